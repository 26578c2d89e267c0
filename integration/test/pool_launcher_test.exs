defmodule XlaNode.PoolLauncherTest do
  @moduledoc """
  `XlaNode.Pool` with `launcher:`: nodes started on demand (a call that finds none, runs that
  find every device busy), stopped once idle down to `min` (never while anyone holds a buffer
  there), replaced when they die, retried with backoff when they fail to start, and stopped
  with the pool. Real nodes started by `XlaNode.Launcher.Local`, real runs with exact results.
  """
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog

  # :telemetry is built by XlaNode.TelemetryLibrary at run time, where TELEMETRY_PATH names it.
  @compile {:no_warn_undefined, [:telemetry, :telemetry_test]}

  alias XlaNode.{Error, Harness, Pool, PoolHelpers, Tensor, TelemetryLibrary}

  @add_one """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %r = stablehlo.add %x, %one : tensor<4xf32>
    return %r : tensor<4xf32>
  }
  """

  defp pool_name, do: :"launch_pool_#{System.unique_integer([:positive])}"

  # The suite's node arguments (none on the CPU plugin; a GPU run gives some).
  defp launcher(opts \\ []) do
    extra = Harness.extra_args()
    opts = if extra == [], do: opts, else: [args: extra] ++ opts
    {XlaNode.Launcher.Local, opts}
  end

  defp x, do: Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32})

  defp launched(pool), do: for(n <- Pool.status(pool).nodes, n.launched != nil, do: n)

  defp wait_for(fun, timeout \\ 30_000), do: Harness.eventually(fun, timeout, 50)

  defp os_pids(nodes), do: Enum.flat_map(nodes, &Harness.xla_node_processes/1)

  test "without nodes: compile and run at once, starting the first node; stopped when idle" do
    name = pool_name()

    start_supervised!(
      {Pool, name: name, launcher: launcher(), min: 0, max: 2, idle_shutdown_after: 3000}
    )

    assert %{nodes: [], launcher: %{started: 0, running: 0}} = Pool.status(name)

    exe = XlaNode.compile!(name, @add_one)
    [y] = XlaNode.run!(name, exe, [x()])
    assert Tensor.to_list(y) == [2.0, 3.0, 4.0, 5.0]

    assert [%{node: node, status: :up, runs: 1, launched: %{reason: :demand}}] =
             Pool.status(name).nodes

    assert %{started: 1, running: 1, stopped: 0, failed: 0} = Pool.status(name).launcher
    [os_pid] = Harness.xla_node_processes(node)

    # Nothing holds anything there: it stops after idle_shutdown_after.
    assert wait_for(fn -> Pool.status(name).nodes == [] end)
    assert wait_for(fn -> not Harness.os_process_alive?(os_pid) end, 10_000)
    # Its nodedown reaches this VM a moment after the process ends.
    assert wait_for(fn -> node not in Node.list(:hidden) end, 5_000)

    assert %{started: 1, stopped: 1, running: 0, events: [stopped, started]} =
             Pool.status(name).launcher

    assert %{event: :stopped, node: ^node, reason: :idle} = stopped
    assert %{event: :started, node: ^node, reason: :demand} = started

    # And a call starts one again.
    assert Tensor.to_list(hd(XlaNode.run!(name, exe, [x()]))) == [2.0, 3.0, 4.0, 5.0]
    assert %{started: 2} = Pool.status(name).launcher
  end

  @tag :cpu_only
  @tag :slow
  test "a load that saturates one node starts a second and a third; they stop once it ends" do
    name = pool_name()

    if reason = TelemetryLibrary.unavailable() do
      IO.puts("pool launcher test: the :telemetry part is skipped: #{reason}")
    else
      :ok = TelemetryLibrary.start()
    end

    telemetry =
      if TelemetryLibrary.unavailable() == nil do
        ref =
          :telemetry_test.attach_event_handlers(self(), [
            [:xla_node, :pool, :launch, :start],
            [:xla_node, :pool, :launch, :stop],
            [:xla_node, :pool, :node_stop]
          ])

        on_exit(fn -> :telemetry.detach(ref) end)
        ref
      end

    # One device per node, so that a few callers keep a node busy.
    start_supervised!(
      {Pool,
       name: name,
       launcher: launcher(pjrt_options: [cpu_device_count: 1], log: "warn"),
       min: 0,
       max: 3,
       idle_shutdown_after: 2_000,
       max_concurrency: 1}
    )

    n = 20_000
    exe = XlaNode.compile!(name, PoolHelpers.busy_sum(n))
    parent = self()

    # Six callers run until three nodes serve (up, not only started), then 20 runs more each.
    # The first to see three up takes their OS processes, while the load keeps them from idling.
    first_to_see = :atomics.new(1, [])

    three_up? = fn ->
      case for(%{status: :up, node: node} <- launched(name), do: node) do
        [_, _, _] = up ->
          if :atomics.compare_exchange(first_to_see, 1, 0, 1) == :ok,
            do: send(parent, {:three_up, up, os_pids(up)})

          true

        _ ->
          false
      end
    end

    callers =
      for c <- 1..6 do
        Task.async(fn ->
          loop = fn loop, i, more ->
            input = Tensor.from_list([c, i, 1, -1], {:s, 64})

            result =
              case XlaNode.run(name, exe, [input]) do
                {:ok, [sum]} -> Tensor.to_list(sum)
                {:error, error} -> error
              end

            ok = result == [c * n, i * n, n, -n]
            unless ok, do: send(parent, {:bad_run, result})

            cond do
              more == 0 -> i
              more != nil -> loop.(loop, i + 1, more - 1)
              three_up?.() -> loop.(loop, i + 1, 20)
              true -> loop.(loop, i + 1, nil)
            end
          end

          loop.(loop, 1, nil)
        end)
      end

    runs = callers |> Task.await_many(120_000) |> Enum.sum()
    refute_received {:bad_run, _}

    status = Pool.status(name)
    assert %{started: 3, failed: 0} = status.launcher
    assert length(status.nodes) == 3
    assert %{errors: 0, failures: 0, retries: 0, runs: ^runs} = status
    assert Enum.all?(status.nodes, &(&1.runs > 0)), inspect(status.nodes)

    reasons = for %{event: :started, reason: r} <- status.launcher.events, do: r
    assert Enum.sort(reasons) == [:demand, :saturated, :saturated]
    nodes = Enum.map(status.nodes, & &1.node)
    assert_received {:three_up, up, pids}
    assert Enum.sort(up) == Enum.sort(nodes)
    assert length(pids) == 3

    # The load is over: each stops once idle for 2 s, down to min: 0.
    assert wait_for(fn -> Pool.status(name).nodes == [] end, 60_000)
    assert wait_for(fn -> not Enum.any?(pids, &Harness.os_process_alive?/1) end, 10_000)
    status = Pool.status(name)
    assert %{started: 3, stopped: 3, running: 0, failed: 0} = status.launcher
    stops = for %{event: :stopped, node: node, reason: :idle} <- status.launcher.events, do: node
    assert Enum.sort(stops) == Enum.sort(nodes)

    if telemetry do
      events = collect_telemetry(telemetry, name)
      starts = for {[_, _, :launch, :start], _, meta} <- events, do: meta.reason
      assert Enum.sort(starts) == [:demand, :saturated, :saturated]

      for {[_, _, :launch, :stop], measurements, meta} <- events do
        assert meta.error == nil and meta.node in nodes and
                 meta.launcher == XlaNode.Launcher.Local

        assert measurements.duration > 0
      end

      stopped = for {[_, _, :node_stop], m, meta} <- events, do: {meta.node, meta.reason, m}

      assert Enum.sort(for {node, :idle, %{lifetime: l}} <- stopped, l > 0, do: node) ==
               Enum.sort(nodes)
    end
  end

  defp collect_telemetry(ref, pool, acc \\ []) do
    receive do
      {event, ^ref, measurements, %{pool: ^pool} = metadata} ->
        collect_telemetry(ref, pool, [{event, measurements, metadata} | acc])

      {_event, ^ref, _measurements, _metadata} ->
        collect_telemetry(ref, pool, acc)
    after
      0 -> Enum.reverse(acc)
    end
  end

  test "a node where anyone holds a buffer is not idle; it stops once the buffer is freed" do
    name = pool_name()

    start_supervised!(
      {Pool, name: name, launcher: launcher(), min: 0, max: 1, idle_shutdown_after: 300}
    )

    log =
      capture_log([level: :debug], fn ->
        buffer = XlaNode.to_device!(name, x())
        [%{node: node}] = launched(name)

        # Several times idle_shutdown_after: the pool looks, finds the buffer, keeps the node.
        Process.sleep(2_000)
        assert [%{node: ^node, status: :up}] = Pool.status(name).nodes
        assert {:ok, _} = XlaNode.read(name, buffer)

        :ok = XlaNode.free(name, buffer)
        assert wait_for(fn -> Pool.status(name).nodes == [] end)
        send(self(), {:node, node})
      end)

    assert_received {:node, node}
    assert log =~ "#{node} is not idle (buffers: 1); kept"
    assert log =~ "#{node} stopped: idle for 300 ms"
  end

  test "min: a node that dies is replaced" do
    name = pool_name()
    start_supervised!({Pool, name: name, launcher: launcher(log: "warn"), min: 1, max: 1})
    assert wait_for(fn -> match?([%{status: :up}], launched(name)) end)
    [%{node: first, launched: %{reason: :min}}] = launched(name)
    [os_pid] = Harness.xla_node_processes(first)

    capture_log(fn ->
      System.cmd("kill", ["-KILL", "#{os_pid}"])

      assert wait_for(fn ->
               match?([%{node: node, status: :up}] when node != first, launched(name))
             end)
    end)

    [%{node: second, launched: %{reason: :min}}] = launched(name)
    exe = XlaNode.compile!(name, @add_one)
    assert Tensor.to_list(hd(XlaNode.run!(name, exe, [x()]))) == [2.0, 3.0, 4.0, 5.0]

    assert [%{event: :started, node: ^second}, %{event: :stopped, node: ^first, reason: why} | _] =
             Pool.status(name).launcher.events

    assert match?({:exited, _}, why) or why == :nodedown
  end

  test "a node that fails to start is retried with backoff and reported; the pool serves on" do
    fixed = Harness.start_node()
    name = pool_name()

    log =
      capture_log(fn ->
        start_supervised!(
          {Pool,
           name: name,
           nodes: [fixed.name],
           launcher: launcher(bin: "/no/such/xla_node"),
           min: 1,
           max: 2,
           launch_backoff: {100, 400}}
        )

        assert wait_for(fn -> Pool.status(name).launcher.failed >= 3 end)

        # Runs go to the node it has.
        exe = XlaNode.compile!(name, @add_one)

        for _ <- 1..5,
            do: assert(Tensor.to_list(hd(XlaNode.run!(name, exe, [x()]))) == [2.0, 3.0, 4.0, 5.0])
      end)

    status = Pool.status(name)
    assert [%{node: node, runs: 5, launched: nil}] = status.nodes
    assert node == fixed.name
    assert status.launcher.started == 0
    assert status.launcher.last_error =~ "no xla_node binary at /no/such/xla_node"
    assert status.launcher.next_launch_in_ms <= 400
    assert [%{event: :launch_failed, reason: reason} | _] = status.launcher.events
    assert reason =~ "/no/such/xla_node"
    assert log =~ "a node failed to start (1 in a row; next attempt in 100 ms)"
    assert log =~ "(2 in a row; next attempt in 200 ms)"
    assert log =~ "in a row; next attempt in 400 ms)"
  end

  test "a pool without nodes that cannot start one answers with the launch's error" do
    name = pool_name()

    capture_log(fn ->
      start_supervised!(
        {Pool,
         name: name,
         launcher: launcher(bin: "/no/such/xla_node"),
         launch_backoff: {60_000, 60_000}}
      )

      assert {:error, %Error{kind: :launch_error, message: message}} =
               XlaNode.compile(name, @add_one)

      assert message =~ "no node of the pool #{inspect(name)} is up, and starting one failed"
      assert message =~ "/no/such/xla_node"
    end)
  end

  test "a pool stops the nodes it started when it stops, and remove_node/2 stops one" do
    name = pool_name()

    start_supervised!({Pool, name: name, launcher: launcher(log: "warn"), min: 3, max: 3})

    assert wait_for(fn -> length(for %{status: :up} <- launched(name), do: 1) == 3 end)
    [gone | kept] = Enum.map(launched(name), & &1.node)
    [gone_pid] = Harness.xla_node_processes(gone)

    :ok = Pool.remove_node(name, gone)
    assert wait_for(fn -> not Harness.os_process_alive?(gone_pid) end, 10_000)

    # min: 3 may already have started the replacement, so the stop need not be the latest event.
    assert Enum.any?(
             Pool.status(name).launcher.events,
             &match?(%{event: :stopped, node: ^gone, reason: :removed}, &1)
           )

    # min: 3 starts another.
    assert wait_for(fn -> length(for %{status: :up} <- launched(name), do: 1) == 3 end)

    pids = os_pids(Enum.map(launched(name), & &1.node))
    assert length(pids) == 3
    assert Enum.all?(kept, &(&1 in Enum.map(launched(name), fn n -> n.node end)))

    :ok = stop_supervised(name)
    refute Enum.any?(pids, &Harness.os_process_alive?/1)
  end
end
