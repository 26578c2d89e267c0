defmodule XlaNode.BackendTest do
  # Tensors on the node, operations run there: every result is compared with Nx.BinaryBackend's
  # on the same values. Not async: its tensors stay on the node, and other tests count the
  # node's buffers.
  use ExUnit.Case, async: false

  # Compiles go one at a time through XlaNode.Compiler.Cache; on a loaded 2-core machine a test
  # that compiles many programs (linear algebra's) can take over a minute.
  @moduletag timeout: 300_000

  alias XlaNode.NxTest.Node

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name
  defp on_node(t, node \\ nil), do: Nx.backend_copy(t, {XlaNode.Backend, node: node || xla()})

  # `fun` on the node's copies of `args` and on the BinaryBackend originals: the node's results
  # live on the node and match.
  defp assert_same(fun, args, opts \\ []) do
    ours = apply(fun, Enum.map(args, &on_node/1))
    theirs = apply(fun, args)
    assert_match(ours, theirs, opts)
    ours
  end

  defp assert_match(%Nx.Tensor{} = ours, %Nx.Tensor{} = theirs, opts) do
    assert %XlaNode.Backend{node: node} = ours.data
    assert node == xla()
    assert {ours.type, ours.shape, ours.names} == {theirs.type, theirs.shape, theirs.names}
    ours = Nx.backend_transfer(ours)

    if Nx.Type.integer?(theirs.type) do
      assert Nx.to_flat_list(ours) == Nx.to_flat_list(theirs)
    else
      close =
        Nx.all_close(ours, theirs, atol: opts[:atol] || 1.0e-5, rtol: 1.0e-4, equal_nan: true)

      assert Nx.to_number(close) == 1, "got #{inspect(ours)}\nexpected #{inspect(theirs)}"
    end
  end

  defp assert_match(ours, theirs, opts) when is_tuple(ours) do
    assert tuple_size(ours) == tuple_size(theirs)
    Enum.zip_with(Tuple.to_list(ours), Tuple.to_list(theirs), &assert_match(&1, &2, opts))
  end

  @f Nx.tensor([[0.5, -1.5, 2.0], [3.25, 0.0, -0.75]], names: [:rows, :cols])
  @g Nx.tensor([[1.0, 2.0, -3.0], [0.25, -4.0, 5.0]])
  @i Nx.tensor([[1, -2, 3], [4, 5, -6]], type: :s32)
  @v Nx.tensor([3.0, 1.0, 2.0, 1.0, 5.0, 4.0])

  describe "operations run on the node" do
    test "element-wise" do
      for f <-
            [&Nx.add/2, &Nx.subtract/2, &Nx.multiply/2, &Nx.divide/2, &Nx.atan2/2] ++
              [
                &Nx.min/2,
                &Nx.max/2,
                &Nx.pow(Nx.add(Nx.abs(&1), 1), &2),
                &Nx.remainder/2,
                &Nx.greater/2
              ] ++
              [&Nx.less_equal/2, &Nx.equal/2, &Nx.logical_and/2, &Nx.logical_xor/2] do
        assert_same(f, [@f, @g])
      end

      for f <-
            [&Nx.quotient/2, &Nx.bitwise_and/2, &Nx.bitwise_or/2, &Nx.bitwise_xor/2] ++
              [&Nx.left_shift(&1, Nx.abs(&2)), &Nx.right_shift(&1, Nx.abs(&2))] do
        assert_same(f, [@i, Nx.tensor([[3, 1, 2], [2, 2, 1]], type: :s32)])
      end

      for f <-
            [&Nx.exp/1, &Nx.log(Nx.abs(&1)), &Nx.sigmoid/1, &Nx.tanh/1, &Nx.sin/1] ++
              [&Nx.erf/1, &Nx.abs/1, &Nx.negate/1, &Nx.floor/1, &Nx.round/1, &Nx.sign/1] ++
              [&Nx.cbrt/1, &Nx.is_nan/1, &Nx.as_type(&1, :s64), &Nx.bitcast(&1, :s32)] do
        assert_same(f, [@f])
      end

      for f <- [&Nx.bitwise_not/1, &Nx.population_count/1, &Nx.count_leading_zeros/1] do
        assert_same(f, [@i])
      end

      assert_same(&Nx.select(Nx.greater(&1, 0), &1, &2), [@f, @g])
      assert_same(&Nx.clip(&1, -1.0, 1.0), [@f])
      assert_same(&Nx.add(&1, 1), [@f])
      assert_same(&Nx.multiply(&1, Complex.new(0, 1)), [@f])
      assert_same(&(&1 |> Nx.multiply(Complex.new(1, 2)) |> Nx.conjugate() |> Nx.imag()), [@f])
    end

    test "reductions" do
      for f <-
            [&Nx.sum/1, &Nx.sum(&1, axes: [:cols], keep_axes: true), &Nx.product/1] ++
              [&Nx.reduce_max(&1, axes: [0]), &Nx.reduce_min/1, &Nx.mean/1] ++
              [&Nx.argmax(&1, axis: 1), &Nx.argmin(&1, tie_break: :high), &Nx.all/1] ++
              [&Nx.any(&1, axes: [1]), &Nx.logsumexp/1, &Nx.standard_deviation/1] do
        assert_same(f, [@f])
      end

      assert_same(&Nx.reduce(&1, 1.0, [axes: [0]], fn a, b -> Nx.multiply(a, b) end), [@f])
    end

    test "shapes" do
      for f <-
            [&Nx.reshape(&1, {3, 2}), &Nx.transpose/1, &Nx.reverse(&1, axes: [1])] ++
              [&Nx.new_axis(&1, 0), &Nx.squeeze(Nx.new_axis(&1, 0)), &Nx.flatten/1] ++
              [&Nx.broadcast(&1, {4, 2, 3}), &Nx.pad(&1, 0.0, [{1, -1, 1}, {0, 2, 0}])] ++
              [&Nx.slice(&1, [0, 1], [2, 2]), &Nx.slice(&1, [0, 0], [2, 2], strides: [1, 2])] ++
              [&Nx.concatenate([&1, &1], axis: 1), &Nx.stack([&1, &1, &1])] ++
              [&Nx.put_slice(&1, [1, 1], Nx.tensor([[9.0, 8.0]]))] do
        assert_same(f, [@f])
      end

      # Start indices given as tensors.
      assert_same(&Nx.slice(&1, [&2, 1], [1, 2]), [@f, Nx.tensor(1)])
      assert_same(&Nx.put_slice(&1, [&2, 0], Nx.tensor([[7.0]])), [@f, Nx.tensor(1)])
      assert_same(&Nx.dot/2, [@f, Nx.transpose(@g)])
      assert_same(&Nx.dot(&1, [2], [0], &2, [1], [0]), [Nx.iota({2, 3, 4}), Nx.iota({2, 4, 5})])
    end

    test "indexing and sorting" do
      idx = Nx.tensor([[1], [0], [1]])
      assert_same(&Nx.gather/2, [@f, Nx.tensor([[0, 1], [1, 2]])])
      assert_same(&Nx.take(&1, Nx.tensor([2, 0, 2]), axis: 1), [@f])
      assert_same(&Nx.take_along_axis(&1, Nx.tensor([[0, 0], [2, 1]]), axis: 1), [@f])
      assert_same(&Nx.indexed_add(&1, idx, Nx.tensor([1, 2, 3])), [@v |> Nx.as_type(:s32)])

      assert_same(&Nx.indexed_put(&1, Nx.tensor([[0, 0], [1, 2]]), &2), [
        @f,
        Nx.tensor([1.0, 2.0])
      ])

      assert_same(&Nx.sort(&1, direction: :desc), [@v])
      assert_same(&Nx.argsort(&1, stable: true), [@v])
      assert_same(&Nx.top_k(&1, k: 2), [@v])
      assert_same(&Nx.cumulative_sum/1, [@v])
    end

    test "windows and convolutions" do
      t = Nx.iota({1, 1, 4, 5}, type: :f32)

      for f <-
            [&Nx.window_sum(&1, {1, 1, 2, 2}), &Nx.window_max(&1, {1, 1, 3, 3}, padding: :same)] ++
              [&Nx.window_min(&1, {1, 1, 2, 2}, strides: [1, 1, 2, 1])] ++
              [&Nx.window_product(&1, {1, 1, 1, 2})] ++
              [&Nx.window_reduce(&1, 0.0, {1, 1, 2, 2}, fn a, b -> Nx.max(a, b) end)] do
        assert_same(f, [t])
      end

      src = Nx.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])

      assert_same(&Nx.window_scatter_max(&1, src, 0.0, {1, 1, 2, 2}, strides: [1, 1, 2, 2]), [
        Nx.slice(t, [0, 0, 0, 0], [1, 1, 4, 4])
      ])

      kernel = Nx.iota({2, 1, 2, 2}, type: :f32)
      assert_same(&Nx.conv(&1, kernel, padding: :same, strides: [1, 2]), [t])
      assert_same(&Nx.conv(&1, &2, feature_group_size: 2), [Nx.iota({1, 2, 3, 3}), kernel])
    end

    test "linear algebra and fft" do
      a = Nx.tensor([[4.0, 1.0, 2.0], [1.0, 3.0, 0.5], [2.0, 0.5, 5.0]])
      b = Nx.tensor([1.0, 2.0, 3.0])
      assert_same(&Nx.LinAlg.cholesky/1, [a])
      assert_same(&Nx.LinAlg.triangular_solve(&1, &2, lower: true), [Nx.tril(a), b])
      assert_same(&Nx.LinAlg.solve/2, [a, b])
      assert_same(&Nx.LinAlg.invert/1, [a])
      assert_same(&Nx.LinAlg.determinant/1, [a])
      assert_same(&Nx.LinAlg.norm/1, [a])
      assert_same(&Nx.LinAlg.qr/1, [a])
      assert_same(&Nx.LinAlg.lu/1, [a])
      {eigenvalues, _} = assert_same(&Nx.LinAlg.eigh/1, [a], atol: 1.0e-3)
      assert %XlaNode.Backend{} = eigenvalues.data
      {u, s, vt} = Nx.LinAlg.svd(on_node(a))
      assert %XlaNode.Backend{} = s.data
      assert Nx.to_number(Nx.all_close(u |> Nx.multiply(s) |> Nx.dot(vt), a, atol: 1.0e-4)) == 1

      assert_same(&Nx.fft/1, [@v])
      assert_same(&Nx.ifft/1, [Nx.as_type(@v, :c64)])
      assert_same(&Nx.fft2/1, [Nx.reshape(@v, {2, 3})])
      assert_same(&Nx.rfft/1, [@v])
    end

    test "a vectorized tensor" do
      v = Nx.vectorize(Nx.iota({3, 2}, type: :f32), :x)
      ours = Nx.exp(on_node(v))
      assert ours.vectorized_axes == [x: 3]
      assert %XlaNode.Backend{} = ours.data
      expected = Nx.exp(v)

      assert Nx.to_number(
               Nx.all_close(Nx.devectorize(Nx.backend_transfer(ours)), Nx.devectorize(expected))
             ) == 1
    end
  end

  describe "creation" do
    test "tensors, iota, eye and constants are made on the node" do
      backend = {XlaNode.Backend, node: xla()}
      t = Nx.tensor([[1, 2], [3, 4]], type: :u16, backend: backend)
      assert %XlaNode.Backend{buffer: buffer} = t.data
      assert is_reference(buffer)
      assert Nx.to_list(t) == [[1, 2], [3, 4]]

      assert Nx.iota({2, 3}, axis: 1, backend: backend) |> Nx.to_list() == [[0, 1, 2], [0, 1, 2]]

      assert Nx.eye(3, type: :f32, backend: backend) |> Nx.to_list() ==
               Nx.to_list(Nx.eye(3, type: :f32))

      # A large constant is broadcast on the node; a scalar rides in the struct until used.
      full = Nx.broadcast(Nx.tensor(2.5, backend: backend), {300, 400})
      assert is_reference(full.data.buffer)
      assert Nx.to_number(Nx.sum(full)) == 2.5 * 300 * 400
      assert %XlaNode.Backend{buffer: {:inline, _}} = Nx.tensor(1.0, backend: backend).data
    end

    test "Nx.Random, with the default backend on the node" do
      Nx.default_backend({XlaNode.Backend, node: xla()})
      key = Nx.Random.key(42)
      {u, _key} = Nx.Random.uniform(key, shape: {4})
      {n, _key} = Nx.Random.normal(key, shape: {2, 2})
      assert %XlaNode.Backend{} = u.data
      assert %XlaNode.Backend{} = n.data

      Nx.default_backend(Nx.BinaryBackend)
      key = Nx.Random.key(42)
      assert Nx.to_flat_list(u) == Nx.to_flat_list(elem(Nx.Random.uniform(key, shape: {4}), 0))
      expected = elem(Nx.Random.normal(key, shape: {2, 2}), 0)
      assert Nx.to_number(Nx.all_close(Nx.backend_transfer(n), expected)) == 1
    end

    test "Nx.to_batched, the leftover repeated" do
      batches = @v |> on_node() |> Nx.to_batched(4, leftover: :repeat) |> Enum.to_list()
      assert Enum.all?(batches, &match?(%XlaNode.Backend{}, &1.data))
      assert Enum.map(batches, &Nx.to_flat_list/1) == [[3.0, 1.0, 2.0, 1.0], [5.0, 4.0, 3.0, 1.0]]
    end

    test "the node option is checked" do
      assert_raise ArgumentError, ~r/needs the compute node/, fn ->
        Nx.tensor([1], backend: XlaNode.Backend)
      end

      # An option it does not know is ignored (as EXLA.Backend does), so a misspelt node is
      # a missing one.
      assert_raise ArgumentError, ~r/needs the compute node/, fn ->
        Nx.tensor([1], backend: {XlaNode.Backend, nod: xla()})
      end

      assert_raise ArgumentError, ~r/must be a node name/, fn ->
        Nx.tensor([1], backend: {XlaNode.Backend, node: "xla@host"})
      end

      t = Nx.tensor([1], backend: {XlaNode.Backend, node: xla(), client: :host})
      assert Nx.to_flat_list(Nx.add(t, 1)) == [2]
    end
  end

  describe "transfers" do
    # Every type of Nx, the 2- and 4-bit ones packed as Nx packs them.
    @types [s: 2, s: 4, s: 8, s: 16, s: 32, s: 64, u: 2, u: 4, u: 8, u: 16, u: 32, u: 64] ++
             [f: 8, f8_e4m3fn: 8, f: 16, bf: 16, f: 32, f: 64, c: 64, c: 128]

    test "BinaryBackend -> node -> BinaryBackend keeps every bit, for every type" do
      for {_, bits} = type <- @types do
        # Every byte value in every byte of an element (signed zeros, infinities, NaNs with
        # payloads, subnormals, the extremes of the integers), then random ones.
        bytes = max(div(bits, 8), 1)

        binary =
          for(i <- 0..255, into: <<>>, do: :binary.copy(<<i>>, bytes)) <>
            :crypto.strong_rand_bytes(bytes * 64)

        t = Nx.from_binary(binary, type) |> Nx.reshape({:auto, 2})
        there = Nx.backend_transfer(t, {XlaNode.Backend, node: xla()})
        assert is_reference(there.data.buffer)
        back = Nx.backend_transfer(there, Nx.BinaryBackend)
        assert {back.type, back.shape} == {type, t.shape}
        assert Nx.to_binary(back) == binary, "#{inspect(type)} changed on the way"
      end
    end

    test "node A -> node B, and copies" do
      b = Node.start!("xla_nx_b_#{System.pid()}")
      on_exit(fn -> Node.stop(b) end)

      a_tensor = on_node(@f)
      b_tensor = Nx.backend_copy(a_tensor, {XlaNode.Backend, node: b.name})
      assert b_tensor.data.node == b.name
      assert b_tensor.names == [:rows, :cols]
      assert Nx.to_binary(b_tensor) == Nx.to_binary(@f)

      # A copy on the same node is a new buffer; a transfer to it is the tensor itself.
      copy = Nx.backend_copy(a_tensor, {XlaNode.Backend, node: xla()})
      assert copy.data.buffer != a_tensor.data.buffer
      assert Nx.backend_transfer(copy, {XlaNode.Backend, node: xla()}) == copy

      # A transfer frees the source.
      moved = Nx.backend_transfer(a_tensor, {XlaNode.Backend, node: b.name})
      assert Nx.to_binary(moved) == Nx.to_binary(@f)
      error = assert_raise XlaNode.Error, fn -> Nx.to_binary(a_tensor) end
      assert error.kind == :gone
      assert error.message =~ "#{inspect(xla())} is gone"

      # Tensors of two nodes in one operation: it runs on the first one's node, the other's
      # data moved there.
      sum = Nx.add(copy, b_tensor)
      assert sum.data.node == xla()
      assert Nx.to_binary(sum) == Nx.to_binary(Nx.add(@f, @f))
      sum = Nx.add(b_tensor, copy)
      assert sum.data.node == b.name
    end

    test "deallocation, and reading a freed tensor" do
      t = on_node(@f)
      assert Nx.backend_deallocate(t) == :ok
      assert Nx.backend_deallocate(t) == :already_deallocated
      error = assert_raise XlaNode.Error, fn -> Nx.exp(t) end
      assert error.kind == :gone
      assert error.message =~ inspect(xla())
      assert_raise XlaNode.Error, ~r/is gone/, fn -> Nx.to_flat_list(t) end
      # Inspect shows the error instead of raising it.
      assert inspect(t) =~ "is gone"
    end

    test "inspect and to_binary with a limit read only what they show" do
      big = Nx.iota({500, 500}, type: :f32, backend: {XlaNode.Backend, node: xla()})

      assert Nx.to_binary(big, limit: 3) ==
               <<0.0::float-32-native, 1.0::float-32-native, 2.0::float-32-native>>

      assert inspect(big, limit: 4) =~ "[0.0, 1.0, 2.0, 3.0, ...]"

      # A packed type: the elements' bits, not whole bytes.
      packed = Nx.iota({500, 500}, type: :u4, backend: Nx.BinaryBackend)
      packed = Nx.backend_transfer(packed, {XlaNode.Backend, node: xla()})
      assert Nx.to_binary(packed, limit: 3) == <<0::4, 1::4, 2::4>>
    end

    test "pointers raise" do
      assert_raise ArgumentError, ~r/another machine/, fn -> Nx.to_pointer(on_node(@f)) end
    end
  end

  describe "errors" do
    test "a node that is down, or goes down, raises naming it; its tensors are gone" do
      assert_raise XlaNode.Error, ~r/nowhere@nohost/, fn ->
        Nx.tensor([1.0, 2.0], backend: {XlaNode.Backend, node: :nowhere@nohost})
      end

      doomed = Node.start!("xla_nx_gone_#{System.pid()}")
      backend = {XlaNode.Backend, node: doomed.name}
      t = Nx.iota({2000, 2000}, type: :f32, backend: backend)
      # Compiled and run once, so that the next run is only the run.
      Nx.dot(t, t)
      parent = self()

      running =
        Task.async(fn ->
          send(parent, :running)

          # The node answers the product once launched (its result stays there); reading the
          # result waits for it.
          try do
            t |> Nx.dot(t) |> Nx.to_binary()
          rescue
            e in XlaNode.Error -> e
          end
        end)

      assert_receive :running
      Process.sleep(20)
      Node.stop(doomed)
      assert %XlaNode.Error{kind: :nodedown, message: message} = Task.await(running, 30_000)
      assert message =~ Atom.to_string(doomed.name)

      error = assert_raise XlaNode.Error, fn -> Nx.to_binary(t) end
      assert error.kind == :nodedown
      assert error.message =~ "the tensors on #{inspect(doomed.name)} are gone"
    end
  end

  describe "with XlaNode.Compiler" do
    test "a tensor on the node goes as its buffer, and results stay there by default" do
      x = on_node(Nx.iota({64, 64}, type: :f32))
      f = Nx.Defn.jit(&Nx.multiply(&1, 2), compiler: XlaNode.Compiler, node: xla())

      # The default backend is BinaryBackend: results come back.
      assert %Nx.BinaryBackend{} = f.(x).data

      Nx.default_backend({XlaNode.Backend, node: xla()})
      y = f.(x)
      assert %XlaNode.Backend{node: node} = y.data
      assert node == xla()
      assert Nx.to_flat_list(y) == Nx.to_flat_list(Nx.multiply(Nx.iota({64, 64}, type: :f32), 2))

      # keep_on_device: false still brings them back.
      g =
        Nx.Defn.jit(&Nx.multiply(&1, 2),
          compiler: XlaNode.Compiler,
          node: xla(),
          keep_on_device: false
        )

      assert %Nx.BinaryBackend{} = g.(x).data
    end
  end
end
