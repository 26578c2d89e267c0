defmodule XlaNode.PoolTest do
  @moduledoc """
  `XlaNode.Pool` over three real xla_node processes: placement, failover when a node is killed
  in the middle of runs whose callbacks go to a process on a peer node, a node restarted under
  the same name rejoining, a run's one `:telemetry` span, every node down, buffers pinning runs,
  and bad input.
  """
  use ExUnit.Case, async: false

  alias XlaNode.{Error, Harness, Pool, PoolHelpers, Tensor}

  # :telemetry is there only when TELEMETRY_PATH is (see XlaNode.TelemetryLibrary).
  @compile {:no_warn_undefined, [:telemetry, :telemetry_test]}

  @moduletag timeout: 300_000

  setup do
    xlas = for _ <- 1..3, do: Harness.start_node()
    names = Enum.map(xlas, & &1.name)
    pool = :"pool_#{System.unique_integer([:positive])}"
    start_supervised!({Pool, name: pool, nodes: names, reconnect_backoff: {50, 500}})
    wait_until_up(pool, names)
    %{xlas: xlas, names: names, pool: pool}
  end

  defp wait_until_up(pool, nodes) do
    Harness.eventually(fn -> Enum.all?(nodes, &(status_of(pool, &1).status == :up)) end, 30_000) ||
      flunk("pool nodes not up: #{inspect(Pool.status(pool).nodes)}")
  end

  defp status_of(pool, node), do: Enum.find(Pool.status(pool).nodes, &(&1.node == node))
  defp runs_per_node(pool), do: Map.new(Pool.status(pool).nodes, &{&1.node, &1.runs})

  defp s64(list), do: Tensor.from_list(list, {:s, 64})
  defp f32(list), do: Tensor.from_list(list, {:f, 32})

  # Each run waits 30 ms for a callback on this node, so that a run takes about as long on every
  # node and the share each node gets shows placement alone. Runs of a CPU-bound program, or runs
  # short enough for a node's scheduling hiccups on a loaded 2-core machine to matter, finish
  # sooner on one node than on another, and the pool rightly sends more of them to the node that
  # finishes them sooner (bench/pool.exs measures CPU-bound runs).
  test "300 runs spread over three nodes, each within 20% of a third", %{pool: pool, names: names} do
    {:ok, server} =
      XlaNode.CallbackServer.start_link(%{
        double: fn [x] ->
          Process.sleep(30)
          {:ok, [f32(Enum.map(Tensor.to_list(x), &(&1 * 2)))]}
        end
      })

    exe = XlaNode.compile!(pool, PoolHelpers.doubling())

    # A node compiles a program the first time a run goes there, and a fresh node takes a while
    # over its first runs that call back; runs placed meanwhile rightly go to the others. Warm
    # every node up first, so that the 300 runs show placement alone.
    for node <- names, _ <- 1..2 do
      1..10
      |> Task.async_stream(fn _ ->
        {:ok, _} =
          XlaNode.run(pool, exe, [f32([0, 0, 0, 0])], node: node, callback_server: server)
      end)
      |> Stream.run()
    end

    before = runs_per_node(pool)

    results =
      1..300
      |> Task.async_stream(
        fn i -> XlaNode.run(pool, exe, [f32([i, 1, 2, 3])], callback_server: server) end,
        max_concurrency: 15,
        timeout: :infinity
      )
      |> Enum.map(fn {:ok, result} -> result end)

    for {result, i} <- Enum.with_index(results, 1) do
      assert {:ok, [y]} = result
      assert Tensor.to_list(y) == [2 * i + 1.0, 3.0, 5.0, 7.0]
    end

    runs = Map.new(runs_per_node(pool), fn {node, runs} -> {node, runs - before[node]} end)
    assert Enum.sum(Map.values(runs)) == 300

    for node <- names do
      assert runs[node] in 80..120,
             "#{node} ran #{runs[node]} of 300: #{inspect(runs)} #{inspect(Pool.status(pool))}"
    end

    assert %{in_flight: 0, failures: 0, retries: 0, programs: 1} = Pool.status(pool)
  end

  # The busy program's loop is sized for a CPU; on a GPU each iteration costs a round trip
  # to the host.
  @tag :cpu_only
  test "kill -9 of a node in the middle of 200 runs: pure runs finish elsewhere, side effects " <>
         "fail fast, no callback served twice; the node restarted rejoins",
       %{pool: pool, xlas: [victim | _], names: names} do
    peer = Harness.start_peer()
    {server, log, gate} = Harness.peer_call(peer, PoolHelpers, :start_recording_server, [20])

    busy = XlaNode.compile!(pool, PoolHelpers.busy_sum(5_000_000))
    doubling = XlaNode.compile!(pool, PoolHelpers.doubling())
    logging = XlaNode.compile!(pool, PoolHelpers.logging())
    assert doubling.effects == :callbacks
    assert {:side_effects, _} = logging.effects

    run = fn i ->
      x = [i * 1.0, 1.0, 2.0, 3.0]

      case rem(i, 3) do
        0 -> {:busy, i, XlaNode.run(pool, busy, [s64([i, 1, 2, 3])])}
        1 -> {:doubling, i, XlaNode.run(pool, doubling, [f32(x)], callback_server: server)}
        2 -> {:logging, i, XlaNode.run(pool, logging, [f32(x)], callback_server: server)}
      end
    end

    runner =
      Task.async(fn ->
        Task.async_stream(1..200, run, max_concurrency: 40, timeout: :infinity)
        |> Enum.map(&elem(&1, 1))
      end)

    # Once a good part of the runs is done, the callbacks are held: the runs in flight that call
    # back cannot complete, and soon they are all that is in flight (40 at a time). The node is
    # killed with some of them in flight, then the callbacks go on.
    Harness.eventually(fn -> Pool.status(pool).runs >= 50 end, 120_000, 5) ||
      flunk("the runs never got going: #{inspect(Pool.status(pool))}")

    Harness.peer_call(peer, PoolHelpers, :close_gate, [gate])

    Harness.eventually(
      fn ->
        Pool.status(pool).in_flight == 40 and status_of(pool, victim.name).in_flight >= 3
      end,
      120_000,
      5
    ) || flunk("the runs in flight never settled: #{inspect(Pool.status(pool))}")

    Harness.stop_node(victim, "KILL")
    Harness.peer_call(peer, PoolHelpers, :open_gate, [gate])
    results = Task.await(runner, :infinity)

    assert length(results) == 200

    lost =
      for {kind, i, result} <- results, reduce: [] do
        lost ->
          case {kind, result} do
            {:busy, {:ok, [sum]}} ->
              assert Tensor.to_list(sum) == Enum.map([i, 1, 2, 3], &(&1 * 5_000_000))
              lost

            {:busy, error} ->
              flunk("pure run #{i} failed: #{inspect(error)}")

            {:doubling, {:ok, [y]}} ->
              assert Tensor.to_list(y) == [2 * i + 1.0, 3.0, 5.0, 7.0]
              lost

            {:logging, {:ok, [y]}} ->
              assert Tensor.to_list(y) == [i * 1.0, 1.0, 2.0, 3.0]
              lost

            {kind,
             {:error, %Error{kind: :nodedown, reason: :nodedown, node: node, message: message}}}
            when kind in [:doubling, :logging] ->
              assert node == victim.name

              if kind == :logging,
                do: assert(message =~ "side effects"),
                else: assert(message =~ "already fired")

              [{kind, i} | lost]

            {kind, other} ->
              flunk("#{kind} run #{i}: #{inspect(other)}")
          end
      end

    status = Pool.status(pool)
    victim_status = status_of(pool, victim.name)
    # The kill hit runs in flight: some were re-sent, or failed for their effects.
    assert status.retries + length(lost) > 0
    assert victim_status.failures > 0
    assert victim_status.status != :up

    served = Harness.peer_call(peer, PoolHelpers, :served, [log])
    counts = Enum.frequencies(served)

    for {{_id, _x} = callback, count} <- counts do
      assert count == 1, "callback #{inspect(callback)} served #{count} times"
    end

    for {kind, i, {:ok, _}} <- results, kind != :busy do
      id = if kind == :doubling, do: :double, else: :log

      assert counts[{id, i * 1.0}] == 1,
             "#{kind} run #{i} succeeded but its callback was not served once"
    end

    # The node comes back under the same name and gets runs again.
    restarted = Harness.start_node(sname: victim.sname)
    assert restarted.name == victim.name
    wait_until_up(pool, names)
    before = runs_per_node(pool)[victim.name]

    1..60
    |> Task.async_stream(fn i -> {:ok, _} = XlaNode.run(pool, busy, [s64([i, 0, 0, 0])]) end,
      max_concurrency: 12,
      timeout: :infinity
    )
    |> Stream.run()

    assert runs_per_node(pool)[victim.name] > before
    assert status_of(pool, victim.name).executables == 1
  end

  if reason = XlaNode.TelemetryLibrary.unavailable() do
    IO.puts("XlaNode.PoolTest: the :telemetry test is skipped: #{reason}")
  end

  # The busy program's loop is sized for a CPU; on a GPU each iteration costs a round trip
  # to the host.
  @tag :cpu_only
  @tag skip: XlaNode.TelemetryLibrary.unavailable()
  test "a run through the pool is one :telemetry span, with its attempts and its last node",
       %{pool: pool, xlas: [victim | _], names: names} do
    :ok = XlaNode.TelemetryLibrary.start()
    events = [[:xla_node, :run, :start], [:xla_node, :run, :stop]]
    ref = :telemetry_test.attach_event_handlers(self(), events)
    on_exit(fn -> :telemetry.detach(ref) end)
    busy = XlaNode.compile!(pool, PoolHelpers.busy_sum(50_000_000))
    tagged = [telemetry_metadata: %{test: ref}]

    [_] = XlaNode.run!(pool, busy, [s64([1, 2, 3, 4])], tagged)
    assert_receive {[:xla_node, :run, :start], ^ref, _, %{node: nil, server: ^pool, test: ^ref}}
    assert_receive {[:xla_node, :run, :stop], ^ref, _, %{attempts: 1, error: nil} = stop}
    assert stop.node in names
    refute_received {[:xla_node, :run, _], ^ref, _, _}

    # Runs in flight on a node that is killed go to another: still one span each, counting both
    # attempts.
    runner =
      Task.async(fn ->
        1..30
        |> Task.async_stream(&XlaNode.run(pool, busy, [s64([&1, 0, 0, 0])], tagged),
          max_concurrency: 9,
          timeout: :infinity
        )
        |> Enum.map(fn {:ok, result} -> result end)
      end)

    Harness.eventually(fn -> status_of(pool, victim.name).in_flight >= 2 end, 60_000, 5) ||
      flunk("no run went to #{victim.name}: #{inspect(Pool.status(pool))}")

    Harness.stop_node(victim, "KILL")
    assert Enum.all?(Task.await(runner, :infinity), &match?({:ok, [_]}, &1))

    stops =
      for _ <- 1..30 do
        assert_receive {[:xla_node, :run, :stop], ^ref, _, %{test: ^ref} = stop}, 10_000
        stop
      end

    refute_received {[:xla_node, :run, :stop], ^ref, _, _}
    resent = Enum.filter(stops, &(&1.attempts > 1))
    assert resent != []
    assert length(resent) == Pool.status(pool).retries
    assert Enum.all?(resent, &(&1.attempts == 2 and &1.node != victim.name and &1.node in names))
  end

  test "every node down: a clear error naming them", %{pool: pool, xlas: xlas, names: names} do
    exe = XlaNode.compile!(pool, PoolHelpers.busy_sum(10))
    assert {:ok, _} = XlaNode.run(pool, exe, [s64([1, 2, 3, 4])])

    for xla <- xlas, do: Harness.stop_node(xla, "KILL")

    Harness.eventually(fn -> Enum.all?(Pool.status(pool).nodes, &(&1.status != :up)) end, 10_000) ||
      flunk("nodes still up: #{inspect(Pool.status(pool).nodes)}")

    assert {:error, %Error{kind: :nodedown, reason: {:nodes_down, ^names}, message: message}} =
             XlaNode.run(pool, exe, [s64([1, 2, 3, 4])])

    for name <- names, do: assert(message =~ Atom.to_string(name))

    assert {:error, %Error{reason: {:nodes_down, ^names}}} =
             XlaNode.compile(pool, PoolHelpers.busy_sum(10))

    error = assert_raise Error, fn -> XlaNode.to_device!(pool, s64([1, 2, 3, 4])) end
    assert error.kind == :nodedown
  end

  test "buffers pin runs to their node; node: pins a run; a lost buffer is named",
       %{pool: pool, xlas: xlas, names: names} do
    exe = XlaNode.compile!(pool, PoolHelpers.busy_sum(10))
    buffer = XlaNode.to_device!(pool, s64([1, 2, 3, 4]))
    holder = node(buffer)
    assert holder in names
    assert XlaNode.read!(pool, buffer) == s64([1, 2, 3, 4])

    before = runs_per_node(pool)

    for _ <- 1..20 do
      assert [sum] = XlaNode.run!(pool, exe, [buffer])
      assert Tensor.to_list(sum) == [10, 20, 30, 40]
    end

    # Results kept on the device are buffers of the node that ran the program.
    assert [kept] = XlaNode.run!(pool, exe, [buffer], keep_on_device: true)
    assert node(kept) == holder
    assert Tensor.to_list(XlaNode.read!(pool, kept)) == [10, 20, 30, 40]

    after_runs = runs_per_node(pool)
    assert after_runs[holder] - before[holder] == 21
    for node <- names -- [holder], do: assert(after_runs[node] == before[node])

    [other | _] = names -- [holder]

    for _ <- 1..5, do: assert({:ok, _} = XlaNode.run(pool, exe, [s64([0, 0, 0, 0])], node: other))
    assert runs_per_node(pool)[other] - after_runs[other] == 5

    assert {:error, %Error{kind: :argument_error, message: message}} =
             XlaNode.run(pool, exe, [buffer], node: other)

    assert message =~ "is a buffer on #{holder}"

    assert :ok = XlaNode.free(pool, kept)
    assert {:error, %Error{kind: :argument_error}} = XlaNode.read(pool, kept)

    # The node holding the buffer goes: runs that need the buffer fail, naming it.
    Harness.stop_node(Enum.find(xlas, &(&1.name == holder)), "KILL")
    Harness.eventually(fn -> status_of(pool, holder).status != :up end, 10_000)

    assert {:error, %Error{kind: :nodedown, reason: :nodedown, node: ^holder, message: message}} =
             XlaNode.run(pool, exe, [buffer])

    assert message =~ inspect(buffer)
    assert message =~ "lost"
    assert {:error, %Error{kind: :nodedown, node: ^holder}} = XlaNode.read(pool, buffer)

    assert {:error, %Error{kind: :nodedown, node: ^holder}} =
             XlaNode.run(pool, exe, [s64([1, 1, 1, 1])], node: holder)

    # Runs without a pin go on elsewhere.
    assert {:ok, _} = XlaNode.run(pool, exe, [s64([1, 1, 1, 1])])
  end

  test "a handle is compiled where runs go, freed everywhere, and works only with its pool",
       %{pool: pool, names: names} do
    exe = XlaNode.compile!(pool, PoolHelpers.busy_sum(10))
    executables = fn -> Enum.map(names, &elem(XlaNode.info(&1), 1).executables) end

    for node <- names,
        do: assert({:ok, _} = XlaNode.run(pool, exe, [s64([1, 1, 1, 1])], node: node))

    # One executable on each node, the pool's.
    assert Enum.all?(Pool.status(pool).nodes, &(&1.executables == 1))
    assert executables.() == [1, 1, 1]

    assert :ok = XlaNode.free(pool, exe)
    assert %{programs: 0} = Pool.status(pool)
    assert Enum.all?(Pool.status(pool).nodes, &(&1.executables == 0))

    Harness.eventually(fn -> executables.() == [0, 0, 0] end, 5_000) ||
      flunk("executables left on the nodes: #{inspect(executables.())}")

    assert {:error, %Error{kind: :argument_error, message: message}} =
             XlaNode.run(pool, exe, [s64([1, 1, 1, 1])])

    assert message =~ "freed"
    assert {:error, %Error{kind: :argument_error}} = XlaNode.free(pool, exe)

    # node: chooses where compile/3 compiles it first.
    last = List.last(names)
    exe = XlaNode.compile!(pool, PoolHelpers.busy_sum(20), node: last)
    assert [0, 0, 1] == Enum.map(Pool.status(pool).nodes, & &1.executables)
    assert :ok = XlaNode.free(pool, exe)

    # Another pool over the same nodes does not take this pool's handles, nor do the nodes. A
    # pool just started takes calls at once: they wait for its nodes' first connection.
    other = :"other_#{System.unique_integer([:positive])}"
    start_supervised!({Pool, name: other, nodes: names}, id: other)
    other_exe = XlaNode.compile!(other, PoolHelpers.busy_sum(10))
    assert {:ok, _} = XlaNode.run(other, other_exe, [s64([1, 1, 1, 1])])
    exe = XlaNode.compile!(pool, PoolHelpers.busy_sum(10))

    assert {:error, %Error{kind: :argument_error, message: message}} =
             XlaNode.run(other, exe, [s64([1, 1, 1, 1])])

    assert message =~ inspect(pool)

    assert {:error, %Error{kind: :argument_error}} =
             XlaNode.run(hd(names), exe, [s64([1, 1, 1, 1])])

    node_exe = XlaNode.compile!(hd(names), PoolHelpers.busy_sum(10))

    assert {:error, %Error{kind: :argument_error, message: message}} =
             XlaNode.run(pool, node_exe, [s64([1, 1, 1, 1])])

    assert message =~ "compiled through the pool"
  end

  # Places are counted as on XLA's CPU client.
  @tag :cpu_only
  test "a run a node refuses as overloaded goes to another node; refused by all, the refusal" do
    # Nodes on which this client node may have no run waiting for a place.
    [a, b] = for _ <- 1..2, do: Harness.start_node(args: ["--tenant", "default:max_queued=0"])
    pool = :"pool_#{System.unique_integer([:positive])}"
    start_supervised!({Pool, name: pool, nodes: [a.name, b.name]})
    wait_until_up(pool, [a.name, b.name])

    {held, _log, gate} = PoolHelpers.start_recording_server(0)
    {open, _log, _gate} = PoolHelpers.start_recording_server(0)
    PoolHelpers.close_gate(gate)
    exe = XlaNode.compile!(pool, PoolHelpers.doubling())
    x = f32([1, 2, 3, 4])

    # Fills `node`'s places with runs held on their callbacks, sent to it directly (the pool
    # does not count them), until it refuses one. (A refusal slower than the wait for it is
    # among the tasks returned, which end in a refusal or the run's results.)
    fill = fn node ->
      direct = XlaNode.compile!(node, PoolHelpers.doubling())
      run = fn -> XlaNode.run(node, direct, [x], callback_server: held, timeout: 60_000) end

      Stream.repeatedly(fn -> Task.async(run) end)
      |> Enum.reduce_while([], fn task, tasks ->
        case Task.yield(task, 200) do
          nil -> {:cont, [task | tasks]}
          {:ok, {:error, %Error{kind: :overloaded}}} -> {:halt, tasks}
        end
      end)
    end

    refusals = fn node ->
      {:ok, %{tenants: tenants}} = XlaNode.info(node)
      tenants[node()].refusals.overloaded
    end

    held_on_a = fill.(a.name)
    refused_on_a = refusals.(a.name)
    # One run in flight through the pool on b, so that the pool places the next one on a.
    pinned =
      Task.async(fn -> XlaNode.run(pool, exe, [x], node: b.name, callback_server: held) end)

    assert Harness.eventually(fn -> status_of(pool, b.name).in_flight == 1 end)

    assert {:ok, [y]} = XlaNode.run(pool, exe, [x], callback_server: open)
    assert Tensor.to_list(y) == [3.0, 5.0, 7.0, 9.0]
    assert refusals.(a.name) == refused_on_a + 1
    assert %{errors: 1, retries: 1, runs: 0} = status_of(pool, a.name)
    assert %{runs: 1} = status_of(pool, b.name)

    # Refused by every node: the caller has the refusal, at once.
    held_on_b = fill.(b.name)
    refused = refusals.(a.name) + refusals.(b.name)

    assert {:error, %Error{kind: :overloaded, message: message}} =
             XlaNode.run(pool, exe, [x], callback_server: open)

    assert message =~ "max_queued of 0"
    assert refusals.(a.name) + refusals.(b.name) == refused + 2
    # Pinned: not re-sent.
    assert {:error, %Error{kind: :overloaded}} =
             XlaNode.run(pool, exe, [x], node: a.name, callback_server: open)

    assert refusals.(a.name) + refusals.(b.name) == refused + 3

    PoolHelpers.open_gate(gate)

    assert {:ok, [y]} = Task.await(pinned, 60_000)
    assert Tensor.to_list(y) == [3.0, 5.0, 7.0, 9.0]

    for task <- held_on_a ++ held_on_b do
      case Task.await(task, 60_000) do
        {:ok, [y]} -> assert Tensor.to_list(y) == [3.0, 5.0, 7.0, 9.0]
        refused -> assert {:error, %Error{kind: :overloaded}} = refused
      end
    end
  end

  test "callbacks reach the caller's callback server; errors of the node keep their kind",
       %{pool: pool, names: names} do
    {:ok, server} =
      XlaNode.CallbackServer.start_link(%{
        double: fn [x] -> {:ok, [f32(Enum.map(Tensor.to_list(x), &(&1 * 2)))]} end
      })

    exe = XlaNode.compile!(pool, PoolHelpers.doubling())

    for i <- 1..9 do
      assert {:ok, [y]} = XlaNode.run(pool, exe, [f32([i, 0, 0, 0])], callback_server: server)
      assert Tensor.to_list(y) == [2 * i + 1.0, 1.0, 1.0, 1.0]
    end

    # A caller killed while its run waits: the pool no longer counts the run in flight.
    {:ok, stuck} =
      XlaNode.CallbackServer.start_link(%{double: fn _ -> Process.sleep(:infinity) end})

    caller = spawn(fn -> XlaNode.run(pool, exe, [f32([1, 1, 1, 1])], callback_server: stuck) end)
    assert Harness.eventually(fn -> Pool.status(pool).in_flight == 1 end)
    Process.exit(caller, :kill)
    assert Harness.eventually(fn -> Pool.status(pool).in_flight == 0 end)

    assert {:error, %Error{kind: :compile_error}} = XlaNode.compile(pool, "not MLIR")

    busy = XlaNode.compile!(pool, PoolHelpers.busy_sum(10))

    assert {:error, %Error{kind: :argument_error, node: node}} =
             XlaNode.run(pool, busy, [f32([1, 2, 3, 4])])

    assert node in names
    platform = Harness.platform()
    assert {:ok, %{platform: ^platform}} = XlaNode.info(pool)
    assert XlaNode.ping(pool) == :pong
    assert %{errors: 1} = Pool.status(pool)
  end
end
