defmodule XlaNode.Pool do
  @moduledoc """
  Several xla_node compute nodes used as one, every device of each: each run goes where it will
  finish first, and a run whose node goes down finishes on another.

      children = [
        {XlaNode.Pool, name: MyApp.XLA, nodes: [:"xla1@host", :"xla2@host"]}
      ]

      {:ok, _supervisor} = Supervisor.start_link(children, strategy: :one_for_one)

      mlir = \"\"\"
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %one = stablehlo.constant dense<1.0> : tensor<4xf32>
        %r = stablehlo.add %x, %one : tensor<4xf32>
        return %r : tensor<4xf32>
      }
      \"\"\"
      exe = XlaNode.compile!(MyApp.XLA, mlir)
      [y] = XlaNode.run!(MyApp.XLA, exe, [XlaNode.Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32})])
      XlaNode.Tensor.to_list(y)
      #=> [2.0, 3.0, 4.0, 5.0]

  Every `XlaNode` function that takes a node takes a pool instead (its name, or its pid):
  `compile/3`, `run/4`, `to_device/3`, `read/3`, `free/3` and their bang variants, `info/2`
  and `ping/2` (one of the up nodes answers), and through them `XlaNode.Compiler`'s and
  `XlaNode.Backend`'s `node:` option. A pool lives on the node that started it and serves the
  processes of that node.

  ## Nodes

  The pool connects to its nodes, follows them with
  `:net_kernel.monitor_nodes(true, node_type: :all)`, and asks each for `:info` before sending
  it work (the answer also tells its devices). A node that goes down or cannot be reached is tried again after a delay that doubles
  from the first `:reconnect_backoff` value up to the second; it gets work again once it answers
  `:info` (a node restarted under the same name rejoins this way). `status/1` shows where each
  node stands.

  ## Nodes on demand

  Given a `launcher:` (an `XlaNode.Launcher`), a pool starts its own nodes and stops them, as
  FLAME's pools start runners:

      {XlaNode.Pool,
       name: MyApp.XLA,
       launcher: {XlaNode.Launcher.Local, plugin: :cpu},
       min: 0,
       max: 3,
       idle_shutdown_after: 30_000}

    * it keeps `:min` nodes started (side by side at start, and again when one dies);
    * a call that finds no node up starts one and waits for it (the first `compile/3` of a pool
      with `min: 0` starts its first node);
    * a run that finds every device of every node up *busy*, with `:max_concurrency` runs of the
      pool in flight or more (executing or queued on the node), starts one more node, up to
      `:max`, one at a time: the next starts only once the last is up and the devices are still
      busy. Runs are never held back for it: they go to the least loaded device meanwhile (the
      node queues what it cannot run yet) and to the new node once it is up;
    * a started node without a run of the pool in flight or answered for `:idle_shutdown_after`
      is stopped, down to `:min`, once the node itself says that it holds nothing of anyone's
      (no buffers, no run running or queued): a node with live buffers of its clients is not
      idle, so that no buffer is lost. It first stops taking the runs the pool places (status
      `:stopping`; runs pinned to it by their buffers or `node:` still go there), and is asked
      once more before it stops; a call that finds no other node up takes it back;
    * a node that fails to start is reported and tried again after `:launch_backoff`, doubling
      with each failure in a row; a call that finds no node up meanwhile gets the failure as
      `{:error, %XlaNode.Error{kind: :launch_error}}`, and the pool serves on the nodes it has;
    * a started node that exits or goes down is forgotten and stopped (its runs in flight fail
      over as any node's), and another started where `:min` asks for it; the pool stops every
      node it started when it stops, however it stops (a node's process watches the pool's).

  `nodes:` may be given too: those nodes are served alike and never stopped, and `:min` and
  `:max` count only the nodes the pool starts. `status/1` says what was started and stopped,
  when and why (`launcher:` and each node's `launched:`); each start is a `[:xla_node, :pool,
  :launch]` span and each stop a `[:xla_node, :pool, :node_stop]` event (see
  `XlaNode.Telemetry`).

  ## Programs

  A program compiled through a pool is an `XlaNode.Pool.Executable`: `compile/3` compiles it on
  one node (so that a compile error comes back at once; `node: node` chooses which), and the
  pool compiles it on each other node the first time a run goes there. Those executables belong to the pool process: they live
  as long as it does, or until `XlaNode.free/3` with the handle frees them on every node.
  Buffers are ordinary buffer references, owned by the process that made them, as with one
  node: `to_device/3` puts the tensor on a node the pool chooses, and `read/3` and `free/3` go to
  the node holding the buffer.

  ## Placement

  The pool places on devices: each node's devices (`:info`'s `devices`, asked when the node
  joins) are places as the nodes are. A run with host arguments goes to the device, of every
  device of the up nodes, with the fewest runs in flight from this pool; among those, to the
  node with the fewest, then to the one where the program's recent runs took least time (a node
  where it never ran counts as 0, so that every node gets to run it), then by chance. It is sent
  to that node with `device: n` (a node compiles a program once for all its devices).
  `to_device/3` without `device:` places the tensor the same way, so tensors placed one after
  another spread over the devices too.

  A run whose arguments include buffers goes to the node holding them and runs on their device
  there, where its results stay: a buffer's reference does not say its device, so the node
  takes it from the buffers (the pool counts such a run in the node's runs in flight, not a
  device's). Buffers that the pool put on two devices of one node meet: a run that takes both
  and names no device runs on the device of its first buffer, and the pool first copies each
  other buffer there (read and placed again, in chunks where large; the copy is freed once the
  run is answered), as `XlaNode.Backend` sends a tensor of another node along. Place tensors
  used together with `device:`, or move them once, to spare the copies.

  The `node:` run option pins a run to a node (to its least loaded device); `device: n` runs it
  on device n of the node the pool chooses (the one whose device n has the fewest runs in
  flight), or of the node of its buffers, which must then be on device n (the node refuses them
  otherwise, naming both devices). The caller sends the run to the node itself: the pool
  process is only asked when a program must be compiled on a node.

  ## Failover

  A run whose node goes down or disconnects before replying is sent to another node (compiled
  there if needed; to its least loaded device, as placement chooses), up to `:max_attempts` attempts in all. The caller learns of it as soon as
  its own connection does (the call monitors the node's `:xla` process), not after a timeout.
  A run that its node refuses at once as `:overloaded` (its client node had the `max_queued`
  runs waiting there that the node's `--tenant` rules allow) never started: it is sent to
  another node of the pool that is up, within the same limits (not pinned, no `retry: false`,
  `:max_attempts`); where every node refuses it, the caller gets the last refusal.

  A run is not re-sent, and the caller gets `{:error, %XlaNode.Error{kind: :nodedown,
  reason: :nodedown, node: node}}` at once, when

    * the program has side effects (see `XlaNode.Pool.Effects`: `io_call`, outfeed, infeed, a
      custom call marked `has_side_effect`), which the pool reads from the module text;
    * the program calls back (`runtime_call`) and a callback of the attempt already fired;
    * the run was pinned to the node (`node:`, or buffers held there: the error then names the
      lost buffer);
    * the run says `retry: false`, or `:max_attempts` attempts were made.

  ## Callbacks

  A run's callbacks go to its `callback_server:` wherever the run lands. When a program that
  calls back may be re-sent, each attempt names its own relay process
  as the callback server: it forwards to the caller's server and tells
  whether a callback fired, and it is closed before the run is re-sent, so that a late request
  of the attempt that died is never served.

  ## Telemetry

  A run through the pool is one `[:xla_node, :run]` span (see `XlaNode.Telemetry`), however
  many nodes it tries: its `:stop` metadata has `attempts` (how many nodes it was sent to),
  `node` (where the last attempt went) and `device` (the device the pool chose there; `nil`
  where the node chose it by the run's buffers).

  ## Run options

  Besides `run/4`'s own (`:device`, `:keep_on_device`, `:wait`, `:callback_server`, `:callback_timeout`,
  `:queue_timeout`, `:timeout`, which covers all attempts): `node: node` (pin the run),
  `retry: false` (never re-send it), `max_attempts: n` (this run's limit).

  ## Errors

    * an unknown pool: `XlaNode.Error` of kind `:noproc`;
    * a pool without nodes: kind `:no_nodes`;
    * no node up: kind `:nodedown`, `reason: {:nodes_down, nodes}`, the message naming each
      node and where it stands;
    * no node up, and the pool's launcher failed to start one: kind `:launch_error`;
    * an executable of another pool, of one node, or freed: kind `:argument_error`.
  """

  use GenServer

  require Logger

  alias XlaNode.{Error, Options}
  alias XlaNode.Pool.{Dispatch, Executable, Scaler, Table}

  @typedoc "A pool: its registered name or its pid."
  @type t :: atom() | pid()

  @type option ::
          {:name, atom()}
          | {:nodes, [node()]}
          | {:max_attempts, pos_integer()}
          | {:reconnect_backoff, {non_neg_integer(), pos_integer()}}
          | {:check_timeout, timeout()}
          | {:launcher, {module(), keyword()}}
          | {:min, non_neg_integer()}
          | {:max, pos_integer()}
          | {:idle_shutdown_after, timeout()}
          | {:max_concurrency, pos_integer()}
          | {:launch_backoff, {non_neg_integer(), pos_integer()}}

  ## API

  @doc """
  Starts a pool linked to the caller.

  Options:

    * `:nodes` - the compute nodes (node names; required without `:launcher`, and may be
      empty, see `add_node/2`)
    * `:name` - registers the pool under this atom; `XlaNode` functions then take the name
    * `:max_attempts` - attempts per run, the first included (default 3)
    * `:reconnect_backoff` - `{first_ms, max_ms}`: how soon a node that went down or could not
      be reached is tried again, doubling each time (default `{100, 5_000}`)
    * `:check_timeout` - how long a node may take to answer `:info` when it (re)joins (default
      10_000 ms)

  Nodes on demand (see "Nodes on demand" above):

    * `:launcher` - `{module, options}`: an `XlaNode.Launcher` that starts the pool's nodes
      (`XlaNode.Launcher.Local`, `XlaNode.Launcher.SSH`, or one of your own); its options are
      checked here
    * `:min` - nodes the pool keeps started (default 0)
    * `:max` - nodes it may start (default `max(min, 1)`)
    * `:idle_shutdown_after` - milliseconds after which a started node without work is stopped,
      down to `:min`, or `:infinity` (default 30_000)
    * `:max_concurrency` - runs of the pool in flight on a device (executing or queued on the
      node) at which that device counts as busy (default 1): a run that finds every device of
      every node busy starts one more node
    * `:launch_backoff` - `{first_ms, max_ms}`: how long after a failed start the next one
      may begin, doubling with each failure in a row (default `{1_000, 30_000}`)

  A pool takes calls at once: they wait for its nodes' first connection.

      {:ok, pool} = XlaNode.Pool.start_link(nodes: [:"xla1@host", :"xla2@host"])
      :pong = XlaNode.ping(pool)

  A pool with no nodes of its own starts them when calls come:

      {:ok, pool} =
        XlaNode.Pool.start_link(
          launcher: {XlaNode.Launcher.Local, []},
          min: 0,
          max: 2,
          idle_shutdown_after: 3_000
        )
  """
  @spec start_link([option()]) :: GenServer.on_start()
  def start_link(opts) do
    opts = validate!(opts)
    gen_opts = if opts[:name], do: [name: opts[:name]], else: []
    GenServer.start_link(__MODULE__, opts, gen_opts)
  end

  @doc """
  A child spec: `{XlaNode.Pool, name: MyPool, nodes: [...]}` in a supervisor. Its id is the
  pool's name.

      iex> XlaNode.Pool.child_spec(name: MyPool, nodes: [:"xla1@host"])
      %{id: MyPool, start: {XlaNode.Pool, :start_link, [[name: MyPool, nodes: [:"xla1@host"]]]}}
  """
  @spec child_spec([option()]) :: Supervisor.child_spec()
  def child_spec(opts) do
    %{id: Keyword.get(opts, :name, __MODULE__), start: {__MODULE__, :start_link, [opts]}}
  end

  @doc """
  Where the pool's nodes stand:

      {:ok, _} = XlaNode.Pool.start_link(name: MyPool, nodes: [:"xla1@host", :"xla2@host"])
      :pong = XlaNode.ping(MyPool)
      %{pool: MyPool, programs: 0, nodes: [%{node: :"xla1@host"}, %{node: :"xla2@host"}]} =
        XlaNode.Pool.status(MyPool)

  A pool that has run 300 times, on two nodes of several devices each, says for instance:

  ```text
  %{
    pool: MyPool,
    programs: 2,
    in_flight: 0,
    runs: 300,
    errors: 0,
    failures: 1,
    retries: 1,
    nodes: [
      %{node: :"xla@host1", status: :up, in_flight: 0, runs: 151, errors: 0, failures: 0,
        retries: 0, recent_run_us: 812, executables: 2, platform: "cpu", last_error: nil,
        devices: [
          %{device: 0, name: "cpu:0", in_flight: 0, runs: 38},
          %{device: 1, name: "cpu:1", in_flight: 0, runs: 37},
          ...
        ]},
      ...
    ]
  }
  ```

  Per node: `status` (`:up`; `:connecting`, `:checking` while it (re)joins; `:down`;
  `:stopping` while a node the pool started is drained before it stops),
  `in_flight` (runs of this pool sent there and not answered), `runs` (answered with results),
  `errors` (answered with an error), `failures` (attempts lost because the node went down),
  `retries` (runs re-sent elsewhere: lost with the node, or refused there as `:overloaded`,
  which also counts among its `errors`), `recent_run_us` (a moving average of its
  runs' wall time, as the caller sees it), `executables` (programs compiled there), `platform`,
  `last_error` (why it is not up) and `devices`: per device of the node (as its `:info` last
  listed them), its index, its name, and the runs the pool placed on it in flight and answered
  with results (a run that its buffers place counts on the node alone; the node's own
  `:info` `device_info` counts every run on each device), and `launched`: `nil` for a node
  given to the pool, else `%{reason: :min | :demand | :saturated, since: DateTime, draining:
  boolean}`, why and when the pool started it. The totals are over the nodes.

  A pool with a launcher also has `launcher`: `%{module:, min:, max:, idle_shutdown_after:,
  max_concurrency:, running:, launching:, started:, stopped:, failed:, last_error:,
  next_launch_in_ms:, events:}`: the nodes it runs and is starting now, how many it started,
  stopped and failed to start in all, the last failure's message, how long until a start may
  be tried again after failures, and its last 20 events, newest first, each `%{event: :started
  | :stopped | :launch_failed, node:, reason:, at: DateTime}` (a stop's reason: `:idle`,
  `:removed`, `:pool_stopped`, `{:exited, reason}`, `:nodedown`); `nil` without one. Raises
  `XlaNode.Error` (kind `:noproc`) for an unknown pool.
  """
  @spec status(t()) :: map()
  def status(pool), do: pool_call!(pool, :status)

  @doc """
  Whether `server` is a running pool (a name or a pid).

      {:ok, _} = XlaNode.Pool.start_link(name: MyPool, nodes: [:"xla1@host"])
      true = XlaNode.Pool.pool?(MyPool)
      false = XlaNode.Pool.pool?(:"xla1@host")
  """
  @spec pool?(term()) :: boolean()
  def pool?(server), do: match?({:pool, _}, route(server, nil))

  @doc """
  The pool's nodes, up or not, in the order they were given. Raises `XlaNode.Error` (kind
  `:noproc`) for an unknown pool.

      {:ok, pool} = XlaNode.Pool.start_link(nodes: [:"xla1@host", :"xla2@host"])
      [:"xla1@host", :"xla2@host"] = XlaNode.Pool.nodes(pool)
  """
  @spec nodes(t()) :: [node()]
  def nodes(pool) do
    case route(pool, nil) do
      {:pool, %{nodes: nodes}} -> nodes
      _ -> raise unknown_pool(pool)
    end
  end

  @doc """
  Adds a node to the pool; it gets work once it answers `:info`. Adding a node the pool has is
  `:ok`.

      {:ok, pool} = XlaNode.Pool.start_link(nodes: [])
      :ok = XlaNode.Pool.add_node(pool, :"xla1@host")
      :ok = XlaNode.Pool.add_node(pool, :"xla1@host")
      [:"xla1@host"] = XlaNode.Pool.nodes(pool)
      :pong = XlaNode.ping(pool)
  """
  @spec add_node(t(), node()) :: :ok
  def add_node(pool, node) do
    check_node!(node)
    pool_call!(pool, {:add_node, node})
  end

  @doc """
  Removes a node from the pool: no new runs go there, the pool's executables there are freed;
  runs in flight there finish. A node the pool started is stopped (and another started where
  `:min` asks for it).

      {:ok, pool} = XlaNode.Pool.start_link(nodes: [:"xla1@host", :"xla2@host"])
      :ok = XlaNode.Pool.remove_node(pool, :"xla2@host")
      [:"xla1@host"] = XlaNode.Pool.nodes(pool)
  """
  @spec remove_node(t(), node()) :: :ok
  def remove_node(pool, node), do: pool_call!(pool, {:remove_node, node})

  @doc false
  # For XlaNode's functions: whether `server` is a pool (`{:pool, context}`), a node or another
  # GenServer server (`{:node, server}`, where the name of an `XlaNode.Local` stands for its
  # node) or neither (`{:error, error}`: an unknown name, or a pool's handle given to a node).
  def route(server, request) do
    case Table.whereis(server) do
      nil ->
        cond do
          pool_name?(server) -> local_node(server)
          handle = pool_handle(request) -> {:error, Dispatch.foreign_handle(handle, server)}
          true -> {:node, server}
        end

      tab ->
        case Table.context(tab) do
          nil -> {:error, unknown_pool(server)}
          context -> {:pool, context}
        end
    end
  end

  @doc false
  defdelegate request(context, request, timeout), to: Dispatch

  @doc false
  defdelegate run(context, request, timeout), to: Dispatch

  defp local_node(name) do
    case XlaNode.Local.whereis_node(name) do
      nil -> {:error, unknown_pool(name)}
      node -> {:node, node}
    end
  end

  # A bare atom without "@" cannot name a node.
  defp pool_name?(server),
    do: is_atom(server) and server != nil and not String.contains?(Atom.to_string(server), "@")

  defp pool_handle({:run, %Executable{} = h, _args}), do: h
  defp pool_handle({:run, %Executable{} = h, _args, _opts}), do: h
  defp pool_handle({:free, %Executable{} = h}), do: h
  defp pool_handle(_request), do: nil

  defp unknown_pool(server),
    do:
      Error.noproc(
        "no pool named #{inspect(server)} is running, nor an XlaNode.Local with a node up " <>
          "(and a node name needs an \"@\")"
      )

  defp pool_call!(pool, request) do
    case Table.whereis(pool) && Table.context(Table.whereis(pool)) do
      nil -> raise unknown_pool(pool)
      %{pid: pid} -> GenServer.call(pid, request, :infinity)
    end
  end

  # The options, checked, with their defaults.
  @on_demand [:min, :max, :idle_shutdown_after, :max_concurrency, :launch_backoff]

  defp validate!(opts) do
    spec = [
      name: :pool_name,
      nodes: :node_names,
      max_attempts: :pos_integer,
      reconnect_backoff: :backoff,
      check_timeout: :positive_timeout,
      launcher:
        {:check, "{module, options}, the module an XlaNode.Launcher, the options a keyword list",
         &launcher?/1},
      min: :non_neg_integer,
      max: :pos_integer,
      idle_shutdown_after: :positive_timeout,
      max_concurrency: :pos_integer,
      launch_backoff: :backoff
    ]

    # XlaNode.Options names the first unknown option; the pool's message names them all.
    unknown = if Keyword.keyword?(opts), do: Keyword.keys(opts) -- Keyword.keys(spec), else: []

    opts =
      Options.validate!(opts, "XlaNode.Pool.start_link/1", spec, "; unknown: #{inspect(unknown)}")

    nodes =
      Keyword.get(opts, :nodes) ||
        if(opts[:launcher],
          do: [],
          else:
            raise(ArgumentError, "XlaNode.Pool needs nodes: [...] or launcher: {module, opts}")
        )

    [
      name: Keyword.get(opts, :name),
      nodes: Enum.uniq(nodes),
      max_attempts: Keyword.get(opts, :max_attempts, 3),
      reconnect_backoff: Keyword.get(opts, :reconnect_backoff, {100, 5_000}),
      check_timeout: Keyword.get(opts, :check_timeout, 10_000)
    ] ++ on_demand!(opts)
  end

  defp launcher?({module, opts}) when is_atom(module), do: Keyword.keyword?(opts)
  defp launcher?(_), do: false

  # The launcher and its bounds, checked: a launcher's own options by the launcher.
  defp on_demand!(opts) do
    case Keyword.fetch(opts, :launcher) do
      :error ->
        case Enum.find(@on_demand, &Keyword.has_key?(opts, &1)) do
          nil ->
            [launcher: nil]

          key ->
            raise ArgumentError,
                  "XlaNode.Pool.start_link/1: option #{inspect(key)} applies to a pool that " <>
                    "starts its nodes: give launcher: {module, options} too"
        end

      {:ok, {module, launcher_opts}} ->
        unless Code.ensure_loaded?(module) and function_exported?(module, :start_node, 2) and
                 function_exported?(module, :stop_node, 1) and
                 function_exported?(module, :validate_options, 1) do
          raise ArgumentError,
                "XlaNode.Pool.start_link/1: option :launcher: #{inspect(module)} is not an " <>
                  "XlaNode.Launcher (validate_options/1, start_node/2, stop_node/1)"
        end

        min = Keyword.get(opts, :min, 0)
        max = Keyword.get(opts, :max, max(min, 1))

        if min > max do
          raise ArgumentError,
                "XlaNode.Pool.start_link/1: option :min (#{min}) is more than :max (#{max})"
        end

        [
          launcher: {module, module.validate_options(launcher_opts)},
          min: min,
          max: max,
          idle_shutdown_after: Keyword.get(opts, :idle_shutdown_after, 30_000),
          max_concurrency: Keyword.get(opts, :max_concurrency, 1),
          launch_backoff: Keyword.get(opts, :launch_backoff, {1_000, 30_000})
        ]
    end
  end

  defp check_node!(node) do
    unless Options.node_name?(node) do
      raise ArgumentError,
            "a pool node must be a node name such as :\"xla@host\", got #{inspect(node)}"
    end
  end

  ## GenServer

  @impl true
  def init(opts) do
    # To unregister the pool when its supervisor stops it.
    Process.flag(:trap_exit, true)
    tab = Table.new()
    label = opts[:name] || self()
    pool_ref = make_ref()
    scaler = if opts[:launcher], do: Scaler.new(opts, label)

    Table.put_meta(
      tab,
      pool_ref,
      label,
      opts[:nodes],
      opts[:max_attempts],
      scaler && scaler.max_concurrency
    )

    Enum.each(opts[:nodes], &Table.put_node(tab, &1))
    Table.register(Enum.reject([self(), opts[:name]], &is_nil/1), tab)
    :ok = :net_kernel.monitor_nodes(true, node_type: :all)

    state = %{
      tab: tab,
      pool_ref: pool_ref,
      label: label,
      name: opts[:name],
      max_attempts: opts[:max_attempts],
      backoff: opts[:reconnect_backoff],
      check_timeout: opts[:check_timeout],
      order: opts[:nodes],
      nodes: %{},
      requests: :gen_server.reqids_new(),
      next_id: 1,
      # id => %{mlir, opts}: what compiling a program on one more node needs
      programs: %{},
      # {id, node} => [from]: callers waiting for a compile on a node
      pending: %{},
      # {from, node | nil}: callers waiting for a joining node (see :await_join)
      waiters: [],
      # nil, or the nodes it starts and stops (XlaNode.Pool.Scaler)
      scaler: scaler,
      retry_timer: nil,
      idle_timer: nil
    }

    state = Enum.reduce(opts[:nodes], state, &connect(&2, &1))
    {:ok, ensure_min(state)}
  end

  @impl true
  def terminate(_reason, state) do
    Table.unregister(Enum.reject([self(), state.name], &is_nil/1), state.tab)
    if state.scaler, do: Scaler.stop_all(state.scaler)
  end

  @impl true
  def handle_call({:compile, mlir, node_opts, effects, node}, from, state) do
    if serving?(state, node) do
      label = {:compile, from, node, generation(state, node), mlir, node_opts, effects}
      {:noreply, send_request(state, node, compile_request(mlir, node_opts), label)}
    else
      {:reply, {:error, Dispatch.not_up(node)}, state}
    end
  end

  def handle_call({:executable, id, node}, from, state) do
    gen = generation(state, node)

    cond do
      not Map.has_key?(state.programs, id) ->
        {:reply, {:error, Dispatch.freed(id, state.label)}, state}

      match?({_exe, ^gen, _}, Table.executable(state.tab, id, node)) ->
        {exe, _, _} = Table.executable(state.tab, id, node)
        {:reply, {:ok, exe}, state}

      not serving?(state, node) ->
        {:reply, {:error, Dispatch.not_up(node)}, state}

      Map.has_key?(state.pending, {id, node}) ->
        {:noreply, update_in(state.pending[{id, node}], &[from | &1])}

      true ->
        %{mlir: mlir, opts: opts} = state.programs[id]
        state = put_in(state.pending[{id, node}], [from])
        {:noreply, send_request(state, node, compile_request(mlir, opts), {:lazy, id, node, gen})}
    end
  end

  def handle_call({:free, id}, _from, state) do
    case Map.pop(state.programs, id) do
      {nil, _} ->
        {:reply, {:error, Dispatch.freed(id, state.label)}, state}

      {_program, programs} ->
        executables = for {^id, node, exe} <- Table.executables(state.tab), do: {node, exe}
        Table.delete_program(state.tab, id)
        state = Enum.reduce(executables, state, fn {node, exe}, s -> free_on(s, node, exe) end)
        {:reply, {:ok, :ok}, %{state | programs: programs}}
    end
  end

  def handle_call(:status, _from, state), do: {:reply, status_map(state), state}

  # A caller found no node up: it waits while a node that has never been up or down yet (its
  # first connection, just started or added) may still come up.
  def handle_call({:await_join, node}, from, state) do
    cond do
      # It came up since the caller looked.
      up?(state, node) ->
        {:reply, {:ok, :changed}, state}

      joining?(state, node) ->
        {:noreply, %{state | waiters: [{from, node} | state.waiters]}}

      node == nil and state.scaler != nil ->
        on_demand(state, from)

      true ->
        {:reply, {:ok, :none}, state}
    end
  end

  def handle_call({:add_node, node}, _from, state) do
    if Map.has_key?(state.nodes, node),
      do: {:reply, :ok, state},
      else: {:reply, :ok, join(state, node)}
  end

  def handle_call({:remove_node, node}, _from, state) do
    if state.scaler && Scaler.launched?(state.scaler, node) do
      {:reply, :ok, state |> stop_launched(node, :removed) |> ensure_min()}
    else
      {:reply, :ok, drop_node(state, node, true)}
    end
  end

  @impl true
  def handle_info(message, state) do
    case :gen_server.check_response(message, state.requests, true) do
      {response, label, requests} ->
        {:noreply, handle_response(label, response, %{state | requests: requests})}

      _no_request_or_no_reply ->
        handle_message(message, state)
    end
  end

  defp handle_message({:connected, node, connected}, state) do
    case status(state, node) do
      :connecting when connected == true ->
        {:noreply, check(state, node)}

      :connecting ->
        why = if connected == :ignored, do: "this node is not distributed", else: "cannot connect"
        {:noreply, down(state, node, why)}

      _ ->
        {:noreply, state}
    end
  end

  defp handle_message({:reconnect, node}, state) do
    case status(state, node) do
      :down -> {:noreply, connect(state, node)}
      _ -> {:noreply, state}
    end
  end

  defp handle_message({:check_timeout, node, request}, state) do
    case {status(state, node), state.nodes[node]} do
      {:checking, %{check: ^request}} ->
        {:noreply, down(state, node, "no answer to :info within #{state.check_timeout} ms")}

      _ ->
        {:noreply, state}
    end
  end

  defp handle_message({:nodeup, node, _info}, state) do
    case {status(state, node), state.nodes[node]} do
      {:down, info} ->
        cancel_timer(info)
        {:noreply, check(state, node)}

      _ ->
        {:noreply, state}
    end
  end

  defp handle_message({:nodedown, node, _info}, state) do
    case status(state, node) do
      # A node the pool started is not waited for: it is stopped, and started anew if needed.
      status when status in [:up, :checking, :stopping] and state.scaler != nil ->
        if Scaler.launched?(state.scaler, node) do
          {:noreply, state |> stop_launched(node, :nodedown) |> ensure_min()}
        else
          Logger.warning("XlaNode.Pool #{inspect(state.label)}: #{node} went down")
          {:noreply, down(state, node, "disconnected")}
        end

      status when status in [:up, :checking] ->
        Logger.warning("XlaNode.Pool #{inspect(state.label)}: #{node} went down")
        state = down(state, node, "disconnected")
        {:noreply, state}

      _ ->
        {:noreply, state}
    end
  end

  defp handle_message({:watch, caller}, state) do
    Process.monitor(caller)
    {:noreply, state}
  end

  defp handle_message({:DOWN, monitor, :process, pid, reason}, state) do
    case state.scaler && Scaler.launch_ended(state.scaler, monitor, reason) do
      {:started, node, _handle, _why, scaler} ->
        state = join(%{state | scaler: scaler}, node)
        {:noreply, schedule_idle_check(state)}

      {:failed, error, _why, scaler} ->
        {:noreply, launch_failed(%{state | scaler: scaler}, error)}

      launch when launch in [nil, :unknown] ->
        case state.scaler && Scaler.node_of_monitor(state.scaler, monitor) do
          nil ->
            # A caller that died with runs in flight.
            Table.end_runs_of(state.tab, pid)
            {:noreply, state}

          node ->
            {_handle, scaler} = Scaler.forget(state.scaler, node, :exited, reason)
            state = drop_node(%{state | scaler: scaler}, node, false)
            {:noreply, ensure_min(state)}
        end
    end
  end

  defp handle_message(:saturated, state) do
    Table.clear_saturated(state.tab)
    {:noreply, scale_up(state)}
  end

  defp handle_message(:launch_retry, state) do
    state = ensure_min(%{state | retry_timer: nil})

    state =
      if Enum.any?(state.waiters, fn {_, node} -> node == nil end) and not up?(state, nil) and
           map_size(state.scaler.launches) == 0,
         do: launch(state, :demand),
         else: state

    {:noreply, state}
  end

  defp handle_message(:idle_check, state) do
    state = %{state | idle_timer: nil}

    loads =
      Map.new(Map.keys(state.scaler.launched), fn node ->
        case Table.node_info(state.tab, node) do
          nil -> {node, {0, 0}}
          info -> {node, {info.in_flight, info.runs + info.errors}}
        end
      end)

    scaler = Scaler.observe(state.scaler, loads)
    up = for node <- state.order, up?(state, node), do: node
    state = %{state | scaler: scaler}

    state =
      scaler
      |> Scaler.idle_nodes(up)
      |> Enum.reduce(state, &probe_idle(&2, &1))

    {:noreply, schedule_idle_check(state)}
  end

  defp handle_message({:drain_check, node, ref}, state) do
    cond do
      not Scaler.draining?(state.scaler, node, {:drain, ref}) ->
        {:noreply, state}

      Table.load(state.tab, node) |> in_flight() > 0 ->
        {:noreply, end_drain(state, node, "runs came in")}

      true ->
        {:noreply, send_request(state, node, :info, {:drain, node, ref})}
    end
  end

  defp handle_message(_message, state), do: {:noreply, state}

  ## Responses of the nodes

  defp handle_response({:check, node}, response, state) do
    case {status(state, node), response} do
      {:checking, {:reply, {:ok, %{} = info}}} ->
        # Its devices first: callers place runs on them as soon as it is up.
        Table.put_devices(state.tab, node, Map.get(info, :devices))
        Table.set_up(state.tab, node)
        platform = Map.get(info, :platform)
        Logger.info("XlaNode.Pool #{inspect(state.label)}: #{node} is up (#{platform})")

        state
        |> update_node(node, %{
          check: nil,
          backoff: nil,
          platform: platform,
          last_error: nil,
          joined: true
        })
        |> wake_waiters(node)

      {:checking, {:reply, other}} ->
        down(state, node, ":info answered #{inspect(other, limit: 5)}")

      {:checking, {:error, {reason, _server}}} ->
        down(state, node, ":info failed: #{inspect(reason)}")

      _ ->
        state
    end
  end

  defp handle_response({:compile, from, node, gen, mlir, opts, effects}, response, state) do
    case node_reply(response, node) do
      {:ok, exe} ->
        id = state.next_id
        Table.put_program(state.tab, id, effects)
        if generation(state, node) == gen, do: Table.put_executable(state.tab, id, node, exe, gen)

        handle = %Executable{
          pool: state.label,
          pool_ref: state.pool_ref,
          id: id,
          effects: effects
        }

        GenServer.reply(from, {:ok, handle})

        %{
          state
          | next_id: id + 1,
            programs: Map.put(state.programs, id, %{mlir: mlir, opts: opts})
        }

      {:error, _} = error ->
        GenServer.reply(from, error)
        state
    end
  end

  defp handle_response({:lazy, id, node, gen}, response, state) do
    {froms, pending} = Map.pop(state.pending, {id, node}, [])
    state = %{state | pending: pending}

    {reply, state} =
      case node_reply(response, node) do
        {:ok, exe} ->
          cond do
            not Map.has_key?(state.programs, id) ->
              {{:error, Dispatch.freed(id, state.label)}, free_on(state, node, exe)}

            generation(state, node) != gen or not serving?(state, node) ->
              {{:error, Dispatch.not_up(node)}, state}

            true ->
              Table.put_executable(state.tab, id, node, exe, gen)
              {{:ok, exe}, state}
          end

        {:error, _} = error ->
          {error, state}
      end

    Enum.each(froms, &GenServer.reply(&1, reply))
    state
  end

  defp handle_response(:free, _response, state), do: state

  # An idle node is asked whether anyone holds anything there before it stops taking runs
  # (`probe`), and once more, drained, before it stops (`drain`).
  defp handle_response({step, node, ref}, response, state) when step in [:probe, :drain] do
    if Scaler.draining?(state.scaler, node, {step, ref}) do
      case busy(state, node, response) do
        [] when step == :probe -> begin_drain(state, node)
        [] -> stop_launched(state, node, :idle)
        busy -> end_drain(state, node, Enum.join(busy, ", "))
      end
    else
      state
    end
  end

  defp node_reply({:reply, {:ok, value}}, _node), do: {:ok, value}
  defp node_reply({:reply, {:error, reason}}, _node), do: {:error, Error.from_reason(reason)}
  defp node_reply({:reply, other}, _node), do: {:error, Error.from_reason(other)}

  defp node_reply({:error, {reason, server}}, node),
    do: {:error, %{Error.from_exit(reason, server) | node: node}}

  ## Nodes coming and going

  defp connect(state, node) do
    pool = self()
    Table.set_status(state.tab, node, :connecting)
    spawn(fn -> send(pool, {:connected, node, Node.connect(node)}) end)
    update_node(state, node, %{})
  end

  defp check(state, node) do
    Table.set_status(state.tab, node, :checking)
    state = send_request(state, node, :info, {:check, node})
    # The request id is the newest in the collection; the timeout message names the node's
    # check by a reference of its own.
    check = make_ref()

    if state.check_timeout != :infinity,
      do: Process.send_after(self(), {:check_timeout, node, check}, state.check_timeout)

    update_node(state, node, %{check: check})
  end

  # The node is not usable: its executables went with it (or will be unknown to it when it
  # comes back). Tries again after the backoff.
  defp down(state, node, why) do
    if state.scaler && Scaler.launched?(state.scaler, node) do
      Logger.warning("XlaNode.Pool #{inspect(state.label)}: #{node}, which it started: #{why}")
      state |> stop_launched(node, :nodedown) |> ensure_min() |> wake_waiters(node)
    else
      down_and_retry(state, node, why)
    end
  end

  defp down_and_retry(state, node, why) do
    Table.set_status(state.tab, node, :down)
    Table.delete_executables(state.tab, node)
    {first, max} = state.backoff
    previous = get_in(state.nodes, [node, :backoff])
    backoff = if previous, do: min(previous * 2, max), else: first
    timer = Process.send_after(self(), {:reconnect, node}, backoff)

    state
    |> update_node(node, %{
      check: nil,
      backoff: max(backoff, 1),
      timer: timer,
      last_error: why,
      joined: true
    })
    |> wake_waiters(node)
  end

  # Callers waiting for a joining node learn that `node`'s first outcome (or any later) is in.
  defp wake_waiters(state, node) do
    {woken, waiting} = Enum.split_with(state.waiters, fn {_, n} -> n in [nil, node] end)
    Enum.each(woken, fn {from, _} -> GenServer.reply(from, {:ok, :changed}) end)
    %{state | waiters: waiting}
  end

  defp joining?(state, nil), do: Enum.any?(state.nodes, fn {_, info} -> not info.joined end)

  defp joining?(state, node), do: match?(%{joined: false}, state.nodes[node])

  # What the pool process alone needs of a node; its status is in the table (Table.set_status/3),
  # where callers read it too.
  defp update_node(state, node, changes) do
    base = %{
      check: nil,
      backoff: nil,
      timer: nil,
      platform: nil,
      last_error: nil,
      # whether the node was ever up or down: until then callers may wait for it
      joined: false
    }

    info = Map.merge(Map.get(state.nodes, node, base), changes)
    %{state | nodes: Map.put(state.nodes, node, info)}
  end

  defp cancel_timer(%{timer: timer}) when is_reference(timer), do: Process.cancel_timer(timer)
  defp cancel_timer(_info), do: :ok

  defp up?(state, nil), do: Enum.any?(state.nodes, fn {node, _} -> up?(state, node) end)
  defp up?(state, node), do: status(state, node) == :up

  # Up, or being drained: it takes no new runs of its own choosing, but the runs pinned to it
  # (its buffers, `node:`) still run there.
  defp serving?(state, node), do: status(state, node) in [:up, :stopping]

  # `:connecting`, `:checking`, `:up`, `:stopping` (a node it started, being drained before it
  # stops) or `:down`; nil for a node the pool does not have.
  defp status(state, node) do
    case Table.load(state.tab, node) do
      {status, _generation, _in_flight} -> status
      nil -> nil
    end
  end

  defp generation(state, node) do
    case Table.load(state.tab, node) do
      {_status, gen, _in_flight} -> gen
      nil -> nil
    end
  end

  defp put_meta(state),
    do:
      Table.put_meta(
        state.tab,
        state.pool_ref,
        state.label,
        state.order,
        state.max_attempts,
        state.scaler && state.scaler.max_concurrency
      )

  defp in_flight({_status, _gen, in_flight}), do: in_flight
  defp in_flight(nil), do: 0

  # A node joins: in the table, last in the order, connected and checked.
  defp join(state, node) do
    Table.put_node(state.tab, node)
    state = %{state | order: state.order ++ [node]}
    put_meta(state)
    connect(state, node)
  end

  # A node leaves: no new runs go there; its executables are freed when it stays up.
  defp drop_node(state, node, free?) do
    case Map.pop(state.nodes, node) do
      {nil, _} ->
        state

      {info, nodes} ->
        cancel_timer(info)
        state = %{state | nodes: nodes, order: List.delete(state.order, node)}
        put_meta(state)

        state =
          if free?,
            do:
              state.tab
              |> Table.executables_on(node)
              |> Enum.reduce(state, fn {_id, exe}, s -> free_on(s, node, exe) end),
            else: state

        Table.delete_node(state.tab, node)
        wake_waiters(state, node)
    end
  end

  ## Nodes on demand

  # A caller found no node up (and none joining): start one, unless the last start failed
  # moments ago, and have the caller wait for it.
  defp on_demand(state, from) do
    scaler = state.scaler
    draining = Enum.find(Map.keys(scaler.launched), &(status(state, &1) == :stopping))

    cond do
      draining != nil ->
        {:reply, {:ok, :changed}, end_drain(state, draining, "a call found no other node up")}

      map_size(scaler.launches) > 0 ->
        {:noreply, %{state | waiters: [{from, nil} | state.waiters]}}

      Scaler.may_launch?(scaler) ->
        state = launch(state, :demand)
        {:noreply, %{state | waiters: [{from, nil} | state.waiters]}}

      scaler.last_error != nil and Scaler.backoff_left(scaler) > 0 ->
        {:reply, {:error, launch_failure(state)}, state}

      true ->
        {:reply, {:ok, :none}, state}
    end
  end

  defp launch_failure(state) do
    %{scaler: scaler} = state

    error = scaler.last_error

    message =
      "no node of the pool #{inspect(state.label)} is up, and starting one failed " <>
        "(#{scaler.failures} in a row; the next attempt in #{Scaler.backoff_left(scaler)} ms): " <>
        Exception.message(error)

    %Error{kind: :launch_error, message: message, reason: Map.get(error, :reason)}
  end

  defp launch(state, reason), do: %{state | scaler: Scaler.launch(state.scaler, reason, self())}

  # Starts nodes up to `min`, side by side (none during a backoff: the retry comes).
  defp ensure_min(%{scaler: nil} = state), do: state

  defp ensure_min(state) do
    missing = state.scaler.min - Scaler.count(state.scaler)

    cond do
      missing <= 0 -> state
      Scaler.backoff_left(state.scaler) > 0 -> schedule_retry(state)
      true -> Enum.reduce(1..missing, state, fn _, s -> launch(s, :min) end)
    end
  end

  # A caller found every device busy: one more node, when none is on its way already.
  defp scale_up(%{scaler: nil} = state), do: state

  defp scale_up(state) do
    joining =
      Enum.any?(Map.keys(state.scaler.launched), &(status(state, &1) in [:connecting, :checking]))

    if map_size(state.scaler.launches) == 0 and not joining and Scaler.may_launch?(state.scaler),
      do: launch(state, :saturated),
      else: state
  end

  defp launch_failed(state, _error) do
    state = schedule_retry(state)
    # Callers waiting for that node learn of it (they ask again and get the error).
    if up?(state, nil), do: state, else: wake_waiters(state, nil)
  end

  defp schedule_retry(%{retry_timer: nil} = state) do
    wait = Scaler.backoff_left(state.scaler)
    %{state | retry_timer: Process.send_after(self(), :launch_retry, max(wait, 1))}
  end

  defp schedule_retry(state), do: state

  defp schedule_idle_check(%{idle_timer: nil, scaler: %Scaler{} = scaler} = state) do
    interval = Scaler.idle_check_interval(scaler)

    if interval != nil and map_size(scaler.launched) > scaler.min,
      do: %{state | idle_timer: Process.send_after(self(), :idle_check, interval)},
      else: state
  end

  defp schedule_idle_check(state), do: state

  # What keeps `node` from stopping, from its `:info` answer and the pool's runs in flight:
  # anyone's buffers, runs running or queued there.
  defp busy(state, node, {:reply, {:ok, %{} = info}}) do
    held =
      for key <- [:buffers, :runs_running, :runs_queued],
          (n = Map.get(info, key, 0)) > 0,
          do: "#{key}: #{n}"

    if in_flight(Table.load(state.tab, node)) > 0, do: ["runs in flight" | held], else: held
  end

  defp busy(_state, _node, _failed), do: [":info failed"]

  defp probe_idle(state, node) do
    ref = make_ref()
    state = send_request(state, node, :info, {:probe, node, ref})
    %{state | scaler: Scaler.drain(state.scaler, node, {:probe, ref})}
  end

  # A node idle long enough, which holds nothing of anyone's, stops taking runs (:stopping);
  # after a moment for runs placed just before (they are counted in flight by then), it is
  # asked again.
  defp begin_drain(state, node) do
    Table.set_status(state.tab, node, :stopping)

    if in_flight(Table.load(state.tab, node)) > 0 do
      end_drain(state, node, "runs came in")
    else
      ref = make_ref()
      Process.send_after(self(), {:drain_check, node, ref}, 200)
      %{state | scaler: Scaler.drain(state.scaler, node, {:drain, ref})}
    end
  end

  defp end_drain(state, node, why) do
    Logger.debug("XlaNode.Pool #{inspect(state.label)}: #{node} is not idle (#{why}); kept")
    if status(state, node) == :stopping, do: Table.set_status(state.tab, node, :up)
    %{state | scaler: Scaler.drain(state.scaler, node, nil)}
  end

  # Stops a node the pool started, and takes it out of the pool.
  defp stop_launched(state, node, why) do
    {handle, scaler} = Scaler.forget(state.scaler, node, why)
    if handle, do: Scaler.stop_node(scaler, handle)
    drop_node(%{state | scaler: scaler}, node, false)
  end

  ## Requests to nodes, answered in handle_info

  defp send_request(state, node, request, label) do
    requests = :gen_server.send_request({:xla, node}, request, label, state.requests)
    %{state | requests: requests}
  end

  defp free_on(state, node, exe), do: send_request(state, node, {:free, exe}, :free)

  defp compile_request(mlir, []), do: {:compile, mlir}
  defp compile_request(mlir, opts), do: {:compile, mlir, opts}

  defp status_map(state) do
    executables = Enum.frequencies_by(Table.executables(state.tab), fn {_, node, _} -> node end)

    nodes =
      for node <- state.order do
        info = state.nodes[node]

        Table.node_info(state.tab, node)
        |> Map.drop([:generation])
        |> Map.merge(%{
          node: node,
          executables: Map.get(executables, node, 0),
          devices: Table.device_info(state.tab, node),
          platform: info.platform,
          last_error: info.last_error,
          launched: state.scaler && Scaler.node_status(state.scaler, node)
        })
      end

    totals =
      for key <- [:in_flight, :runs, :errors, :failures, :retries], into: %{} do
        {key, nodes |> Enum.map(& &1[key]) |> Enum.sum()}
      end

    Map.merge(totals, %{
      pool: state.label,
      programs: map_size(state.programs),
      nodes: nodes,
      launcher: state.scaler && Scaler.status(state.scaler)
    })
  end
end
