defmodule XlaNode.ProtocolTest do
  @moduledoc """
  The distribution protocol of OTP 28 and 29 as peers newer than this machine's OTP 25 speak it,
  played by the hand-written client: alias replies through ALTACT_SIG_SEND to peers that
  advertise DFLAG_ALTACT_SIG (ALIAS_SEND to the others), ALTACT_SIG_SEND from peers, OTP 29
  native records (RECORD_EXT), and payloads no decoder knows: each fails its own message or call,
  never the connection.
  """
  use ExUnit.Case, async: true

  import Bitwise

  alias XlaNode.Harness
  alias XlaNode.Harness.RawDist

  setup_all do
    Harness.start_shared_node()
  end

  @otp28 RawDist.default_flags() ||| RawDist.alias_flag() ||| RawDist.altact_sig_flag()
  @otp25 RawDist.default_flags() ||| RawDist.alias_flag()

  @add_one """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %y = stablehlo.add %x, %one : tensor<4xf32>
    return %y : tensor<4xf32>
  }
  """

  defp f32(list), do: for(v <- list, into: <<>>, do: <<v::float-32-little>>)

  # A proper list's bytes from encoded elements.
  defp list_bytes(elements), do: <<108, length(elements)::32>> <> Enum.join(elements) <> <<106>>

  # A monitor known to be in place: the call after it travels behind it on the same connection,
  # while signals from the raw client come over another.
  defp monitor(pid) do
    ref = Process.monitor(pid)
    :pong = GenServer.call(pid, :ping)
    ref
  end

  # The connection still serves: a call on it, and a call from a BEAM node.
  defp assert_serving(node, conn) do
    assert {:ok, :pong} = RawDist.gen_call(conn, :xla, :ping)
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end

  describe "alias replies" do
    test "the node advertises DFLAG_ALTACT_SIG, and not DFLAG_NATIVE_RECORDS", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)
      assert (conn.peer_flags &&& RawDist.altact_sig_flag()) != 0
      assert (conn.peer_flags &&& RawDist.alias_flag()) != 0
      assert (conn.peer_flags &&& RawDist.native_records_flag()) == 0
      RawDist.close(conn)
    end

    test "go through ALTACT_SIG_SEND with the ALIAS flag to a peer that has DFLAG_ALTACT_SIG",
         %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)
      assert {:ok, control, :pong} = RawDist.call(conn, :xla, :ping, alias: true)
      # {37, Flags, SenderPid, Alias}: the alias is the reference of the call's [:alias | ref].
      assert {37, 4, from, alias} = control
      assert is_pid(from) and node(from) == node.name
      assert is_reference(alias) and node(alias) == String.to_atom(conn.name)

      # Replies made on executor threads take the same path.
      assert {:ok, {37, 4, _, _}, {:ok, exe}} =
               RawDist.call(conn, :xla, {:compile, @add_one}, alias: true, timeout: 30_000)

      arg = {f32([1.0, 2.0, 3.0, 4.0]), {{:f, 32}, [4]}}

      assert {:ok, {37, 4, _, _}, {:ok, [{result, {{:f, 32}, [4]}}]}} =
               RawDist.call(conn, :xla, {:run, exe, [arg]}, alias: true, timeout: 30_000)

      assert result == f32([2.0, 3.0, 4.0, 5.0])
      # A call tagged with a plain reference is answered with a plain send, as before.
      assert {:ok, {2, _, _}, :pong} = RawDist.call(conn, :xla, :ping)
      RawDist.close(conn)
    end

    test "go through ALIAS_SEND to a peer without DFLAG_ALTACT_SIG (OTP 24-27)", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp25)
      assert {:ok, {33, from, alias}, :pong} = RawDist.call(conn, :xla, :ping, alias: true)
      assert is_pid(from) and node(from) == node.name
      assert is_reference(alias) and node(alias) == String.to_atom(conn.name)
      RawDist.close(conn)
    end
  end

  describe "ALTACT_SIG_SEND from a peer" do
    test "a message to a registered name, with priority and a trace token", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)
      assert {:ok, _, :pong} = RawDist.call(conn, :xla, :ping, via: {:altact, 0})

      prio_token = RawDist.altact(:prio) ||| RawDist.altact(:token)

      assert {:ok, _, {:x, 1}} =
               RawDist.call(conn, :xla, {:echo, {:x, 1}}, via: {:altact, prio_token})

      # Flag bits OTP does not define yet are ignored.
      assert {:ok, _, :pong} = RawDist.call(conn, :xla, :ping, via: {:altact, 0x80})
      RawDist.close(conn)
    end

    test "a message to a pid, and an exit signal to it", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)
      assert {:ok, worker} = GenServer.call({:xla, node.name}, :spawn_echo)
      assert {:ok, _, "hi"} = RawDist.call(conn, worker, {:echo, "hi"}, via: {:altact, 0})
      ref = monitor(worker)

      exit = {37, RawDist.altact(:exit) ||| RawDist.altact(:prio), RawDist.pid(conn), worker}
      :ok = RawDist.send_frame(conn, RawDist.pass_through(exit, :shutdown_now))
      assert_receive {:DOWN, ^ref, :process, ^worker, :shutdown_now}, 5_000
      assert_serving(node, conn)
      RawDist.close(conn)
    end

    test "a message to an alias this node never made is dropped", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)
      control = {37, RawDist.altact(:alias), RawDist.pid(conn), make_ref()}
      :ok = RawDist.send_frame(conn, RawDist.pass_through(control, :lost))
      assert_serving(node, conn)
      RawDist.close(conn)
    end

    test "a malformed one drops the connection, as OTP does", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)
      # ALIAS and NAME at once: nobody can tell whom it is for.
      control = {37, RawDist.altact(:alias) ||| RawDist.altact(:name), RawDist.pid(conn), :xla}
      :ok = RawDist.send_frame(conn, RawDist.pass_through(control, :what))
      assert RawDist.await_closed(conn, 5_000) == :closed
      assert {:ok, _} = Harness.wait_for_log(node, [conn.name, "ALTACT_SIG_SEND"], 5_000)
      assert GenServer.call({:xla, node.name}, :ping) == :pong
    end
  end

  describe "native records (RECORD_EXT)" do
    test "an echo of one is an argument error, and the connection serves on", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)
      record = RawDist.native_record(:shapes, :point, x: 1, y: 2.5)
      request = RawDist.tuple_bytes([:echo, {:encoded, record}])

      assert {:ok, {:error, {:argument_error, message}}} =
               RawDist.gen_call_encoded(conn, :xla, request)

      assert message =~ "native record"
      assert message =~ "#shapes:point{x, y}"
      assert_serving(node, conn)

      # Deep in a request, exported, in a spawned echo process's call too.
      exported = RawDist.native_record(:m, :r, [a: [1, 2]], true)
      nested = RawDist.tuple_bytes([:echo, {:encoded, list_bytes([exported])}])
      assert {:ok, {:error, {:argument_error, _}}} = RawDist.gen_call_encoded(conn, :xla, nested)
      {:ok, worker} = GenServer.call({:xla, node.name}, :spawn_echo)

      assert {:ok, _, {:error, {:argument_error, _}}} =
               RawDist.call(conn, worker, {:encoded, request})

      assert {:ok, _, "still here"} = RawDist.call(conn, worker, {:echo, "still here"})
      RawDist.close(conn)
    end

    test "one in a run request is an argument error", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)
      assert {:ok, {:ok, exe}} = RawDist.gen_call(conn, :xla, {:compile, @add_one}, 30_000)
      # {data, {type, #tensor:shape{dims = [4]}}} as the one argument.
      shape = RawDist.native_record(:tensor, :shape, dims: [4])
      type_and_shape = RawDist.tuple_bytes([{:f, 32}, {:encoded, shape}])
      arg = RawDist.tuple_bytes([f32([1.0, 2.0, 3.0, 4.0]), {:encoded, type_and_shape}])
      request = RawDist.tuple_bytes([:run, exe, {:encoded, list_bytes([arg])}])

      assert {:ok, {:error, {:argument_error, message}}} =
               RawDist.gen_call_encoded(conn, :xla, request, 30_000)

      assert message =~ "#tensor:shape{dims}"
      # The same run without the record works on the same connection.
      good = {f32([1.0, 2.0, 3.0, 4.0]), {{:f, 32}, [4]}}
      assert {:ok, {:ok, [_]}} = RawDist.gen_call(conn, :xla, {:run, exe, [good]}, 30_000)
      RawDist.close(conn)
    end

    test "one in a message that is not a call is passed on", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)

      payload =
        <<131>> <> RawDist.tuple_bytes([:note, {:encoded, RawDist.native_record(:m, :r, [])}])

      :ok =
        RawDist.send_frame(
          conn,
          RawDist.pass_through({6, RawDist.pid(conn), :"", :xla}, {:encoded, payload})
        )

      assert_serving(node, conn)
      RawDist.close(conn)
    end
  end

  describe "payloads that cannot be decoded" do
    test "a call whose request cannot be decoded gets a bad_request error", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)

      # A tag no decoder knows, an atom cache reference (none was negotiated), a binary longer
      # than the frame, nesting deeper than the node accepts.
      deep = String.duplicate(<<104, 1>>, 100_000) <> <<106>>

      for request <- [<<200, 1, 2>>, <<82, 0>>, <<109, 0xFFFF_FFF0::32, 1, 2>>, deep] do
        bytes = RawDist.tuple_bytes([:echo, {:encoded, request}])

        assert {:ok, {:error, {:bad_request, message}}} =
                 RawDist.gen_call_encoded(conn, :xla, bytes)

        assert message =~ "could not be decoded"
        assert_serving(node, conn)
      end

      # Through ALTACT_SIG_SEND, with an alias reply.
      assert {:ok, {37, 4, _, _}, {:error, {:bad_request, _}}} =
               RawDist.call(conn, :xla, {:encoded, <<200>>}, via: {:altact, 0}, alias: true)

      assert {:ok, _} =
               Harness.wait_for_log(node, [conn.name, "request could not be decoded"], 5_000)

      RawDist.close(conn)
    end

    test "a message that is not a call is dropped with one log line", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)
      control = {6, RawDist.pid(conn), :"", :xla}

      :ok =
        RawDist.send_frame(conn, RawDist.pass_through(control, {:encoded, <<131, 104, 2, 200>>}))

      assert {:ok, _} =
               Harness.wait_for_log(node, [conn.name, "dropping a message to xla"], 5_000)

      # To a name nobody holds, and a call whose caller cannot be read either.
      :ok =
        RawDist.send_frame(
          conn,
          RawDist.pass_through({6, RawDist.pid(conn), :"", :nobody}, {:encoded, <<131, 200>>})
        )

      bad_from = <<131, 104, 3>> <> RawDist.bare(:"$gen_call") <> <<82, 0, 97, 1>>
      :ok = RawDist.send_frame(conn, RawDist.pass_through(control, {:encoded, bad_from}))
      assert_serving(node, conn)
      RawDist.close(conn)
    end

    test "an exit signal whose reason cannot be decoded still arrives", %{node: node} do
      {:ok, conn} = RawDist.connect(node, flags: @otp28)
      {:ok, worker} = GenServer.call({:xla, node.name}, :spawn_echo)
      ref = monitor(worker)
      # PAYLOAD_EXIT2 {26, From, To} + an undecodable reason.
      :ok =
        RawDist.send_frame(
          conn,
          RawDist.pass_through({26, RawDist.pid(conn), worker}, {:encoded, <<131, 200>>})
        )

      assert_receive {:DOWN, ^ref, :process, ^worker, {:undecodable, message}}, 5_000
      assert message =~ "unsupported term tag 200"
      assert_serving(node, conn)
      RawDist.close(conn)
    end
  end
end
