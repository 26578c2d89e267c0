defmodule XlaNode.ClientTest do
  @moduledoc """
  The Elixir client library (`elixir_client/`, app `:xla_node_client`) end to end against a real
  node: `XlaNode`, `XlaNode.Tensor`, `XlaNode.Error` and `XlaNode.CallbackServer`.
  """
  use ExUnit.Case, async: true

  alias XlaNode.{CallbackServer, Error, Harness, Tensor}

  @add_one """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %r = stablehlo.add %x, %one : tensor<4xf32>
    return %r : tensor<4xf32>
  }
  """

  setup_all do
    node = start_xla!(cleanup: false)
    on_exit(fn -> Harness.stop_node(node, "KILL") end)
    %{node: node.name}
  end

  # Starts a node and waits until `:xla` answers (the node registers in epmd a little before
  # its `:xla` server is up, so a ping right after `start_node/1` can find no process).
  defp start_xla!(opts \\ []) do
    xla = Harness.start_node(opts)
    true = Node.connect(xla.name)

    Harness.eventually(fn -> XlaNode.ping(xla.name) == :pong end, 30_000) ||
      raise "xla_node #{xla.name} does not answer ping\n--- log ---\n#{Harness.log(xla)}"

    xla
  end

  # EXLA's form of a host callback: operand 0 is the u8[8] callback handle the node supplies,
  # `callback_id` is term_to_binary(id) zero-padded to whole 64-bit words, read native-endian.
  defp callback_mlir(id, type \\ "tensor<4xf32>") do
    bin = :erlang.term_to_binary(id)
    padded = bin <> :binary.copy(<<0>>, rem(8 - rem(byte_size(bin), 8), 8))
    words = for <<w::signed-native-64 <- padded>>, do: Integer.to_string(w)

    """
    func.func @main(%cb: tensor<8xui8>, %x: #{type}) -> #{type} {
      %r = stablehlo.custom_call @exla_runtime_callback(%cb, %x) {api_version = 4 : i32, has_side_effect = true, backend_config = {callback_id = array<i64: #{Enum.join(words, ", ")}>, callback_id_size = #{byte_size(bin)} : ui64, num_aliased_data_outputs = 0 : ui64}} : (tensor<8xui8>, #{type}) -> #{type}
      return %r : #{type}
    }
    """
  end

  defp f32(list), do: Tensor.from_list(list, {:f, 32})

  describe "compile and run" do
    test "compile!/run! x + 1 on f32[4]", %{node: node} do
      exe = XlaNode.compile!(node, @add_one)
      assert is_reference(exe)

      assert [y] = XlaNode.run!(node, exe, [f32([1.0, 2.0, 3.0, 4.0])])
      assert Tensor.type(y) == {:f, 32}
      assert Tensor.shape(y) == [4]
      assert Tensor.to_list(y) == [2.0, 3.0, 4.0, 5.0]

      assert {:ok, [y]} = XlaNode.run(node, exe, [f32([-1.0, 0.5, :infinity, 1.0e6])])
      assert Tensor.to_list(y) == [0.0, 1.5, :infinity, 1_000_001.0]
    end

    test "the node name and {:xla, node} are the same server", %{node: node} do
      exe = XlaNode.compile!({:xla, node}, @add_one)
      assert [_] = XlaNode.run!(node, exe, [f32([1, 2, 3, 4])])
    end

    test "invalid MLIR gives a compile_error struct", %{node: node} do
      assert {:error, %Error{kind: :compile_error, message: message} = error} =
               XlaNode.compile(node, "this is not MLIR")

      assert is_binary(message) and message != ""
      assert Exception.message(error) == "compile_error: " <> message

      error = assert_raise Error, fn -> XlaNode.compile!(node, "func.func @main(") end
      assert error.kind == :compile_error
      assert Exception.message(error) =~ ~r/^compile_error: ./
    end

    test "wrong arguments give an argument_error struct", %{node: node} do
      exe = XlaNode.compile!(node, @add_one)

      assert {:error, %Error{kind: :argument_error}} = XlaNode.run(node, exe, [])

      assert {:error, %Error{kind: :argument_error, message: message}} =
               XlaNode.run(node, exe, [Tensor.from_list([1, 2, 3, 4], {:s, 32})])

      assert message =~ "argument 0"

      assert_raise Error, ~r/^argument_error: /, fn ->
        XlaNode.run!(node, exe, [f32([1.0, 2.0])])
      end

      # An unknown option is a mistake in the calling code: it raises before anything is sent.
      assert_raise ArgumentError, ~r/unknown option :no_such_option; valid options: /, fn ->
        XlaNode.run(node, exe, [f32([1, 2, 3, 4])], no_such_option: true)
      end
    end

    test "device buffers: keep_on_device, to_device, read, free", %{node: node} do
      exe = XlaNode.compile!(node, @add_one)

      buf = XlaNode.to_device!(node, f32([0, 0, 0, 0]))
      assert is_reference(buf)
      assert [out] = XlaNode.run!(node, exe, [buf], keep_on_device: true)
      assert is_reference(out)
      assert [out2] = XlaNode.run!(node, exe, [out], keep_on_device: true)
      assert XlaNode.read!(node, out2) |> Tensor.to_list() == [2.0, 2.0, 2.0, 2.0]
      assert {:ok, t} = XlaNode.read(node, buf)
      assert Tensor.to_list(t) == [0.0, 0.0, 0.0, 0.0]

      for ref <- [buf, out, out2, exe], do: assert(XlaNode.free(node, ref) == :ok)

      assert {:error, %Error{kind: :argument_error}} = XlaNode.read(node, buf)
      assert {:error, %Error{kind: :argument_error}} = XlaNode.free(node, buf)
      assert {:error, %Error{kind: :argument_error}} = XlaNode.run(node, exe, [f32([1, 2, 3, 4])])
      assert_raise Error, ~r/^argument_error: /, fn -> XlaNode.free!(node, exe) end
    end

    test "tensors of other types survive a round trip through the device", %{node: node} do
      for {values, type} <- [
            {[1.0, -2.5, 65504.0, :infinity], {:f, 16}},
            {[1.0, -2.5, 3.3895313892515355e38, :neg_infinity], {:bf, 16}},
            {[1.0e300, -0.5], {:f, 64}},
            {[-128, 127], {:s, 8}},
            {[-9_223_372_036_854_775_808, 9_223_372_036_854_775_807], {:s, 64}},
            {[0, 18_446_744_073_709_551_615], {:u, 64}},
            {[{1.0, -1.0}, {0.5, 2.0}], {:c, 64}},
            {[{1.0e200, -1.0}], {:c, 128}},
            {[1, 0, 1], {:pred, 8}}
          ] do
        t = Tensor.from_list(values, type)
        back = XlaNode.read!(node, XlaNode.to_device!(node, t))
        assert back == t, "#{inspect(type)}: #{inspect(back)}"
        assert Tensor.to_list(back) == values
      end
    end
  end

  describe "status and failures" do
    test "ping and info", %{node: node} do
      assert XlaNode.ping(node) == :pong
      assert {:ok, %{node: ^node} = info} = XlaNode.info(node)
      assert is_binary(info.version)
      assert is_integer(info[:runs] || 0)
    end

    test "an unknown node gives :nodedown, not an exit" do
      name = :"#{Harness.unique_name("absent")}@#{Harness.host()}"
      assert {:error, %Error{kind: :nodedown}} = XlaNode.ping(name)
      assert {:error, %Error{kind: :nodedown}} = XlaNode.compile(name, @add_one)
      assert_raise Error, ~r/^nodedown: /, fn -> XlaNode.run!(name, make_ref(), []) end
    end

    test "a server term with nothing registered gives :noproc", %{node: node} do
      assert {:error, %Error{kind: :noproc}} = XlaNode.ping({:not_xla, node})
    end

    # Starts a node of its own: slow on a loaded machine.
    @tag :slow
    test "a node that dies during a run gives :nodedown to the caller" do
      xla = start_xla!()
      exe = XlaNode.compile!(xla.name, callback_mlir(:hang))

      # The callback never answers: the run waits until the node is killed.
      {:ok, cb} = CallbackServer.start_link(%{hang: fn _ -> Process.sleep(:infinity) end})

      task =
        Task.async(fn ->
          XlaNode.run(xla.name, exe, [f32([1, 2, 3, 4])], callback_server: cb)
        end)

      Process.sleep(300)
      Harness.stop_node(xla, "KILL")
      assert {:error, %Error{kind: :nodedown}} = Task.await(task, 15_000)
    end

    test "a short :timeout gives a :timeout error", %{node: node} do
      exe = XlaNode.compile!(node, callback_mlir(:slow))

      {:ok, cb} =
        CallbackServer.start_link(%{slow: fn [x] -> Process.sleep(500) && {:ok, [x]} end})

      assert {:error, %Error{kind: :timeout}} =
               XlaNode.run(node, exe, [f32([1, 2, 3, 4])], callback_server: cb, timeout: 100)

      # no late reply leaks into the mailbox
      Process.sleep(700)
      refute_received {_, {:ok, _}}
    end
  end

  describe "callbacks" do
    @describetag :callbacks

    test "a runtime callback served by a CallbackServer", %{node: node} do
      test = self()

      {:ok, cb} =
        CallbackServer.start_link(%{
          double: fn [x] ->
            send(test, {:callback_args, x})
            {:ok, [x |> Tensor.to_list() |> Enum.map(&(&1 * 2)) |> f32()]}
          end
        })

      exe = XlaNode.compile!(node, callback_mlir(:double))
      x = f32([1.0, 2.0, 3.0, 4.5])
      assert [y] = XlaNode.run!(node, exe, [x], callback_server: cb)
      assert Tensor.to_list(y) == [2.0, 4.0, 6.0, 9.0]
      assert_received {:callback_args, ^x}

      # the same executable, many times and concurrently
      results =
        1..8
        |> Task.async_stream(fn i ->
          XlaNode.run!(node, exe, [f32([i, i, i, i])], callback_server: cb)
        end)
        |> Enum.map(fn {:ok, [t]} -> Tensor.to_list(t) end)

      assert results == for(i <- 1..8, do: List.duplicate(2.0 * i, 4))
    end

    test "callback ids are any term; a single function serves them all", %{node: node} do
      id = {:my, "callback", 42, [1.5]}
      test = self()

      {:ok, cb} =
        CallbackServer.start_link(fn got, [x] ->
          send(test, {:id, got})
          {:ok, [x]}
        end)

      exe = XlaNode.compile!(node, callback_mlir(id))
      assert [y] = XlaNode.run!(node, exe, [f32([1, 2, 3, 4])], callback_server: cb)
      assert Tensor.to_list(y) == [1.0, 2.0, 3.0, 4.0]
      assert_received {:id, ^id}
    end

    test "a registered name as callback_server", %{node: node} do
      name = :"client_test_cb_#{System.unique_integer([:positive])}"
      {:ok, _} = CallbackServer.start_link(%{neg: fn [x] -> {:ok, [neg(x)]} end}, name: name)
      exe = XlaNode.compile!(node, callback_mlir(:neg))

      for server <- [name, {name, node()}] do
        assert [y] = XlaNode.run!(node, exe, [f32([1, -2, 3, -4])], callback_server: server)
        assert Tensor.to_list(y) == [-1.0, 2.0, -3.0, 4.0]
      end
    end

    test "callback failures fail the run with a runtime_error", %{node: node} do
      {:ok, cb} =
        CallbackServer.start_link(%{
          raises: fn _ -> raise ArgumentError, "bad callback input" end,
          errors: fn _ -> {:error, {:argument_error, "rejected by the callback"}} end,
          wrong_size: fn _ -> {:ok, [<<1, 2, 3>>]} end
        })

      run = fn id ->
        exe = XlaNode.compile!(node, callback_mlir(id))
        XlaNode.run(node, exe, [f32([1, 2, 3, 4])], callback_server: cb)
      end

      assert {:error, %Error{kind: :runtime_error, message: m}} = run.(:raises)
      assert m =~ "ArgumentError"
      assert m =~ "bad callback input"

      assert {:error, %Error{kind: :runtime_error, message: m}} = run.(:errors)
      assert m =~ "rejected by the callback"

      assert {:error, %Error{kind: :runtime_error, message: m}} = run.(:wrong_size)
      assert m =~ "3 bytes"

      assert {:error, %Error{kind: :runtime_error, message: m}} = run.(:not_registered)
      assert m =~ "unknown_callback"

      # the node and the callback server are still fine
      assert Process.alive?(cb)
      assert XlaNode.ping(node) == :pong
    end

    test "outfeed and infeed through a CallbackServer", %{node: node} do
      {:ok, cb} = CallbackServer.start_link(%{}, outfeed: self())

      outfeed = """
      func.func @main(%s: tensor<8xui8>, %x: tensor<3xf32>) -> tensor<ui8> {
        %f = stablehlo.custom_call @exla_beam_outfeed(%s, %x) {api_version = 4 : i32, has_side_effect = true} : (tensor<8xui8>, tensor<3xf32>) -> tensor<ui8>
        return %f : tensor<ui8>
      }
      """

      x = f32([1.0, 2.0, 3.0])
      exe = XlaNode.compile!(node, outfeed)
      assert [flag] = XlaNode.run!(node, exe, [x], callback_server: cb)
      assert Tensor.to_number(flag) == 1
      assert_receive {:xla_outfeed, [^x]}, 5_000

      infeed = """
      func.func @main(%s: tensor<8xui8>, %t: tensor<i32>) -> (tensor<3xi32>, tensor<2xf32>) {
        %0:2 = stablehlo.custom_call @exla_beam_infeed(%s, %t) {api_version = 4 : i32, has_side_effect = true} : (tensor<8xui8>, tensor<i32>) -> (tensor<3xi32>, tensor<2xf32>)
        return %0#0, %0#1 : tensor<3xi32>, tensor<2xf32>
      }
      """

      exe = XlaNode.compile!(node, infeed)
      tag = Tensor.scalar(0, {:s, 32})
      :ok = CallbackServer.push_infeed(cb, [Tensor.from_list([1, 2, 3], :s32), f32([0.5, 1.5])])

      assert [a, b] = XlaNode.run!(node, exe, [tag], callback_server: cb)
      assert Tensor.to_list(a) == [1, 2, 3]
      assert Tensor.to_list(b) == [0.5, 1.5]

      # Nothing queued: the run waits until a value is pushed.
      task = Task.async(fn -> XlaNode.run(node, exe, [tag], callback_server: cb) end)
      Process.sleep(200)
      assert Task.yield(task, 0) == nil
      assert CallbackServer.infeed_status(cb) == %{queued: 0, waiting: 1}
      :ok = CallbackServer.push_infeed(cb, [Tensor.from_list([7, 8, 9], :s32), f32([1, 2])])
      assert {:ok, [a, _]} = Task.await(task, 10_000)
      assert Tensor.to_list(a) == [7, 8, 9]
    end
  end

  defp neg(x), do: x |> Tensor.to_list() |> Enum.map(&(-&1)) |> f32()
end
