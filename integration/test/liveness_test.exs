defmodule XlaNode.LivenessTest do
  @moduledoc """
  The node keeps answering everyone under mixed concurrent load: client processes on two BEAM
  nodes loop over tiny runs, runs large enough for XLA to execute them asynchronously, and runs
  that call back into a process on the other BEAM node, some of whose callback servers answer
  only after 2 s. Meanwhile a watchdog on the test node calls `:ping` every 10 ms with a 1 s
  timeout. Every request must be answered with the right result and no ping may time out.
  """
  use ExUnit.Case, async: false

  alias XlaNode.{Harness, Load}

  @moduletag :slow
  @moduletag timeout: 240_000

  @tiny """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %y = stablehlo.add %x, %one : tensor<4xf32>
    return %y : tensor<4xf32>
  }
  """

  # 256 KiB in and out: XLA's CPU client runs it asynchronously on its own threads.
  @big """
  func.func @main(%x: tensor<65536xf32>) -> tensor<65536xf32> {
    %two = stablehlo.constant dense<2.0> : tensor<65536xf32>
    %y = stablehlo.multiply %x, %two : tensor<65536xf32>
    return %y : tensor<65536xf32>
  }
  """

  setup_all do
    peers = for _ <- 1..2, do: Harness.start_peer(nil, [], cleanup: false)

    for peer <- peers do
      Harness.peer_call(peer, Load, :callback_server, [0, :liveness_fast])
      Harness.peer_call(peer, Load, :callback_server, [2_000, :liveness_slow])
    end

    on_exit(fn -> Enum.each(peers, &Harness.stop_peer/1) end)
    %{peers: peers}
  end

  setup do
    node = Harness.start_node()
    Harness.connect!(node)

    exes =
      for {kind, mlir} <- [tiny: @tiny, big: @big, callback: Load.callback_program(:liveness)], into: %{} do
        {:ok, exe} = GenServer.call({:xla, node.name}, {:compile, mlir}, 60_000)
        {kind, exe}
      end

    %{node: node, exes: exes}
  end

  # The requests a client on `peer` loops over; its callbacks go to the other peer.
  defp fast_mix(exes, peers, peer) do
    [other] = peers -- [peer]

    [
      {:tiny, exes.tiny},
      {:big, exes.big},
      {:callback, exes.callback, {:liveness_fast, other.node}}
    ]
  end

  defp on_peers(peers, fun) do
    peers
    |> Enum.map(fn peer -> Task.async(fn -> fun.(peer) end) end)
    |> Enum.map(&Task.await(&1, 200_000))
  end

  defp fast_load(node, exes, peers, clients_per_peer, duration_ms) do
    on_peers(peers, fn peer ->
      Harness.peer_call(peer, Load, :run_clients, [node.name, clients_per_peer, duration_ms, fast_mix(exes, peers, peer)], 200_000)
    end)
  end

  # `count` runs at once whose callback server answers after 2 s, split over the peers.
  defp slow_burst(node, exes, peers, count) do
    on_peers(peers, fn peer ->
      [other] = peers -- [peer]
      Harness.peer_call(peer, Load, :burst, [node.name, exes.callback, {:liveness_slow, other.node}, div(count, length(peers))], 200_000)
    end)
  end

  defp assert_all_answered(summaries) do
    for s <- List.flatten(summaries) do
      assert s.failed == 0, "#{s.failed} requests failed, the first: #{inspect(s.failures)}"
    end

    Enum.sum(for s <- List.flatten(summaries), do: s.ok)
  end

  defp with_watchdog(node, fun) do
    watchdog = Task.async(fn -> watch(node.name, System.monotonic_time(:millisecond), 0, 0, 0) end)
    result = fun.()
    send(watchdog.pid, :stop)
    %{pings: pings, timeouts: timeouts, max_ms: max_ms} = Task.await(watchdog, 5_000)
    assert timeouts == 0, "#{timeouts} of #{pings} pings timed out (1 s); the slowest answered in #{max_ms} ms"
    assert pings > 100
    result
  end

  defp watch(name, _started, pings, timeouts, max_ms) do
    receive do
      :stop -> %{pings: pings, timeouts: timeouts, max_ms: max_ms}
    after
      10 ->
        t0 = System.monotonic_time(:millisecond)

        answered =
          try do
            GenServer.call({:xla, name}, :ping, 1_000) == :pong
          catch
            :exit, _ -> false
          end

        took = System.monotonic_time(:millisecond) - t0
        watch(name, t0, pings + 1, timeouts + if(answered, do: 0, else: 1), max(max_ms, took))
    end
  end

  defp info(node) do
    {:ok, info} = GenServer.call({:xla, node.name}, :info)
    info
  end

  test "a large run, a callback run 2 ms later and a tiny run, then mixed fast load from 4 clients", %{node: node, exes: exes, peers: [a, b] = peers} do
    with_watchdog(node, fn ->
      big = Task.async(fn -> Load.request(node.name, {:big, exes.big}, 1) end)
      Process.sleep(2)
      callback = Task.async(fn -> Load.request(node.name, {:callback, exes.callback, {:liveness_fast, b.node}}, 2) end)
      tiny = Task.async(fn -> Load.request(node.name, {:tiny, exes.tiny}, 3) end)
      assert Enum.map([big, callback, tiny], &Task.await(&1, 30_000)) == [:ok, :ok, :ok]

      total = assert_all_answered(fast_load(node, exes, peers, 2, 15_000))
      assert total > 100
      assert a != b
    end)

    assert %{callbacks: %{pending: 0, open_runs: 0}, runs_queued: 0} = info(node)
  end

  test "50 runs waiting 2 s for their callbacks, with 4 fast clients alongside", %{node: node, exes: exes, peers: peers} do
    with_watchdog(node, fn ->
      slow = Task.async(fn -> slow_burst(node, exes, peers, 50) end)
      fast = fast_load(node, exes, peers, 2, 8_000)
      assert_all_answered(fast)
      assert assert_all_answered(Task.await(slow, 200_000)) == 50
    end)

    assert %{callbacks: %{pending: 0, open_runs: 0, replies: replies}, runs_queued: 0} = info(node)
    assert replies >= 50
  end

  test "both loads at once: fast clients while bursts of 50 slow callback runs come and go", %{node: node, exes: exes, peers: peers} do
    with_watchdog(node, fn ->
      slow =
        Task.async(fn ->
          for _ <- 1..2, do: slow_burst(node, exes, peers, 50)
        end)

      fast = fast_load(node, exes, peers, 2, 15_000)
      assert_all_answered(fast)
      assert assert_all_answered(Task.await(slow, 200_000)) == 100
    end)

    assert %{callbacks: %{pending: 0, open_runs: 0}, runs_queued: 0} = info(node)
  end

  # The node's run limits (24 of 28) are set below the 32 computations XLA's CPU client holds
  # per device. A client node with runs in flight leaves 2 of them to the nodes with none: this
  # node takes 22, peers a and b one each.
  @tag :cpu_only
  test "beyond 24 runs that call back, the rest queue in the node; a run that cannot start within its queue_timeout fails", %{node: node, exes: exes, peers: [a, b]} do
    slow = {:liveness_slow, b.node}
    x = Load.f32(1.0, 4)
    waiting = for _ <- 1..22, do: Task.async(fn -> GenServer.call({:xla, node.name}, {:run, exes.callback, [x], [callback_server: slow]}, 30_000) end)
    assert Harness.eventually(fn -> info(node).runs_running == 22 end, 5_000, 25)
    others = for peer <- [a, b], do: Task.async(fn -> Harness.peer_call(peer, Load, :burst, [node.name, exes.callback, slow, 1], 30_000) end)
    assert Harness.eventually(fn -> info(node).runs_running == 24 end, 5_000, 25)

    # Runs without callbacks have places of their own.
    assert Load.request(node.name, {:tiny, exes.tiny}, 7) == :ok

    assert {:error, {:timeout, message}} =
             GenServer.call({:xla, node.name}, {:run, exes.callback, [x], [callback_server: slow, queue_timeout: 100]}, 10_000)

    assert message =~ "could not start within its queue_timeout of 100 ms"
    assert message =~ "24 runs were executing (24 of them programs that call back"

    # Queued, counted in :info, and started once a place frees.
    queued = Task.async(fn -> GenServer.call({:xla, node.name}, {:run, exes.callback, [x], [callback_server: slow]}, 30_000) end)
    assert Harness.eventually(fn -> info(node).runs_queued == 1 end, 5_000, 25)
    {bin, _} = x
    expected = Load.plus_one(bin)
    for task <- [queued | waiting], do: assert({:ok, [{^expected, _}]} = Task.await(task, 30_000))
    for task <- others, do: assert(%{ok: 1, failed: 0} = Task.await(task, 30_000))

    assert %{runs_running: 0, runs_queued: 0, queue_timeouts: 1} = info(node)

    assert {:error, {:argument_error, text}} = GenServer.call({:xla, node.name}, {:run, exes.tiny, [x], [queue_timeout: :soon]})
    assert text =~ "queue_timeout must be a non-negative number of milliseconds or :infinity"
  end

  # Counts its runs against the same CPU-client limits.
  @tag :cpu_only
  test "SIGTERM ends the node while its runs wait on callbacks that never answer", %{node: node, exes: exes, peers: [_, b]} do
    silent = Harness.peer_call(b, :erlang, :spawn, [Process, :sleep, [:infinity]])
    x = Load.f32(1.0, 4)

    for _ <- 1..30 do
      spawn(fn -> GenServer.call({:xla, node.name}, {:run, exes.callback, [x], [callback_server: silent, callback_timeout: :infinity]}, :infinity) end)
    end

    # 22 of this node's: it leaves 2 places to nodes with nothing in flight.
    assert Harness.eventually(fn -> match?(%{runs_running: 22, runs_queued: 8}, info(node)) end, 5_000, 25)
    assert Harness.stop_node(node, "TERM", 10_000) != :timeout
  end
end
