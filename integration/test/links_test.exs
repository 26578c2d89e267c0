defmodule XlaNode.LinksTest do
  @moduledoc "Links and exit signals between BEAM processes and node processes."
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, PeerHelpers}

  setup do
    node = Harness.start_node()
    Harness.connect!(node)
    %{node: node}
  end

  # Runs `fun` in a fresh process that traps exits and forwards what it receives.
  defp trapping(fun) do
    test = self()

    spawn(fn ->
      Process.flag(:trap_exit, true)
      fun.()
      send(test, :ready)

      receive do
        :stop -> :ok
      end
    end)
    |> tap(fn _ -> assert_receive :ready, 5_000 end)
  end

  test "a trapping process linked to a worker gets {:EXIT, pid, reason} when it is killed",
       %{node: node} do
    pid = Harness.spawn_echo(node)
    Process.flag(:trap_exit, true)
    Process.link(pid)
    # The link is in place once a call has made the round trip (signals are ordered).
    assert GenServer.call(pid, :ping) == :pong
    Process.exit(pid, :boom)
    assert_receive {:EXIT, ^pid, :boom}, 2_000
    assert {:noproc, _} = catch_exit(GenServer.call(pid, :ping, 2_000))
  end

  test "Process.exit(pid, :kill) gives :killed to links and monitors", %{node: node} do
    pid = Harness.spawn_echo(node)
    Process.flag(:trap_exit, true)
    Process.link(pid)
    ref = Process.monitor(pid)
    Process.exit(pid, :kill)
    assert_receive {:EXIT, ^pid, :killed}, 2_000
    assert_receive {:DOWN, ^ref, :process, ^pid, :killed}, 2_000
  end

  test "Process.exit(pid, :normal) does not end a worker that does not trap exits", %{node: node} do
    pid = Harness.spawn_echo(node)
    ref = Process.monitor(pid)
    Process.exit(pid, :normal)
    assert GenServer.call(pid, :ping) == :pong
    refute_received {:DOWN, ^ref, _, _, _}
  end

  test "GenServer.stop of a linked worker: the trapping linker gets the reason", %{node: node} do
    pid = Harness.spawn_echo(node)
    Process.flag(:trap_exit, true)
    Process.link(pid)
    assert GenServer.stop(pid, :stopped_by_test) == :ok
    assert_receive {:EXIT, ^pid, :stopped_by_test}, 2_000
  end

  test "a linked BEAM process that dies takes the worker down with it", %{node: node} do
    pid = Harness.spawn_echo(node)
    ref = Process.monitor(pid)

    linker =
      spawn(fn ->
        Process.link(pid)

        receive do
          :die -> exit(:linker_died)
        end
      end)

    # Make sure the LINK reached the node before the exit.
    Process.sleep(100)
    send(linker, :die)
    assert_receive {:DOWN, ^ref, :process, ^pid, :linker_died}, 2_000
  end

  test "link to a pid of a stopped node incarnation: {:EXIT, pid, :noproc}", %{node: node} do
    old = Harness.spawn_echo(node)
    assert Harness.stop_node(node) == 0
    # The exit reaches this VM as a nodedown soon after, not with the stop itself.
    assert Harness.eventually(fn -> node.name not in Node.list(:hidden) end)
    again = Harness.start_node(sname: node.sname)
    Harness.connect!(again)

    Process.flag(:trap_exit, true)
    Process.link(old)
    assert_receive {:EXIT, ^old, :noproc}, 2_000
  end

  test "link to a dead worker of the running node: {:EXIT, pid, :noproc}", %{node: node} do
    pid = Harness.spawn_echo(node)
    GenServer.stop(pid, :normal)
    Process.flag(:trap_exit, true)
    Process.link(pid)
    assert_receive {:EXIT, ^pid, :noproc}, 2_000
  end

  test "link, unlink, then stop the worker: no EXIT", %{node: node} do
    pid = Harness.spawn_echo(node)
    Process.flag(:trap_exit, true)
    Process.link(pid)
    assert GenServer.call(pid, :ping) == :pong
    Process.unlink(pid)
    ref = Process.monitor(pid)
    GenServer.stop(pid, :after_unlink)
    assert_receive {:DOWN, ^ref, :process, ^pid, :after_unlink}, 2_000
    refute_receive {:EXIT, ^pid, _}, 300
  end

  test "link from a separate trapping process, unlink, kill: no EXIT there", %{node: node} do
    pid = Harness.spawn_echo(node)
    test = self()

    holder =
      trapping(fn ->
        Process.link(pid)
        Process.unlink(pid)
        Process.link(pid)
        Process.unlink(pid)
      end)

    ref = Process.monitor(pid)
    Process.exit(pid, :boom)
    assert_receive {:DOWN, ^ref, :process, ^pid, :boom}, 2_000

    send(holder, {:report, test})
    Process.sleep(200)
    {:messages, msgs} = Process.info(holder, :messages)
    refute Enum.any?(msgs, &match?({:EXIT, ^pid, _}, &1))
    send(holder, :stop)
  end

  test "a worker linked to a process on a third node that exits dies with its reason",
       %{node: node} do
    pid = Harness.spawn_echo(node)
    ref = Process.monitor(pid)
    peer = Harness.start_peer()
    assert {true, {:ok, :pong}} = Harness.peer_call(peer, PeerHelpers, :connect_and_ping, [node.name])

    assert {:ok, :third_node_reason} =
             Harness.peer_call(peer, PeerHelpers, :link_and_exit, [pid, :third_node_reason])

    assert_receive {:DOWN, ^ref, :process, ^pid, :third_node_reason}, 2_000
  end

  test "a worker linked to a process on a third node dies :noconnection when that node dies",
       %{node: node} do
    pid = Harness.spawn_echo(node)
    ref = Process.monitor(pid)
    peer = Harness.start_peer()
    assert {true, {:ok, :pong}} = Harness.peer_call(peer, PeerHelpers, :connect_and_ping, [node.name])
    _holder = Harness.peer_call(peer, PeerHelpers, :spawn_link_holder, [pid])
    # Round trip from the peer to the node so the LINK has arrived.
    assert {:ok, :pong} = Harness.peer_call(peer, PeerHelpers, :call, [pid, :ping])

    Harness.signal_peer(peer, "KILL")
    assert_receive {:DOWN, ^ref, :process, ^pid, :noconnection}, 5_000
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end

  test "a third node's process exiting normally does not end the linked worker", %{node: node} do
    pid = Harness.spawn_echo(node)
    peer = Harness.start_peer()
    assert {true, {:ok, :pong}} = Harness.peer_call(peer, PeerHelpers, :connect_and_ping, [node.name])
    assert {:ok, :normal} = Harness.peer_call(peer, PeerHelpers, :link_and_exit, [pid, :normal])
    assert GenServer.call(pid, :ping) == :pong
  end
end
