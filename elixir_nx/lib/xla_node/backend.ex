defmodule XlaNode.Backend do
  @moduledoc """
  Tensors whose data stays on an xla_node compute node: what `XlaNode.Compiler` returns with
  `keep_on_device: true`.

  Such a tensor passes into the next call jitted with `XlaNode.Compiler` on the same node
  without leaving it. `Nx.to_binary/1`, `inspect/1`, `Nx.backend_transfer/2`,
  `Nx.backend_copy/2` and `Nx.backend_deallocate/1` work; any other Nx operation on it raises,
  saying to jit it or to transfer the tensor first. The buffer belongs to the process that
  made the call: the node frees it when that process exits (or with `Nx.backend_deallocate/1`).
  `Nx.Serving` runs each batch in a task of its own, which exits once it has replied, so a
  serving's results must not be kept on the device.
  `node` is what the call named: a node, or an `XlaNode.Pool`, which reads and frees the buffer
  on the node holding it.
  """

  @behaviour Nx.Backend

  @enforce_keys [:node, :buffer]
  defstruct [:node, :buffer]

  @implemented [
    to_binary: 2,
    inspect: 2,
    backend_copy: 3,
    backend_transfer: 3,
    backend_deallocate: 1,
    init: 1
  ]

  # Its tensors come from XlaNode.Compiler (keep_on_device: true), never from options.
  @impl true
  def init([]), do: []

  def init(opts) do
    raise ArgumentError,
          "XlaNode.Backend takes no options (its tensors come from XlaNode.Compiler with " <>
            "keep_on_device: true), got #{inspect(opts)}"
  end

  @impl true
  def to_binary(%Nx.Tensor{} = t, limit) do
    {_, size} = t.type
    binary = read!(t)
    binary_part(binary, 0, min(byte_size(binary), div(limit * size, 8)))
  end

  @impl true
  def inspect(%Nx.Tensor{} = t, opts) do
    Nx.Backend.inspect(t, read!(t), opts)
  end

  @impl true
  def backend_copy(t, backend, opts), do: backend_transfer(t, backend, opts)

  @impl true
  def backend_transfer(%Nx.Tensor{data: %__MODULE__{}} = t, __MODULE__, _opts), do: t

  def backend_transfer(%Nx.Tensor{} = t, backend, opts) do
    backend = if backend == Nx.Tensor, do: Nx.BinaryBackend, else: backend
    backend.from_binary(t, read!(t), opts)
  end

  @impl true
  def backend_deallocate(%Nx.Tensor{data: %__MODULE__{node: node, buffer: buffer}}) do
    case XlaNode.free(node, buffer) do
      :ok -> :ok
      {:error, _} -> :already_deallocated
    end
  end

  defp read!(%Nx.Tensor{data: %__MODULE__{node: node, buffer: buffer}}) do
    case XlaNode.read(node, buffer) do
      {:ok, {binary, _}} -> binary
      {:error, error} -> raise error
    end
  end

  # Every other operation: a clear error instead of an undefined function.
  for {name, arity} <- Nx.Backend.behaviour_info(:callbacks), {name, arity} not in @implemented do
    args = Macro.generate_arguments(arity, __MODULE__)

    @impl true
    def unquote(name)(unquote_splicing(args)) do
      raise ArgumentError,
            "Nx.#{unquote(name)} cannot work on a tensor kept on an xla_node compute node " <>
              "(keep_on_device: true): jit it with XlaNode.Compiler, or Nx.backend_transfer/2 it first"
    end
  end
end
