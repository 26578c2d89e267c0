defmodule XlaNode.Compiler.Callbacks do
  @moduledoc false

  # Serves a compiled program's `runtime_call`s and hooks on the caller's node: turns each
  # callback request into Nx tensors shaped as the expression said, calls the function, checks
  # its result against the output template and replies with the result's binaries (see
  # `XlaNode.CallbackServer` for the protocol). Callbacks compute on this node: their tensors are
  # `Nx.BinaryBackend`'s, whatever the default backend is.
  #
  # A callback that fails (raises, throws, exits, or returns a result that does not match its
  # output template, which raises `RuntimeError` with `Nx.Defn.Evaluator`'s message) fails the
  # run, as under the Evaluator, where it runs in the caller's process: the failure goes to the
  # caller (`report_to`) before the node is answered with the error, and `raise_failure/3`, once
  # the run has failed, raises, throws or exits there with it, as the Evaluator would have.

  alias Nx.Defn.Composite
  alias XlaNode.Backend.Transfer

  @doc """
  The `XlaNode.CallbackServer` handlers for the callbacks `XlaNode.Compiler.Lower` found.
  Each failure is sent to `report_to` (an alias of the caller, `:erlang.alias/0`) as
  `{report_to, {:callback_failed, kind, reason, stacktrace}}`, then raised again, so that the
  callback server answers the node with the error (and its `:telemetry` span ends with
  `:exception`).
  """
  def handlers(callbacks, hooks, report_to) do
    Map.new(callbacks, fn {id, callback} ->
      handler = handler(callback, hooks)

      {id,
       fn args ->
         try do
           # Callbacks compute on this node, whatever the configured default backend.
           Nx.with_default_backend(Nx.BinaryBackend, fn -> handler.(args) end)
         catch
           kind, reason ->
             send(report_to, {report_to, {:callback_failed, kind, reason, __STACKTRACE__}})
             :erlang.raise(kind, reason, __STACKTRACE__)
         end
       end}
    end)
  end

  @doc """
  After a run with the callbacks of `handlers/3` failed with `error` (raised at `stacktrace`):
  raises, throws or exits as the callback that failed it did, if one did (its failure is in
  the caller's mailbox: it was sent before the node was answered), and raises `error`
  otherwise (the node, the connection or the callback server failed, or a callback timed out).
  """
  def raise_failure(report_to, %XlaNode.Error{} = error, stacktrace) do
    # Only for the error a callback's error reply makes: a run that failed otherwise (its
    # callback timed out, say) raises its own error, even if the callback failed meanwhile.
    if error.kind == :runtime_error and error.message =~ "elixir callback returned" do
      receive do
        {^report_to, {:callback_failed, kind, reason, callback_stacktrace}} ->
          :erlang.raise(kind, reason, callback_stacktrace)
      after
        0 -> reraise error, stacktrace
      end
    else
      reraise error, stacktrace
    end
  end

  @doc """
  Ends the run's `report_to`: failures sent to it later are dropped, and those already in the
  caller's mailbox (of a run that failed otherwise) are taken out.
  """
  def close(report_to) do
    :erlang.unalias(report_to)
    flush(report_to)
  end

  defp flush(report_to) do
    receive do
      {^report_to, _failure} -> flush(report_to)
    after
      0 -> :ok
    end
  end

  defp handler(%{kind: :runtime_call} = c, _hooks) do
    fn args ->
      result = c.fun.(to_container(args, c.args_template), c.opts)

      # Nx.Defn.Evaluator's check and message.
      if not Nx.compatible?(c.out_template, result) do
        raise "expected the runtime_call function to match the given output template"
      end

      {:ok, result |> List.wrap() |> Composite.flatten_list() |> Enum.map(&Nx.to_binary/1)}
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
