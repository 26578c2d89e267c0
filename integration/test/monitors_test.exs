defmodule XlaNode.MonitorsTest do
  @moduledoc "Monitors: GenServer.call failures, DOWN messages, stale pids, purge on node down."
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, PeerHelpers}

  setup do
    node = Harness.start_node()
    Harness.connect!(node)
    %{node: node}
  end

  test "GenServer.call to an unregistered name exits :noproc immediately", %{node: node} do
    {ms, result} =
      Harness.timed(fn ->
        try do
          GenServer.call({:no_such_name, node.name}, :ping, 5_000)
        catch
          :exit, reason -> {:exit, reason}
        end
      end)

    assert {:exit, {:noproc, {GenServer, :call, _}}} = result
    assert ms < 1_000, "took #{ms} ms: the node should answer the monitor with DOWN :noproc"
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end

  test "monitoring an unregistered name yields DOWN :noproc", %{node: node} do
    ref = Process.monitor({:no_such_name, node.name})
    assert_receive {:DOWN, ^ref, :process, {:no_such_name, name}, :noproc}, 2_000
    assert name == node.name
  end

  test "calls by pid to a spawn_echo worker", %{node: node} do
    pid = Harness.spawn_echo(node)
    assert GenServer.call(pid, :ping) == :pong
    assert GenServer.call(pid, {:echo, {:hello, self()}}) == {:hello, self()}
  end

  test "monitor a worker, GenServer.stop it: DOWN with the stop reason", %{node: node} do
    pid = Harness.spawn_echo(node)
    ref = Process.monitor(pid)
    assert GenServer.stop(pid, :bye) == :ok
    assert_receive {:DOWN, ^ref, :process, ^pid, :bye}, 2_000

    # A dead pid: calls exit :noproc and new monitors fire at once.
    assert {:noproc, _} = catch_exit(GenServer.call(pid, :ping, 2_000))
    ref2 = Process.monitor(pid)
    assert_receive {:DOWN, ^ref2, :process, ^pid, :noproc}, 2_000
  end

  test "several monitors on one worker all fire; a demonitored one does not", %{node: node} do
    pid = Harness.spawn_echo(node)
    refs = for _ <- 1..5, do: Process.monitor(pid)
    gone = Process.monitor(pid)
    assert Process.demonitor(gone)
    GenServer.stop(pid, {:shutdown, :tuple_reason})

    for ref <- refs do
      assert_receive {:DOWN, ^ref, :process, ^pid, {:shutdown, :tuple_reason}}, 2_000
    end

    refute_received {:DOWN, ^gone, _, _, _}
  end

  test "monitors by name: no DOWN while :xla lives, demonitor works", %{node: node} do
    ref = Process.monitor({:xla, node.name})
    assert GenServer.call({:xla, node.name}, :ping) == :pong
    refute_receive {:DOWN, ^ref, _, _, _}, 300
    assert Process.demonitor(ref, [:flush])
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end

  test "monitors of node processes get DOWN :noconnection when the node goes away", %{node: node} do
    pid = Harness.spawn_echo(node)
    ref = Process.monitor(pid)
    ref_name = Process.monitor({:xla, node.name})
    assert Harness.stop_node(node, "KILL") != 0
    assert_receive {:DOWN, ^ref, :process, ^pid, :noconnection}, 5_000
    assert_receive {:DOWN, ^ref_name, :process, _, :noconnection}, 5_000
  end

  @tag timeout: 60_000
  test "a pid from an earlier incarnation of the node is dead", %{node: node} do
    old = Harness.spawn_echo(node)
    assert GenServer.call(old, :ping) == :pong
    assert Harness.stop_node(node) == 0
    # The exit reaches this VM as a nodedown soon after, not with the stop itself.
    assert Harness.eventually(fn -> node.name not in Node.list(:hidden) end)

    again = Harness.start_node(sname: node.sname)
    assert again.name == node.name
    Harness.connect!(again)
    new = Harness.spawn_echo(again)
    assert new != old

    assert {:noproc, _} = catch_exit(GenServer.call(old, :ping, 2_000))
    ref = Process.monitor(old)
    assert_receive {:DOWN, ^ref, :process, ^old, :noproc}, 2_000
    assert GenServer.call(new, :ping) == :pong
  end

  test "monitors held by a peer that dies are purged; the node keeps working", %{node: node} do
    pid = Harness.spawn_echo(node)
    {:ok, %{processes: before}} = GenServer.call({:xla, node.name}, :info)

    peer = Harness.start_peer()
    assert {true, {:ok, :pong}} = Harness.peer_call(peer, PeerHelpers, :connect_and_ping, [node.name])

    for _ <- 1..20 do
      Harness.peer_call(peer, PeerHelpers, :spawn_monitor_holder, [pid])
      Harness.peer_call(peer, PeerHelpers, :spawn_monitor_holder, [{:xla, node.name}])
    end

    Harness.signal_peer(peer, "KILL")
    peer_name = Atom.to_string(peer.node)
    assert {:ok, _} = Harness.wait_for_log(node, ["nodedown", peer_name], 5_000)

    assert GenServer.call({:xla, node.name}, :ping) == :pong
    assert GenServer.call(pid, :ping) == :pong
    {:ok, %{processes: after_, peers: peers}} = GenServer.call({:xla, node.name}, :info)
    assert after_ == before
    refute peer.node in peers

    # The worker's monitors from the dead peer are gone: stopping it still works and only our
    # monitor fires.
    ref = Process.monitor(pid)
    GenServer.stop(pid, :done)
    assert_receive {:DOWN, ^ref, :process, ^pid, :done}, 2_000
    assert Harness.os_alive?(node)
  end

  test "monitors held by a peer that disconnects cleanly are purged", %{node: node} do
    pid = Harness.spawn_echo(node)
    peer = Harness.start_peer()
    assert {true, {:ok, :pong}} = Harness.peer_call(peer, PeerHelpers, :connect_and_ping, [node.name])
    Harness.peer_call(peer, PeerHelpers, :spawn_monitor_holder, [pid])
    assert Harness.peer_call(peer, :erlang, :disconnect_node, [node.name]) == true
    assert {:ok, _} = Harness.wait_for_log(node, ["nodedown", Atom.to_string(peer.node)], 5_000)
    assert GenServer.call(pid, :ping) == :pong
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end
end
