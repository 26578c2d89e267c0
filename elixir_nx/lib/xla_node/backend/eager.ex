defmodule XlaNode.Backend.Eager do
  @moduledoc false

  # Runs one Nx operation on a compute node, for `XlaNode.Backend`'s callbacks.
  #
  # The operation is the program `XlaNode.Compiler` makes of the one `Nx.Defn.Expr` call the
  # callback stands for. It is compiled once per (operation, static arguments, output type and
  # shape, argument types and shapes, node) and kept in `XlaNode.Compiler.Cache`; after that an
  # operation is one `:run` request: the tensors that live on the node go as buffers, the result
  # stays there as a buffer.
  #
  # The tensor arguments are found by looking at the callback's arguments (and into lists of
  # them: `concatenate/3`'s tensors, `slice/5`'s start indices, `block/4`'s arguments); every other
  # argument (axes, options, the functions of `reduce/5`) is part of the program's key.
  #
  # The node an operation runs on is that of its first argument with data on a node; tensors of
  # any other node are read from theirs and sent along, so mixing nodes works and moves data
  # through this node (see `XlaNode.Backend`).
  #
  # The first run of an operation goes through `Nx.Defn.jit_apply/3` with this module as the
  # compiler, which traces the expression as Nx does for any compiler and hands it to
  # `XlaNode.Compiler.Program.runner/5` under the operation's key; later runs find the program
  # there. As in any program, only the arguments the expression uses are sent.

  @behaviour Nx.Defn.Compiler

  alias Nx.Defn.Composite
  alias XlaNode.Backend
  alias XlaNode.Backend.Transfer
  alias XlaNode.Compiler.{Cache, Program}

  @doc """
  Runs `Nx.Defn.Expr.<name>(out, args...)` on the node; `out` is the callback's output tensor
  (or container of them). `node` is where an operation without tensor arguments runs.
  """
  def run(name, out, args, node \\ nil) do
    run(name, out, args, node, &apply(Nx.Defn.Expr, name, [out | &1]))
  end

  @doc "As `run/4`, with `build` making the expression from the arguments (`block/4`)."
  def run(name, out, args, node, build) do
    {static, tensors} = split(args)
    node = node_of(tensors) || node || raise_no_node(name)
    # Names label the result only: programs are shared across them.
    inputs = Enum.map(tensors, &unnamed/1)
    key = {{Backend, name, static, shapes(out)}, Program.arguments_key(inputs), node}

    results =
      case Cache.get(Program.stored_key(key)) do
        %{exe: exe, callbacks: callbacks, used: used} when callbacks == %{} ->
          args = inputs |> Program.take_used(used) |> Transfer.args(node)

          Transfer.data(
            node,
            Transfer.run!(
              node,
              exe,
              args,
              [keep_on_device: true] ++ Transfer.owner() ++ priority()
            )
          )

        _ ->
          compile_and_run(key, static, inputs, node, build)
      end

    {result, []} =
      Composite.traverse(out, results, fn t, [data | rest] -> {%{t | data: data}, rest} end)

    result
  end

  defp compile_and_run(key, static, inputs, node, build) do
    expr_fun = fn params -> build.(fill(static, Tuple.to_list(params))) end
    opts = [compiler: __MODULE__, cache_key: key, node: node, on_conflict: :force]

    [Nx.Defn.jit_apply(expr_fun, [List.to_tuple(inputs)], opts)]
    |> Composite.flatten_list()
    |> Enum.map(& &1.data)
  end

  @impl true
  def __jit__(key, vars, fun, args_list, opts), do: __compile__(key, vars, fun, opts).(args_list)

  @impl true
  def __compile__(_key, vars, fun, opts) do
    node = Keyword.fetch!(opts, :node)
    program_opts = [node: node, callbacks: :inside, keep_on_device: true] ++ priority()
    info = Cache.node_info(node)
    Program.runner(Keyword.fetch!(opts, :cache_key), vars, fun, program_opts, info)
  end

  @impl true
  def __partitions_options__(opts), do: [opts]

  @impl true
  def __to_backend__(opts), do: {Backend, node: Keyword.fetch!(opts, :node)}

  # The `:priority` of the process's default backend options (`{XlaNode.Backend, node: n,
  # priority: :low}`), which its eager operations run at.
  defp priority do
    case Nx.default_backend() do
      {Backend, opts} -> Keyword.take(opts, [:priority])
      _other -> []
    end
  end

  # Splits the arguments into the tensors (at the top level or in a list) and the rest, with
  # {Backend, :tensor} where each tensor was.
  defp split(args) do
    {static, tensors} =
      Enum.map_reduce(args, [], fn
        %Nx.Tensor{} = t, acc ->
          {{Backend, :tensor}, [t | acc]}

        list, acc when is_list(list) ->
          Enum.map_reduce(list, acc, fn
            %Nx.Tensor{} = t, acc -> {{Backend, :tensor}, [t | acc]}
            other, acc -> {other, acc}
          end)

        other, acc ->
          {other, acc}
      end)

    {static, Enum.reverse(tensors)}
  end

  defp fill(static, tensors) do
    {args, []} =
      Enum.map_reduce(static, tensors, fn
        {Backend, :tensor}, [t | rest] -> {t, rest}
        list, acc when is_list(list) -> Enum.map_reduce(list, acc, &fill_one/2)
        other, acc -> {other, acc}
      end)

    args
  end

  defp fill_one({Backend, :tensor}, [t | rest]), do: {t, rest}
  defp fill_one(other, acc), do: {other, acc}

  # The node of the first tensor with data on a node, else of the first kept inline.
  defp node_of(tensors) do
    Enum.find_value(tensors, fn
      %Nx.Tensor{data: %Backend{node: node, buffer: buffer}} when is_reference(buffer) -> node
      _ -> nil
    end) ||
      Enum.find_value(tensors, fn
        %Nx.Tensor{data: %Backend{node: node}} -> node
        _ -> nil
      end)
  end

  defp raise_no_node(name) do
    raise ArgumentError,
          "XlaNode.Backend: Nx.#{name} has no tensor on a node to run next to: " <>
            "give the node with backend: {XlaNode.Backend, node: node}"
  end

  defp unnamed(%Nx.Tensor{shape: shape} = t),
    do: %{t | names: List.duplicate(nil, tuple_size(shape))}

  # The output's structure with each tensor's type, shape and vectorized axes.
  defp shapes(out),
    do: Composite.traverse(out, fn t -> {t.type, t.shape, t.vectorized_axes} end)
end
