defmodule XlaNode.MLIRBuilderTest do
  @moduledoc """
  Programs built with `XlaNode.MLIR`, compiled and run on a real node through the client, their
  results checked against values computed here in plain Elixir.
  """
  use ExUnit.Case, async: true

  import Bitwise

  alias XlaNode.{Harness, Tensor}
  alias XlaNode.MLIR, as: M

  setup_all do
    Harness.start_shared_node()
  end

  # Builds `main(arg_types)` from `body`, runs it on `args` (lists or tensors), returns the
  # results as flat lists.
  defp run(node, arg_types, body, args, opts \\ []) do
    text = M.module(fn -> M.function("main", arg_types, body) end)
    exe = XlaNode.compile!(node.name, text)

    # A callback handle parameter (the first) is supplied by the node, not passed.
    args =
      Enum.zip_with(Enum.take(arg_types, -length(args)), args, fn {type, dims}, arg ->
        if is_list(arg), do: Tensor.from_list(arg, type, dims), else: arg
      end)

    node.name |> XlaNode.run!(exe, args, opts) |> Enum.map(&Tensor.to_flat_list/1)
  end

  defp close?(a, b) when is_number(a) and is_number(b), do: Kernel.abs(a - b) <= 1.0e-4 * max(1.0, Kernel.abs(b))
  defp close?(a, b), do: a == b

  defp assert_close(got, expected) do
    assert length(got) == length(expected) and Enum.all?(Enum.zip(got, expected), fn {g, e} -> close?(g, e) end),
           "got #{inspect(got)}, expected #{inspect(expected)}"
  end

  @f32 {:f, 32}

  test "elementwise float ops match Erlang's :math", %{node: node} do
    xs = [0.1, 0.5, 0.9]

    for {op, f} <- [
          exponential: &:math.exp/1,
          log: &:math.log/1,
          sqrt: &:math.sqrt/1,
          sine: &:math.sin/1,
          cosine: &:math.cos/1,
          tan: &:math.tan/1,
          tanh: &:math.tanh/1,
          logistic: &(1 / (1 + :math.exp(-&1))),
          erf: &:math.erf/1,
          asin: &:math.asin/1,
          atanh: &:math.atanh/1,
          log_plus_one: &:math.log(1 + &1),
          rsqrt: &(1 / :math.sqrt(&1))
        ] do
      [got] = run(node, [{@f32, [3]}], fn [x] -> apply(M, op, [x]) end, [xs])
      assert_close(got, Enum.map(xs, f))
    end
  end

  test "binary ops on every dtype family", %{node: node} do
    for {type, a, b} <- [
          {{:s, 32}, [7, -3, 12], [2, 5, -4]},
          {{:u, 8}, [7, 3, 200], [2, 5, 40]},
          {{:s, 64}, [1 <<< 40, -5, 9], [3, 2, 1]},
          {{:f, 64}, [1.5, -2.25, 8.0], [0.5, 4.0, -2.0]},
          {{:bf, 16}, [1.5, -2.0, 8.0], [0.5, 4.0, -2.0]},
          {{:f, 16}, [1.5, -2.0, 8.0], [0.5, 4.0, -2.0]}
        ] do
      [sum, prod, mx] =
        run(node, [{type, [3]}, {type, [3]}], fn [x, y] -> [M.add(x, y), M.multiply(x, y), M.maximum(x, y)] end, [a, b])

      wrap = fn v -> if type == {:u, 8}, do: rem(v, 256), else: v end
      assert_close(sum, Enum.zip_with(a, b, &wrap.(&1 + &2)))
      assert_close(prod, Enum.zip_with(a, b, &wrap.(&1 * &2)))
      assert_close(mx, Enum.zip_with(a, b, &max/2))
    end

    [and_, shifted] =
      run(node, [{{:u, 32}, [2]}, {{:u, 32}, [2]}], fn [x, y] -> [M.bitwise_and(x, y), M.shift_left(x, y)] end, [[12, 5], [10, 3]])

    assert and_ == [8, 1]
    assert shifted == [12 <<< 10, 5 <<< 3]
  end

  test "compare in every direction, select and clamp", %{node: node} do
    a = [1.0, 2.0, 3.0]
    b = [2.0, 2.0, 2.0]

    for {dir, f} <- [eq: &==/2, ne: &!=/2, lt: &</2, le: &<=/2, gt: &>/2, ge: &>=/2] do
      [got] = run(node, [{@f32, [3]}, {@f32, [3]}], fn [x, y] -> M.compare(dir, x, y) end, [a, b])
      assert got == Enum.zip_with(a, b, &if(f.(&1, &2), do: 1, else: 0))
    end

    [sel, clamped] =
      run(node, [{@f32, [3]}, {@f32, [3]}], fn [x, y] ->
        lo = M.constant(1.5, {@f32, []})
        hi = M.constant(2.5, {@f32, []})
        [M.select(M.compare(:lt, x, y), x, y), M.clamp(lo, x, hi)]
      end, [a, b])

    assert sel == [1.0, 2.0, 2.0]
    assert clamped == [1.5, 2.0, 2.5]

    [signed] = run(node, [{{:s, 32}, [2]}, {{:s, 32}, [2]}], fn [x, y] -> M.compare(:lt, x, y) end, [[-1, 3], [1, 2]])
    assert signed == [1, 0]
  end

  test "constants of every dtype, splat and dense, with NaN and infinities", %{node: node} do
    for {type, values} <- [
          {{:f, 32}, [1.5, :nan, :infinity, :neg_infinity]},
          {{:f, 64}, [1.0e300, :nan, -0.0, 3.25]},
          {{:bf, 16}, [1.0, :infinity, -2.0, 0.5]},
          {{:f, 16}, [65504.0, :neg_infinity, 0.25, -1.0]},
          {{:s, 8}, [-128, 127, 0, 5]},
          {{:u, 64}, [0, 1 <<< 63, 7, 8]},
          {{:pred, 8}, [1, 0, 0, 1]},
          {{:c, 64}, [{1.0, 2.0}, {-1.0, 0.5}, {0.0, 0.0}, {3.0, -3.0}]}
        ] do
      [dense, splat] = run(node, [], fn [] -> [M.constant(values, {type, [4]}), M.constant(hd(values), {type, [3]})] end, [])
      assert dense == Tensor.to_flat_list(Tensor.from_list(values, type, [4]))
      assert splat == List.duplicate(hd(dense), 3)
    end
  end

  test "iota, convert, bitcast_convert", %{node: node} do
    [iota, converted, bits] =
      run(node, [], fn [] ->
        i = M.iota({{:s, 32}, [2, 3]}, 1)
        f = M.convert(i, {:f, 32})
        [i, f, M.bitcast_convert(M.constant(1.0, {@f32, [1]}), {:u, 32})]
      end, [])

    assert iota == [0, 1, 2, 0, 1, 2]
    assert converted == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
    assert bits == [0x3F800000]

    [halves] = run(node, [], fn [] -> M.bitcast_convert(M.constant(1.0, {@f32, [1]}), {:u, 16}) end, [])
    assert halves == [0x0000, 0x3F80]
  end

  test "shape ops", %{node: node} do
    x = Enum.to_list(1..6) |> Enum.map(&(&1 * 1.0))

    [bcast, reshaped, transposed, reversed, sliced, concat, padded] =
      run(node, [{@f32, [2, 3]}], fn [x] ->
        row = M.slice(x, [0, 0], [1, 3])
        [
          M.broadcast_in_dim(M.reshape(row, [3]), [2, 3], [1]),
          M.reshape(x, [3, 2]),
          M.transpose(x, [1, 0]),
          M.reverse(x, [1]),
          M.slice(x, [0, 0], [2, 3], [1, 2]),
          M.concatenate([x, x], 0),
          M.pad(M.reshape(row, [3]), M.constant(0.0, {@f32, []}), [1], [2], [1])
        ]
      end, [x])

    assert bcast == [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
    assert reshaped == x
    assert transposed == [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    assert reversed == [3.0, 2.0, 1.0, 6.0, 5.0, 4.0]
    assert sliced == [1.0, 3.0, 4.0, 6.0]
    assert concat == x ++ x
    assert padded == [0.0, 1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 0.0]

    [dyn, updated] =
      run(node, [{@f32, [2, 3]}, {{:s, 32}, []}], fn [x, i] ->
        zero = M.constant(0, {{:s, 32}, []})
        [M.dynamic_slice(x, [zero, i], [2, 2]), M.dynamic_update_slice(x, M.constant(0.0, {@f32, [1, 2]}), [i, zero])]
      end, [x, [1]])

    assert dyn == [2.0, 3.0, 5.0, 6.0]
    assert updated == [1.0, 2.0, 3.0, 0.0, 0.0, 6.0]
  end

  test "dot_general with batch and contracting dimensions", %{node: node} do
    a = Enum.map(1..12, &(&1 * 1.0))
    b = Enum.map(1..12, &(&1 * 0.5))

    [got] =
      run(node, [{@f32, [2, 2, 3]}, {@f32, [2, 3, 2]}], fn [x, y] ->
        M.dot_general(x, y, batch: {[0], [0]}, contracting: {[2], [1]}, precision: :highest)
      end, [a, b])

    at = fn list, dims, idx -> Enum.at(list, Enum.reduce(Enum.zip(idx, dims), 0, fn {i, d}, acc -> acc * d + i end)) end

    expected =
      for n <- 0..1, i <- 0..1, j <- 0..1 do
        Enum.sum(for k <- 0..2, do: at.(a, [2, 2, 3], [n, i, k]) * at.(b, [2, 3, 2], [n, k, j]))
      end

    assert_close(got, expected)
  end

  test "reduce with two operands (argmax) and sort with two operands", %{node: node} do
    values = [3.0, 9.0, 1.0, 9.0, 2.0]

    [max, arg] =
      run(node, [{@f32, [5]}], fn [x] ->
        idx = M.iota({{:s, 32}, [5]}, 0)
        init = [M.constant(:neg_infinity, {@f32, []}), M.constant(0, {{:s, 32}, []})]

        M.reduce([x, idx], init, [0], fn [acc_v, acc_i, v, i] ->
          take = M.compare(:gt, v, acc_v)
          [M.select(take, v, acc_v), M.select(take, i, acc_i)]
        end)
      end, [values])

    assert {max, arg} == {[9.0], [1]}

    [sorted, perm] =
      run(node, [{@f32, [5]}], fn [x] ->
        M.sort([x, M.iota({{:s, 32}, [5]}, 0)], 0, fn [a, b, _, _] -> M.compare(:gt, a, b) end, stable: true)
      end, [values])

    assert sorted == [9.0, 9.0, 3.0, 2.0, 1.0]
    assert perm == [1, 3, 0, 4, 2]
  end

  test "while, if, case and func.call", %{node: node} do
    [sum] =
      run(node, [{{:s, 32}, []}], fn [n] ->
        add_one = fn v -> M.add(v, M.constant(1, {{:s, 32}, []})) end

        [_, total] =
          M.while_loop([M.constant(0, {{:s, 32}, []}), M.constant(0, {{:s, 32}, []})], fn [i, _] -> M.compare(:lt, i, n) end, fn [i, acc] ->
            [add_one.(i), M.add(acc, i)]
          end)

        total
      end, [[10]])

    assert sum == [Enum.sum(0..9)]

    [chosen, cased] =
      run(node, [{@f32, []}, {{:s, 32}, []}], fn [x, k] ->
        [a] = M.if_then_else(M.compare(:gt, x, M.constant(0.0, {@f32, []})), fn -> M.negate(x) end, fn -> x end)
        [b] = M.case_of(k, [fn -> M.constant(10.0, {@f32, []}) end, fn -> M.constant(20.0, {@f32, []}) end])
        [a, b]
      end, [[2.5], [1]])

    assert {chosen, cased} == {[-2.5], [20.0]}

    text =
      M.module(fn ->
        double = M.function("double", [{@f32, [2]}], fn [x] -> M.add(x, x) end)
        M.function("main", [{@f32, [2]}], fn [x] -> M.call(double, [M.call(double, [x])]) end)
      end)

    exe = XlaNode.compile!(node.name, text)
    [y] = XlaNode.run!(node.name, exe, [Tensor.from_list([1.0, 2.5], @f32)])
    assert Tensor.to_list(y) == [4.0, 10.0]
  end

  test "complex parts, fft round trip, top_k, rng_bit_generator, optimization_barrier", %{node: node} do
    [re, im, mag] =
      run(node, [{@f32, [2]}, {@f32, [2]}], fn [a, b] ->
        c = M.complex(a, b)
        [M.real(c), M.imag(c), M.abs(c)]
      end, [[3.0, 1.0], [4.0, 0.0]])

    assert {re, im, mag} == {[3.0, 1.0], [4.0, 0.0], [5.0, 1.0]}

    signal = [1.0, 2.0, 3.0, 4.0]

    [spectrum, back] =
      run(node, [{@f32, [4]}], fn [x] ->
        s = M.fft(x, :rfft, [4])
        [s, M.fft(s, :irfft, [4])]
      end, [signal])

    assert length(spectrum) == 3
    assert_close(hd(spectrum) |> elem(0) |> List.wrap(), [10.0])
    assert_close(back, signal)

    [round_trip] = run(node, [{{:c, 64}, [4]}], fn [z] -> M.fft(M.fft(z, :fft, [4]), :ifft, [4]) end, [[{1.0, 0.0}, {2.0, 1.0}, {0.0, -1.0}, {3.0, 0.5}]])
    assert_close(Enum.flat_map(round_trip, &Tuple.to_list/1), [1.0, 0.0, 2.0, 1.0, 0.0, -1.0, 3.0, 0.5])

    [total] = run(node, [{@f32, [2]}, {@f32, [2]}], fn [x, y] -> M.compare(:lt, x, y, :totalorder) end, [[-0.0, :nan], [0.0, 1.0]])
    assert total == [1, 0]

    [top, idx] = run(node, [{@f32, [5]}], fn [x] -> M.top_k(x, 2) end, [[3.0, 9.0, 1.0, 7.0, 2.0]])
    assert {top, idx} == {[9.0, 7.0], [1, 3]}

    [state, bits, same] =
      run(node, [{{:u, 64}, [2]}], fn [s] ->
        [s2, b] = M.rng_bit_generator(s, {{:u, 32}, [4]})
        [x] = M.optimization_barrier([s])
        [s2, b, x]
      end, [[1, 2]])

    assert length(state) == 2 and length(bits) == 4 and same == [1, 2]
  end

  test "a program with two callbacks and an io_call in a while loop", %{node: node} do
    parent = self()

    {:ok, server} =
      XlaNode.CallbackServer.start_link(%{
        :double => fn [t] -> {:ok, [Tensor.from_list(Enum.map(Tensor.to_list(t), &(&1 * 2)), @f32)]} end,
        :add_index => fn [t, i] -> {:ok, [Tensor.from_list(Enum.map(Tensor.to_list(t), &(&1 + Tensor.to_number(i))), @f32)]} end,
        {:seen, :loop} => fn [i] ->
          send(parent, {:seen, Tensor.to_number(i)})
          {:ok, []}
        end
      })

    [result] =
      run(node, [{{:u, 8}, [8]}, {@f32, [2]}], fn [cb, x] ->
        zero = M.constant(0, {{:s, 32}, []})

        [_, out] =
          M.while_loop([zero, x], fn [i, _] -> M.compare(:lt, i, M.constant(3, {{:s, 32}, []})) end, fn [i, v] ->
            [i] = M.io_call(cb, {:seen, :loop}, [i])
            [d] = M.runtime_call(cb, :double, [v], [{@f32, [2]}])
            [a] = M.runtime_call(cb, :add_index, [d, i], [{@f32, [2]}])
            [M.add(i, M.constant(1, {{:s, 32}, []})), a]
          end)

        out
      end, [[1.0, 2.0]], callback_server: server)

    # v -> 2v + i for i = 0, 1, 2
    expected = Enum.reduce(0..2, [1.0, 2.0], fn i, v -> Enum.map(v, &(&1 * 2 + i)) end)
    assert result == expected
    for i <- 0..2, do: assert_receive({:seen, ^i})
  end

  test "type errors raise in Elixir, naming the op and the types" do
    assert_raise ArgumentError, ~r/stablehlo.add: got tensor<4xf32>, tensor<4xi32>; expected operands of one type/, fn ->
      M.module(fn ->
        M.function("main", [{@f32, [4]}, {{:s, 32}, [4]}], fn [x, y] -> M.add(x, y) end)
      end)
    end

    assert_raise ArgumentError, ~r/stablehlo.dot_general: got tensor<2x3xf32>, tensor<2x3xf32>/, fn ->
      M.module(fn -> M.function("main", [{@f32, [2, 3]}, {@f32, [2, 3]}], fn [x, y] -> M.dot_general(x, y) end) end)
    end

    assert_raise ArgumentError, ~r/stablehlo.reduce: the region returned tensor<i32>; expected tensor<f32>/, fn ->
      M.module(fn ->
        M.function("main", [{@f32, [4]}], fn [x] ->
          M.reduce(x, M.constant(0.0, {@f32, []}), [0], fn [_, _] -> M.constant(0, {{:s, 32}, []}) end)
        end)
      end)
    end

    assert_raise ArgumentError, ~r/sine: got tensor<4xi32>; expected float or complex tensors/, fn ->
      M.module(fn -> M.function("main", [{{:s, 32}, [4]}], fn [x] -> M.sine(x) end) end)
    end
  end

  test "the same program gives the same text" do
    build = fn ->
      M.module(fn -> M.function("main", [{@f32, [3]}], fn [x] -> M.tanh(M.multiply(x, M.constant(2.0, {@f32, [3]}))) end) end)
    end

    assert build.() == build.()
  end

  test "gather and scatter with an update region", %{node: node} do
    x = Enum.map(1..12, &(&1 * 1.0))

    # Rows 2 and 0 of a 4x3 matrix.
    [rows] =
      run(node, [{@f32, [4, 3]}, {{:s, 32}, [2, 1]}], fn [x, idx] ->
        M.gather(x, idx, [1, 3], offset_dims: [1], collapsed_slice_dims: [0], start_index_map: [0], index_vector_dim: 1)
      end, [x, [2, 0]])

    assert rows == Enum.slice(x, 6, 3) ++ Enum.slice(x, 0, 3)

    # Adds rows of updates into rows 1 and 3 (row 1 twice).
    [scattered] =
      run(node, [{@f32, [4, 3]}, {{:s, 32}, [3, 1]}, {@f32, [3, 3]}], fn [x, idx, upd] ->
        M.scatter(x, idx, upd, fn [a, b] -> M.add(a, b) end,
          update_window_dims: [1],
          inserted_window_dims: [0],
          scatter_dims_to_operand_dims: [0],
          index_vector_dim: 1
        )
      end, [x, [1, 3, 1], List.duplicate(1.0, 9)])

    added = %{1 => 2.0, 3 => 1.0}
    expected = x |> Enum.chunk_every(3) |> Enum.with_index() |> Enum.flat_map(fn {row, i} -> Enum.map(row, &(&1 + Map.get(added, i, 0.0))) end)
    assert scattered == expected
  end

  test "reduce_window with two operands, select_and_scatter", %{node: node} do
    x = [1.0, 5.0, 2.0, 8.0, 3.0, 4.0]

    [sums, maxes] =
      run(node, [{@f32, [6]}], fn [x] ->
        M.reduce_window([x, x], [M.constant(0.0, {@f32, []}), M.constant(:neg_infinity, {@f32, []})], [3], fn [s, m, a, b] ->
          [M.add(s, a), M.maximum(m, b)]
        end, strides: [2], padding: [{1, 0}])
      end, [x])

    windows = Enum.chunk_every([0.0 | x], 3, 2, :discard)
    assert sums == Enum.map(windows, &Enum.sum/1)
    assert maxes == Enum.map(Enum.chunk_every([:neg | x], 3, 2, :discard), fn w -> w |> Enum.reject(&(&1 == :neg)) |> Enum.max() end)

    # Max-pool gradient: each window's source value goes to the window's maximum.
    [grad] =
      run(node, [{@f32, [6]}, {@f32, [3]}], fn [x, src] ->
        M.select_and_scatter(x, src, M.constant(0.0, {@f32, []}), [2], &M.compare(:ge, hd(&1), List.last(&1)), fn [a, b] -> M.add(a, b) end, strides: [2])
      end, [x, [10.0, 20.0, 30.0]])

    assert grad == [0.0, 10.0, 0.0, 20.0, 0.0, 30.0]
  end

  # A plain 2-D convolution over NCHW input and OIHW kernel, with strides, padding and groups.
  defp conv_nchw(input, [n, c, h, w], kernel, [o, ci, kh, kw], strides: [sh, sw], padding: [{ph, _}, {pw, _}], out: [oh, ow], groups: g) do
    at = fn list, dims, idx -> Enum.at(list, Enum.reduce(Enum.zip(idx, dims), 0, fn {i, d}, acc -> acc * d + i end)) end
    per_group = div(o, g)

    for b <- 0..(n - 1), f <- 0..(o - 1), y <- 0..(oh - 1), x <- 0..(ow - 1) do
      group = div(f, per_group)

      Enum.sum(
        for k <- 0..(ci - 1), dy <- 0..(kh - 1), dx <- 0..(kw - 1) do
          {iy, ix} = {y * sh + dy - ph, x * sw + dx - pw}
          if iy < 0 or iy >= h or ix < 0 or ix >= w, do: 0.0, else: at.(input, [n, c, h, w], [b, group * ci + k, iy, ix]) * at.(kernel, [o, ci, kh, kw], [f, k, dy, dx])
        end
      )
    end
  end

  test "convolution: strides, padding, feature groups, NHWC layout", %{node: node} do
    input = Enum.map(1..(1 * 4 * 5 * 5), &(rem(&1 * 7, 11) * 0.5))
    kernel = Enum.map(1..(4 * 2 * 3 * 3), &(rem(&1 * 5, 7) - 3.0))

    [got] =
      run(node, [{@f32, [1, 4, 5, 5]}, {@f32, [4, 2, 3, 3]}], fn [x, k] ->
        M.convolution(x, k, strides: [2, 1], padding: [{1, 1}, {1, 0}], feature_group_count: 2, precision: :highest)
      end, [input, kernel])

    assert_close(got, conv_nchw(input, [1, 4, 5, 5], kernel, [4, 2, 3, 3], strides: [2, 1], padding: [{1, 1}, {1, 0}], out: [3, 4], groups: 2))

    # The same without groups, with the input as NHWC and the kernel as HWIO.
    kernel1 = Enum.map(1..(2 * 4 * 3 * 3), &(rem(&1 * 5, 7) - 3.0))
    nhwc = for h <- 0..4, w <- 0..4, c <- 0..3, do: Enum.at(input, c * 25 + h * 5 + w)
    hwio = for h <- 0..2, w <- 0..2, i <- 0..3, o <- 0..1, do: Enum.at(kernel1, o * 36 + i * 9 + h * 3 + w)

    [out] =
      run(node, [{@f32, [1, 5, 5, 4]}, {@f32, [3, 3, 4, 2]}], fn [x, k] ->
        M.convolution(x, k, input: {0, 3, [1, 2]}, kernel: {2, 3, [0, 1]}, output: {0, 1, [2, 3]}, padding: [{1, 1}, {1, 1}], precision: :highest)
      end, [nhwc, hwio])

    assert_close(out, conv_nchw(input, [1, 4, 5, 5], kernel1, [2, 4, 3, 3], strides: [1, 1], padding: [{1, 1}, {1, 1}], out: [5, 5], groups: 1))
  end

  test "chlo special functions at known values", %{node: node} do
    for {op, xs, expected} <- [
          lgamma: {[1.0, 2.0, 3.0, 0.5], [0.0, 0.0, :math.log(2.0), :math.log(:math.sqrt(:math.pi()))]},
          digamma: {[1.0, 2.0], [-0.5772156649, 1 - 0.5772156649]},
          erf_inv: {[0.0, 0.5], [0.0, 0.4769362762]},
          erfc: {[0.0, 1.0], [1.0, 1 - :math.erf(1.0)]},
          cosh: {[0.0, 1.0], [1.0, :math.cosh(1.0)]}
        ] |> Enum.map(fn {op, {xs, e}} -> {op, xs, e} end) do
      [got] = run(node, [{@f32, [length(xs)]}], fn [x] -> apply(M, op, [x]) end, [xs])
      assert_close(got, expected)
    end

    [inf, finite] = run(node, [{@f32, [3]}], fn [x] -> [M.is_inf(x), M.is_finite(x)] end, [[1.0, :infinity, :nan]])
    assert {inf, finite} == {[0, 1, 0], [1, 0, 0]}
  end

  test "outfeed and infeed through a callback server", %{node: node} do
    parent = self()
    {:ok, server} = XlaNode.CallbackServer.start_link(%{}, outfeed: fn args -> send(parent, {:outfeed, args}) end)
    :ok = XlaNode.CallbackServer.push_infeed(server, [Tensor.from_list([5.0, 6.0], @f32)])

    [flag, got] =
      run(node, [{{:u, 8}, [8]}, {@f32, [2]}], fn [cb, x] ->
        sent = M.outfeed(cb, [x])
        [y] = M.infeed(cb, [{@f32, [2]}])
        [sent, M.add(x, y)]
      end, [[1.0, 2.0]], callback_server: server)

    assert {flag, got} == {[1], [6.0, 8.0]}
    assert_receive {:outfeed, [{bin, {{:f, 32}, [2]}}]}
    assert Tensor.to_list({bin, {@f32, [2]}}) == [1.0, 2.0]
  end

  test "held programs rebuilt with the builder give the same outputs", %{node: node} do
    held = File.read!(Path.expand("../../tests/fixtures/long_loop.mlir", __DIR__))

    rebuilt =
      M.module(fn ->
        M.function("main", [{{:s, 64}, []}, {@f32, [16]}], fn [n, x] ->
          [_, _, acc] =
            M.while_loop([M.constant(0, {{:s, 64}, []}), n, x], fn [i, lim, _] -> M.compare(:lt, i, lim) end, fn [i, lim, acc] ->
              [M.add(i, M.constant(1, {{:s, 64}, []})), lim, M.add(M.sine(acc), acc)]
            end)

          acc
        end)
      end)

    args = [Tensor.scalar(50, {:s, 64}), Tensor.from_list(Enum.map(1..16, &(&1 / 16)), @f32)]
    outputs = for text <- [held, rebuilt], do: XlaNode.run!(node.name, XlaNode.compile!(node.name, text), args)
    assert [same, same] = outputs
  end

  test "triangular_solve", %{node: node} do
    # [[2, 0], [1, 4]] x = [[2], [9]] -> x = [[1], [2]]
    [x] = run(node, [{@f32, [2, 2]}, {@f32, [2, 1]}], fn [a, b] -> M.triangular_solve(a, b) end, [[2.0, 0.0, 1.0, 4.0], [2.0, 9.0]])
    assert_close(x, [1.0, 2.0])

    # The transpose of the same lower matrix: [[2, 1], [0, 4]] x = [[4], [8]] -> x = [[1], [2]]
    [y] = run(node, [{@f32, [2, 2]}, {@f32, [2, 1]}], fn [a, b] -> M.triangular_solve(a, b, transpose_a: :transpose) end, [[2.0, 0.0, 1.0, 4.0], [4.0, 8.0]])
    assert_close(y, [1.0, 2.0])
  end

  test "the other elementwise ops, on every dtype family they take", %{node: node} do
    floats = [0.25, 1.5, -2.5]

    for {op, f} <- [
          exponential_minus_one: &(:math.exp(&1) - 1),
          cbrt: &(if &1 < 0, do: -:math.pow(-&1, 1 / 3), else: :math.pow(&1, 1 / 3)),
          floor: &Float.floor/1,
          ceil: &Float.ceil/1,
          round_nearest_afz: &Float.round/1,
          round_nearest_even: &(if &1 == -2.5, do: -2.0, else: Float.round(&1)),
          sign: &(if &1 < 0, do: -1.0, else: 1.0),
          abs: &Kernel.abs/1,
          negate: &(-&1),
          atan: &:math.atan/1,
          sinh: &:math.sinh/1,
          asinh: &:math.asinh/1
        ],
        type <- [{:f, 32}, {:f, 64}] do
      [got] = run(node, [{type, [3]}], fn [x] -> apply(M, op, [x]) end, [floats])
      assert_close(got, Enum.map(floats, f))
    end

    for type <- [{:f, 16}, {:bf, 16}] do
      [neg, exp] = run(node, [{type, [2]}], fn [x] -> [M.negate(x), M.exponential(x)] end, [[0.5, 2.0]])
      assert neg == [-0.5, -2.0]
      assert Enum.all?(Enum.zip_with(exp, [:math.exp(0.5), :math.exp(2.0)], &(Kernel.abs(&1 - &2) < 0.05)))
    end

    [acos, acosh] = run(node, [{@f32, [2]}], fn [x] -> [M.acos(M.multiply(x, M.constant(0.5, {@f32, [2]}))), M.acosh(M.add(x, M.constant(1.0, {@f32, [2]})))] end, [[0.5, 1.0]])
    assert_close(acos, [:math.acos(0.25), :math.acos(0.5)])
    assert_close(acosh, [:math.acosh(1.5), :math.acosh(2.0)])

    ints = [-7, 12, 5]

    [neg, abs, sign, not_, pop, clz] =
      run(node, [{{:s, 32}, [3]}], fn [x] ->
        [M.negate(x), M.abs(x), M.sign(x), M.bitwise_not(x), M.population_count(x), M.count_leading_zeros(x)]
      end, [ints])

    popcount = fn v -> for(<<b::1 <- <<v::signed-32>> >>, do: b) |> Enum.sum() end
    clz_of = fn v -> Enum.find_index(for(<<b::1 <- <<v::signed-32>> >>, do: b), &(&1 == 1)) || 32 end
    assert neg == [7, -12, -5]
    assert abs == [7, 12, 5]
    assert sign == [-1, 1, 1]
    assert not_ == Enum.map(ints, &(-&1 - 1))
    assert pop == Enum.map(ints, popcount)
    assert clz == Enum.map(ints, clz_of)

    a = [7, -12, 9]
    b = [2, 5, -4]

    [sub, div, rem, min, or_, xor, sra, srl] =
      run(node, [{{:s, 32}, [3]}, {{:s, 32}, [3]}], fn [x, y] ->
        two = M.constant(2, {{:s, 32}, [3]})

        [
          M.subtract(x, y),
          M.divide(x, y),
          M.remainder(x, y),
          M.minimum(x, y),
          M.bitwise_or(x, y),
          M.bitwise_xor(x, y),
          M.shift_right_arithmetic(x, two),
          M.shift_right_logical(x, two)
        ]
      end, [a, b])

    assert sub == Enum.zip_with(a, b, &-/2)
    assert div == Enum.zip_with(a, b, &Kernel.div/2)
    assert rem == Enum.zip_with(a, b, &Kernel.rem/2)
    assert min == Enum.zip_with(a, b, &min/2)
    assert or_ == Enum.zip_with(a, b, &bor/2)
    assert xor == Enum.zip_with(a, b, &bxor/2)
    assert sra == Enum.map(a, &(&1 >>> 2))
    assert srl == Enum.map(a, &(Bitwise.band(&1, 0xFFFFFFFF) >>> 2))

    [pow, atan2, pos, neg_inf] =
      run(node, [{@f32, [3]}, {@f32, [3]}], fn [x, y] -> [M.power(x, y), M.atan2(x, y), M.is_pos_inf(x), M.is_neg_inf(x)] end, [[2.0, 9.0, :infinity], [3.0, 0.5, 1.0]])

    assert_close(Enum.take(pow, 2), [8.0, 3.0])
    assert_close(atan2, [:math.atan2(2.0, 3.0), :math.atan2(9.0, 0.5), :math.pi() / 2])
    assert {pos, neg_inf} == {[0, 0, 1], [0, 0, 0]}

    [c_exp] = run(node, [{{:c, 64}, [1]}], fn [z] -> M.exponential(z) end, [[{0.0, :math.pi()}]])
    [{re, im}] = c_exp
    assert_close([re, im], [-1.0, 0.0])
  end
end
