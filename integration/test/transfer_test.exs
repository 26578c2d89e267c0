defmodule XlaNode.TransferTest do
  @moduledoc """
  Tensors larger than one message, and frees that need no answer: `XlaNode.to_device/3` and
  `XlaNode.read/3` move a large tensor in chunks below the node's `--max-message-bytes`, so the
  caller's connection (and every buffer its node holds there) survives; the raw requests behind
  them (`{:upload, ...}`, `{:upload_done, ...}`, `{:read, buffer, chunk_bytes: n}`) as the
  README shows them; an upload cut off by its caller's death leaves nothing behind; and
  `{:free, refs}` as a cast or a call.
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, Tensor}

  @mib 1024 * 1024

  defp call(node, request), do: GenServer.call({:xla, node.name}, request, 60_000)

  defp random_f32(bytes), do: {:crypto.strong_rand_bytes(bytes), {{:f, 32}, [div(bytes, 4)]}}

  defp info(node, key) do
    {:ok, info} = call(node, :info)
    Map.fetch!(info, key)
  end

  describe "a node with an 8 MiB message limit" do
    setup do
      %{node: Harness.start_node(args: ["--max-message-bytes", "8M"])}
    end

    test "a 40 MiB tensor goes in chunks and comes back bit for bit; the connection and its buffers stay", %{node: node} do
      assert info(node, :max_message_bytes) == 8 * @mib
      {:ok, small} = XlaNode.to_device(node.name, Tensor.from_list([1.0, 2.0], {:f, 32}))
      {data, shape} = tensor = random_f32(40 * @mib)

      received = info(node, :traffic).received_messages
      assert {:ok, big} = XlaNode.to_device(node.name, tensor)
      # At least five chunks of at most 8 MiB (less the envelope), each its own message.
      assert info(node, :traffic).received_messages - received >= 6
      assert {:ok, {^data, ^shape}} = XlaNode.read(node.name, big)

      assert {:ok, small_back} = XlaNode.read(node.name, small)
      assert Tensor.to_list(small_back) == [1.0, 2.0]
      assert node.name in Node.list(:hidden)
    end

    test "a 4-bit tensor of an odd element count goes and comes back in chunks, bit for bit", %{node: node} do
      count = 20 * @mib * 2 + 1
      data = <<:crypto.strong_rand_bytes(div(count, 2))::binary, 5::4>>
      assert {:ok, buf} = XlaNode.to_device(node.name, {data, {{:s, 4}, [count]}})
      assert {:ok, {^data, {{:s, 4}, [^count]}}} = XlaNode.read(node.name, buf)
    end
  end

  describe "a run whose tensors take more than a message, at an 8 MiB limit" do
    # Four devices whatever the machine: the CPU plugin's option.
    @describetag :cpu_only

    @add_u8 """
    func.func @main(%x: tensor<25165824xui8>, %y: tensor<25165824xui8>) -> tensor<25165824xui8> {
      %z = stablehlo.add %x, %y : tensor<25165824xui8>
      return %z : tensor<25165824xui8>
    }
    """

    # The same over two devices, each adding its half.
    @add_u8_halves """
    module @halves attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
      func.func public @main(%x: tensor<25165824xui8> {mhlo.sharding = "{devices=[2]0,1}"}, %y: tensor<25165824xui8> {mhlo.sharding = "{devices=[2]0,1}"}) -> (tensor<25165824xui8> {mhlo.sharding = "{devices=[2]0,1}"}) {
        %z = stablehlo.add %x, %y : tensor<25165824xui8>
        return %z : tensor<25165824xui8>
      }
    }
    """

    @n 24 * @mib

    setup do
      node =
        Harness.start_node(args: ["--max-message-bytes", "8M", "--pjrt-option", "cpu_device_count=4"])

      x = :crypto.strong_rand_bytes(@n)
      %{node: node, x: x, zeros: :binary.copy(<<0>>, @n)}
    end

    defp u8(data), do: {data, {{:u, 8}, [byte_size(data)]}}

    test "XlaNode.run places its largest tensors first, in chunks, and frees them once answered",
         %{node: node, x: x, zeros: zeros} do
      exe = XlaNode.compile!(node.name, @add_u8)
      {:ok, small} = XlaNode.to_device(node.name, Tensor.from_list([1.0, 2.0], {:f, 32}))
      buffers = info(node, :buffers)
      received = info(node, :traffic).received_messages

      assert {:ok, [{^x, {{:u, 8}, [@n]}}]} = XlaNode.run(node.name, exe, [u8(x), u8(zeros)])
      # 48 MiB as chunks of under 8 MiB, not one message: the connection stays.
      assert info(node, :traffic).received_messages - received >= 7
      assert node.name in Node.list(:hidden)
      assert Tensor.to_list(XlaNode.read!(node.name, small)) == [1.0, 2.0]
      Harness.eventually(fn -> info(node, :buffers) == buffers end)
    end

    test "the tensors go where the run will run: its device:, or its first buffer's",
         %{node: node, x: x, zeros: zeros} do
      exe = XlaNode.compile!(node.name, @add_u8)
      assert {:ok, [{^x, _}]} = XlaNode.run(node.name, exe, [u8(x), u8(zeros)], device: 2)

      # A buffer on device 3: the tensor beside it is placed there too, so the run is not
      # refused for arguments on two devices.
      {:ok, on_3} = XlaNode.to_device(node.name, u8(zeros), device: 3)
      assert {:ok, [{^x, _}]} = XlaNode.run(node.name, exe, [u8(x), on_3])
      assert {:ok, %{device: 3}} = XlaNode.describe(node.name, on_3)
    end

    test "a program over two devices: each device's tensors placed on it",
         %{node: node, x: x, zeros: zeros} do
      {:ok, exe} = XlaNode.compile(node.name, @add_u8_halves, devices: [1, 2])
      half = div(@n, 2)
      {x1, x2} = :erlang.split_binary(x, half)
      {z1, z2} = :erlang.split_binary(zeros, half)
      halves = fn data -> {data, {{:u, 8}, [half]}} end

      assert {:ok, [[{^x1, _}], [{^x2, _}]]} =
               XlaNode.run(node.name, exe, [[halves.(x1), halves.(z1)], [halves.(x2), halves.(z2)]])

      assert node.name in Node.list(:hidden)
    end
  end

  describe "the raw requests" do
    setup do
      Harness.start_shared_node()
    end

    test "upload: begin, chunks as casts, done; the upload is a buffer then", %{node: node} do
      server = {:xla, node.name}
      data = :crypto.strong_rand_bytes(4096)
      {:ok, upload} = GenServer.call(server, {:upload, {{:f, 32}, [32, 32]}})

      for <<chunk::binary-size(1000) <- binary_part(data, 0, 4000)>>,
          do: GenServer.cast(server, {:upload, upload, chunk})

      # A chunk may also be a call, answered :ok.
      assert :ok = GenServer.call(server, {:upload, upload, binary_part(data, 4000, 96)})
      assert {:ok, buffer} = GenServer.call(server, {:upload_done, upload})
      assert {:ok, {^data, {{:f, 32}, [32, 32]}}} = GenServer.call(server, {:read, buffer})
      # The upload is gone.
      assert {:error, {:argument_error, message}} = GenServer.call(server, {:upload_done, upload})
      assert message =~ "unknown or freed reference"
    end

    test "the README's example, as written there (a smaller tensor)", %{node: node} do
      xla = {:xla, node.name}
      data = :crypto.strong_rand_bytes(5 * 4096 * 4)
      chunks = for <<chunk::binary-size(16_384) <- data>>, do: chunk
      {:ok, upload} = GenServer.call(xla, {:upload, {{:f, 32}, [5, 4096]}})
      for chunk <- chunks, do: GenServer.cast(xla, {:upload, upload, chunk})
      {:ok, buffer} = GenServer.call(xla, {:upload_done, upload})

      {:ok, {:chunks, {{:f, 32}, [5, 4096]}, count, stream}} =
        GenServer.call(xla, {:read, buffer, [chunk_bytes: 32 * 1024]})

      read = for i <- 0..(count - 1), into: <<>>, do: (receive do {:xla_chunk, ^stream, ^i, d} -> d end)
      assert count == 3
      assert read == data
    end

    test "read in chunks: a reply, then the chunks in order", %{node: node} do
      server = {:xla, node.name}
      {data, _} = tensor = random_f32(10_000)
      {:ok, buffer} = GenServer.call(server, {:to_device, tensor})

      assert {:ok, {:chunks, {{:f, 32}, [2500]}, 3, stream}} =
               GenServer.call(server, {:read, buffer, [chunk_bytes: 4096]})

      chunks =
        for index <- 0..2 do
          assert_receive {:xla_chunk, ^stream, ^index, chunk}, 5_000
          chunk
        end

      assert IO.iodata_to_binary(chunks) == data
      # A read within one chunk is the ordinary reply.
      assert {:ok, {^data, _}} = GenServer.call(server, {:read, buffer, [chunk_bytes: 10_000]})
    end

    test "uploads that do not add up, and bad chunks, say what is wrong", %{node: node} do
      server = {:xla, node.name}
      {:ok, short} = GenServer.call(server, {:upload, {{:u, 8}, [10]}})
      :ok = GenServer.call(server, {:upload, short, <<1, 2, 3>>})
      assert {:error, {:argument_error, m}} = GenServer.call(server, {:upload_done, short})
      assert m =~ "takes 10 bytes, 3 arrived"

      {:ok, long} = GenServer.call(server, {:upload, {{:u, 8}, [2]}})
      GenServer.cast(server, {:upload, long, <<1, 2, 3>>})
      assert {:error, {:argument_error, m}} = GenServer.call(server, {:upload_done, long})
      assert m =~ "takes 2 bytes, and 3 more arrived after 0"

      {:ok, up} = GenServer.call(server, {:upload, {{:u, 8}, [2]}})
      assert {:error, {:argument_error, m}} = GenServer.call(server, {:upload, up, <<1::4>>})
      assert m =~ "a whole number of bytes"
      assert {:error, {:argument_error, _}} = GenServer.call(server, {:upload, {{:u, 7}, [2]}})
      assert {:error, {:argument_error, m}} = GenServer.call(server, {:read, up})
      assert m =~ "is an upload not yet done"
      assert {:error, {:argument_error, m}} = GenServer.call(server, {:read, up, [chunk_bytes: 0]})
      assert m =~ "chunk_bytes must be a positive integer"
    end

    test "an upload whose caller dies midway leaves nothing behind", %{node: node} do
      server = {:xla, node.name}
      parent = self()

      {pid, monitor} =
        spawn_monitor(fn ->
          {:ok, upload} = GenServer.call(server, {:upload, {{:u, 8}, [1_000_000]}})
          GenServer.cast(server, {:upload, upload, :binary.copy(<<7>>, 500_000)})
          send(parent, {:upload, upload})
        end)

      assert_receive {:upload, upload}, 10_000
      assert_receive {:DOWN, ^monitor, :process, ^pid, :normal}, 10_000

      Harness.eventually(fn ->
        match?({:error, {:argument_error, _}}, GenServer.call(server, {:upload_done, upload}))
      end)
    end

    test "{:free, refs} as a cast frees what the node has and skips the rest; as a call it answers :ok",
         %{node: node} do
      server = {:xla, node.name}
      buffers = for i <- 1..3, do: elem(GenServer.call(server, {:to_device, Tensor.from_list([i], {:s, 32})}), 1)
      [a, b, c] = buffers
      :ok = GenServer.call(server, {:free, a})

      GenServer.cast(server, {:free, [a, b, make_ref()]})
      # In order with the requests after it: b is gone for the next call.
      assert {:error, {:argument_error, _}} = GenServer.call(server, {:read, b})
      assert {:ok, _} = GenServer.call(server, {:read, c})
      assert :ok = GenServer.call(server, {:free, [c, b]})
      assert {:error, {:argument_error, _}} = GenServer.call(server, {:read, c})
    end

    test "XlaNode.free_all/1 sends one message per node and waits for nothing", %{node: node} do
      buffers = for i <- 1..20, do: XlaNode.to_device!(node.name, Tensor.from_list([i], {:s, 32}))
      received = info(node, :traffic).received_messages
      assert :ok = XlaNode.free_all(buffers)
      Harness.eventually(fn -> match?({:error, _}, XlaNode.read(node.name, List.last(buffers))) end)
      # The cast, then the reads polling for the result (3 messages each: monitor, request,
      # demonitor) and the :info calls around them.
      assert rem(info(node, :traffic).received_messages - received - 1, 3) == 0
      assert_raise ArgumentError, ~r/takes the references/, fn -> XlaNode.free_all([:not_a_ref]) end
    end
  end

  describe "a tensor of hundreds of MiB at the default limit" do
    setup do
      %{node: Harness.start_node()}
    end

    @tag timeout: 300_000
    test "320 MiB goes to the node and back bit for bit", %{node: node} do
      {data, shape} = tensor = random_f32(320 * @mib)
      assert {:ok, buf} = XlaNode.to_device(node.name, tensor, timeout: 120_000)
      assert {:ok, {^data, ^shape}} = XlaNode.read(node.name, buf, timeout: 120_000)
      assert :pong = XlaNode.ping(node.name)
    end
  end
end
