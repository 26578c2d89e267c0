defmodule XlaNode.RobustnessTest do
  @moduledoc """
  Hostile or broken peers (raw TCP and a hand-written distribution client): the node drops the
  offending connection when a frame or control message is broken, fails only the message when
  its payload is, logs it, and keeps serving everyone else.
  """
  use ExUnit.Case, async: true

  alias XlaNode.Harness
  alias XlaNode.Harness.RawDist

  setup do
    node = Harness.start_node()
    Harness.connect!(node)
    %{node: node}
  end

  defp assert_still_serving(node) do
    assert Harness.os_alive?(node)
    assert GenServer.call({:xla, node.name}, :ping) == :pong
    assert node.name in Node.list(:hidden)
    # New connections are still accepted.
    {:ok, conn} = RawDist.connect(node)
    assert {:ok, :pong} = RawDist.gen_call(conn, :xla, :ping)
    RawDist.close(conn)
  end

  defp assert_dropped(node, conn) do
    assert RawDist.await_closed(conn, 5_000) == :closed
    assert {:ok, _} = Harness.wait_for_log(node, [conn.name, "dropping the connection"], 5_000)
    assert {:ok, _} = Harness.wait_for_log(node, [conn.name, "nodedown"], 5_000)
  end

  test "the raw client itself works: handshake, call, echo", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    assert {:ok, :pong} = RawDist.gen_call(conn, :xla, :ping)
    assert {:ok, {1, "two", [3]}} = RawDist.gen_call(conn, :xla, {:echo, {1, "two", [3]}})
    assert {:ok, _} = Harness.wait_for_log(node, [conn.name, "nodeup"])
    RawDist.close(conn)
    assert {:ok, _} = Harness.wait_for_log(node, [conn.name, "nodedown"])
  end

  test "garbage before the handshake", %{node: node} do
    # A short length prefix and junk: refused at once.
    {:ok, s} = RawDist.open(node)
    :ok = :gen_tcp.send(s, <<0, 20>> <> :crypto.strong_rand_bytes(998))
    assert RawDist.await_closed(s, 5_000) == :closed

    # Random bytes: the first two read as a length that may exceed what was sent; the node then
    # waits for the rest until the setup timeout (7 s, as OTP's net_setuptime) and closes.
    {:ok, s} = RawDist.open(node)
    :ok = :gen_tcp.send(s, :crypto.strong_rand_bytes(1000))
    assert GenServer.call({:xla, node.name}, :ping) == :pong
    assert RawDist.await_closed(s, 10_000) == :closed
    assert_still_serving(node)
  end

  test "a bogus handshake message type and an oversized length prefix", %{node: node} do
    {:ok, s} = RawDist.open(node)
    :ok = RawDist.send_hs(s, "Xnot a handshake")
    assert RawDist.await_closed(s, 5_000) == :closed

    {:ok, s} = RawDist.open(node)
    :ok = :gen_tcp.send(s, <<0xFFFF::16, "short">>)
    :gen_tcp.close(s)
    assert_still_serving(node)
  end

  test "an aborted handshake: a valid-length send_name prefix, then close", %{node: node} do
    {:ok, s} = RawDist.open(node)
    name_msg = RawDist.send_name("aborted@#{Harness.host()}")
    full = <<byte_size(name_msg)::16, name_msg::binary>>
    :ok = :gen_tcp.send(s, binary_part(full, 0, 9))
    :gen_tcp.close(s)
    assert {:ok, _} = Harness.wait_for_log(node, "handshake aborted", 5_000)
    assert_still_serving(node)
  end

  test "a handshake without the mandatory flags is refused", %{node: node} do
    assert {:error, _} = RawDist.connect(node, flags: 0x4)
    assert_still_serving(node)
  end

  test "a handshake that stops after the status (never replies to the challenge)", %{node: node} do
    {:ok, s} = RawDist.open(node)
    :ok = RawDist.send_hs(s, RawDist.send_name("silent@#{Harness.host()}"))
    assert {:ok, "sok"} = RawDist.recv_hs(s)
    assert {:ok, <<?N, _::binary>>} = RawDist.recv_hs(s)
    # Meanwhile everyone else is served.
    assert GenServer.call({:xla, node.name}, :ping) == :pong
    :gen_tcp.close(s)
    assert_still_serving(node)
  end

  test "garbage frames after the handshake", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    assert {:ok, :pong} = RawDist.gen_call(conn, :xla, :ping)
    :ok = RawDist.send_frame(conn, <<1, 2, 3, 4, 5, 6, 7>>)
    assert_dropped(node, conn)
    assert_still_serving(node)
  end

  test "a pass-through frame holding a non-term", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    :ok = RawDist.send_frame(conn, <<112, 131, 255, 0, 0>>)
    assert_dropped(node, conn)
    assert_still_serving(node)
  end

  test "a control message that is not a known operation", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    :ok = RawDist.send_frame(conn, RawDist.pass_through({999, :what}))
    # The BEAM kills a connection that sends an undefined operation; this node ignores it
    # (and any operation it does not implement). Either way nobody else is disturbed.
    assert_still_serving(node)
    RawDist.close(conn)
  end

  test "a control message too short for its operation", %{node: node} do
    # SEND without its pid, EXIT without its target, ALIAS_SEND without its alias.
    for {control, payload} <- [{{2}, :hi}, {{3, :self}, nil}, {{33, :self}, :hi}] do
      {:ok, conn} = RawDist.connect(node)
      control = with {op, :self} <- control, do: {op, RawDist.pid(conn)}
      :ok = RawDist.send_frame(conn, RawDist.pass_through(control, payload))
      assert_dropped(node, conn)
    end

    assert_still_serving(node)
  end

  test "erpc (SPAWN_REQUEST) is refused by the BEAM itself: the node does not advertise spawn",
       %{node: node} do
    assert {:erpc, :notsup} = catch_error(:erpc.call(node.name, :erlang, :node, [], 2_000))
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end

  test "a truncated frame, then close", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    frame = RawDist.pass_through({6, RawDist.pid(conn), :"", :xla}, {:hello, "world"})
    :ok = RawDist.send_raw(conn, <<byte_size(frame)::32, binary_part(frame, 0, 10)::binary>>)
    RawDist.close(conn)
    assert {:ok, _} = Harness.wait_for_log(node, [conn.name, "nodedown"], 5_000)
    assert_still_serving(node)
  end

  test "a frame length beyond the limit", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    :ok = RawDist.send_raw(conn, <<0xFFFF_FFFF::32, 1, 2, 3>>)
    assert_dropped(node, conn)
    assert_still_serving(node)
  end

  test "a huge length announced, little data sent, connection left open", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    # 1 GiB announced: the node must not allocate it up front.
    :ok = RawDist.send_raw(conn, <<0x4000_0000::32, 112, 131>>)
    Process.sleep(300)
    assert_still_serving(node)
    RawDist.close(conn)
    assert {:ok, _} = Harness.wait_for_log(node, [conn.name, "nodedown"], 5_000)
  end

  # The message fails, with one log line; the connection serves on.
  defp assert_message_dropped(node, conn) do
    assert {:ok, _} = Harness.wait_for_log(node, [conn.name, "could not be decoded"], 5_000)
    assert {:ok, :pong} = RawDist.gen_call(conn, :xla, :ping)
    refute Harness.log(node) =~ ~r/#{Regex.escape(conn.name)}.*nodedown/
  end

  test "a list header claiming 4 billion elements with no data", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    control = :erlang.term_to_binary({6, RawDist.pid(conn), :"", :xla})
    body = <<112, control::binary, 131, 108, 0xFFFF_FFFF::32>>
    :ok = RawDist.send_frame(conn, body)
    assert_message_dropped(node, conn)
    assert_still_serving(node)
  end

  test "binary and map headers claiming more than the frame holds", %{node: node} do
    control = :erlang.term_to_binary({6, :c.pid(0, 1, 0), :"", :xla})

    for payload <- [<<131, 109, 0xFFFF_FFF0::32, 1, 2>>, <<131, 116, 0xFFFF_FFFF::32, 97, 1>>] do
      {:ok, conn} = RawDist.connect(node)
      :ok = RawDist.send_frame(conn, <<112, control::binary, payload::binary>>)
      assert_message_dropped(node, conn)
      RawDist.close(conn)
    end

    assert_still_serving(node)
  end

  test "100,000 nested tuples in a call to :xla", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    deep = Enum.reduce(1..100_000, :leaf, fn _, acc -> {acc} end)
    # The node bounds nesting depth (the BEAM itself has no limit): that call fails alone.
    assert {:ok, {:error, {:bad_request, message}}} = RawDist.gen_call(conn, :xla, {:echo, deep})
    assert message =~ "nested deeper"
    assert_message_dropped(node, conn)
    assert_still_serving(node)
  end

  test "100,000 nested lists in a SEND to :xla", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    deep = Enum.reduce(1..100_000, [], fn _, acc -> [acc] end)
    :ok = RawDist.reg_send(conn, :xla, {:nested, deep})
    assert_message_dropped(node, conn)
    assert_still_serving(node)
  end

  test "an atom-cache header although no atom cache was negotiated", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    :ok = RawDist.send_frame(conn, <<131, ?D, 1, 0, 0, 0>>)
    assert_dropped(node, conn)
    assert_still_serving(node)
  end

  test "a continuation fragment with no first fragment", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    :ok = RawDist.send_frame(conn, <<131, ?F, 7::64, 3::64, 1, 2, 3>>)
    assert_dropped(node, conn)
    assert_still_serving(node)
  end

  test "legit after all that: a 1,000,000-element list echo over a BEAM connection", %{node: node} do
    {:ok, conn} = RawDist.connect(node)
    :ok = RawDist.send_frame(conn, <<1, 2, 3>>)
    assert_dropped(node, conn)
    list = Enum.to_list(1..1_000_000)
    assert GenServer.call({:xla, node.name}, {:echo, list}, 60_000) === list
  end

  test "the raw client's own connection survives a burst of calls", %{node: node} do
    {:ok, conn} = RawDist.connect(node)

    for i <- 1..200 do
      assert {:ok, {:n, ^i}} = RawDist.gen_call(conn, :xla, {:echo, {:n, i}})
    end

    RawDist.close(conn)
    assert_still_serving(node)
  end
end
