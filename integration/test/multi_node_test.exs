defmodule XlaNode.MultiNodeTest do
  @moduledoc "Several BEAM nodes using one xla_node at once; large messages from several nodes."
  use ExUnit.Case, async: false

  alias XlaNode.{Harness, PeerHelpers}

  setup do
    node = Harness.start_node()
    Harness.connect!(node)
    a = Harness.start_peer()
    b = Harness.start_peer()

    for p <- [a, b] do
      assert {true, {:ok, :pong}} = Harness.peer_call(p, PeerHelpers, :connect_and_ping, [node.name])
    end

    %{node: node, a: a, b: b}
  end

  test "two BEAM nodes connected at once both show in :info peers", %{node: node, a: a, b: b} do
    {:ok, %{peers: peers}} = GenServer.call({:xla, node.name}, :info)
    assert Enum.sort([node(), a.node, b.node]) == Enum.sort(peers)

    for p <- [a, b] do
      assert node.name in Harness.peer_call(p, :erlang, :nodes, [:hidden])
      refute node.name in Harness.peer_call(p, :erlang, :nodes, [])
    end
  end

  test "concurrent calls from two nodes and the runner", %{node: node, a: a, b: b} do
    tasks =
      for p <- [a, b] do
        Task.async(fn -> Harness.peer_call(p, PeerHelpers, :concurrent_echoes, [node.name, 500], 60_000) end)
      end

    local =
      1..200
      |> Task.async_stream(fn i -> GenServer.call({:xla, node.name}, {:echo, {:local, i}}) == {:local, i} end)
      |> Enum.count(&(&1 == {:ok, true}))

    assert Enum.map(tasks, &Task.await(&1, 60_000)) == [500, 500]
    assert local == 200
  end

  test "a worker spawned for one node is callable and monitorable from another", %{node: node, a: a, b: b} do
    {:ok, {:ok, pid}} = Harness.peer_call(a, PeerHelpers, :call, [{:xla, node.name}, :spawn_echo])
    assert {:ok, :pong} = Harness.peer_call(b, PeerHelpers, :call, [pid, :ping])

    # b's pid, echoed through the node by a, comes back to b intact.
    b_pid = Harness.peer_call(b, :erlang, :whereis, [:init])
    assert {:ok, ^b_pid} = Harness.peer_call(a, PeerHelpers, :call, [{:xla, node.name}, {:echo, b_pid}])

    ref = Process.monitor(pid)
    assert {:ok, :pong} = Harness.peer_call(b, PeerHelpers, :call, [pid, :ping])
    GenServer.stop(pid, :from_runner)
    assert_receive {:DOWN, ^ref, :process, ^pid, :from_runner}, 2_000
  end

  test "one node going down does not disturb the other", %{node: node, a: a, b: b} do
    Harness.signal_peer(a, "KILL")
    assert {:ok, _} = Harness.wait_for_log(node, ["nodedown", Atom.to_string(a.node)], 5_000)
    assert Harness.peer_call(b, PeerHelpers, :concurrent_echoes, [node.name, 100], 30_000) == 100
    {:ok, %{peers: peers}} = GenServer.call({:xla, node.name}, :info)
    assert b.node in peers
    refute a.node in peers
  end

  @tag :slow
  @tag timeout: 240_000
  test "64 MiB echoes from two nodes at once while small pings go through", %{node: node, a: a, b: b} do
    size = 64 * 1024 * 1024

    big =
      for p <- [a, b] do
        Task.async(fn -> Harness.peer_call(p, PeerHelpers, :echo_big, [node.name, size], 200_000) end)
      end

    pinger =
      Task.async(fn ->
        Enum.map(1..40, fn _ ->
          Process.sleep(50)
          Harness.timed(fn -> GenServer.call({:xla, node.name}, :ping, 60_000) end)
        end)
      end)

    pings = Task.await(pinger, 200_000)
    results = Enum.map(big, &Task.await(&1, 200_000))

    assert Enum.all?(pings, fn {_ms, r} -> r == :pong end)
    assert [{:ok, ms_a}, {:ok, ms_b}] = results

    latencies = Enum.map(pings, &elem(&1, 0))

    IO.puts(
      "\n  note: 2 x 64 MiB echoes took #{ms_a} / #{ms_b} ms; ping latency during transfer: " <>
        "median #{Float.round(Enum.at(Enum.sort(latencies), 20), 1)} ms, " <>
        "max #{Float.round(Enum.max(latencies), 1)} ms"
    )

    assert {:ok, %{node: _}} = GenServer.call({:xla, node.name}, :info)
  end
end
