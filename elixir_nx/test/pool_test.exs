defmodule XlaNode.NxPoolTest do
  @moduledoc """
  `XlaNode.Compiler` and `Nx.Serving` over an `XlaNode.Pool` of two real nodes: the one the
  suite starts and a second one started here.
  """
  use ExUnit.Case, async: false

  alias XlaNode.Pool

  setup_all do
    second = XlaNode.NxTest.Node.start!("xla_nx_pool_#{System.pid()}")
    on_exit(fn -> XlaNode.NxTest.Node.stop(second) end)
    nodes = [Application.fetch_env!(:xla_node_nx, :test_node).name, second.name]
    %{nodes: nodes}
  end

  setup %{nodes: nodes} do
    pool = :"nx_pool_#{System.unique_integer([:positive])}"
    start_supervised!({Pool, name: pool, nodes: nodes})

    Enum.any?(1..300, fn _ ->
      Enum.all?(Pool.status(pool).nodes, &(&1.status == :up)) || (Process.sleep(20) && false)
    end) || flunk("pool not up: #{inspect(Pool.status(pool))}")

    %{pool: pool}
  end

  defp runs(pool), do: Map.new(Pool.status(pool).nodes, &{&1.node, &1.runs})

  test "jit with node: a pool, with results kept on the node holding them", %{pool: pool} do
    add = Nx.Defn.jit(&Nx.add(&1, &2), compiler: XlaNode.Compiler, node: pool)
    assert Nx.to_flat_list(add.(Nx.tensor([1.0, 2.0]), Nx.tensor([3.0, 4.0]))) == [4.0, 6.0]

    kept =
      Nx.Defn.jit(&Nx.multiply(&1, 2),
        compiler: XlaNode.Compiler,
        node: pool,
        keep_on_device: true
      )

    y = kept.(Nx.tensor([1.0, 2.0]))
    assert %XlaNode.Backend{node: ^pool, buffer: buffer} = y.data
    z = kept.(y)
    assert node(z.data.buffer) == node(buffer)
    assert Nx.to_flat_list(z) == [4.0, 8.0]
    assert Nx.backend_deallocate(y) == :ok
  end

  test "an Nx.Serving batches as usual and spreads its batches over the pool", %{pool: pool} do
    # A batched matrix product of each item with itself.
    square = fn x -> Nx.dot(x, [2], [0], x, [1], [0]) |> Nx.tanh() end

    serving =
      Nx.Serving.jit(square, compiler: XlaNode.Compiler, node: pool)
      |> Nx.Serving.batch_size(8)

    name = :"serving_#{System.unique_integer([:positive])}"

    start_supervised!(
      {Nx.Serving, serving: serving, name: name, batch_timeout: 5, partitions: true}
    )

    before = runs(pool)
    x = Nx.iota({64, 64}, type: :f32) |> Nx.divide(4096)
    expected = Nx.Defn.jit(square, compiler: Nx.Defn.Evaluator).(Nx.new_axis(x, 0))

    results =
      1..64
      |> Task.async_stream(fn _ -> Nx.Serving.batched_run(name, Nx.Batch.stack([x])) end,
        max_concurrency: 32,
        timeout: :infinity
      )
      |> Enum.map(fn {:ok, result} -> result end)

    for result <- results do
      assert Nx.all_close(Nx.squeeze(result, axes: [0]), expected, rtol: 1.0e-4) |> Nx.to_number() ==
               1
    end

    used = Map.new(runs(pool), fn {node, n} -> {node, n - before[node]} end)
    # Every batch ran on some node of the pool, and both nodes ran batches.
    assert Enum.sum(Map.values(used)) in 8..64
    assert Enum.all?(Map.values(used), &(&1 > 0)), "batches per node: #{inspect(used)}"
  end

  test "a pool restarted under the same name, and a pool given by pid", %{
    pool: pool,
    nodes: nodes
  } do
    double = Nx.Defn.jit(&Nx.multiply(&1, 2), compiler: XlaNode.Compiler, node: pool)
    assert Nx.to_flat_list(double.(Nx.tensor([1.0]))) == [2.0]

    :ok = stop_supervised(pool)
    pid = start_supervised!({Pool, name: pool, nodes: nodes})

    Enum.any?(1..300, fn _ ->
      Enum.all?(Pool.status(pool).nodes, &(&1.status == :up)) || (Process.sleep(20) && false)
    end)

    # The programs compiled through the pool that stopped are gone with it: compiled anew.
    assert Nx.to_flat_list(double.(Nx.tensor([3.0]))) == [6.0]

    by_pid = Nx.Defn.jit(&Nx.add(&1, 1), compiler: XlaNode.Compiler, node: pid)
    assert Nx.to_flat_list(by_pid.(Nx.tensor([3.0]))) == [4.0]
  end

  test "__partitions_options__ gives one partition per device of every node of a pool (or of a node)",
       %{pool: pool, nodes: [a, b]} do
    {:ok, %{devices: devices}} = XlaNode.info(a)
    {:ok, %{devices: b_devices}} = XlaNode.info(b)

    assert length(XlaNode.Compiler.__partitions_options__(node: pool)) ==
             length(devices) + length(b_devices)

    # One node alone: one partition per device of it.

    assert XlaNode.Compiler.__partitions_options__(node: a) ==
             for(d <- 0..(length(devices) - 1), do: [device_id: d, node: a])
  end

  test "XlaNode.Backend with node: a pool", %{pool: pool} do
    backend = {XlaNode.Backend, node: pool}
    a = Nx.iota({2, 3}, type: :f32, backend: backend)
    b = Nx.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], backend: backend)
    assert %XlaNode.Backend{node: ^pool} = a.data

    # Each operation runs where its tensors are; one on the other node of the pool is sent along.
    sum = Nx.add(a, b)
    assert node(sum.data.buffer) == node(a.data.buffer)
    assert Nx.to_flat_list(sum) == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    assert Nx.to_flat_list(Nx.sum(sum, axes: [1])) == [9.0, 27.0]

    {:ok, %{buffers: before}} = XlaNode.info(node(a.data.buffer))
    XlaNode.Backend.scope(fn -> a |> Nx.exp() |> Nx.multiply(2) |> Nx.sum() |> Nx.to_number() end)
    assert {:ok, %{buffers: ^before}} = XlaNode.info(node(a.data.buffer))

    assert Nx.backend_deallocate(a) == :ok
    error = assert_raise XlaNode.Error, fn -> Nx.to_binary(a) end
    assert error.kind == :gone
    assert error.message =~ inspect(node(a.data.buffer))
  end

  test "a callback that raises through a pool raises its exception, once", %{pool: pool} do
    test = self()

    raising = fn x ->
      Nx.runtime_call(x, x, [], fn _t, _opts ->
        send(test, :called)
        raise ArgumentError, "not through a pool either"
      end)
    end

    f = Nx.Defn.jit(raising, compiler: XlaNode.Compiler, node: pool)
    assert_raise ArgumentError, "not through a pool either", fn -> f.(Nx.tensor([1.0])) end
    # The pool does not re-send a run whose callback has fired.
    assert_received :called
    refute_received :called
  end

  test "a run through a pool names the pool, not a node, in its :telemetry metadata", %{
    pool: pool
  } do
    ref = :telemetry_test.attach_event_handlers(self(), [[:xla_node, :run, :start]])
    on_exit(fn -> :telemetry.detach(ref) end)

    f = Nx.Defn.jit(&Nx.add(&1, 5), compiler: XlaNode.Compiler, node: pool)
    assert Nx.to_flat_list(f.(Nx.tensor([1.0]))) == [6.0]

    assert_receive {[:xla_node, :run, :start], ^ref, _measurements, metadata}
    assert %{node: nil, server: ^pool} = metadata
  end
end
