defmodule XlaNode.CompilerTest do
  use ExUnit.Case, async: true

  import Nx.Defn
  import ExUnit.CaptureIO
  import XlaNode.NxTest.Compare

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  @f Nx.tensor([[0.5, -1.5, 2.0], [3.25, 0.0, -0.75]])
  @i Nx.tensor([[1, -2, 3], [4, 5, -6]], type: :s32)
  @u Nx.tensor([1, 200, 3], type: :u8)

  test "elementwise unary ops" do
    for f <- [
          &Nx.exp/1,
          &Nx.log1p(Nx.abs(&1)),
          &Nx.sigmoid/1,
          &Nx.tanh/1,
          &Nx.sin/1,
          &Nx.erf/1,
          &Nx.abs/1,
          &Nx.negate/1,
          &Nx.floor/1,
          &Nx.ceil/1,
          &Nx.round/1,
          &Nx.sign/1,
          &Nx.sqrt(Nx.abs(&1)),
          &Nx.is_nan/1,
          &Nx.cbrt/1,
          &Nx.atan/1
        ] do
      assert_same(f, [@f])
    end

    for f <- [
          &Nx.abs/1,
          &Nx.negate/1,
          &Nx.sign/1,
          &Nx.bitwise_not/1,
          &Nx.exp/1,
          &Nx.population_count/1,
          &Nx.count_leading_zeros/1
        ] do
      assert_same(f, [@i])
    end

    assert_same(&Nx.sign/1, [@u])
  end

  test "every dtype, with edge values" do
    finite = [0.0, -0.0, 1.5, -2.5, 3.0]
    special = [1.5, :nan, :infinity, :neg_infinity]

    for type <- [{:f, 16}, {:bf, 16}, {:f, 32}, {:f, 64}] do
      x = Nx.tensor(finite, type: type)
      s = Nx.tensor(special, type: type)

      for f <- [
            &Nx.exp/1,
            &Nx.sign/1,
            &Nx.floor/1,
            &Nx.round/1,
            &Nx.sort/1,
            &Nx.argmax/1,
            &Nx.as_type(&1, :s32),
            &Nx.sum/1
          ] do
        assert_same(f, [x])
      end

      for f <- [
            &Nx.add(&1, &1),
            &Nx.multiply(&1, 2),
            &Nx.negate/1,
            &Nx.abs/1,
            &Nx.is_nan/1,
            &Nx.is_infinity/1,
            &Nx.greater(&1, 0),
            &Nx.equal(&1, &1)
          ] do
        assert_same(f, [s])
      end
    end

    for type <- [{:s, 8}, {:s, 16}, {:s, 64}, {:u, 8}, {:u, 16}, {:u, 32}, {:u, 64}] do
      x = Nx.tensor([0, 1, 7, 100], type: type)

      for f <- [
            &Nx.add(&1, &1),
            &Nx.multiply(&1, 3),
            &Nx.quotient(&1, 3),
            &Nx.remainder(&1, 3),
            &Nx.bitwise_xor(&1, 5),
            &Nx.sum/1,
            &Nx.reduce_max/1,
            &Nx.argmin/1,
            &Nx.as_type(&1, :f32),
            &Nx.right_shift(&1, 1),
            &Nx.floor/1,
            &Nx.round/1
          ] do
        assert_same(f, [x])
      end
    end

    for type <- [{:c, 64}, {:c, 128}] do
      z = Nx.tensor([Complex.new(1.0, 2.0), Complex.new(-0.5, 0.0)], type: type)

      for f <- [
            &Nx.add(&1, &1),
            &Nx.multiply(&1, &1),
            &Nx.abs/1,
            &Nx.real/1,
            &Nx.imag/1,
            &Nx.conjugate/1,
            &Nx.exp/1,
            &Nx.sum/1
          ] do
        assert_same(f, [z])
      end
    end
  end

  test "binary ops with broadcasting and type promotion" do
    row = Nx.tensor([1.0, 2.0, 4.0])

    for f <- [
          &Nx.add/2,
          &Nx.subtract/2,
          &Nx.multiply/2,
          &Nx.divide/2,
          &Nx.pow/2,
          &Nx.max/2,
          &Nx.min/2,
          &Nx.atan2/2,
          &Nx.greater/2,
          &Nx.equal/2,
          &Nx.less_equal/2,
          &Nx.logical_and/2
        ] do
      assert_same(f, [@f, row])
      assert_same(f, [@i, row])
    end

    for f <- [
          &Nx.quotient/2,
          &Nx.remainder/2,
          &Nx.bitwise_and/2,
          &Nx.bitwise_xor/2,
          &Nx.left_shift(&1, Nx.abs(&2)),
          &Nx.right_shift(&1, Nx.abs(&2))
        ] do
      assert_same(f, [@i, Nx.tensor([3, 1, 2], type: :s32)])
    end

    assert_same(&Nx.add(&1, 1), [@u])
    assert_same(fn a, b -> Nx.select(Nx.greater(a, 0), a, b) end, [@f, Nx.tensor(-9.0)])
    assert_same(&Nx.clip(&1, -1, 1), [@f])
  end

  test "reductions, argmax and argmin" do
    for f <- [
          &Nx.sum/1,
          &Nx.sum(&1, axes: [1]),
          &Nx.product(&1, axes: [0], keep_axes: true),
          &Nx.reduce_max/1,
          &Nx.reduce_min(&1, axes: [1]),
          &Nx.all(&1, axes: [0]),
          &Nx.any/1,
          &Nx.argmax/1,
          &Nx.argmax(&1, axis: 1),
          &Nx.argmin(&1, axis: 0, keep_axis: true),
          &Nx.argmax(&1, axis: 1, tie_break: :high),
          &Nx.mean/1
        ] do
      assert_same(f, [@f])
      assert_same(f, [@i])
    end
  end

  test "shapes: dot, reshape, transpose, slices, concatenate, stack, pad, reverse, iota, eye" do
    a = Nx.iota({2, 3, 4}, type: :f32)
    b = Nx.iota({2, 4, 5}, type: :f32)
    assert_same(&Nx.dot(&1, [2], [0], &2, [1], [0]), [a, b])
    assert_same(&Nx.dot/2, [Nx.iota({3, 4}), Nx.iota({4})])
    assert_same(&Nx.reshape(&1, {4, 6}), [a])
    assert_same(&Nx.transpose(&1, axes: [2, 0, 1]), [a])
    assert_same(&Nx.slice(&1, [0, 1, 1], [2, 2, 3], strides: [1, 1, 2]), [a])
    assert_same(fn t, i -> Nx.slice(t, [0, i, 1], [2, 2, 2]) end, [a, Nx.tensor(1)])

    assert_same(fn t, i -> Nx.put_slice(t, [i, 0, 0], Nx.broadcast(-1.0, {1, 2, 2})) end, [
      a,
      Nx.tensor(1)
    ])

    assert_same(&Nx.concatenate([&1, &1], axis: 1), [a])
    assert_same(&Nx.stack([&1, &1], axis: 1), [@f])
    assert_same(&Nx.pad(&1, 0.0, [{1, 0, 1}, {0, 2, 0}]), [@f])
    assert_same(&Nx.reverse(&1, axes: [1]), [@f])
    assert_same(fn _ -> {Nx.iota({2, 3}, axis: 1), Nx.iota({2, 3}), Nx.eye(3)} end, [@f])
    assert_same(&Nx.as_type(&1, :s16), [@f])
    assert_same(&Nx.new_axis(&1, 0), [@f])
  end

  test "sort, argsort, take, gather, indexed_add, indexed_put" do
    v = Nx.tensor([[3.0, 1.0, 2.0], [0.5, 9.0, -1.0]])
    assert_same(&Nx.sort(&1, axis: 1), [v])
    assert_same(&Nx.sort(&1, axis: 0, direction: :desc), [v])
    assert_same(&Nx.argsort(&1, axis: 1), [v])
    assert_same(&Nx.take(&1, Nx.tensor([1, 0, 1]), axis: 0), [v])
    assert_same(&Nx.gather(&1, Nx.tensor([[1, 2], [0, 0]])), [v])

    assert_same(
      &Nx.indexed_add(&1, Nx.tensor([[0, 1], [1, 2], [0, 1]]), Nx.tensor([1.0, 2.0, 3.0])),
      [v]
    )

    assert_same(&Nx.indexed_put(&1, Nx.tensor([[0, 0], [1, 1]]), Nx.tensor([7.0, 8.0])), [v])
  end

  # The StableHLO text the compiler generates for `fun` on `args`.
  defp lowered(fun, args) do
    expr = apply(Nx.Defn.debug_expr(fun), args)
    XlaNode.Compiler.Lower.module(args, Nx.Defn.Composite.flatten_list([expr])).text
  end

  defp count(text, pattern), do: length(String.split(text, pattern)) - 1

  test "blocks: take and top_k lowered to one op" do
    v = Nx.iota({3, 4}, type: :f32)
    assert_same(&Nx.take(&1, Nx.tensor([[2, 0], [1, 1]]), axis: 1), [v])
    assert_same(&Nx.take(&1, Nx.tensor([2, 0, 2]), axis: 0), [v])

    assert count(
             lowered(&Nx.take(&1, Nx.tensor([2, 0, 2]), axis: 0), [v]),
             "\"stablehlo.gather\""
           ) == 1

    top = Nx.tensor([[3.0, 9.0, 1.0], [7.0, 2.0, 8.0]])
    assert_same(&Nx.top_k(&1, k: 2), [top])
    assert lowered(&Nx.top_k(&1, k: 2), [top]) =~ "chlo.top_k"
  end

  # The test kernel library is written for host memory.
  @tag :cpu_only
  test "Nx.block through XlaNode.Compiler.CustomCall: a kernel loaded on the node, or the default" do
    library = XlaNode.NxTest.Node.kernel_library!()
    :ok = XlaNode.load_kernel(xla(), "xn_add_scaled", library, "xn_add_scaled")
    f = &XlaNode.NxTest.AddScaled.add_scaled(&1, 3.0)
    x = Nx.tensor([[0.5, -1.0], [2.0, 3.0]])

    assert_same(f, [x])
    text = lowered(f, [x])
    assert text =~ ~s(call_target_name = "xn_add_scaled")
    assert text =~ "backend_config = {n = 3.0 : f32}"
    refute text =~ "stablehlo.sine"

    # The implementation skips f64, and other platforms: the default expression runs.
    assert_same(f, [Nx.as_type(x, :f64)])
    refute lowered(f, [Nx.as_type(x, :f64)]) =~ "custom_call"

    gpu =
      XlaNode.Compiler.Lower.module([x], [apply(Nx.Defn.debug_expr(f), [x])], %{
        node: nil,
        platform: "cuda"
      })

    refute gpu.text =~ "custom_call"
  end

  test "FFTs: one stablehlo.fft along any axes, with lengths and eps" do
    signal = Nx.tensor([[1.0, 2.0, 0.5, -1.0, 3.0], [0.0, 1.0, 0.0, -1.0, 0.25]])
    complex = Nx.complex(signal, Nx.reverse(signal))

    for {fun, arg, fft_type} <- [
          {&Nx.fft(&1), complex, "FFT"},
          {&Nx.fft(&1, axis: 0, length: 3), signal, "FFT"},
          {&Nx.ifft(&1, length: 4), complex, "IFFT"},
          {&Nx.fft2(&1, lengths: [4, 8]), signal, "FFT"},
          {&Nx.ifft2(&1, axes: [1, 0], eps: 1.0e-3), complex, "IFFT"},
          {&Nx.rfft(&1), signal, "RFFT"},
          {&Nx.rfft(&1, axis: 0, length: 4, eps: 1.0e-6), signal, "RFFT"},
          {&Nx.rfft(&1, length: :power_of_two), Nx.as_type(signal, :f64), "RFFT"},
          {&Nx.irfft(&1), complex, "IRFFT"},
          {&Nx.irfft(&1, length: 7, axis: 0), complex, "IRFFT"}
        ] do
      assert_same(fun, [arg])
      text = lowered(fun, [arg])
      assert count(text, "stablehlo.fft") == 1, text
      assert text =~ "fft_type #{fft_type}>"
    end

    # Components no larger than eps come back as exact zeros, as from Nx's own backend.
    {ours, theirs} = both(&Nx.fft(&1, eps: 1.0e-3), [Nx.tensor([1.0, 1.0, 1.0, 1.0])])
    assert Nx.to_flat_list(ours) == Nx.to_flat_list(theirs)
  end

  test "windows and convolution" do
    t = Nx.iota({1, 1, 5, 5}, type: :f32)
    assert_same(&Nx.window_sum(&1, {1, 1, 2, 2}, strides: [1, 1, 2, 1], padding: :same), [t])
    assert_same(&Nx.window_max(&1, {1, 1, 3, 3}), [t])

    assert_same(
      &Nx.conv(&1, Nx.iota({2, 1, 3, 3}, type: :f32), strides: [2, 1], padding: :same),
      [t]
    )

    assert_same(
      &Nx.conv(&1, Nx.iota({4, 1, 2, 2}, type: :f32),
        feature_group_size: 1,
        kernel_dilation: [2, 1]
      ),
      [t]
    )
  end

  defn while_sum(n) do
    {_, acc, _} =
      while {i = 0, acc = 0, n}, i < n do
        {i + 1, acc + i, n}
      end

    acc
  end

  defn pick(x) do
    cond do
      Nx.sum(x) > 10 -> {x * 2, 1}
      Nx.sum(x) < 0 -> {-x, 2}
      true -> {x, 3}
    end
  end

  test "while, cond, containers in and out" do
    assert_same(&while_sum/1, [Nx.tensor(10)])
    assert_same(&pick/1, [Nx.tensor([5.0, 6.0])])
    assert_same(&pick/1, [Nx.tensor([-5.0, 1.0])])
    assert_same(&pick/1, [Nx.tensor([1.0, 1.0])])

    assert_same(fn %{a: a, b: {b, c}} -> %{sum: Nx.add(a, b), prod: {Nx.multiply(b, c)}} end, [
      %{a: @f, b: {@f, Nx.tensor(2.0)}}
    ])
  end

  defn loss(w, x) do
    x |> Nx.dot(w) |> Nx.tanh() |> Nx.sum()
  end

  test "gradients of a small model" do
    w = Nx.iota({3, 2}, type: :f32) |> Nx.divide(10)
    x = Nx.iota({4, 3}, type: :f32) |> Nx.divide(7)
    assert_same(fn w, x -> value_and_grad(w, &loss(&1, x)) end, [w, x], atol: 1.0e-4)
  end

  test "Nx.Random" do
    assert_same(fn key -> Nx.Random.uniform(key, shape: {4}) |> elem(0) end, [Nx.Random.key(42)])

    assert_same(fn key -> Nx.Random.normal(key, shape: {3}) |> elem(0) end, [Nx.Random.key(7)],
      atol: 1.0e-4
    )
  end

  def times(t, opts), do: Nx.multiply(t, opts[:by])

  defn with_runtime_call(x) do
    y = Nx.runtime_call(x, x, [by: 3], &times/2)
    y + 1
  end

  test "runtime_call runs on the caller's node" do
    {ours, theirs} = both(&with_runtime_call/1, [Nx.tensor([1.0, 2.0])])
    assert_match(ours, theirs, [])
    assert Nx.to_flat_list(ours) == [4.0, 7.0]

    parent = self()

    tuple_out =
      Nx.Defn.jit(
        fn x ->
          Nx.runtime_call({x, x}, x, [], fn t, _ ->
            send(parent, {:called_on, node()})
            {Nx.add(t, 1), Nx.multiply(t, 2)}
          end)
        end,
        compiler: XlaNode.Compiler,
        node: xla()
      ).(Nx.tensor([1.0, 5.0]))

    assert {a, b} = tuple_out
    assert {Nx.to_flat_list(a), Nx.to_flat_list(b)} == {[2.0, 6.0], [2.0, 10.0]}
    assert_receive {:called_on, called_on}
    assert called_on == node()
  end

  defn two_calls(x) do
    y = Nx.runtime_call(x, x, [by: 3], &times/2)
    z = Nx.sin(y) * 2
    Nx.runtime_call(z, z, [by: 0.5], &times/2) + x
  end

  test "callbacks: :split gives the same results, with the callbacks between programs" do
    x = Nx.tensor([0.5, 1.0, 2.0])

    split =
      Nx.Defn.jit(&two_calls/1, compiler: XlaNode.Compiler, node: xla(), callbacks: :split).(x)

    inside = Nx.Defn.jit(&two_calls/1, compiler: XlaNode.Compiler, node: xla()).(x)
    theirs = Nx.Defn.jit(&two_calls/1, compiler: Nx.Defn.Evaluator).(x)
    assert_match(split, theirs, [])
    assert_match(inside, theirs, [])
    assert %Nx.Tensor{data: %Nx.BinaryBackend{}} = split
  end

  def scaled_pair({a, b}, opts), do: {Nx.multiply(a, opts[:by]), Nx.add(b, opts[:by])}
  def pair_map({a, b}, _opts), do: %{sum: Nx.add(a, b), pair: {Nx.negate(a), Nx.multiply(b, 2)}}

  # runtime_calls returning containers: a tuple used by a later program, a map of a nested
  # tuple handed to a second runtime_call, and a container returned as it came.
  defn container_calls(x) do
    {a, b} = Nx.runtime_call({x, x}, {x * 2, x}, [by: 3], &scaled_pair/2)

    %{sum: sum, pair: {n, d}} =
      Nx.runtime_call(%{sum: x, pair: {x, x}}, {a + 1, b}, [], &pair_map/2)

    {c, e} = Nx.runtime_call({x, x}, {sum * n, d}, [by: 0.5], &scaled_pair/2)
    {c + e, Nx.runtime_call({x, x}, {a, d}, [by: 2], &scaled_pair/2)}
  end

  test "callbacks: :split with runtime_calls returning containers" do
    x = Nx.tensor([0.5, 1.0, 2.0])
    theirs = Nx.Defn.jit(&container_calls/1, compiler: Nx.Defn.Evaluator).(x)

    for callbacks <- [:split, :inside] do
      ours =
        Nx.Defn.jit(&container_calls/1,
          compiler: XlaNode.Compiler,
          node: xla(),
          callbacks: callbacks
        ).(x)

      assert_match(ours, theirs, [])
    end
  end

  test "callbacks: :split runs hooks on the caller between programs too" do
    out =
      capture_io(fn ->
        f = Nx.Defn.jit(&printed/1, compiler: XlaNode.Compiler, node: xla(), callbacks: :split)
        assert Nx.to_flat_list(f.(Nx.tensor([1.0, 2.0]))) == [3.0, 5.0]
      end)

    assert out =~ "4.0"
    assert_hook_overridden(callbacks: :split)
  end

  def report(t, opts) do
    send(opts[:to], {:ran_in, self()})
    Nx.multiply(t, 3)
  end

  defn while_called_back(x, opts \\ []) do
    opts = keyword!(opts, [:to])

    {_i, x} =
      while {i = 0, x}, i < 2 do
        {i + 1, Nx.runtime_call(x, x, [to: opts[:to]], &report/2)}
      end

    x
  end

  test "callbacks: :split leaves a callback inside a while in the node's program" do
    f =
      Nx.Defn.jit(&while_called_back/2,
        compiler: XlaNode.Compiler,
        node: xla(),
        callbacks: :split
      )

    assert Nx.to_flat_list(f.(Nx.tensor([1.0, 2.0]), to: self())) == [9.0, 18.0]
    # Served by the run's callback server, not evaluated by the caller.
    assert_receive {:ran_in, pid}
    assert pid != self()
  end

  test "a CPU node runs callbacks inside the program unless told to split" do
    assert XlaNode.Compiler.Cache.node_info(xla()) == %{platform: "cpu", host_callbacks: true}
    parent = self()

    where = fn opts ->
      f = fn x ->
        Nx.runtime_call(x, x, [], fn t, _ -> send(parent, {:ran_in, self()}) && t end)
      end

      Nx.Defn.jit(f, [compiler: XlaNode.Compiler, node: xla()] ++ opts).(Nx.tensor([1.0]))
      assert_receive {:ran_in, pid}
      pid
    end

    # Inside the program, the callback server answers; split, the caller evaluates it itself.
    assert where.([]) != self()
    assert where.(callbacks: :split) == self()
  end

  defn(printed(x), do: print_value(x * 2) + 1)

  test "print_value prints on the caller's terminal" do
    out =
      capture_io(fn ->
        Nx.Defn.jit(&printed/1, compiler: XlaNode.Compiler, node: xla()).(Nx.tensor([1.0, 2.0]))
      end)

    assert out =~ "2.0"
    assert out =~ "4.0"
  end

  test "window_scatter_max/min and triangular_solve" do
    t = Nx.tensor([[1.0, 5.0, 2.0, 8.0], [3.0, 4.0, 9.0, 0.0]])
    src = Nx.tensor([[10.0, 20.0]])
    assert_same(&Nx.window_scatter_max(&1, src, 0.0, {2, 2}, strides: [2, 2]), [t])
    assert_same(&Nx.window_scatter_min(&1, src, 0.0, {2, 2}, strides: [2, 2]), [t])
    a = Nx.tensor([[2.0, 0.0, 0.0], [1.0, 3.0, 0.0], [0.5, -1.0, 4.0]])
    assert_same(&Nx.LinAlg.triangular_solve(&1, Nx.tensor([1.0, 2.0, 3.0])), [a])

    assert_same(
      &Nx.LinAlg.triangular_solve(&1, Nx.iota({3, 2}, type: :f32), transform_a: :transpose),
      [a]
    )

    assert_same(&Nx.LinAlg.triangular_solve(&1, Nx.iota({2, 3}, type: :f32), left_side: false), [
      a
    ])
  end

  test "vectorized tensors in and out" do
    x = Nx.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]) |> Nx.vectorize(:rows)
    {ours, theirs} = both(&Nx.multiply(Nx.sum(&1), &1), [x])
    assert ours.vectorized_axes == [rows: 3]
    assert_match(Nx.devectorize(ours), Nx.devectorize(theirs), [])
  end

  defn(hooked(x), do: hook(x * 2, :doubled) + 1)

  # `hooked/1` with its hook overridden by `hooks:` (and `opts`): the override gets the value.
  defp assert_hook_overridden(opts) do
    parent = self()
    hooks = %{doubled: &send(parent, {:hooked, &1})}
    jit_opts = [compiler: XlaNode.Compiler, node: xla(), hooks: hooks] ++ opts
    f = Nx.Defn.jit(&hooked/1, jit_opts)

    assert Nx.to_flat_list(f.(Nx.tensor([1.0, 2.0]))) == [3.0, 5.0]
    assert_receive {:hooked, doubled}
    assert Nx.to_flat_list(doubled) == [2.0, 4.0]
  end

  test "hooks run on the caller, and hooks: overrides a named hook" do
    assert_hook_overridden([])
  end

  test "keep_on_device: results stay on the node between calls" do
    {:ok, %{buffers: b0}} = GenServer.call({:xla, xla()}, :info)

    kept =
      Nx.Defn.jit(&Nx.multiply(&1, 2),
        compiler: XlaNode.Compiler,
        node: xla(),
        keep_on_device: true
      )

    y = kept.(Nx.tensor([1.0, 2.0]))
    assert %XlaNode.Backend{} = y.data
    z = kept.(y)
    {:ok, %{buffers: b1}} = GenServer.call({:xla, xla()}, :info)
    assert b1 - b0 == 2
    assert Nx.to_flat_list(z) == [4.0, 8.0]
    assert inspect(z) =~ "4.0, 8.0"
    assert Nx.backend_transfer(z) |> Nx.add(1) |> Nx.to_flat_list() == [5.0, 9.0]
    # Eager operations on it run on the node too.
    assert %XlaNode.Backend{node: node} = Nx.add(y, 1).data
    assert node == xla()
    assert Nx.add(y, 1) |> Nx.to_flat_list() == [3.0, 5.0]
    assert Nx.backend_deallocate(y) == :ok
    assert Nx.backend_deallocate(y) == :already_deallocated
  end

  test "Nx.Defn.compile/3, default options and Nx.Serving" do
    compiled =
      Nx.Defn.compile(&Nx.add(&1, 10), [Nx.template({2}, :f32)],
        compiler: XlaNode.Compiler,
        node: xla()
      )

    assert Nx.to_flat_list(compiled.(Nx.tensor([1.0, 2.0]))) == [11.0, 12.0]

    serving =
      Nx.Serving.jit(&Nx.multiply(&1, 2), compiler: XlaNode.Compiler, node: xla())
      |> Nx.Serving.batch_size(4)

    batch = Nx.Batch.stack([Nx.tensor([1.0, 2.0]), Nx.tensor([3.0, 4.0])])
    assert serving |> Nx.Serving.run(batch) |> Nx.to_list() == [[2.0, 4.0], [6.0, 8.0]]
  end

  test "options it does not know are taken and ignored, as EXLA does; its own are checked" do
    f = &Nx.multiply(&1, 2)
    x = Nx.tensor([1.0, 2.0])

    # What libraries forward through Nx.Defn.jit/2 (Axon.build's :mode, ...), and a misspelling.
    for opts <- [
          [mode: :train],
          [global_layer_options: [dropout: 0.5]],
          [print_values: true],
          [keep_on_devise: true],
          [mode: :inference, debug: false, time_out: 5]
        ] do
      jitted = Nx.Defn.jit(f, [compiler: XlaNode.Compiler, node: xla()] ++ opts)
      assert Nx.to_flat_list(jitted.(x)) == [2.0, 4.0], inspect(opts)
    end

    template = [Nx.template({2}, :f32)]
    compiled = Nx.Defn.compile(f, template, compiler: XlaNode.Compiler, node: xla(), mode: :train)
    assert Nx.to_flat_list(compiled.(x)) == [2.0, 4.0]

    assert Nx.Defn.to_backend(compiler: XlaNode.Compiler, node: xla(), mode: :train) ==
             {Nx.BinaryBackend, []}

    # One option set per device of the node, each with the foreign option kept.
    {:ok, %{devices: devices}} = XlaNode.info(xla())
    partitions = XlaNode.Compiler.__partitions_options__(node: xla(), mode: :train)
    assert length(partitions) == length(devices)
    assert Enum.all?(partitions, &(&1[:mode] == :train))

    # The node is still required, whatever else is given.
    assert_raise ArgumentError, ~r/needs the compute node/, fn ->
      Nx.Defn.to_backend(compiler: XlaNode.Compiler, nod: xla())
    end

    # Options must still be a keyword list.
    assert_raise ArgumentError, ~r/must be a keyword list/, fn ->
      XlaNode.Compiler.Options.validate!([{:node, xla()}, :mode])
    end

    for {option, bad} <- [
          node: "xla@host",
          callbacks: :outside,
          callback_timeout: 0,
          queue_timeout: -1,
          priority: :urgent,
          hooks: [print: &IO.inspect/1],
          keep_on_device: :yes,
          timeout: :never,
          debug: :yes
        ] do
      assert_raise ArgumentError, ~r/#{inspect(option)}( option)? must be/, fn ->
        Nx.Defn.jit(
          f,
          [compiler: XlaNode.Compiler, node: xla(), mode: :train, debug: false] ++ [{option, bad}]
        ).(x)
      end
    end

    # The backend's too: it ignores what it does not know, and needs its node.
    assert_raise ArgumentError, ~r/needs the compute node/, fn ->
      Nx.backend_transfer(x, {XlaNode.Backend, nod: xla()})
    end

    moved = Nx.backend_transfer(x, {XlaNode.Backend, node: xla(), client: :host})
    assert %XlaNode.Backend{} = moved.data
    assert Nx.to_flat_list(moved) == [1.0, 2.0]
  end

  test "debug: true logs the lowered module and how long lowering and compiling took" do
    f = &Nx.add(&1, 40)
    x = Nx.tensor([1.0, 2.0])
    jitted = Nx.Defn.jit(f, compiler: XlaNode.Compiler, node: xla(), debug: true)

    log =
      ExUnit.CaptureLog.capture_log([level: :debug], fn ->
        assert Nx.to_flat_list(jitted.(x)) == [41.0, 42.0]
      end)

    assert log =~ ~r/lowered in [\d.]+ms, compiled on .* in [\d.]+ms/
    assert log =~ "func.func"

    log =
      ExUnit.CaptureLog.capture_log([level: :debug], fn ->
        assert Nx.to_flat_list(jitted.(x)) == [41.0, 42.0]
      end)

    assert log =~ "cached"
  end

  test "every valid option, and those Nx passes through to the compiler, are taken" do
    f = &Nx.multiply(&1, 2)
    x = Nx.tensor([1.0, 2.0])

    for opts <- [
          [callbacks: :inside],
          [callbacks: :split],
          [callback_timeout: 5_000],
          [callback_timeout: :infinity],
          [queue_timeout: 0],
          [queue_timeout: :infinity],
          [priority: :high],
          [priority: :low],
          [hooks: %{}],
          [keep_on_device: false],
          [timeout: 60_000],
          [timeout: :infinity],
          [debug: false],
          # Nx.Defn.jit/2's own, which Nx keeps to itself.
          [on_conflict: :raise]
        ] do
      jitted = Nx.Defn.jit(f, [compiler: XlaNode.Compiler, node: xla()] ++ opts)
      assert Nx.to_flat_list(jitted.(x)) == [2.0, 4.0], inspect(opts)
    end

    kept = Nx.Defn.jit(f, compiler: XlaNode.Compiler, node: xla(), keep_on_device: true)
    assert Nx.to_flat_list(kept.(x)) == [2.0, 4.0]

    # Nx.Defn.compile/3 passes :on_conflict on to the compiler.
    compiled =
      Nx.Defn.compile(f, [Nx.template({2}, :f32)],
        compiler: XlaNode.Compiler,
        node: xla(),
        hooks: %{},
        on_conflict: :reuse
      )

    assert Nx.to_flat_list(compiled.(x)) == [2.0, 4.0]

    # Options set as defaults reach the compiler like any other.
    previous = Nx.Defn.default_options(compiler: XlaNode.Compiler, node: xla())

    try do
      assert Nx.to_flat_list(Nx.Defn.jit(f).(x)) == [2.0, 4.0]
    after
      Nx.Defn.default_options(previous)
    end

    assert Nx.Defn.to_backend(compiler: XlaNode.Compiler, node: xla()) == {Nx.BinaryBackend, []}
  end

  test "Nx.Serving's options reach the compiler and are taken: batch keys, partitions, hooks" do
    batch = Nx.Batch.stack([Nx.tensor([1.0, 2.0]), Nx.tensor([3.0, 4.0])])

    # A one-argument function gets the options with the serving's :batch_keys.
    serving =
      Nx.Serving.new(fn opts -> Nx.Defn.jit(&Nx.multiply(&1, 2), opts) end,
        compiler: XlaNode.Compiler,
        node: xla()
      )

    assert serving |> Nx.Serving.run(batch) |> Nx.to_list() == [[2.0, 4.0], [6.0, 8.0]]

    # Partitioned, the compiler's __partitions_options__ gets them with :compiler; streaming
    # hooks come as :hooks.
    name = :"partitioned_serving_#{System.unique_integer([:positive])}"

    hooked =
      Nx.Serving.new(
        fn opts -> Nx.Defn.jit(&hooked/1, opts) end,
        compiler: XlaNode.Compiler,
        node: xla()
      )
      |> Nx.Serving.streaming(hooks: [:doubled])

    start_supervised!({Nx.Serving, serving: hooked, name: name, batch_size: 2, partitions: true})

    events = name |> Nx.Serving.batched_run(batch) |> Enum.to_list()
    assert {:doubled, doubled} = List.keyfind(events, :doubled, 0)
    assert Nx.to_list(doubled) == [[2.0, 4.0], [6.0, 8.0]]
    assert {:batch, result, _metadata} = List.keyfind(events, :batch, 0)
    assert Nx.to_list(result) == [[3.0, 5.0], [7.0, 9.0]]
  end

  test "an op it cannot lower, or a missing node, raises at compile time" do
    assert_raise ArgumentError, ~r/needs the compute node/, fn ->
      Nx.Defn.jit(&Nx.exp/1, compiler: XlaNode.Compiler).(Nx.tensor(1.0))
    end

    x = Nx.tensor([1.0])
    %{data: expr} = exp = Nx.Defn.debug_expr(&Nx.exp/1).(x)

    assert_raise ArgumentError, ~r/cannot lower the Nx operation :made_up/, fn ->
      XlaNode.Compiler.Lower.module([x], [%{exp | data: %{expr | op: :made_up}}])
    end
  end

  test "an unreachable node, or one that goes down mid-call, fails the call naming it" do
    error =
      assert_raise XlaNode.Error, fn ->
        Nx.Defn.jit(&Nx.exp/1, compiler: XlaNode.Compiler, node: :nowhere@nohost).(Nx.tensor(1.0))
      end

    assert error.message =~ "nowhere@nohost"

    doomed = XlaNode.NxTest.Node.start!("xla_nx_doomed_#{System.pid()}")
    parent = self()

    stalled = fn x ->
      Nx.runtime_call(x, x, [], fn t, _ ->
        send(parent, :in_callback)
        Process.sleep(:infinity)
        t
      end)
    end

    call =
      Task.async(fn ->
        try do
          Nx.Defn.jit(stalled, compiler: XlaNode.Compiler, node: doomed.name).(Nx.tensor([1.0]))
        rescue
          e in XlaNode.Error -> e
        end
      end)

    assert_receive :in_callback, 10_000
    XlaNode.NxTest.Node.stop(doomed)
    assert %XlaNode.Error{kind: :nodedown, message: message} = Task.await(call, 10_000)
    assert message =~ Atom.to_string(doomed.name)
  end
end
