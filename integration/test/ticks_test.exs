defmodule XlaNode.TicksTest do
  @moduledoc """
  net_ticktime: an idle connection stays up; a frozen peer is declared down.

  The runner (net_ticktime 60) never connects to these nodes: a node with net_ticktime 4 would
  rightly drop a peer that ticks only every 15 s. Peers use `connection: :standard_io`.
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, PeerHelpers}

  @ticktime 4

  setup do
    node = Harness.start_node(net_ticktime: @ticktime)

    peer =
      Harness.start_peer(nil, ["-kernel", "net_ticktime", "#{@ticktime}"], connection: :standard_io)

    assert {true, {:ok, :pong}} = Harness.peer_call(peer, PeerHelpers, :connect_and_ping, [node.name])
    %{node: node, peer: peer}
  end

  @tag :slow
  @tag timeout: 60_000
  test "a silent connection survives 5 x net_ticktime", %{node: node, peer: peer} do
    Process.sleep(5 * @ticktime * 1000)
    assert node.name in Harness.peer_call(peer, :erlang, :nodes, [:hidden])
    assert {:ok, :pong} = Harness.peer_call(peer, PeerHelpers, :call, [{:xla, node.name}, :ping])
    assert Harness.log_matching(node, ["nodedown", Atom.to_string(peer.node)]) == []
  end

  @tag timeout: 60_000
  test "a frozen (SIGSTOP) peer is declared down within about net_ticktime", %{node: node, peer: peer} do
    Harness.signal_peer(peer, "STOP")
    {ms, found} = Harness.timed(fn -> Harness.wait_for_log(node, ["nodedown", Atom.to_string(peer.node)], 15_000) end)
    Harness.signal_peer(peer, "KILL")
    assert {:ok, _line} = found
    assert ms >= (@ticktime - 1) * 1000, "declared down after only #{ms} ms"
    assert Harness.os_alive?(node)
  end
end
