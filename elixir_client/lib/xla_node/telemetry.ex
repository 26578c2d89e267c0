defmodule XlaNode.Telemetry do
  @moduledoc """
  `:telemetry` events of the client, emitted when the application has `:telemetry`.

  `:telemetry` is an optional dependency: this library declares none, and emits events only
  when the `:telemetry` module is loaded (as it is once anything has attached a handler, or in a
  release that includes it). Without it, nothing is emitted and nothing else changes.

  Each operation is a span, as `:telemetry.span/3` makes it: `[:xla_node, op, :start]`,
  then `[:xla_node, op, :stop]`, or `[:xla_node, op, :exception]` if it raised, threw or exited.
  Durations and times are in `:native` units (`System.convert_time_unit/3`).

  | event | measurements | metadata |
  |---|---|---|
  | `[:xla_node, :compile, :start]` | `monotonic_time`, `system_time` | `node`, `server`, and the call's `:telemetry_metadata` |
  | `[:xla_node, :compile, :stop]` | `duration`, `monotonic_time` | as `:start`, plus `exe` (the executable, `nil` on error) and `error` (`nil` or the `XlaNode.Error`) |
  | `[:xla_node, :run, :start]` | `monotonic_time`, `system_time` | `node`, `server`, `exe`, and the call's `:telemetry_metadata` |
  | `[:xla_node, :run, :stop]` | `duration`, `monotonic_time` | as `:start`, plus `error` (`nil` or the `XlaNode.Error`) and `attempts` (how many nodes the run was sent to); through an `XlaNode.Pool`, `node` is the node of the last attempt and `device` the device the pool chose there (`nil` where the run's buffers chose it) |
  | `[:xla_node, :callback, :start]` | `monotonic_time`, `system_time` | `node` (the node whose program called back), `callback_server` (its pid), `callback_id` |
  | `[:xla_node, :callback, :stop]` | `duration`, `monotonic_time` | as `:start`, plus `error` (`nil`, or the `{kind, message}` the program fails with) |
  | `[:xla_node, :pool, :launch, :start]` | `monotonic_time`, `system_time` | `pool` (its name, or pid), `launcher` (the module), `reason` (`:min`, `:demand`: a call found no node up, `:saturated`: a run found every device busy) |
  | `[:xla_node, :pool, :launch, :stop]` | `duration`, `monotonic_time` | as `:start`, plus `node` (the node started; `nil` on error) and `error` (`nil` or the `XlaNode.Error` of kind `:launch_error`) |
  | `[:xla_node, :pool, :node_stop]` | `lifetime` (since the node was up) | `pool`, `launcher`, `node`, `reason` (`:idle`, `:removed`, `:pool_stopped`, `:exited`, `:nodedown`), `detail` (the exit reason of `:exited`) |
  | `[:xla_node, op, :exception]` | `duration`, `monotonic_time` | the `:start` metadata, plus `kind`, `reason`, `stacktrace` |

  Every event's metadata also has `telemetry_span_context`, which pairs a `:start` with its
  `:stop` or `:exception`.

  `compile` and `run` are `XlaNode.compile/3` and `XlaNode.run/4` (the bang variants too): a
  call that fails (a compile error, a failed run, a node that is down) ends with `:stop` and an
  `error`; `node` is the node the call goes to (`nil` for a `{:global, _}` or `{:via, _, _}`
  server). A run through an `XlaNode.Pool` is one span, whatever the attempts: the pool picks
  the node, so `:start` has `node: nil`, and `:stop` has the `node` of the last attempt (`nil` if
  no node could take the run), its `device` and `attempts`, 1 plus one for each time the run was re-sent after
  its node went down (0 if none could take it); a run sent to a node has `attempts: 1`.
  `[:xla_node, :pool, :launch]` is an `XlaNode.Pool` with a `launcher:` starting a node, in a
  process the pool starts for it; `[:xla_node, :pool, :node_stop]` is emitted once for each node
  it started when it stops it or loses it. Counted by `reason`, they are the metrics of a pool's
  growth: with `Telemetry.Metrics`, `counter("xla_node.pool.launch.stop.duration", tags: [:pool,
  :reason])` counts the starts, `summary("xla_node.pool.launch.stop.duration", unit:
  {:native, :millisecond})` times them, and `counter("xla_node.pool.node_stop.lifetime", tags:
  [:pool, :reason])` counts the stops.

  `callback` is an `XlaNode.CallbackServer` running one callback, in the process that
  runs it: a callback that raises, throws or exits ends with `:exception` (the program then fails
  with a `:runtime_error`), one that returns an error with `:stop` and that `error`. Errors the
  node decides (a callback's timeout, a target that is down) end the run, not the callback: see
  the run's `:stop`.
  """

  @compile {:no_warn_undefined, :telemetry}

  @doc """
  Every event this library emits, for `:telemetry.attach_many/4`.

      iex> [:xla_node, :run, :stop] in XlaNode.Telemetry.events()
      true
      iex> length(XlaNode.Telemetry.events())
      13

  In an application with `:telemetry`:

      :telemetry.attach_many("my-handler", XlaNode.Telemetry.events(), &MyApp.handle/4, nil)
  """
  @spec events() :: [[atom()]]
  def events do
    spans =
      for op <- [[:compile], [:run], [:callback], [:pool, :launch]],
          kind <- [:start, :stop, :exception],
          do: [:xla_node | op] ++ [kind]

    spans ++ [[:xla_node, :pool, :node_stop]]
  end

  @doc """
  Runs `fun` inside a `[:xla_node, op]` span when `:telemetry` is loaded, and just runs it
  otherwise. `fun` returns `{result, stop_metadata}`, as for `:telemetry.span/3`; the result is
  returned.

      iex> XlaNode.Telemetry.span(:compile, %{node: nil}, fn -> {{:ok, :exe}, %{error: nil}} end)
      {:ok, :exe}
  """
  @spec span(atom() | [atom()], map(), (-> {result, map()})) :: result when result: term()
  def span(op, metadata, fun) do
    if function_exported?(:telemetry, :span, 3) do
      :telemetry.span([:xla_node | List.wrap(op)], metadata, fun)
    else
      {result, _stop_metadata} = fun.()
      result
    end
  end

  @doc """
  Emits the single event `[:xla_node | name]` when `:telemetry` is loaded; does nothing
  otherwise.
  """
  @spec execute([atom()], map(), map()) :: :ok
  def execute(name, measurements, metadata) do
    if function_exported?(:telemetry, :execute, 3),
      do: :telemetry.execute([:xla_node | name], measurements, metadata)

    :ok
  end

  @doc """
  `metadata` for the `:stop` event of a span that ended with `result`: with `error`, `nil` for
  `{:ok, _}`, the reason for `{:error, reason}`.

      iex> XlaNode.Telemetry.stop_metadata(%{node: :"xla@host"}, {:ok, :exe})
      %{node: :"xla@host", error: nil}
      iex> XlaNode.Telemetry.stop_metadata(%{}, {:error, :timeout})
      %{error: :timeout}
  """
  @spec stop_metadata(map(), {:ok, term()} | {:error, term()}) :: map()
  def stop_metadata(metadata, {:ok, _}), do: Map.put(metadata, :error, nil)
  def stop_metadata(metadata, {:error, error}), do: Map.put(metadata, :error, error)

  @doc """
  The node a `GenServer` server term lives on, as far as the term says: `nil` for `{:global, _}`
  and `{:via, _, _}`.

      iex> XlaNode.Telemetry.node_of({:xla, :"xla@host"})
      :"xla@host"
      iex> XlaNode.Telemetry.node_of({:global, :xla})
      nil
  """
  @spec node_of(GenServer.server()) :: node() | nil
  def node_of(pid) when is_pid(pid), do: node(pid)
  def node_of({:global, _name}), do: nil
  def node_of({name, node}) when is_atom(name) and is_atom(node), do: node
  def node_of(name) when is_atom(name), do: node()
  def node_of(_server), do: nil
end
