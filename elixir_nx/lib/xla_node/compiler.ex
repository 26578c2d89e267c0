defmodule XlaNode.Compiler do
  @moduledoc """
  An `Nx.Defn.Compiler` that runs `defn` on an xla_node compute node.

      defmodule MyModel do
        import Nx.Defn

        defn predict(params, x), do: Nx.dot(x, params.w) + params.b
      end

      params = %{w: Nx.tensor([[1.0], [2.0]]), b: Nx.tensor([0.5])}
      x = Nx.tensor([[1.0, 1.0], [2.0, 0.0]])
      y = Nx.Defn.jit(&MyModel.predict/2, compiler: XlaNode.Compiler, node: :"xla@host").(params, x)
      Nx.to_flat_list(y)
      #=> [3.5, 2.5]

  The expression is lowered to StableHLO in Elixir (with the client's `XlaNode.MLIR`), compiled
  on the node and run there; the caller's node needs no NIF, no XLA and no C compiler. Compiled
  programs are kept per (function, arguments' structure, node) in a cache: a second call with arguments of the same structure
  lowers and compiles nothing; new shapes, types, container kinds or keys, or `keep:` fields
  compile anew. Only the arguments the expression uses are read and sent, as under
  `Nx.Defn.Evaluator`: templates and lazy containers' unused members are never read.
  `Nx.runtime_call/4` callbacks and hooks (`print_value`, `hook/3`) run on the caller's node, in
  a callback server started for each call, while the program runs on the compute node. A
  callback that fails (raises, throws, exits, or returns a result that does not match its
  output template) fails the call as under `Nx.Defn.Evaluator`, with its own exception and
  stacktrace, throw or exit.

  The expression never leaves the process that traced it: the cache holds the executable, the
  output templates and the callbacks, and the function `Nx.Defn.compile/3` returns captures no
  more, so that it runs as cheaply in any process (`Nx.Serving` runs it in its own). An
  expression graph shares its nodes many times over, and a copy between processes or into ETS
  does not keep that sharing.

  ## Types

  Every Nx type, `s2`, `s4`, `u2`, `u4`, `f8` (E5M2) and `f8_e4m3fn` included. Where XLA's CPU
  backend cannot compute an op on the 2- and 4-bit integers (or would abort on it), the op runs
  on 8-bit integers and narrows back, wrapping as Nx does; `erfc` of 8-bit floats, which XLA
  lacks, runs on `f32`. Integer results are Nx's bit for bit;
  8-bit float results differ from `Nx.BinaryBackend`'s only where Nx rounds otherwise (it
  truncates to `f8`, rounds `f8_e4m3fn` ties away from zero and saturates its overflow to ±448,
  where XLA rounds to nearest even and gives NaN), as EXLA's do.

  ## Options

    * `:node` - the compute node (required), or an `XlaNode.Pool` (its name or pid) that spreads
      the runs over several nodes and re-sends a run elsewhere when its node goes down; with
      `Nx.Serving`'s `partitions: true`, a pool gives one partition per node, so that batches
      run on the nodes side by side
    * `:device_id` - the device of the node to run on, an index into `XlaNode.info/2`'s
      `devices` (default: where the argument buffers are, else 0), as EXLA's `:device_id`.
      Arguments from the host go there; an `XlaNode.Backend` argument on another device of
      the node is refused (the node does not move buffers between devices). With
      `Nx.Serving`'s `partitions: true` on a node, each device of the node is one partition
    * `:callback_timeout` - how long the node waits for each callback, in milliseconds or
      `:infinity` (default: the node's `--callback-timeout`)
    * `:callbacks` - `:inside`: `runtime_call`s and hooks run as custom calls inside the
      program; `:split`: the program is cut at each of them, the pieces run on the node with
      their results kept there, and the callbacks run on this node between them. Default: `:inside` where the node's platform can run host
      callbacks (CPU and CUDA; `:info`'s `host_callbacks`), `:split` elsewhere
    * `:keep_on_device` - return tensors whose data stays on the node (`XlaNode.Backend`), to
      pass into the next call without moving them. Default: `true` when the process's default
      backend (`Nx.default_backend/0`) is `XlaNode.Backend`, as with EXLA, `false` otherwise
      and in an `Nx.Serving` (it cuts each batch's results into each caller's, which on the
      node is a request a caller; and a caller on another node must use a tensor there before
      the serving's node drops it, see `XlaNode.Keeper`); with `true` given, a serving's
      results live on the node while their callers hold them. Where the default backend
      decides it, results of 64 bytes or less (a loss) come back in the same reply instead,
      inline behind `XlaNode.Backend` tensors, so that reading them asks the node nothing;
      `true` given keeps every result
    * `:hooks` - a map of hook names to functions, overriding the hooks of the expression
    * `:queue_timeout` - how long a run may wait for a place on a node that already runs as
      many as it admits, in milliseconds or `:infinity` (default: the node's `--queue-timeout`)
    * `:priority` - `:high`, `:normal` (the default) or `:low`: where the runs go among this
      BEAM node's runs waiting on the compute node (see `XlaNode.run/4`); e.g. a latency-bound
      `Nx.Serving` at `:high` beside a batch job's `Nx.Defn.jit(..., priority: :low)`
    * `:timeout` - how long to wait for the run's result, in milliseconds or `:infinity`
      (default `:infinity`)
    * `:debug` - log (`Logger.debug/1`) each program's lowered module with how long lowering
      and the node's compile took, and each cache hit, as `EXLA`'s `:debug` logs its compiles
      (default `false`)
    * `:wait` - `true`: a run whose results all stay on the node returns once they are
      computed; by default it returns once the node has launched it (their buffers carry their
      readiness: reading one, or a run that takes one, waits for it), see `XlaNode.run/4`

  A value of the wrong kind for one of these raises `ArgumentError` naming the option. Options
  the compiler does not know are ignored, as `Nx.Defn.Evaluator` and `EXLA` ignore them:
  libraries forward their own through `Nx.Defn.jit/2`.

  ## Telemetry

  Its compiles and runs are the client's `XlaNode.compile/3` and `XlaNode.run/4`, whose
  `[:xla_node, :compile | :run, :start | :stop | :exception]` spans (see `XlaNode.Telemetry`)
  carry `compiler: XlaNode.Compiler` and `key`, the function's key as `Nx.Defn` gives it (for a
  stage of `callbacks: :split`, `{{:split, key, arguments_key}, stage_index}`). A compile happens once per function,
  arguments' structure and node, in the process that the compiler's cache starts to compile and
  hold that program; its span covers the
  node's compile, not the lowering to StableHLO before it. Callbacks and hooks are
  `[:xla_node, :callback, ...]` spans, in the process that runs each.
  """

  @behaviour Nx.Defn.Compiler

  alias XlaNode.Compiler.{Cache, Options, Program}

  # One partition per device of a node (as EXLA gives one per device of its client), or per
  # device of every node of a pool (the pool places each run on its least loaded device), so
  # that a serving's batches run side by side.
  @impl true
  def __partitions_options__(opts) do
    opts = Options.validate!(opts)
    node = Keyword.get(opts, :node)

    if XlaNode.Pool.pool?(node) do
      devices =
        node
        |> XlaNode.Pool.status()
        |> Map.fetch!(:nodes)
        |> Enum.map(fn status -> max(length(Map.get(status, :devices, [])), 1) end)
        |> Enum.sum()

      List.duplicate(opts, max(devices, 1))
    else
      for device <- 0..(device_count(node!(opts)) - 1)//1,
          do: Keyword.put(opts, :device_id, device)
    end
  end

  defp device_count(node) do
    case XlaNode.info(node) do
      {:ok, %{devices: [_ | _] = devices}} -> length(devices)
      {:ok, _older_node} -> 1
      {:error, error} -> raise error
    end
  end

  @impl true
  def __to_backend__(opts) do
    opts = Options.validate!(opts)
    # Checked either way: a compiler without its node could run nothing.
    node = node!(opts)

    if keep_on_device?(opts),
      do: {XlaNode.Backend, [node: node] ++ Keyword.take(opts, [:device_id])},
      else: {Nx.BinaryBackend, []}
  end

  # Results stay on the node when asked to, or when the default backend is XlaNode.Backend,
  # except in an Nx.Serving (which passes :batch_keys): it cuts each batch's results into its
  # callers', a request each on the node, and its callers may be on other nodes.
  defp keep_on_device?(opts) do
    Keyword.get_lazy(opts, :keep_on_device, fn ->
      not Keyword.has_key?(opts, :batch_keys) and
        match?({XlaNode.Backend, _}, Nx.default_backend())
    end)
  end

  @impl true
  def __jit__(key, vars, fun, args_list, opts) do
    __compile__(key, vars, fun, opts).(args_list)
  end

  @impl true
  def __compile__(key, vars, fun, opts) do
    opts = Options.validate!(opts)
    node = node!(opts)
    info = Cache.node_info(node)
    keep? = keep_on_device?(opts)

    # Small results come back inline where the results stay on the node because the caller's
    # backend is XlaNode.Backend; `keep_on_device: true` given keeps every one (the backend's
    # eager operations and :split's stages give it).
    opts =
      opts
      |> Keyword.put(:inline_results, keep? and not Keyword.has_key?(opts, :keep_on_device))
      |> Keyword.put(:keep_on_device, keep?)

    case Keyword.get_lazy(opts, :callbacks, fn -> default_callbacks(info) end) do
      :inside ->
        program_key = {Program.function_key(key), Program.arguments_key(vars), node}
        Program.runner(program_key, vars, fun, opts, info)

      :split ->
        XlaNode.Compiler.Split.compile(Program.function_key(key), vars, fun, opts, info)
    end
  end

  @impl true
  def __shard_jit__(key, mesh, vars, fun, args_list, opts) do
    opts = Options.validate!(opts)
    node = node!(opts)

    if XlaNode.Pool.pool?(node) do
      raise ArgumentError,
            "shard_jit with XlaNode.Compiler runs on the devices of one node: give node: a " <>
              "node, not an XlaNode.Pool"
    end

    keep? = keep_on_device?(opts)

    opts =
      opts
      |> Keyword.put(:inline_results, keep? and not Keyword.has_key?(opts, :keep_on_device))
      |> Keyword.put(:keep_on_device, keep?)

    XlaNode.Compiler.Shard.run(key, mesh, vars, fun, args_list, opts)
  end

  # Callbacks inside the program need a platform whose programs can call the node's host
  # handlers (CPU, CUDA); elsewhere the program is cut at them.
  defp default_callbacks(%{host_callbacks: true}), do: :inside
  defp default_callbacks(_info), do: :split

  defp node!(opts) do
    case Keyword.fetch(opts, :node) do
      {:ok, pid} when is_pid(pid) ->
        if XlaNode.Pool.pool?(pid),
          do: pid,
          else: raise(ArgumentError, "XlaNode.Compiler: #{inspect(pid)} is not an XlaNode.Pool")

      # The name of an XlaNode.Local stands for its node of the moment.
      {:ok, node} ->
        XlaNode.Local.resolve(node)

      :error ->
        raise ArgumentError, "XlaNode.Compiler needs the compute node: pass node: :\"xla@host\""
    end
  end
end
