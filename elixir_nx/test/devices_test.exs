defmodule XlaNode.NxDevicesTest do
  @moduledoc """
  Every device of the node under Nx: `XlaNode.Compiler`'s and `XlaNode.Backend`'s `device_id:`
  (as EXLA's), and one `Nx.Serving` partition per device (`__partitions_options__/1`), checked
  through `:info`'s per-device run counts. The suite's node has the CPU plugin's default
  device count (four here).
  """
  # The per-device run counts are the node's, shared with other modules' runs.
  use ExUnit.Case, async: false
  # The CPU plugin's four devices (test_helper.exs excludes the module on fewer).
  @moduletag :multi_device

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  defp devices do
    {:ok, %{devices: devices}} = XlaNode.info(xla())
    length(devices)
  end

  # Runs started on each device: `running` as well as `runs`, since the node moves a run from
  # `running` to `runs` only after it has answered it.
  defp runs_per_device do
    {:ok, %{device_info: info}} = XlaNode.info(xla())
    Enum.map(info, &(&1.runs + &1.running))
  end

  defp runs_since(before), do: Enum.zip_with(runs_per_device(), before, &(&1 - &2))

  setup_all do
    if devices() < 2, do: raise("these tests need a node with several devices")
    :ok
  end

  test "__partitions_options__ gives one option set per device of the node" do
    assert XlaNode.Compiler.__partitions_options__(node: xla(), timeout: 5_000) ==
             for(d <- 0..(devices() - 1), do: [device_id: d, node: xla(), timeout: 5_000])
  end

  test "jit with device_id: runs there and keeps its results there" do
    before = runs_per_device()

    double =
      Nx.Defn.jit(&Nx.multiply(&1, 2),
        compiler: XlaNode.Compiler,
        node: xla(),
        device_id: 2,
        keep_on_device: true
      )

    y = double.(Nx.tensor([1.0, 2.0]))
    # y's buffer is on device 2: the next run goes there without device_id.
    z = Nx.Defn.jit(&Nx.add(&1, 1), compiler: XlaNode.Compiler, node: xla()).(y)
    assert Nx.to_flat_list(z) == [3.0, 5.0]
    assert Enum.at(runs_since(before), 2) == 2

    # Asked to run on another device than its buffer's, the node refuses naming both.
    error =
      assert_raise XlaNode.Error, fn ->
        Nx.Defn.jit(&Nx.add(&1, 1), compiler: XlaNode.Compiler, node: xla(), device_id: 0).(y)
      end

    assert error.message =~ "argument 0 is on device cpu:2, but the run is on device cpu:0"
  end

  test "XlaNode.Backend with device_id: places tensors there; the backend's ops run there" do
    backend = {XlaNode.Backend, node: xla(), device_id: 1}
    before = runs_per_device()
    x = Nx.tensor([1.0, 2.0, 3.0], backend: backend)
    y = Nx.multiply(x, x)
    assert Nx.to_flat_list(y) == [1.0, 4.0, 9.0]
    assert Enum.at(runs_since(before), 1) >= 1
    assert Enum.at(runs_since(before), 0) == 0

    # A transfer to another device of the same node moves it there.
    moved = Nx.backend_transfer(y, {XlaNode.Backend, node: xla(), device_id: 3})
    before = runs_per_device()
    assert Nx.to_flat_list(Nx.add(moved, 1)) == [2.0, 5.0, 10.0]
    assert Enum.at(runs_since(before), 3) >= 1

    assert_raise ArgumentError, ~r/:device_id must be a device index/, fn ->
      Nx.tensor([1.0], backend: {XlaNode.Backend, node: xla(), device_id: -1})
    end
  end

  test "a device index out of range is refused" do
    error =
      assert_raise XlaNode.Error, fn ->
        Nx.Defn.jit(&Nx.exp/1, compiler: XlaNode.Compiler, node: xla(), device_id: 99).(
          Nx.tensor(1.0)
        )
      end

    assert error.message =~ "device 99 is out of range"
  end

  test "an Nx.Serving with partitions: true runs batches on every device" do
    # Enough work per batch that batches overlap.
    square = fn x -> x |> Nx.dot([2], [0], x, [1], [0]) |> Nx.tanh() |> Nx.sum(axes: [1, 2]) end
    serving = Nx.Serving.jit(square, compiler: XlaNode.Compiler, node: xla())
    name = :"device_serving_#{System.unique_integer([:positive])}"

    start_supervised!(
      {Nx.Serving,
       serving: serving, name: name, batch_size: 2, batch_timeout: 1, partitions: true}
    )

    before = runs_per_device()
    input = Nx.iota({2, 96, 96}, type: :f32) |> Nx.divide(10_000)
    expected = Nx.to_flat_list(square.(Nx.backend_copy(input, Nx.BinaryBackend)))

    results =
      1..64
      |> Task.async_stream(
        fn _ -> Nx.Serving.batched_run(name, Nx.Batch.concatenate([input])) end,
        max_concurrency: 32,
        timeout: 120_000
      )
      |> Enum.map(fn {:ok, result} -> Nx.to_flat_list(result) end)

    for result <- results do
      for {a, b} <- Enum.zip(result, expected), do: assert_in_delta(a, b, 1.0e-3)
    end

    counted = runs_since(before)
    assert length(counted) == devices()
    assert Enum.all?(counted, &(&1 > 0)), "runs per device: #{inspect(counted)}"
  end
end
