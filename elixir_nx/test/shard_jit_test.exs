defmodule XlaNode.ShardJitTest do
  @moduledoc """
  `Nx.Defn.shard_jit/3` with `XlaNode.Compiler`: one SPMD program over an `Nx.Mesh` of the
  node's devices, each partition given its shard of each argument and returning its shard of
  each result. An MLP forward pass with the batch split over a 1-D mesh and with a weight split
  over a 2-D mesh agrees with `Nx.Defn.Evaluator` on the whole tensors; EXLA's sharding cases
  (tuple outputs, partial replication, three mesh axes, a dimension over two axes, windows
  across shard edges) give EXLA's per-partition results; each bad mesh or sharding is an
  `ArgumentError` saying what is wrong; a second call compiles nothing. The suite's node has
  the CPU plugin's default four devices.
  """
  # Counts the compiles telemetry reports, which other modules' tests would add to.
  use ExUnit.Case, async: false
  # The CPU plugin's four devices (test_helper.exs excludes the module on fewer).
  @moduletag :multi_device

  alias Nx.Mesh

  doctest XlaNode.Compiler.Shard

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  defp shard_jit(fun, mesh, opts),
    do: Nx.Defn.shard_jit(fun, mesh, [compiler: XlaNode.Compiler, node: xla()] ++ opts)

  # A run on the tensor's device takes it; one on another device is refused, naming its device.
  defp assert_on_device(%Nx.Tensor{data: %XlaNode.Backend{}} = t, device) do
    opts = [compiler: XlaNode.Compiler, node: xla(), device_id: device]
    assert Nx.shape(Nx.Defn.jit(&Nx.add(&1, 1), opts).(t)) == t.shape

    assert_raise XlaNode.Error, ~r/argument 0 is on device cpu:#{device}/, fn ->
      Nx.Defn.jit(&Nx.add(&1, 1), Keyword.put(opts, :device_id, rem(device + 1, 4))).(t)
    end
  end

  # The shards of `t` along `axis`, `count` of them.
  defp split(t, axis, count) do
    size = div(elem(t.shape, axis), count)
    for k <- 0..(count - 1), do: Nx.slice_along_axis(t, k * size, size, axis: axis)
  end

  # Each partition's result is one tile of the whole, and every tile is held by some partition:
  # what holds whichever way the partitioner split the output.
  defp assert_tiles(results, whole) do
    shard_shape = hd(results).shape
    assert Enum.all?(results, &(&1.shape == shard_shape))

    tiles =
      Enum.reduce(0..(tuple_size(whole.shape) - 1)//1, [whole], fn axis, tiles ->
        count = div(elem(whole.shape, axis), elem(shard_shape, axis))
        Enum.flat_map(tiles, &split(&1, axis, count))
      end)

    held =
      for result <- results do
        index = Enum.find_index(tiles, &close?(&1, result))
        assert index, "#{inspect(result)} is no tile of #{inspect(whole)}"
        index
      end

    assert Enum.sort(Enum.uniq(held)) == Enum.to_list(0..(length(tiles) - 1))
  end

  defp close?(a, b), do: Nx.all_close(a, b, atol: 1.0e-4, rtol: 1.0e-4) |> Nx.to_number() == 1

  defp assert_equal(result, expected) do
    assert result.shape == expected.shape
    assert Nx.to_flat_list(result) == Nx.to_flat_list(expected)
  end

  defmodule MLP do
    import Nx.Defn

    defn forward(x, w1, b1, w2, b2) do
      x |> Nx.dot(w1) |> Nx.add(b1) |> Nx.max(0) |> Nx.dot(w2) |> Nx.add(b2)
    end
  end

  defp mlp_params do
    key = Nx.Random.key(7)
    {x, key} = Nx.Random.normal(key, shape: {8, 16}, type: :f32)
    {w1, key} = Nx.Random.normal(key, shape: {16, 32}, type: :f32)
    {b1, key} = Nx.Random.normal(key, shape: {32}, type: :f32)
    {w2, key} = Nx.Random.normal(key, shape: {32, 4}, type: :f32)
    {b2, _key} = Nx.Random.normal(key, shape: {4}, type: :f32)
    {x, w1, b1, w2, b2}
  end

  describe "an MLP's forward pass agrees with the Evaluator" do
    test "with the batch split over a 1-D mesh of four devices" do
      {x, w1, b1, w2, b2} = mlp_params()

      expected =
        Nx.Defn.jit_apply(&MLP.forward/5, [x, w1, b1, w2, b2], compiler: Nx.Defn.Evaluator)

      mesh = %Mesh{name: "batch", shape: {4}}

      results =
        shard_jit(&MLP.forward/5, mesh, input_shardings: [%{0 => [0]}, %{}, %{}, %{}, %{}]).(
          for shard <- split(x, 0, 4), do: [shard, w1, b1, w2, b2]
        )

      # Each device holds its rows of the output.
      assert length(results) == 4
      assert Enum.all?(results, &(&1.shape == {2, 4}))
      assert close?(Nx.concatenate(results), expected)
    end

    test "with the first weight split over a 2-D mesh {2, 2}" do
      {x, w1, b1, w2, b2} = mlp_params()

      expected =
        Nx.Defn.jit_apply(&MLP.forward/5, [x, w1, b1, w2, b2], compiler: Nx.Defn.Evaluator)

      mesh = %Mesh{name: "grid", shape: {2, 2}}

      # w1 {16, 32}: its rows over mesh axis 0, its columns over axis 1; b1 by columns too.
      w1_tiles = for rows <- split(w1, 0, 2), tile <- split(rows, 1, 2), do: tile
      b1_parts = split(b1, 0, 2)

      args =
        for {tile, k} <- Enum.with_index(w1_tiles) do
          x_cols = Enum.at(split(x, 1, 2), div(k, 2))
          [x_cols, tile, Enum.at(b1_parts, rem(k, 2)), w2, b2]
        end

      results =
        shard_jit(&MLP.forward/5, mesh,
          input_shardings: [%{1 => [0]}, %{0 => [0], 1 => [1]}, %{0 => [1]}, %{}, %{}]
        ).(args)

      assert length(results) == 4
      assert_tiles(results, expected)
    end
  end

  describe "EXLA's sharding cases" do
    test "tuple outputs, one input split on both mesh axes and one on axis 0 only" do
      fun = fn x, y -> {Nx.add(x, y), Nx.multiply(y, 2)} end
      mesh = %Mesh{name: "mesh", shape: {2, 2}}

      args = [
        [Nx.tensor([[0], [1], [2], [3]]), Nx.tensor([[100], [101], [102], [103]])],
        [Nx.tensor([[10], [11], [12], [13]]), Nx.tensor([[100], [101], [102], [103]])],
        [Nx.tensor([[4], [5], [6], [7]]), Nx.tensor([[104], [105], [106], [107]])],
        [Nx.tensor([[14], [15], [16], [17]]), Nx.tensor([[104], [105], [106], [107]])]
      ]

      [{a0, b0}, {a1, b1}, {a2, b2}, {a3, b3}] =
        shard_jit(fun, mesh, input_shardings: [%{0 => [0], 1 => [1]}, %{0 => [0]}]).(args)

      assert_equal(a0, Nx.tensor([[100], [102], [104], [106]]))
      assert_equal(a1, Nx.tensor([[110], [112], [114], [116]]))
      assert_equal(a2, Nx.tensor([[108], [110], [112], [114]]))
      assert_equal(a3, Nx.tensor([[118], [120], [122], [124]]))
      # y is whole along mesh axis 1: partitions 0 and 1 hold the same rows, as do 2 and 3.
      assert_equal(b0, Nx.tensor([[200], [202], [204], [206]]))
      assert_equal(b1, Nx.tensor([[200], [202], [204], [206]]))
      assert_equal(b2, Nx.tensor([[208], [210], [212], [214]]))
      assert_equal(b3, Nx.tensor([[208], [210], [212], [214]]))
    end

    test "three inputs, two of them partially replicated" do
      fun = fn x, y, z -> Nx.add(Nx.multiply(x, y), z) end
      mesh = %Mesh{name: "mesh", shape: {2, 2}}
      hundreds = Nx.tensor([[100], [100], [100], [100]])
      ones = Nx.tensor([[1], [1], [1], [1]])
      twos = Nx.tensor([[2], [2], [2], [2]])

      args = [
        [Nx.tensor([[0], [1], [2], [3]]), ones, hundreds],
        [Nx.tensor([[10], [11], [12], [13]]), ones, hundreds],
        [Nx.tensor([[4], [5], [6], [7]]), twos, hundreds],
        [Nx.tensor([[14], [15], [16], [17]]), twos, hundreds]
      ]

      results =
        shard_jit(fun, mesh, input_shardings: [%{0 => [0], 1 => [1]}, %{0 => [0]}, %{0 => [0]}]).(
          args
        )

      expected = [
        [[100], [101], [102], [103]],
        [[110], [111], [112], [113]],
        [[108], [110], [112], [114]],
        [[128], [130], [132], [134]]
      ]

      for {result, rows} <- Enum.zip(results, expected), do: assert_equal(result, Nx.tensor(rows))
    end

    test "a 3-D mesh {2, 1, 2}, each dimension on its axis" do
      args = for k <- 0..3, do: [Nx.iota({2, 2, 2}) |> Nx.add(8 * k)]
      mesh = %Mesh{name: "3d_mesh", shape: {2, 1, 2}}

      results =
        shard_jit(&Nx.multiply(&1, 2), mesh, input_shardings: [%{0 => [0], 1 => [1], 2 => [2]}]).(
          args
        )

      for {[shard], result} <- Enum.zip(args, results),
          do: assert_equal(result, Nx.multiply(shard, 2))
    end

    test "a dimension split over both mesh axes, transposed" do
      full = Nx.iota({4, 4})
      mesh = %Mesh{name: "mesh", shape: {2, 2}}
      args = for rows <- split(full, 0, 4), do: [rows]

      results =
        shard_jit(&Nx.transpose/1, mesh, input_shardings: [%{0 => [0, 1], 1 => []}]).(args)

      for {result, k} <- Enum.with_index(results),
          do: assert_equal(result, Nx.tensor(for i <- 0..3, do: [4 * k + i]))
    end

    test "windows across the shards' edges" do
      mesh = %Mesh{name: "mesh", shape: {2, 2}}

      args = [
        [Nx.tensor([[1, 2]])],
        [Nx.tensor([[3, 4]])],
        [Nx.tensor([[5, 6]])],
        [Nx.tensor([[7, 8]])]
      ]

      shardings = [input_shardings: [%{0 => [0], 1 => [1]}]]

      strided = shard_jit(&Nx.window_sum(&1, {2, 2}, strides: [2, 2]), mesh, shardings).(args)
      # The whole result is [[14, 22]]: XLA's partitioner may split it, or give it to each.
      assert_tiles(strided, Nx.tensor([[14, 22]]))

      same = shard_jit(&Nx.window_sum(&1, {2, 2}, padding: :same), mesh, shardings).(args)
      assert Enum.map(same, &Nx.to_list/1) == [[[14, 18]], [[22, 12]], [[11, 13]], [[15, 8]]]

      valid = shard_jit(&Nx.window_sum(&1, {2, 2}, padding: :valid), mesh, shardings).(args)
      assert Enum.map(valid, &Nx.to_list/1) == List.duplicate([[14, 18, 22]], 4)
    end

    test "named and negative dimensions" do
      mesh = %Mesh{name: "mesh", shape: {2}}
      x = Nx.iota({4, 2}, names: [:batch, :features])
      args = for rows <- split(x, 0, 2), do: [rows]

      for sharding <- [%{batch: [0]}, %{-2 => [0]}] do
        results = shard_jit(&Nx.add(&1, 1), mesh, input_shardings: [sharding]).(args)
        assert_equal(Nx.concatenate(results), Nx.add(x, 1))
      end
    end
  end

  test "results stay on their devices as XlaNode.Backend tensors where jit keeps them" do
    mesh = %Mesh{name: "mesh", shape: {4}}
    x = Nx.iota({8, 64}, type: :f32)
    args = for rows <- split(x, 0, 4), do: [rows]

    results =
      shard_jit(&Nx.multiply(&1, 2), mesh, input_shardings: [%{0 => [0]}], keep_on_device: true).(
        args
      )

    assert Enum.all?(results, &match?(%Nx.Tensor{data: %XlaNode.Backend{}}, &1))
    assert_equal(Nx.concatenate(Enum.map(results, &Nx.backend_copy/1)), Nx.multiply(x, 2))

    for {result, device} <- Enum.with_index(results), do: assert_on_device(result, device)
  end

  test "device_id: puts the mesh on the devices from it" do
    mesh = %Mesh{name: "pair", shape: {2}}

    results =
      shard_jit(&Nx.add(&1, 1), mesh,
        input_shardings: [%{0 => [0]}],
        device_id: 2,
        keep_on_device: true
      ).([[Nx.tensor([1, 2])], [Nx.tensor([3, 4])]])

    assert Enum.map(results, &Nx.to_list/1) == [[2, 3], [4, 5]]
    assert_on_device(Enum.at(results, 0), 2)
    assert_on_device(Enum.at(results, 1), 3)

    assert_raise ArgumentError, ~r/needs 2 devices \(from device 3\), but .* has 4/, fn ->
      shard_jit(&Nx.add(&1, 1), mesh, input_shardings: [%{0 => [0]}], device_id: 3).([
        [Nx.tensor([1, 2])],
        [Nx.tensor([3, 4])]
      ])
    end
  end

  test "a second call with shards of the same shapes compiles nothing" do
    ref = :telemetry_test.attach_event_handlers(self(), [[:xla_node, :compile, :stop]])
    mesh = %Mesh{name: "mesh", shape: {2}}
    fun = shard_jit(&Nx.subtract(&1, 3), mesh, input_shardings: [%{0 => [0]}])

    try do
      fun.([[Nx.tensor([1, 2])], [Nx.tensor([3, 4])]])
      assert_receive {[:xla_node, :compile, :stop], ^ref, _, %{compiler: XlaNode.Compiler}}

      assert Enum.map(fun.([[Nx.tensor([5, 6])], [Nx.tensor([7, 8])]]), &Nx.to_list/1) == [
               [2, 3],
               [4, 5]
             ]

      refute_receive {[:xla_node, :compile, :stop], ^ref, _, _}, 100

      # Another mesh, or other shapes, are other programs.
      fun.([[Nx.tensor([1, 2, 3])], [Nx.tensor([3, 4, 5])]])
      assert_receive {[:xla_node, :compile, :stop], ^ref, _, _}
    after
      :telemetry.detach(ref)
    end
  end

  test "shardings are checked at every call, and two spellings of one sharding agree" do
    mesh = %Mesh{name: "mesh", shape: {2}}
    args = [[Nx.iota({2, 3}, names: [:rows, :cols])], [Nx.iota({2, 3}, names: [:rows, :cols])]]
    by_index = shard_jit(&Nx.multiply(&1, 2), mesh, input_shardings: [%{0 => [0]}])
    by_name = shard_jit(&Nx.multiply(&1, 2), mesh, input_shardings: [%{rows: [0]}])
    expected = [[[0, 2, 4], [6, 8, 10]], [[0, 2, 4], [6, 8, 10]]]
    assert Enum.map(by_index.(args), &Nx.to_list/1) == expected
    assert Enum.map(by_name.(args), &Nx.to_list/1) == expected

    # A sharding that cannot be is refused each time, never kept.
    wrong = shard_jit(&Nx.multiply(&1, 2), mesh, input_shardings: [%{0 => [1]}])

    for _ <- 1..2 do
      assert_raise ArgumentError, ~r/names mesh axis 1, but the mesh has 1 axes/, fn ->
        wrong.(args)
      end
    end
  end

  describe "errors say what is wrong" do
    @mesh %Mesh{name: "mesh", shape: {2, 2}}

    defp raises(message, fun, args, opts, mesh \\ @mesh) do
      assert_raise ArgumentError, message, fn -> shard_jit(fun, mesh, opts).(args) end
    end

    test "input_shardings missing, not a list, of the wrong count or kind" do
      args = List.duplicate([Nx.iota({4, 2})], 4)
      add = &Nx.add(&1, 1)
      raises(~r/needs input_shardings: a list with one map per argument/, add, args, [])
      raises(~r/needs input_shardings.*got: nil/, add, args, input_shardings: nil)

      raises(
        ~r/expected 2 input sharding\(s\), one per argument, got 1/,
        &Nx.add/2,
        List.duplicate([Nx.iota({4, 1}), Nx.iota({4, 1})], 4),
        input_shardings: [%{0 => [0]}]
      )

      raises(~r/argument 0 must be a map/, add, args, input_shardings: [[0]])
    end

    test "a mesh axis the mesh has not, or used twice in one input" do
      add = &Nx.add(&1, 1)
      args = List.duplicate([Nx.iota({4, 2})], 4)

      raises(~r/names mesh axis 2, but the mesh has 2 axes \(0..1\)/, add, args,
        input_shardings: [%{0 => [2]}]
      )

      raises(~r/uses mesh axis 0 twice/, add, args, input_shardings: [%{0 => [0], 1 => [0]}])
    end

    test "a sharding key that names no dimension" do
      add = &Nx.add(&1, 1)
      args = List.duplicate([Nx.iota({4, 2})], 2)
      mesh = %Mesh{name: "mesh", shape: {2}}

      raises(
        ~r/given axis \(3\) invalid for shape with rank 2/,
        add,
        args,
        [input_shardings: [%{3 => [0]}]],
        mesh
      )

      raises(
        ~r/given axis \(-3\) invalid for shape with rank 2/,
        add,
        args,
        [input_shardings: [%{-3 => [0]}]],
        mesh
      )

      raises(
        ~r/names dimension 0 twice/,
        add,
        args,
        [input_shardings: [%{0 => [0], -2 => []}]],
        mesh
      )
    end

    test "a mesh larger than the node's devices, or other than the argument lists" do
      add = &Nx.add(&1, 1)
      big = %Mesh{name: "big", shape: {4, 2}}

      raises(
        ~r/the mesh \{4, 2\} needs 8 devices \(from device 0\), but .* has 4/,
        add,
        List.duplicate([Nx.iota({2})], 8),
        [input_shardings: [%{0 => [0]}]],
        big
      )

      raises(
        ~r/one argument list per device of the mesh \{2, 2\} \(4\), got 2/,
        add,
        List.duplicate([Nx.iota({2})], 2),
        input_shardings: [%{0 => [0]}]
      )

      raises(
        ~r/the mesh's shape must be a tuple of positive integers/,
        add,
        [[Nx.iota({2})]],
        [input_shardings: [%{}]],
        %Mesh{name: "empty", shape: {0}}
      )

      raises(
        ~r/takes an %Nx.Mesh\{\} as its mesh, got: \{2, 2\}/,
        add,
        [[Nx.iota({2})]],
        [input_shardings: [%{}]],
        {2, 2}
      )
    end

    test "partitions whose shards disagree" do
      args = [[Nx.iota({2, 2})], [Nx.iota({2, 2})], [Nx.iota({3, 2})], [Nx.iota({2, 2})]]

      raises(
        ~r/partition 2 gives a shard of type \{:s, 32\} and shape \{3, 2\}.*\{2, 2\}/,
        &Nx.add(&1, 1),
        args,
        input_shardings: [%{0 => [0]}]
      )
    end

    test "a pool, and callbacks inside the sharded function" do
      add = &Nx.add(&1, 1)
      args = List.duplicate([Nx.iota({2})], 4)

      hooked = fn x -> x |> Nx.add(1) |> Nx.Defn.Kernel.hook(:seen) end

      raises(~r/an SPMD program cannot call back/, hooked, args, input_shardings: [%{0 => [0]}])

      {:ok, pool} = XlaNode.Pool.start_link(nodes: [xla()])

      assert_raise ArgumentError, ~r/not an XlaNode.Pool/, fn ->
        Nx.Defn.shard_jit(add, @mesh,
          compiler: XlaNode.Compiler,
          node: pool,
          input_shardings: [%{}]
        ).(args)
      end
    end
  end
end
