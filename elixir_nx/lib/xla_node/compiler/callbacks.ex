defmodule XlaNode.Compiler.Callbacks do
  @moduledoc false

  # Serves a compiled program's `runtime_call`s and hooks on the caller's node: turns each
  # callback request into Nx tensors shaped as the expression said, calls the function, checks
  # its result against the output template and replies with the result's binaries (see
  # `XlaNode.CallbackServer` for the protocol). A mismatch, a raise or a throw fails the run with
  # a message that names the callback. Callbacks compute on this node: their tensors are
  # `Nx.BinaryBackend`'s, whatever the default backend is.

  alias Nx.Defn.Composite
  alias XlaNode.Backend.Transfer

  @doc "The `XlaNode.CallbackServer` handlers for the callbacks `XlaNode.Compiler.Lower` found."
  def handlers(callbacks, hooks) do
    Map.new(callbacks, fn {id, callback} ->
      handler = handler(callback, hooks)
      # Callbacks compute on this node, whatever the configured default backend.
      {id, &Nx.with_default_backend(Nx.BinaryBackend, fn -> handler.(&1) end)}
    end)
  end

  defp handler(%{kind: :runtime_call} = c, _hooks) do
    fn args ->
      result = c.fun.(to_container(args, c.args_template), c.opts)

      if Nx.compatible?(c.out_template, result) do
        {:ok, result |> List.wrap() |> Composite.flatten_list() |> Enum.map(&Nx.to_binary/1)}
      else
        {:error,
         {:runtime_error,
          "runtime_call #{inspect(c.fun)} returned #{inspect(Nx.to_template(result))}, " <>
            "which does not match the output template #{inspect(c.out_template)}"}}
      end
    end
  end

  defp handler(%{kind: :hook} = c, hooks) do
    fn args ->
      case resolve(c.spec, hooks) do
        nil -> :ok
        fun -> fun.(to_container(args, c.template))
      end

      {:ok, []}
    end
  end

  defp resolve({:fn, fun}, _hooks), do: fun
  defp resolve({:named, name, callback}, hooks), do: hooks[name] || callback

  defp to_container(args, template) do
    {container, []} =
      Composite.traverse(template, args, fn %Nx.Tensor{} = t, [{data, _} | rest] ->
        {Transfer.host_tensor(t, data), rest}
      end)

    container
  end
end
