defmodule XlaNode.ConnectTest do
  @moduledoc "Connecting from a BEAM node: hidden, ping, cookies."
  use ExUnit.Case, async: true

  alias XlaNode.Harness
  alias XlaNode.Harness.RawDist

  setup do
    %{node: Harness.start_node()}
  end

  test "Node.connect succeeds and the node is hidden", %{node: node} do
    assert Node.connect(node.name) == true
    assert node.name in Node.list(:hidden)
    refute node.name in Node.list()
    refute node.name in Node.list(:visible)
    assert {:ok, _} = Harness.wait_for_log(node, ["nodeup", Atom.to_string(node())])
  end

  test "the handshake does not advertise DFLAG_PUBLISHED", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    assert Bitwise.band(conn.peer_flags, RawDist.published_flag()) == 0
    assert conn.peer_name == Atom.to_string(node.name)
    RawDist.close(conn)
  end

  test ":net_adm.ping answers :pong", %{node: node} do
    assert :net_adm.ping(node.name) == :pong
    assert node.name in Node.list(:hidden)
  end

  test "wrong cookie: Node.connect is false and the node logs it exactly once", %{node: node} do
    Node.set_cookie(node.name, :definitely_wrong)
    assert Node.connect(node.name) == false
    refute node.name in Node.list(:hidden)

    me = Atom.to_string(node())
    assert {:ok, _} = Harness.wait_for_log(node, [me, "wrong cookie"], 5_000)
    Process.sleep(300)
    assert length(Harness.log_matching(node, [me, "wrong cookie"])) == 1

    # With the right cookie the same runner then connects.
    Node.set_cookie(node.name, node.cookie)
    assert Node.connect(node.name) == true
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end

  test "wrong cookie from a peer node", %{node: node} do
    peer = Harness.start_peer(nil, [], cookie: :another_cookie, connection: :standard_io)
    assert Harness.peer_call(peer, :net_kernel, :connect_node, [node.name]) == false
    peer_name = Atom.to_string(peer.node)
    assert {:ok, _} = Harness.wait_for_log(node, [peer_name, "wrong cookie"], 5_000)
    Process.sleep(300)
    assert length(Harness.log_matching(node, [peer_name, "wrong cookie"])) == 1
    # The runner (right cookie) is unaffected.
    Harness.connect!(node)
  end

  test "disconnect and reconnect", %{node: node} do
    Harness.connect!(node)
    :ok = :net_kernel.monitor_nodes(true, node_type: :all)
    name = node.name
    assert Node.disconnect(node.name) == true
    assert_receive {:nodedown, ^name, _}, 2_000
    assert {:ok, _} = Harness.wait_for_log(node, ["nodedown", Atom.to_string(node())])
    assert GenServer.call({:xla, node.name}, :ping) == :pong
    assert_receive {:nodeup, ^name, _}, 2_000
    :ok = :net_kernel.monitor_nodes(false, node_type: :all)
  end
end
