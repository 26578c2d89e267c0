defmodule XlaNode.DevicesTest do
  @moduledoc """
  Every device of a node: buffers placed on a device (`{:to_device, tensor, [device: n]}`,
  `{:upload, shape, [device: n]}`), runs on the device of their buffers or the one `device: n`
  names, results left where the run was, `:info`'s per-device run counts, and the refusals: a
  device index out of range, buffers on two devices, a buffer on another device than the run's.
  Through raw `GenServer.call`s, then through `XlaNode.to_device/3` and `XlaNode.run/4`. SPMD
  programs compiled over several devices, written by hand and as `jax.jit` exports them over a
  mesh (real JAX 0.8.1, the one `scripts/kernels.sh` installs, as the counterpart).

  The node starts with four CPU devices (the CPU plugin's `cpu_device_count`).
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, Tensor}

  # The device count is the CPU plugin's option.
  @moduletag :cpu_only

  @devices 4

  @add """
  func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xf32> {
    %y = stablehlo.add %a, %b : tensor<3xf32>
    return %y : tensor<3xf32>
  }
  """

  # An MLP layer with the batch split over two devices and the weight whole on each; the second
  # result, the sum of every input, needs the devices to add up their parts.
  @spmd_layer """
  module @spmd attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
    func.func public @main(%x: tensor<4x3xf32> {mhlo.sharding = "{devices=[2,1]0,1}"}, %w: tensor<3x2xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4x2xf32> {mhlo.sharding = "{devices=[2,1]0,1}"}, tensor<f32> {mhlo.sharding = "{replicated}"}) {
      %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<4x2xf32>
      %zero = stablehlo.constant dense<0.0> : tensor<f32>
      %1 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x3xf32>, tensor<f32>) -> tensor<f32>
      return %0, %1 : tensor<4x2xf32>, tensor<f32>
    }
  }
  """

  # The same with no sharding on its results: the partitioner keeps the product's rows split
  # and gives the sum whole.
  @spmd_layer_open_results """
  module @spmd_open attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
    func.func public @main(%x: tensor<4x3xf32> {mhlo.sharding = "{devices=[2,1]0,1}"}, %w: tensor<3x2xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4x2xf32>, tensor<f32>) {
      %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<4x2xf32>
      %zero = stablehlo.constant dense<0.0> : tensor<f32>
      %1 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x3xf32>, tensor<f32>) -> tensor<f32>
      return %0, %1 : tensor<4x2xf32>, tensor<f32>
    }
  }
  """

  setup_all do
    node = Harness.start_node(args: ["--pjrt-option", "cpu_device_count=#{@devices}"])
    {:ok, exe} = call(node, {:compile, @add})
    %{node: node, exe: exe}
  end

  defp call(node, request), do: GenServer.call({:xla, node.name}, request, 30_000)

  defp f32(list), do: Tensor.from_list(list, {:f, 32})

  defp read!(node, buffer) do
    {:ok, tensor} = call(node, {:read, buffer})
    Tensor.to_list(tensor)
  end

  defp runs_since(node, before), do: Enum.zip_with(runs_per_device(node), before, &(&1 - &2))

  # Runs started on each device: `running` as well as `runs`, since the node moves a run
  # answered at launch (its results kept on the device) from `running` to `runs` only once it
  # has completed.
  defp runs_per_device(node), do: Enum.map(device_info(node), &(&1.runs + &1.running))

  defp device_info(node) do
    {:ok, %{device_info: devices}} = call(node, :info)
    devices
  end

  test "the node shows its devices", %{node: node} do
    # Another test's runs answered at launch count as running until they complete.
    assert Harness.eventually(fn -> Enum.all?(device_info(node), &(&1.running == 0)) end)

    assert {:ok, %{devices: ["cpu:0", "cpu:1", "cpu:2", "cpu:3"], device_info: info}} =
             call(node, :info)

    assert [%{id: 0, runs: _, running: 0} | _] = info
  end

  test "a run answered at completion is no longer counted as running once its caller has the reply",
       %{node: node, exe: exe} do
    # Another test's runs answered at launch count as running until they complete.
    assert Harness.eventually(fn -> Enum.all?(device_info(node), &(&1.running == 0)) end)
    a = f32([1.0, 2.0, 3.0])

    for device <- 0..(@devices - 1), _ <- 1..10 do
      assert {:ok, [_]} = call(node, {:run, exe, [a, a], [device: device]})
      {:ok, %{runs_running: 0, device_info: devices}} = call(node, :info)
      assert Enum.all?(devices, &(&1.running == 0)), inspect(devices)
    end
  end

  test "buffers and runs on each device; a result stays on its run's device",
       %{node: node, exe: exe} do
    for device <- 0..(@devices - 1) do
      before = runs_per_device(node)
      {:ok, a} = call(node, {:to_device, f32([1.0, 2.0, 3.0]), [device: device]})
      {:ok, b} = call(node, {:to_device, f32([10.0, 20.0, 30.0]), [device: device]})
      assert {:ok, [sum]} = call(node, {:run, exe, [a, b], [keep_on_device: true]})
      assert read!(node, sum) == [11.0, 22.0, 33.0]

      # The result is on the same device: it runs with b there, and is refused beside a
      # buffer of another device.
      assert {:ok, [again]} = call(node, {:run, exe, [sum, b]})
      assert Tensor.to_list(again) == [21.0, 42.0, 63.0]
      other = rem(device + 1, @devices)
      {:ok, elsewhere} = call(node, {:to_device, f32([0.0, 0.0, 0.0]), [device: other]})
      assert {:error, {:argument_error, message}} = call(node, {:run, exe, [sum, elsewhere]})
      assert message =~ "argument 1 is on device cpu:#{other}"
      assert message =~ "the run is on device cpu:#{device} (where argument 0 is)"

      # Two runs counted on that device, none elsewhere (async: other tests of this module run
      # on the same node one at a time).
      after_runs = runs_per_device(node)
      counted = Enum.zip_with(after_runs, before, &(&1 - &2))
      assert Enum.at(counted, device) == 2
      assert Enum.sum(counted) == 2
    end
  end

  test "a run on device: n takes host tensors there and leaves its results there",
       %{node: node, exe: exe} do
    assert {:ok, [on_2]} =
             call(
               node,
               {:run, exe, [f32([1.0, 1.0, 1.0]), f32([2.0, 2.0, 2.0])],
                [device: 2, keep_on_device: true]}
             )

    {:ok, b2} = call(node, {:to_device, f32([1.0, 1.0, 1.0]), [device: 2]})
    assert {:ok, [y]} = call(node, {:run, exe, [on_2, b2]})
    assert Tensor.to_list(y) == [4.0, 4.0, 4.0]

    {:ok, b0} = call(node, {:to_device, f32([1.0, 1.0, 1.0])})
    assert {:error, {:argument_error, message}} = call(node, {:run, exe, [on_2, b0]})
    assert message =~ "argument 1 is on device cpu:0"

    # device: n names the run's device, and a buffer elsewhere is refused naming both.
    assert {:error, {:argument_error, message}} =
             call(node, {:run, exe, [b0, f32([1.0, 1.0, 1.0])], [device: 3]})

    assert message =~ "argument 0 is on device cpu:0, but the run is on device cpu:3"
    assert message =~ "does not move buffers between devices"
  end

  test "an upload in chunks lands on its device", %{node: node, exe: exe} do
    assert {:ok, upload} = call(node, {:upload, {{:f, 32}, [3]}, [device: 3]})
    <<head::binary-size(4), rest::binary>> = elem(f32([5.0, 6.0, 7.0]), 0)
    GenServer.cast({:xla, node.name}, {:upload, upload, head})
    assert :ok = call(node, {:upload, upload, rest})
    assert {:ok, buffer} = call(node, {:upload_done, upload})
    {:ok, b3} = call(node, {:to_device, f32([1.0, 1.0, 1.0]), [device: 3]})
    assert {:ok, [y]} = call(node, {:run, exe, [buffer, b3]})
    assert Tensor.to_list(y) == [6.0, 7.0, 8.0]
  end

  test "device indices out of range and bad options are refused", %{node: node, exe: exe} do
    for request <- [
          {:to_device, f32([1.0]), [device: @devices]},
          {:upload, {{:f, 32}, [3]}, [device: 99]},
          {:run, exe, [f32([1.0, 1.0, 1.0]), f32([1.0, 1.0, 1.0])], [device: @devices]}
        ] do
      assert {:error, {:argument_error, message}} = call(node, request)
      assert message =~ "out of range: this node has #{@devices} devices (0..#{@devices - 1})"
    end

    assert {:error, {:argument_error, message}} =
             call(node, {:to_device, f32([1.0]), [device: :gpu]})

    assert message =~ "device must be a device index"

    assert {:error, {:argument_error, message}} = call(node, {:to_device, f32([1.0]), [place: 1]})

    assert message =~ "unknown option place (supported: device, owner)"
    assert :pong = call(node, :ping)
  end

  test "XlaNode.to_device/3 and XlaNode.run/4 take device:", %{node: node, exe: exe} do
    {:ok, a} = XlaNode.to_device(node.name, f32([1.0, 2.0, 3.0]), device: 1)

    assert {:ok, [sum]} =
             XlaNode.run(node.name, exe, [a, f32([1.0, 1.0, 1.0])], keep_on_device: true)

    assert {:ok, [y]} = XlaNode.run(node.name, exe, [sum, a])
    assert Tensor.to_list(y) == [3.0, 5.0, 7.0]

    assert {:error, %XlaNode.Error{kind: :argument_error, message: message}} =
             XlaNode.run(node.name, exe, [a, a], device: 0)

    assert message =~ "on device cpu:1, but the run is on device cpu:0"

    assert_raise ArgumentError, ~r/option :device must be/, fn ->
      XlaNode.to_device(node.name, f32([1.0]), device: -1)
    end
  end

  defp f32_list(binary), do: for(<<v::float-32-little <- binary>>, do: v)

  # Device `d`'s coordinates on a mesh of `shape`, row-major.
  defp mesh_coords(d, shape) do
    shape
    |> Enum.reverse()
    |> Enum.map_reduce(d, fn size, rest -> {rem(rest, size), div(rest, size)} end)
    |> elem(0)
    |> Enum.reverse()
  end

  # The block at `at` (block coordinates per dimension) of a row-major f32 array of `dims`
  # split into `blocks` per dimension.
  defp block(data, dims, blocks, at) do
    shard = Enum.zip_with(dims, blocks, &div/2)
    values = List.to_tuple(f32_list(data))
    strides = dims |> Enum.reverse() |> Enum.scan(&(&1 * &2)) |> Enum.reverse() |> tl() |> Kernel.++([1])

    for index <- indices(shard), into: <<>> do
      offset =
        [index, at, shard, strides]
        |> Enum.zip_with(fn [i, a, s, stride] -> (a * s + i) * stride end)
        |> Enum.sum()

      <<elem(values, offset)::float-32-little>>
    end
  end

  defp indices([]), do: [[]]
  defp indices([n | rest]), do: for(i <- 0..(n - 1), tail <- indices(rest), do: [i | tail])

  describe "one SPMD program over several devices" do
    # What JAX 0.8.1 exports for `jax.jit(layer, in_shardings=...)` over 4 CPU devices
    # (integration/jax/sharded_export.py: Shardy's `sdy.mesh` and `sdy.sharding`, as JAX writes
    # them today), compiled over the node's 4 devices and run with each device's shards, against
    # JAX's own result of the same program. `splits` says, for each argument, which mesh axis
    # each of its dimensions is split over (nil: whole), as the script's shardings do.
    for {name, splits} <- [batch: [[0, nil], [nil, nil]], grid: [[0, nil], [nil, 1]]] do
      test "a module jax.jit exported over a mesh (#{name}) gives JAX's result", %{node: node} do
        out = Path.join(System.tmp_dir!(), "xn_sharded_#{System.unique_integer([:positive])}")
        on_exit(fn -> File.rm_rf(out) end)
        script = Path.expand("../jax/sharded_export.py", __DIR__)

        {log, status} =
          System.cmd("python3", [script, "--out", out],
            env: [{"PYTHONPATH", Harness.jax_path()}, {"JAX_PLATFORMS", "cpu"}],
            stderr_to_stdout: true
          )

        assert status == 0, "the JAX export script failed:\n#{log}"
        dir = Path.join(out, "#{unquote(name)}")
        {:ok, meta} = :file.consult(String.to_charlist(Path.join(dir, "meta.terms")))
        [mesh] = for {:mesh, mesh} <- meta, do: mesh
        arg_dims = for {:arg, :f32, dims} <- meta, do: dims
        [result_dims] = for {:result, :f32, dims} <- meta, do: dims
        args = for i <- 0..(length(arg_dims) - 1), do: File.read!(Path.join(dir, "arg_#{i}.bin"))
        expected = f32_list(File.read!(Path.join(dir, "result.bin")))

        {:ok, exe} = call(node, {:compile, File.read!(Path.join(dir, "module.mlir")), [devices: [0, 1, 2, 3]]})
        {:ok, %{results: [{{:f, 32}, shard_dims}]}} = call(node, {:describe, exe})
        coords = for d <- 0..3, do: mesh_coords(d, mesh)

        lists =
          for c <- coords do
            for {data, dims, split} <- Enum.zip([args, arg_dims, unquote(splits)]) do
              blocks = Enum.map(split, fn axis -> if axis, do: Enum.at(mesh, axis), else: 1 end)
              at = Enum.map(split, fn axis -> if axis, do: Enum.at(c, axis), else: 0 end)
              {block(data, dims, blocks, at), {{:f, 32}, Enum.zip_with(dims, blocks, &div/2)}}
            end
          end

        assert {:ok, results} = call(node, {:run, exe, lists})

        # Each device's result is the block of JAX's whole result at its place on the mesh: the
        # dimensions split (whole / shard) take the mesh's axes in order.
        blocks = Enum.zip_with(result_dims, shard_dims, &div/2)
        split_dims = for {b, i} <- Enum.with_index(blocks), b > 1, do: i
        whole = for(v <- expected, into: <<>>, do: <<v::float-32-little>>)

        assert length(results) == 4

        for {[{data, {{:f, 32}, dims}}], c} <- Enum.zip(results, coords) do
          assert dims == shard_dims
          at =
            for i <- 0..(length(blocks) - 1) do
              case Enum.find_index(split_dims, &(&1 == i)) do
                nil -> 0
                axis -> Enum.at(c, axis)
              end
            end

          got = f32_list(data)
          want = f32_list(block(whole, result_dims, blocks, at))

          assert length(got) == length(want) and length(got) > 0 and Enum.all?(Enum.zip(got, want), fn {g, w} -> abs(g - w) <= 1.0e-5 end),
                 "device at #{inspect(c)}: got #{inspect(got)}, JAX gives #{inspect(want)}"
        end
      end
    end

    test "compiled for devices 1 and 3, it runs with one argument list per device",
         %{node: node} do
      assert {:ok, exe} = call(node, {:compile, @spmd_layer, [devices: [1, 3]]})
      x = Enum.map(0..11, &(&1 / 1))
      w = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
      shard = fn rows -> Tensor.from_list(Enum.slice(x, rows), {:f, 32}, [2, 3]) end
      weight = Tensor.from_list(w, {:f, 32}, [3, 2])
      {:ok, w_on_3} = call(node, {:to_device, weight, [device: 3]})
      before = runs_per_device(node)

      assert {:ok, [[y1, sum1], [y3, sum3]]} =
               call(node, {:run, exe, [[shard.(0..5), weight], [shard.(6..11), w_on_3]]})

      # Row r of x times w: [x0 + x2, x1 + x2].
      assert Tensor.to_list(y1) == [[2.0, 3.0], [8.0, 9.0]]
      assert Tensor.to_list(y3) == [[14.0, 15.0], [20.0, 21.0]]
      assert Tensor.to_list(sum1) == 66.0
      assert Tensor.to_list(sum3) == 66.0
      assert runs_since(node, before) == [0, 1, 0, 1]

      # Kept on the devices: each device's results are buffers there.
      assert {:ok, [[b1, _], [b3, _]]} =
               call(
                 node,
                 {:run, exe, [[shard.(0..5), weight], [shard.(6..11), w_on_3]],
                  [keep_on_device: true]}
               )

      assert read!(node, b3) == [[14.0, 15.0], [20.0, 21.0]]
      assert read!(node, b1) == [[2.0, 3.0], [8.0, 9.0]]
    end

    test "XlaNode.compile/3 takes devices:, and XlaNode.run/4 a list per device", %{node: node} do
      {:ok, exe} = XlaNode.compile(node.name, @spmd_layer, devices: [2, 0])
      weight = Tensor.from_list([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], {:f, 32}, [3, 2])

      shard = fn first ->
        Tensor.from_list(Enum.map(first..(first + 5), &(&1 / 1)), {:f, 32}, [2, 3])
      end

      assert {:ok, [[y2, _], [y0, sum]]} =
               XlaNode.run(node.name, exe, [[shard.(0), weight], [shard.(6), weight]])

      assert Tensor.to_list(y2) == [[2.0, 3.0], [8.0, 9.0]]
      assert Tensor.to_list(y0) == [[14.0, 15.0], [20.0, 21.0]]
      assert Tensor.to_list(sum) == 66.0
    end

    test "its errors say what is wrong", %{node: node} do
      {:ok, exe} = call(node, {:compile, @spmd_layer, [devices: [0, 2]]})
      weight = Tensor.from_list([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], {:f, 32}, [3, 2])
      shard = Tensor.from_list(Enum.map(1..6, &(&1 / 1)), {:f, 32}, [2, 3])
      {:ok, w_on_1} = call(node, {:to_device, weight, [device: 1]})

      for {request, expected} <- [
            {{:run, exe, [shard, weight]}, "runs on 2 devices at once: give one list"},
            {{:run, exe, [[shard, weight]]}, "runs on 2 devices at once, got 1 lists"},
            {{:run, exe, [[shard, weight], [shard, w_on_1]]},
             "device 1 (cpu:2): argument 1 is on device cpu:1, but the run is on device cpu:2"},
            {{:run, exe, [[shard, weight], [weight, weight]]},
             "device 1 (cpu:2): argument 0: expected f32[2,3]"},
            {{:run, exe, [[shard, weight], [shard, weight]], [device: 0]},
             "device: names one device"},
            {{:compile, @spmd_layer, [devices: [0, @devices]]},
             "devices #{@devices} is out of range"},
            {{:compile, @spmd_layer, [devices: [1, 1]]}, "devices names device 1 twice"},
            {{:compile, @spmd_layer, [partitions: 2]}, "unknown compile option partitions"}
          ] do
        assert {:error, {:argument_error, message}} = call(node, request)
        assert message =~ expected
      end

      # A single-device program takes one list, not one per device.
      {:ok, add} = call(node, {:compile, @add})
      assert {:error, {:argument_error, message}} = call(node, {:run, add, [[shard], [shard]]})
      assert message =~ "runs on one device"
    end

    test "results the module leaves unannotated are split as the partitioner chooses, and " <>
           "{:describe, exe} gives each device's shard types",
         %{node: node} do
      assert {:ok, exe} = call(node, {:compile, @spmd_layer_open_results, [devices: [0, 1]]})

      assert {:ok,
              %{
                parameters: [{{:f, 32}, [2, 3]}, {{:f, 32}, [3, 2]}],
                results: [{{:f, 32}, [2, 2]}, {{:f, 32}, []}],
                devices: [0, 1]
              }} = call(node, {:describe, exe})

      weight = Tensor.from_list([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], {:f, 32}, [3, 2])

      shard = fn first ->
        Tensor.from_list(Enum.map(first..(first + 5), &(&1 / 1)), {:f, 32}, [2, 3])
      end

      assert {:ok, [[y0, sum], [y1, sum]]} =
               call(node, {:run, exe, [[shard.(0), weight], [shard.(6), weight]]})

      assert Tensor.to_list(y0) == [[2.0, 3.0], [8.0, 9.0]]
      assert Tensor.to_list(y1) == [[14.0, 15.0], [20.0, 21.0]]
      assert Tensor.to_list(sum) == 66.0

      {:ok, add} = call(node, {:compile, @add})

      assert {:ok, %{parameters: [_, _], results: [{{:f, 32}, [3]}], devices: []}} =
               XlaNode.describe(node.name, add)

      assert {:error, {:argument_error, message}} = call(node, {:describe, make_ref()})
      assert message =~ "unknown or freed reference"

      # A buffer: its shape and the device it lives on.
      {:ok, on_3} = call(node, {:to_device, Tensor.from_list([1.0, 2.0], {:f, 32}), [device: 3]})
      assert {:ok, %{shape: {{:f, 32}, [2]}, device: 3}} = call(node, {:describe, on_3})
    end
  end
end
