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
    * an executable of another pool, of one node, or freed: kind `:argument_error`.
  """

  use GenServer

  require Logger

  alias XlaNode.{Error, Options}
  alias XlaNode.Pool.{Dispatch, Executable, Table}

  @typedoc "A pool: its registered name or its pid."
  @type t :: atom() | pid()

  @type option ::
          {:name, atom()}
          | {:nodes, [node()]}
          | {:max_attempts, pos_integer()}
          | {:reconnect_backoff, {non_neg_integer(), pos_integer()}}
          | {:check_timeout, timeout()}

  ## API

  @doc """
  Starts a pool linked to the caller.

  Options:

    * `:nodes` - the compute nodes (node names, required; may be empty, see `add_node/2`)
    * `:name` - registers the pool under this atom; `XlaNode` functions then take the name
    * `:max_attempts` - attempts per run, the first included (default 3)
    * `:reconnect_backoff` - `{first_ms, max_ms}`: how soon a node that went down or could not
      be reached is tried again, doubling each time (default `{100, 5_000}`)
    * `:check_timeout` - how long a node may take to answer `:info` when it (re)joins (default
      10_000 ms)

  A pool takes calls at once: they wait for its nodes' first connection.

      {:ok, pool} = XlaNode.Pool.start_link(nodes: [:"xla1@host", :"xla2@host"])
      :pong = XlaNode.ping(pool)
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

  Per node: `status` (`:up`; `:connecting`, `:checking` while it (re)joins; `:down`),
  `in_flight` (runs of this pool sent there and not answered), `runs` (answered with results),
  `errors` (answered with an error), `failures` (attempts lost because the node went down),
  `retries` (of those, the runs re-sent elsewhere), `recent_run_us` (a moving average of its
  runs' wall time, as the caller sees it), `executables` (programs compiled there), `platform`,
  `last_error` (why it is not up) and `devices`: per device of the node (as its `:info` last
  listed them), its index, its name, and the runs the pool placed on it in flight and answered
  with results (a run that its buffers place counts on the node alone; the node's own
  `:info` `device_info` counts every run on each device). The totals are over the nodes. Raises `XlaNode.Error`
  (kind `:noproc`) for an unknown pool.
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
  runs in flight there finish.

      {:ok, pool} = XlaNode.Pool.start_link(nodes: [:"xla1@host", :"xla2@host"])
      :ok = XlaNode.Pool.remove_node(pool, :"xla2@host")
      [:"xla1@host"] = XlaNode.Pool.nodes(pool)
  """
  @spec remove_node(t(), node()) :: :ok
  def remove_node(pool, node), do: pool_call!(pool, {:remove_node, node})

  @doc false
  # For XlaNode's functions: whether `server` is a pool (`{:pool, context}`), a node (`:node`)
  # or neither (`{:error, error}`: an unknown pool, or a pool's handle given to a node).
  def route(server, request) do
    case Table.whereis(server) do
      nil ->
        cond do
          pool_name?(server) -> {:error, unknown_pool(server)}
          handle = pool_handle(request) -> {:error, Dispatch.foreign_handle(handle, server)}
          true -> :node
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

  # A bare atom without "@" cannot name a node.
  defp pool_name?(server),
    do: is_atom(server) and server != nil and not String.contains?(Atom.to_string(server), "@")

  defp pool_handle({:run, %Executable{} = h, _args}), do: h
  defp pool_handle({:run, %Executable{} = h, _args, _opts}), do: h
  defp pool_handle({:free, %Executable{} = h}), do: h
  defp pool_handle(_request), do: nil

  defp unknown_pool(server),
    do:
      Error.noproc("no pool named #{inspect(server)} is running (and a node name needs an \"@\")")

  defp pool_call!(pool, request) do
    case Table.whereis(pool) && Table.context(Table.whereis(pool)) do
      nil -> raise unknown_pool(pool)
      %{pid: pid} -> GenServer.call(pid, request, :infinity)
    end
  end

  # The options, checked, with their defaults.
  defp validate!(opts) do
    spec = [
      name: :pool_name,
      nodes: :node_names,
      max_attempts: :pos_integer,
      reconnect_backoff: :backoff,
      check_timeout: :positive_timeout
    ]

    # XlaNode.Options names the first unknown option; the pool's message names them all.
    unknown = if Keyword.keyword?(opts), do: Keyword.keys(opts) -- Keyword.keys(spec), else: []

    opts =
      Options.validate!(opts, "XlaNode.Pool.start_link/1", spec, "; unknown: #{inspect(unknown)}")

    nodes = Keyword.get(opts, :nodes) || raise ArgumentError, "XlaNode.Pool needs nodes: [...]"

    [
      name: Keyword.get(opts, :name),
      nodes: Enum.uniq(nodes),
      max_attempts: Keyword.get(opts, :max_attempts, 3),
      reconnect_backoff: Keyword.get(opts, :reconnect_backoff, {100, 5_000}),
      check_timeout: Keyword.get(opts, :check_timeout, 10_000)
    ]
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
    Table.put_meta(tab, pool_ref, label, opts[:nodes], opts[:max_attempts])
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
      waiters: []
    }

    {:ok, Enum.reduce(opts[:nodes], state, &connect(&2, &1))}
  end

  @impl true
  def terminate(_reason, state) do
    Table.unregister(Enum.reject([self(), state.name], &is_nil/1), state.tab)
  end

  @impl true
  def handle_call({:compile, mlir, node_opts, effects, node}, from, state) do
    if up?(state, node) do
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

      not up?(state, node) ->
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
      up?(state, node) -> {:reply, {:ok, :changed}, state}
      joining?(state, node) -> {:noreply, %{state | waiters: [{from, node} | state.waiters]}}
      true -> {:reply, {:ok, :none}, state}
    end
  end

  def handle_call({:add_node, node}, _from, state) do
    if Map.has_key?(state.nodes, node) do
      {:reply, :ok, state}
    else
      Table.put_node(state.tab, node)
      state = %{state | order: state.order ++ [node]}
      put_meta(state)
      {:reply, :ok, connect(state, node)}
    end
  end

  def handle_call({:remove_node, node}, _from, state) do
    case Map.pop(state.nodes, node) do
      {nil, _} ->
        {:reply, :ok, state}

      {info, nodes} ->
        cancel_timer(info)
        state = %{state | nodes: nodes, order: List.delete(state.order, node)}
        put_meta(state)

        state =
          state.tab
          |> Table.executables_on(node)
          |> Enum.reduce(state, fn {_id, exe}, s -> free_on(s, node, exe) end)

        Table.delete_node(state.tab, node)
        {:reply, :ok, wake_waiters(state, node)}
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

  defp handle_message({:DOWN, _monitor, :process, caller, _reason}, state) do
    Table.end_runs_of(state.tab, caller)
    {:noreply, state}
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

            generation(state, node) != gen or not up?(state, node) ->
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

  # `:connecting`, `:checking`, `:up` or `:down`; nil for a node the pool does not have.
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
    do: Table.put_meta(state.tab, state.pool_ref, state.label, state.order, state.max_attempts)

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
          last_error: info.last_error
        })
      end

    totals =
      for key <- [:in_flight, :runs, :errors, :failures, :retries], into: %{} do
        {key, nodes |> Enum.map(& &1[key]) |> Enum.sum()}
      end

    Map.merge(totals, %{pool: state.label, programs: map_size(state.programs), nodes: nodes})
  end
end
