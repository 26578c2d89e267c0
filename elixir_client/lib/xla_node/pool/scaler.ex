defmodule XlaNode.Pool.Scaler do
  @moduledoc false
  # The on-demand part of an `XlaNode.Pool` given `launcher:`: what it started, what it is
  # starting, why, and what it stopped; its launches (each in a process of its own, so that the
  # pool never waits on one), their backoff after a failure, and the reports of both (Logger,
  # telemetry, the status map). The pool process holds this struct and decides when to call
  # it: it owns the nodes' table and their joining (see XlaNode.Pool's "Nodes on demand").

  require Logger

  alias XlaNode.{Error, Telemetry}

  @events_kept 20

  defstruct [
    :launcher,
    :opts,
    :min,
    :max,
    :idle_after,
    :max_concurrency,
    :backoff,
    :label,
    :base,
    # node => %{handle:, monitor:, reason:, started_at:, since:, last_active:, last_count:,
    #           draining: nil | {:probe, ref} | {:drain, ref}}: idle, it is asked whether
    #           anyone holds anything there (probe), then drained and asked again (drain)
    launched: %{},
    # monitor ref of the launching process => %{pid:, reason:, started_at:}
    launches: %{},
    # consecutive failed launches, and when the next may start (monotonic ms) after them
    failures: 0,
    retry_at: nil,
    last_error: nil,
    started: 0,
    stopped: 0,
    failed: 0,
    events: []
  ]

  @doc "The scaler of a pool labelled `label`, from its checked options."
  def new(opts, label) do
    {module, launcher_opts} = opts[:launcher]

    %__MODULE__{
      launcher: module,
      opts: launcher_opts,
      min: opts[:min],
      max: opts[:max],
      idle_after: opts[:idle_shutdown_after],
      max_concurrency: opts[:max_concurrency],
      backoff: opts[:launch_backoff],
      label: label,
      base: base_name(label)
    }
  end

  # A node name's first part made of the pool's name.
  defp base_name(label) when is_atom(label) and label != nil,
    do:
      label
      |> Atom.to_string()
      |> String.replace_prefix("Elixir.", "")
      |> String.replace(~r/[^A-Za-z0-9_-]/, "_")

  defp base_name(_pid), do: "xla_pool"

  ## Counting

  @doc "Nodes started and being started: what `max` bounds."
  def count(scaler), do: map_size(scaler.launched) + map_size(scaler.launches)

  @doc "Whether `node` is one this scaler started."
  def launched?(scaler, node), do: Map.has_key?(scaler.launched, node)

  @doc "Milliseconds until a launch may start after failures (0: now)."
  def backoff_left(%{retry_at: nil}), do: 0

  def backoff_left(%{retry_at: at}),
    do: max(at - System.monotonic_time(:millisecond), 0)

  @doc "Whether one more node may be started now: below `max`, and not backing off."
  def may_launch?(scaler), do: count(scaler) < scaler.max and backoff_left(scaler) == 0

  ## Launching

  @doc """
  Starts a launch for `reason` (`:min`, `:demand`: a caller found no node up, `:saturated`:
  every device had `max_concurrency` runs in flight) in a process of its own, owned by the pool
  (`owner`): it ends with `{:launched, result}` as its exit reason, read from its `:DOWN`.
  """
  def launch(scaler, reason, owner) do
    %{launcher: module, opts: opts, base: base, label: label} = scaler

    {pid, ref} =
      spawn_monitor(fn ->
        metadata = %{pool: label, launcher: module, reason: reason}

        result =
          Telemetry.span([:pool, :launch], metadata, fn ->
            result = launch_node(module, opts, %{owner: owner, name: base})

            stop =
              case result do
                {:ok, node, _handle} -> %{node: node, error: nil}
                {:error, error} -> %{node: nil, error: error}
              end

            {result, Map.merge(metadata, stop)}
          end)

        exit({:launched, result})
      end)

    launch = %{pid: pid, reason: reason, started_at: System.monotonic_time(:millisecond)}
    %{scaler | launches: Map.put(scaler.launches, ref, launch)}
  end

  # What a launcher returns, or the error of one that raised or answered something else.
  defp launch_node(module, opts, context) do
    case module.start_node(opts, context) do
      {:ok, node, handle} when is_atom(node) and is_pid(handle) ->
        {:ok, node, handle}

      {:error, %{__exception__: true} = error} ->
        {:error, error}

      {:error, reason} ->
        {:error, launch_error("#{inspect(module)}.start_node/2 failed: #{inspect(reason)}")}

      other ->
        {:error,
         launch_error("#{inspect(module)}.start_node/2 answered #{inspect(other, limit: 5)}")}
    end
  rescue
    exception ->
      {:error,
       launch_error(
         "#{inspect(module)}.start_node/2 raised #{Exception.format(:error, exception, __STACKTRACE__)}"
       )}
  end

  @doc """
  A launch's process ended (its `:DOWN`, by monitor `ref`): `{:started, node, handle, reason,
  scaler}`, `{:failed, error, reason, scaler}`, or `:unknown` for a monitor of something else.
  A started node is monitored by its handle from here on, and recorded once it is up
  (`started/3`); a failure sets the backoff.
  """
  def launch_ended(scaler, ref, down_reason) do
    case Map.pop(scaler.launches, ref) do
      {nil, _} ->
        :unknown

      {launch, launches} ->
        scaler = %{scaler | launches: launches}

        case down_reason do
          {:launched, {:ok, node, handle}} ->
            {:started, node, handle, launch.reason, add_launched(scaler, node, handle, launch)}

          {:launched, {:error, error}} ->
            {:failed, error, launch.reason, failed(scaler, error)}

          other ->
            error = launch_error("the launch process exited: #{inspect(other, limit: 10)}")
            {:failed, error, launch.reason, failed(scaler, error)}
        end
    end
  end

  defp add_launched(scaler, node, handle, launch) do
    now = System.monotonic_time(:millisecond)

    entry = %{
      handle: handle,
      monitor: Process.monitor(handle),
      reason: launch.reason,
      started_at: now,
      since: DateTime.utc_now(),
      last_active: now,
      last_count: 0,
      draining: nil
    }

    took = now - launch.started_at

    Logger.info(
      "XlaNode.Pool #{inspect(scaler.label)}: started #{node} in #{took} ms " <>
        "(#{why_started(launch.reason, scaler)})"
    )

    %{
      scaler
      | launched: Map.put(scaler.launched, node, entry),
        failures: 0,
        retry_at: nil,
        started: scaler.started + 1
    }
    |> event(:started, node, launch.reason)
  end

  defp failed(scaler, error) do
    failures = scaler.failures + 1
    {first, max} = scaler.backoff
    wait = min(first * Integer.pow(2, min(failures - 1, 20)), max)

    Logger.warning(
      "XlaNode.Pool #{inspect(scaler.label)}: a node failed to start (#{failures} in a row; " <>
        "next attempt in #{wait} ms): #{Exception.message(error)}"
    )

    %{
      scaler
      | failures: failures,
        retry_at: System.monotonic_time(:millisecond) + wait,
        last_error: error,
        failed: scaler.failed + 1
    }
    |> event(:launch_failed, nil, Exception.message(error))
  end

  defp why_started(:min, scaler), do: "min: #{scaler.min}"
  defp why_started(:demand, _scaler), do: "a call found no node up"

  defp why_started(:saturated, scaler),
    do: "every device had #{scaler.max_concurrency} or more runs in flight"

  ## Stopping

  @doc """
  Forgets `node` (stopped by the pool, or gone by itself) and reports why: `:idle`,
  `:removed`, `:pool_stopped`, `:exited` (its handle exited, with `detail`), `:nodedown`.
  Returns `{handle, scaler}` (handle nil for a node it did not start).
  """
  def forget(scaler, node, why, detail \\ nil) do
    case Map.pop(scaler.launched, node) do
      {nil, _} ->
        {nil, scaler}

      {entry, launched} ->
        Process.demonitor(entry.monitor, [:flush])
        lifetime = System.monotonic_time(:millisecond) - entry.started_at

        Telemetry.execute(
          [:pool, :node_stop],
          %{lifetime: System.convert_time_unit(lifetime, :millisecond, :native)},
          %{
            pool: scaler.label,
            launcher: scaler.launcher,
            node: node,
            reason: why,
            detail: detail
          }
        )

        message =
          "XlaNode.Pool #{inspect(scaler.label)}: #{node} " <>
            case why do
              :idle -> "stopped: idle for #{scaler.idle_after} ms"
              :removed -> "stopped: removed from the pool"
              :pool_stopped -> "stopped with the pool"
              :exited -> "exited (#{inspect(detail)})"
              :nodedown -> "lost (nodedown): stopped"
            end

        if why in [:exited, :nodedown],
          do: Logger.warning(message),
          else: Logger.info(message)

        scaler = %{scaler | launched: launched, stopped: scaler.stopped + 1}
        {entry.handle, event(scaler, :stopped, node, if(detail, do: {why, detail}, else: why))}
    end
  end

  @doc "The launched node whose handle's monitor is `ref`, or nil."
  def node_of_monitor(scaler, ref) do
    Enum.find_value(scaler.launched, fn {node, entry} -> if entry.monitor == ref, do: node end)
  end

  @doc "Stops a node in a process of its own (the launcher's stop waits for it to be gone)."
  def stop_node(scaler, handle) do
    module = scaler.launcher
    spawn(fn -> module.stop_node(handle) end)
    :ok
  end

  @doc "Stops every node it started, side by side, and returns once they are gone."
  def stop_all(scaler) do
    Enum.each(scaler.launches, fn {_ref, %{pid: pid}} -> Process.exit(pid, :kill) end)

    {handles, scaler} =
      Enum.reduce(Map.keys(scaler.launched), {[], scaler}, fn node, {handles, scaler} ->
        {handle, scaler} = forget(scaler, node, :pool_stopped)
        {[handle | handles], scaler}
      end)

    module = scaler.launcher

    handles
    |> Enum.map(fn handle -> Task.async(fn -> module.stop_node(handle) end) end)
    |> Task.yield_many(30_000)

    scaler
  end

  ## Idleness

  @doc """
  Updates each launched node's last activity from the pool's table: a node with runs in
  flight, or that answered runs since the last look, is active now. `loads` maps a node to
  `{in_flight, runs + errors}`.
  """
  def observe(scaler, loads) do
    now = System.monotonic_time(:millisecond)

    launched =
      Map.new(scaler.launched, fn {node, entry} ->
        case Map.get(loads, node) do
          {in_flight, count} when in_flight > 0 or count != entry.last_count ->
            {node, %{entry | last_active: now, last_count: count}}

          _ ->
            {node, entry}
        end
      end)

    %{scaler | launched: launched}
  end

  @doc """
  The launched nodes idle for `idle_shutdown_after` that may stop without going below `min`,
  longest idle first (those of `up` only: nodes that serve; none being drained already).
  """
  def idle_nodes(%{idle_after: :infinity}, _up), do: []

  def idle_nodes(scaler, up) do
    now = System.monotonic_time(:millisecond)
    serving = Enum.filter(scaler.launched, fn {node, _} -> node in up end)
    draining = Enum.count(serving, fn {_, entry} -> entry.draining != nil end)
    spare = length(serving) - draining - scaler.min

    serving
    |> Enum.filter(fn {_node, e} ->
      e.draining == nil and now - e.last_active >= scaler.idle_after
    end)
    |> Enum.sort_by(fn {_node, e} -> e.last_active end)
    |> Enum.take(max(spare, 0))
    |> Enum.map(&elem(&1, 0))
  end

  @doc """
  Marks `node` as being probed or drained (`{:probe | :drain, ref}`), or neither (nil: it serves
  again, active now).
  """
  def drain(scaler, node, ref) do
    case scaler.launched do
      %{^node => entry} ->
        entry =
          if ref == nil,
            do: %{entry | draining: nil, last_active: System.monotonic_time(:millisecond)},
            else: %{entry | draining: ref}

        %{scaler | launched: Map.put(scaler.launched, node, entry)}

      _ ->
        scaler
    end
  end

  @doc "Whether `node` is being probed or drained under `step` (`{:probe | :drain, ref}`)."
  def draining?(scaler, node, step), do: match?(%{^node => %{draining: ^step}}, scaler.launched)

  @doc "How often the pool looks for idle nodes: a quarter of the idle time, within bounds."
  def idle_check_interval(%{idle_after: :infinity}), do: nil
  def idle_check_interval(%{idle_after: ms}), do: ms |> div(4) |> max(50) |> min(5_000)

  ## Reports

  defp event(scaler, what, node, reason) do
    event = %{event: what, node: node, reason: reason, at: DateTime.utc_now()}
    %{scaler | events: Enum.take([event | scaler.events], @events_kept)}
  end

  @doc "The `launcher` entry of the pool's status map."
  def status(scaler) do
    %{
      module: scaler.launcher,
      min: scaler.min,
      max: scaler.max,
      idle_shutdown_after: scaler.idle_after,
      max_concurrency: scaler.max_concurrency,
      running: map_size(scaler.launched),
      launching: map_size(scaler.launches),
      started: scaler.started,
      stopped: scaler.stopped,
      failed: scaler.failed,
      last_error: scaler.last_error && Exception.message(scaler.last_error),
      next_launch_in_ms: backoff_left(scaler),
      events: scaler.events
    }
  end

  @doc "The `launched` entry of a node's status: nil, or why and when the pool started it."
  def node_status(scaler, node) do
    case scaler.launched do
      %{^node => entry} ->
        %{reason: entry.reason, since: entry.since, draining: match?({:drain, _}, entry.draining)}

      _ ->
        nil
    end
  end

  def launch_error(message),
    do: %Error{kind: :launch_error, message: message, reason: :launch_error}
end
