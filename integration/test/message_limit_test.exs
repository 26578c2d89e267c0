defmodule XlaNode.MessageLimitTest do
  @moduledoc """
  `--max-message-bytes`: a peer sending a message larger than the limit, in one frame or in
  fragments that add up past it, is disconnected with one log line naming it, while another
  peer's runs go on throughout.
  """
  use ExUnit.Case, async: true
  import Bitwise

  alias XlaNode.{Harness, Load}
  alias XlaNode.Harness.RawDist

  @limit 1024 * 1024
  @fragments 0x800000

  setup do
    node = Harness.start_node(args: ["--max-message-bytes", "1M"])
    Harness.connect!(node)
    {:ok, exe} = GenServer.call({:xla, node.name}, {:compile, Load.plus_one_program()})
    %{node: node, exe: exe}
  end

  defp assert_cut_off(node, conn) do
    assert RawDist.await_closed(conn, 5_000) == :closed

    assert {:ok, line} =
             Harness.wait_for_log(node, [conn.name, "larger than --max-message-bytes"], 5_000)

    assert line =~ "#{@limit} bytes"
    # One warning; the nodedown line that follows repeats the reason.
    warnings = Harness.log_matching(node, [conn.name, "larger than --max-message-bytes", "WARN"])
    assert length(warnings) == 1
  end

  test "one frame over the limit cuts that peer off; other runs go on", %{node: node, exe: exe} do
    runs = Load.start_runs(node, exe)
    {:ok, conn} = RawDist.connect(node)
    assert {:ok, :pong} = RawDist.gen_call(conn, :xla, :ping)
    big = :binary.copy(<<7>>, @limit + 1)

    :ok =
      RawDist.reg_send(conn, :xla, {:"$gen_call", {RawDist.pid(conn), make_ref()}, {:echo, big}})

    assert_cut_off(node, conn)
    assert {ok, []} = Load.stop_runs(runs)
    assert ok > 0
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end

  test "fragments adding up past the limit cut the peer off before the rest is read", %{
    node: node,
    exe: exe
  } do
    runs = Load.start_runs(node, exe)
    {:ok, conn} = RawDist.connect(node, flags: RawDist.default_flags() ||| @fragments)
    control = {6, RawDist.pid(conn), :"", :xla}

    payload =
      {:"$gen_call", {RawDist.pid(conn), make_ref()}, {:echo, :binary.copy(<<9>>, 3 * @limit)}}

    # Each fragment alone is well within the limit.
    [first, second | _] = RawDist.fragments(control, payload, div(@limit, 2) + 1)
    :ok = RawDist.send_frame(conn, first)
    Process.sleep(100)
    :ok = RawDist.send_frame(conn, second)
    assert_cut_off(node, conn)
    assert {ok, []} = Load.stop_runs(runs)
    assert ok > 0
  end

  test "messages up to the limit pass, in one frame or in fragments", %{node: node} do
    under = :binary.copy(<<5>>, @limit - 4096)
    assert GenServer.call({:xla, node.name}, {:echo, under}, 30_000) == under

    {:ok, conn} = RawDist.connect(node)
    assert {:ok, ^under} = RawDist.gen_call(conn, :xla, {:echo, under}, 30_000)
    RawDist.close(conn)
  end
end
