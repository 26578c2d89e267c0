defmodule XlaNode.Compiler do
  @moduledoc """
  An `Nx.Defn.Compiler` that runs `defn` on an xla_node compute node.

      Nx.Defn.jit(&MyModel.predict/2, compiler: XlaNode.Compiler, node: :"xla@gpu1").(params, x)

  The expression is lowered to StableHLO in Elixir (see `XlaNode.Compiler.Lower`), compiled on
  the node and run there; the caller's node needs no NIF, no XLA and no C compiler. Compiled
  programs are kept per (function, argument templates, node) by `XlaNode.Compiler.Cache`: a
  second call with the same shapes lowers and compiles nothing, new shapes compile anew.
  `Nx.runtime_call/4` callbacks and hooks (`print_value`, `hook/3`) run on the caller's node, in
  a callback server started for each call, while the program runs on the compute node.

  The expression never leaves the process that traced it: the cache holds the executable, the
  output templates and the callbacks, and the function `Nx.Defn.compile/3` returns captures no
  more, so that it runs as cheaply in any process (`Nx.Serving` runs it in its own). An
  expression graph shares its nodes many times over, and a copy between processes or into ETS
  does not keep that sharing.

  ## Types

  Every Nx type, `s2`, `s4`, `u2`, `u4`, `f8` (E5M2) and `f8_e4m3fn` included. Where XLA's CPU
  backend cannot compute an op on the 2- and 4-bit integers (or would abort on it), the op runs
  on 8-bit integers and narrows back, wrapping as Nx does; `erfc` of 8-bit floats, which XLA
  lacks, runs on `f32` (see `XlaNode.Compiler.Lower`). Integer results are Nx's bit for bit;
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
      their results kept there, and the callbacks run on this node between them (see
      `XlaNode.Compiler.Split`). Default: `:inside` where the node's platform can run host
      callbacks (CPU; `:info`'s `host_callbacks`), `:split` elsewhere
    * `:keep_on_device` - return tensors whose data stays on the node (`XlaNode.Backend`), to
      pass into the next call without moving them. Default: `true` when the process's default
      backend (`Nx.default_backend/0`) is `XlaNode.Backend`, as with EXLA, `false` otherwise
      and in an `Nx.Serving` (its batches run in tasks that exit once they have replied, and
      a buffer goes with the process that made it)
    * `:hooks` - a map of hook names to functions, overriding the hooks of the expression
    * `:queue_timeout` - how long a run may wait for a place on a node that already runs as
      many as it admits, in milliseconds or `:infinity` (default: the node's `--queue-timeout`)
    * `:timeout` - how long to wait for the run's result, in milliseconds or `:infinity`
      (default `:infinity`)

  Any other option raises `ArgumentError`, naming the valid ones, except those Nx itself passes
  through to a compiler (see `XlaNode.Compiler.Options`).

  ## Telemetry

  Its compiles and runs are the client's `XlaNode.compile/3` and `XlaNode.run/4`, whose
  `[:xla_node, :compile | :run, :start | :stop | :exception]` spans (see `XlaNode.Telemetry`)
  carry `compiler: XlaNode.Compiler` and `key`, the function's key as `Nx.Defn` gives it (for a
  stage of `callbacks: :split`, `{{:split, key, argument_templates}, stage_index}`). A compile happens once per function,
  argument templates and node, in the process that `XlaNode.Compiler.Cache` starts to compile and hold that program; its span covers the
  node's compile, not the lowering to StableHLO before it. Callbacks and hooks are
  `[:xla_node, :callback, ...]` spans, in the process that runs each.
  """

  @behaviour Nx.Defn.Compiler

  alias Nx.Defn.{Composite, Expr}
  alias XlaNode.Backend.Transfer
  alias XlaNode.Compiler.{Cache, Lower, Options}

  # One partition per node of a pool, or per device of a node (as EXLA gives one per device of
  # its client), so that a serving's batches run side by side.
  @impl true
  def __partitions_options__(opts) do
    opts = Options.validate!(opts)
    node = Keyword.get(opts, :node)

    if XlaNode.Pool.pool?(node) do
      List.duplicate(opts, max(length(XlaNode.Pool.nodes(node)), 1))
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

    if keep_on_device?(opts),
      do: {XlaNode.Backend, [node: node!(opts)] ++ Keyword.take(opts, [:device_id])},
      else: {Nx.BinaryBackend, []}
  end

  # Results stay on the node when asked to, or when the default backend is XlaNode.Backend,
  # except in an Nx.Serving (which passes :batch_keys): it runs each batch in a task that exits
  # once it has replied, taking the buffers it owns with it.
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

    case Keyword.get_lazy(opts, :callbacks, fn -> default_callbacks(info) end) do
      :inside ->
        program({cache_key(key), templates(vars), node}, vars, fun, opts, info)

      :split ->
        opts = Keyword.put(opts, :keep_on_device, keep_on_device?(opts))
        XlaNode.Compiler.Split.compile(cache_key(key), vars, fun, opts, info)
    end
  end

  # Callbacks inside the program need a platform whose programs can call the node's host
  # handlers (CPU); elsewhere the program is cut at them.
  defp default_callbacks(%{host_callbacks: true}), do: :inside
  defp default_callbacks(_info), do: :split

  @doc false
  # The program for `fun` on `opts[:node]`, from the cache under `cache_key` (whose last
  # element is the node) or lowered and compiled now, as the function Nx calls with the
  # arguments. The expression `fun` returns stays in this process: what the cache keeps, and the
  # returned function captures (Nx.Serving runs it in other processes), are templates, the
  # executable and the callbacks' functions.
  def program({_, _, node} = program_key, vars, fun, opts, info) do
    cache_key = stored_key(program_key)

    %{exe: exe, callbacks: callbacks, outputs: outputs} =
      Cache.get(cache_key) || compile!(cache_key, node, info, vars, fun)

    hooks = Keyword.get(opts, :hooks, %{})

    run_opts =
      opts
      |> Keyword.take([:callback_timeout, :queue_timeout])
      |> then(&if(device = opts[:device_id], do: [{:device, device} | &1], else: &1))
      |> Keyword.put(:keep_on_device, keep_on_device?(opts))
      |> Keyword.put(:telemetry_metadata, telemetry_metadata(cache_key))

    timeout = Keyword.get(opts, :timeout, :infinity)

    fn [params] ->
      args = params |> Enum.map(& &1.()) |> Transfer.args(node)
      results = run(node, exe, args, callbacks, hooks, run_opts, timeout)
      [from_client(results, outputs, node)]
    end
  end

  @doc false
  # What a program's cache key holds of its arguments: one {type, shape, names, vectorized
  # axes} per tensor.
  def templates(vars) do
    vars
    |> Composite.flatten_list()
    |> Enum.map(&{&1.type, &1.shape, &1.names, &1.vectorized_axes})
  end

  @doc false
  # The function Nx traced, as the cache's key. A closure is compared with the values it
  # captured, which go into ETS with the key, except for defn expressions (the stages of
  # `Nx.Defn.Graph.run/3` capture theirs): an expression graph shares its nodes, which neither
  # hashing nor copying a term preserves, so each goes as its id, which names it.
  def cache_key(fun) when is_function(fun) do
    case Function.info(fun, :env) do
      {:env, []} ->
        fun

      {:env, env} ->
        info = Function.info(fun)
        {:closure, info[:module], info[:new_uniq], info[:new_index], Enum.map(env, &key_term/1)}
    end
  end

  defp key_term(%Nx.Tensor{data: %Expr{id: id}}), do: {Expr, id}
  defp key_term(%Nx.Tensor{} = tensor), do: tensor
  defp key_term(fun) when is_function(fun), do: cache_key(fun)
  defp key_term(list) when is_list(list), do: key_list(list)

  defp key_term(tuple) when is_tuple(tuple),
    do: tuple |> Tuple.to_list() |> key_list() |> List.to_tuple()

  defp key_term(map) when is_map(map), do: :maps.map(fn _key, value -> key_term(value) end, map)
  defp key_term(other), do: other

  # Improper lists too.
  defp key_list([head | tail]), do: [key_term(head) | key_list(tail)]
  defp key_list([]), do: []
  defp key_list(tail), do: key_term(tail)

  defp compile!(cache_key, node, info, vars, fun) do
    {outputs, output_templates} = outputs(vars, fun)
    target = %{node: node, platform: info.platform}

    %{text: text, callbacks: callbacks} =
      Lower.module(Composite.flatten_list(vars), Composite.flatten_list([outputs]), target)

    if callbacks != %{} and not info.host_callbacks do
      raise ArgumentError,
            "XlaNode.Compiler: #{node}'s platform (#{info.platform}) cannot run host callbacks " <>
              "inside a program. callbacks: :split (the default there) runs them between " <>
              "programs, but cannot cut inside a while or cond: move the runtime_call or hook " <>
              "out of it"
    end

    Cache.compile!(cache_key, node, text, %{callbacks: callbacks, outputs: output_templates},
      telemetry_metadata: telemetry_metadata(cache_key)
    )
  end

  # What the client's :telemetry events of this compiler's compiles and runs carry besides their
  # own: the compiler, and the function's key (a split stage's is {{:split, key, templates}, stage index}).
  defp telemetry_metadata({key, _templates, _node}), do: %{compiler: __MODULE__, key: key}

  defp node!(opts) do
    case Keyword.fetch(opts, :node) do
      {:ok, pid} when is_pid(pid) ->
        if XlaNode.Pool.pool?(pid),
          do: pid,
          else: raise(ArgumentError, "XlaNode.Compiler: #{inspect(pid)} is not an XlaNode.Pool")

      {:ok, node} ->
        node

      :error ->
        raise ArgumentError, "XlaNode.Compiler needs the compute node: pass node: :\"xla@host\""
    end
  end

  @doc false
  # The key `program/5` stores a program under in XlaNode.Compiler.Cache, for `{key, templates,
  # node}`. A pool's programs live as long as its process: a pool restarted under the same name
  # has none.
  def stored_key({key, templates, node}) do
    if XlaNode.Pool.pool?(node),
      do: {key, templates, {XlaNode.Pool, GenServer.whereis(node)}},
      else: {key, templates, node}
  end

  # The traced expression, devectorized for lowering, and the templates of the result: its
  # structure with each tensor's template, then each devectorized output's template.
  defp outputs(vars, fun) do
    output = fun.(vars)

    {devectorized, templates} =
      Composite.traverse(output, [], fn t, acc ->
        t = Nx.devectorize(t)
        {t, [Nx.to_template(t) | acc]}
      end)

    {devectorized, {Composite.traverse(output, &Nx.to_template/1), Enum.reverse(templates)}}
  end

  defp run(node, exe, args, callbacks, hooks, run_opts, timeout) do
    if callbacks == %{} do
      Transfer.run!(node, exe, args, Keyword.put(run_opts, :timeout, timeout))
    else
      {:ok, server} =
        XlaNode.CallbackServer.start_link(XlaNode.Compiler.Callbacks.handlers(callbacks, hooks))

      try do
        Transfer.run!(node, exe, args, run_opts ++ [callback_server: server, timeout: timeout])
      after
        Process.unlink(server)
        Process.exit(server, :shutdown)
      end
    end
  end

  # Results come as tensors, or as buffers with keep_on_device: true.
  defp from_client(results, {structure, templates}, node) do
    tensors =
      Enum.zip_with(results, templates, fn
        {data, _}, template ->
          Transfer.host_tensor(template, data)

        buffer, template when is_reference(buffer) ->
          Transfer.wrap(template, node, buffer)
      end)

    {result, []} =
      Composite.traverse(structure, tensors, fn %Nx.Tensor{} = out, [t | rest] ->
        t = if out.vectorized_axes == [], do: t, else: Nx.vectorize(t, out.vectorized_axes)
        {t, rest}
      end)

    result
  end
end
