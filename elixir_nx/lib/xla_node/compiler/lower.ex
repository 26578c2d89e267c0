defmodule XlaNode.Compiler.Lower do
  @moduledoc false

  # Lowers an `Nx.Defn.Expr` graph to a StableHLO module with `XlaNode.MLIR`.
  #
  # Each expression is lowered once (a cache by expression id, scoped to the region it was first
  # lowered in), with Nx's semantics made explicit: operands are converted to the type Nx computed
  # for the result and broadcast to its shape, comparisons and logical ops produce `u8` 0/1, and
  # reductions, windows, gathers and scatters get their regions and dimension numbers.
  # `runtime_call` and hooks become EXLA's `exla_runtime_callback` custom calls; the module's
  # first parameter is then the callback handle, which the node supplies. Ops XLA's CPU backend
  # cannot compute on the 2- and 4-bit integers or the 8-bit floats run on a wider type (see
  # "Where XLA's CPU backend needs wider elements" below).
  #
  # An op this module cannot lower raises `ArgumentError` naming it, at compile time.

  alias Nx.Defn.{Composite, Expr}
  alias Nx.Tensor, as: T
  alias XlaNode.MLIR, as: M

  @doc """
  Builds `main(parameters) -> outputs`. Returns `%{text: module_text, callbacks: %{id =>
  callback}}`, the callbacks being what the caller's callback server must answer. `parameters`
  are the templates of the expression's root parameters, by position; one that is `nil` (the
  expression does not use it) is left out of `main`'s arguments. `target` (`%{node: node,
  platform: platform}`) is what `XlaNode.Compiler.CustomCall` implementations are told of the
  node the program is for.

  Options, for an SPMD program (`XlaNode.Compiler.Shard`): `:parameter_attributes`, one entry
  per parameter as `parameters` gives them (`nil` or `[{name, attribute text}]`, such as its
  `mhlo.sharding`), and `:module_attributes` (`[{name, attribute text}]`).
  """
  def module(parameters, outputs, target \\ %{node: nil, platform: "cpu"}, opts \\ []) do
    calls_back = Enum.any?(outputs, &calls_back?/1)
    # Vectorized parameters come in devectorized, as the expression uses them.
    param_types = for p <- parameters, p != nil, do: type_of(Nx.devectorize(p))
    arg_types = if calls_back, do: [{{:u, 8}, [8]} | param_types], else: param_types

    function_opts =
      case Keyword.fetch(opts, :parameter_attributes) do
        {:ok, attributes} ->
          used = for {p, a} <- Enum.zip(parameters, attributes), p != nil, do: a
          [arg_attributes: if(calls_back, do: [nil | used], else: used)]

        :error ->
          []
      end

    module_opts =
      Keyword.take(opts, [:module_attributes]) |> Enum.map(fn {_, a} -> {:attributes, a} end)

    Process.put(:xla_node_lower_callbacks, %{})

    try do
      text =
        M.module(
          fn ->
            M.function(
              "main",
              arg_types,
              fn args ->
                {handle, args} = if calls_back, do: {hd(args), tl(args)}, else: {nil, args}
                params = by_position(parameters, args)
                state = %{params: params, handle: handle, loop: %{}, cache: %{}, target: target}
                {values, _state} = lower_all(outputs, state)
                values
              end,
              function_opts
            )
          end,
          module_opts
        )

      %{text: text, callbacks: Process.get(:xla_node_lower_callbacks)}
    after
      Process.delete(:xla_node_lower_callbacks)
    end
  end

  # The function's arguments at the positions of the parameters they stand for, `nil` at the
  # others.
  defp by_position(parameters, args) do
    {params, []} =
      Enum.map_reduce(parameters, args, fn
        nil, args -> {nil, args}
        _parameter, [arg | args] -> {arg, args}
      end)

    params
  end

  defp calls_back?(expr), do: has_op?(expr, [:runtime_call, :hook])

  @doc "Whether an expression (or a container of them) uses any of `ops`."
  def has_op?(expr, ops), do: any_op?(expr, ops, %{}) |> elem(0)

  defp any_op?(%T{data: %Expr{id: id, op: op, args: args}}, ops, seen) do
    cond do
      Map.has_key?(seen, id) ->
        {false, seen}

      op in ops ->
        {true, seen}

      true ->
        Enum.reduce_while(args, {false, Map.put(seen, id, true)}, fn arg, {_, seen} ->
          halt_if(any_op?(arg, ops, seen))
        end)
    end
  end

  defp any_op?(list, ops, seen) when is_list(list),
    do:
      Enum.reduce_while(list, {false, seen}, fn arg, {_, seen} ->
        halt_if(any_op?(arg, ops, seen))
      end)

  defp any_op?(tuple, ops, seen) when is_tuple(tuple),
    do: any_op?(Tuple.to_list(tuple), ops, seen)

  defp any_op?(_other, _ops, seen), do: {false, seen}

  defp halt_if({true, seen}), do: {:halt, {true, seen}}
  defp halt_if({false, seen}), do: {:cont, {false, seen}}

  ## Types

  defp type_of(%T{type: type, shape: shape}), do: {type!(type), Tuple.to_list(shape)}

  defp type!({kind, bits} = type) when kind in [:s, :u] and bits in [2, 4, 8, 16, 32, 64],
    do: type

  defp type!({:f, bits} = type) when bits in [8, 16, 32, 64], do: type
  defp type!({:f8_e4m3fn, 8} = type), do: type
  defp type!({:bf, 16} = type), do: type
  defp type!({:c, bits} = type) when bits in [64, 128], do: type

  defp type!(type) do
    raise ArgumentError,
          "XlaNode.Compiler cannot run tensors of type #{inspect(type)} (the node's types: " <>
            "s2-s64, u2-u64, f8, f8_e4m3fn, f16, bf16, f32, f64, c64, c128)"
  end

  defp dims(%T{shape: shape}), do: Tuple.to_list(shape)

  ## Traversal

  defp lower_all(exprs, state) do
    Enum.map_reduce(exprs, state, &lower/2)
  end

  # Lowers one expression to a value (or, for tuple-valued ones, a list of values).
  defp lower(%T{data: %Expr{id: id, op: op, args: args}} = ans, state) do
    case state.cache do
      %{^id => value} ->
        {value, state}

      _ ->
        {value, state} = op(op, args, ans, state)
        {value, put_in(state.cache[id], value)}
    end
  end

  defp lower(number, state) when is_number(number), do: {number, state}

  # The operands of an elementwise op: converted to `type` and broadcast to `ans`'s shape.
  defp operands(exprs, type, ans, state) do
    {values, state} = lower_all(exprs, state)
    {Enum.map(values, &(&1 |> cast(type) |> broadcast(dims(ans)))), state}
  end

  defp lower_container(container, state) do
    [container] |> Composite.flatten_list() |> lower_all(state)
  end

  ## Ops

  # Parameters of a loop or region function are found by id, the function's by position.
  defp op(:parameter, [i], %T{data: %Expr{id: id}}, state) do
    case state.loop do
      %{^id => value} -> {value, state}
      _ -> {Enum.fetch!(state.params, i), state}
    end
  end

  defp op(:tensor, [t], ans, state) do
    t = Nx.devectorize(t)
    {M.constant_binary(Nx.to_binary(t), type_of(ans)), state}
  end

  defp op(:constant, [number], ans, state),
    do: {M.constant(constant_value(number), type_of(ans)), state}

  defp op(:metadata, [expr, _metadata], _ans, state), do: lower_first(expr, state)

  defp op(:elem, [tuple, i], _ans, state) do
    {values, state} = lower(tuple, state)
    {Enum.fetch!(values, i), state}
  end

  defp op(:as_type, [x], ans, state) do
    {v, state} = lower(x, state)
    {cast(v, ans.type), state}
  end

  defp op(:bitcast, [x], ans, state) do
    {v, state} = lower(x, state)
    {M.bitcast_convert(v, ans.type), state}
  end

  @unary %{
    exp: :exponential,
    expm1: :exponential_minus_one,
    log: :log,
    log1p: :log_plus_one,
    sigmoid: :logistic,
    sqrt: :sqrt,
    rsqrt: :rsqrt,
    cbrt: :cbrt,
    sin: :sine,
    cos: :cosine,
    tan: :tan,
    tanh: :tanh,
    asin: :asin,
    acos: :acos,
    atan: :atan,
    sinh: :sinh,
    cosh: :cosh,
    asinh: :asinh,
    acosh: :acosh,
    atanh: :atanh,
    erf: :erf,
    erfc: :erfc,
    erf_inv: :erf_inv,
    negate: :negate,
    sign: :sign,
    floor: :floor,
    ceil: :ceil,
    round: :round_nearest_afz,
    bitwise_not: :bitwise_not,
    population_count: :population_count,
    count_leading_zeros: :count_leading_zeros
  }

  defp op(op, [x], ans, state) when is_map_key(@unary, op) do
    {v, state} = lower(x, state)
    v = cast(v, ans.type)

    value =
      case {op, M.category(ans.type)} do
        {op, int} when op in [:floor, :ceil, :round] and int in [:signed, :unsigned] -> v
        {:sign, :unsigned} -> M.select(M.compare(:eq, v, zero(v)), v, one(v))
        {:cbrt, :complex} -> complex_cbrt(v)
        {op, _} when op in [:population_count, :count_leading_zeros] -> count_bits(op, v)
        _ -> in_wide(op, ans.type, [v], &apply(M, @unary[op], &1))
      end

    {value, state}
  end

  defp op(:abs, [x], ans, state) do
    {v, state} = lower(x, state)
    value = if M.category(elem_type(v)) == :unsigned, do: v, else: M.abs(v)
    {cast(value, ans.type), state}
  end

  defp op(op, [x], ans, state) when op in [:real, :imag] do
    {v, state} = lower(x, state)

    value =
      case {op, M.category(elem_type(v))} do
        {:real, :complex} -> M.real(v)
        {:imag, :complex} -> M.imag(v)
        {:real, _} -> v
        {:imag, _} -> zero(v)
      end

    {cast(value, ans.type), state}
  end

  defp op(:conjugate, [x], ans, state) do
    {v, state} = lower(x, state)
    {conjugate(cast(v, ans.type)), state}
  end

  defp op(:is_nan, [x], ans, state) do
    {v, state} = lower(x, state)
    {cast(M.compare(:ne, v, v), ans.type), state}
  end

  defp op(:is_infinity, [x], ans, state) do
    {v, state} = lower(x, state)

    pred =
      case M.category(elem_type(v)) do
        :float -> M.is_inf(v)
        :complex -> M.bitwise_or(M.is_inf(M.real(v)), M.is_inf(M.imag(v)))
        _ -> M.compare(:ne, v, v)
      end

    {cast(pred, ans.type), state}
  end

  @arith %{
    add: :add,
    subtract: :subtract,
    multiply: :multiply,
    divide: :divide,
    quotient: :divide,
    remainder: :remainder,
    atan2: :atan2,
    bitwise_and: :bitwise_and,
    bitwise_or: :bitwise_or,
    bitwise_xor: :bitwise_xor,
    left_shift: :shift_left
  }

  defp op(op, [a, b], ans, state) when is_map_key(@arith, op) do
    {[va, vb], state} = operands([a, b], ans.type, ans, state)
    {in_wide(op, ans.type, [va, vb], &apply(M, @arith[op], &1)), state}
  end

  # XLA's integer power is wrong for large exponents ((-3)^100 in s16 came out -14639, not
  # 5073): Nx's wraps like repeated multiplication, so square and multiply over every bit of
  # the exponent.
  defp op(:pow, [a, b], ans, state) do
    {[va, vb], state} = operands([a, b], ans.type, ans, state)

    if M.category(ans.type) in [:signed, :unsigned],
      do: {integer_pow(va, vb), state},
      else: {in_wide(:pow, ans.type, [va, vb], &apply(M, :power, &1)), state}
  end

  # XLA's CPU maximum and minimum can drop a NaN second operand; Nx's propagate NaN from either.
  defp op(op, [a, b], ans, state) when op in [:max, :min] do
    {[va, vb], state} = operands([a, b], ans.type, ans, state)
    {extremum(op, va, vb), state}
  end

  defp op(:right_shift, [a, b], ans, state) do
    {[va, vb], state} = operands([a, b], ans.type, ans, state)

    shift =
      if M.category(ans.type) == :unsigned,
        do: &M.shift_right_logical/2,
        else: &M.shift_right_arithmetic/2

    {shift.(va, vb), state}
  end

  @compare %{
    equal: :eq,
    not_equal: :ne,
    less: :lt,
    less_equal: :le,
    greater: :gt,
    greater_equal: :ge
  }

  defp op(op, [a, b], ans, state) when is_map_key(@compare, op) do
    {[va, vb], state} = operands([a, b], Nx.Type.merge(a.type, b.type), ans, state)
    {cast(M.compare(@compare[op], va, vb), ans.type), state}
  end

  @logical %{logical_and: :bitwise_and, logical_or: :bitwise_or, logical_xor: :bitwise_xor}

  defp op(op, [a, b], ans, state) when is_map_key(@logical, op) do
    {[va, vb], state} = lower_all([a, b], state)
    [pa, pb] = Enum.map([va, vb], &(&1 |> to_pred() |> broadcast(dims(ans))))
    {cast(apply(M, @logical[op], [pa, pb]), ans.type), state}
  end

  defp op(:select, [pred, on_true, on_false], ans, state) do
    {p, state} = lower(pred, state)
    {[t, f], state} = operands([on_true, on_false], ans.type, ans, state)
    {M.select(p |> to_pred() |> broadcast(dims(ans)), t, f), state}
  end

  defp op(:clip, [x, min, max], ans, state) do
    {[v, lo, hi], state} = operands([x, min, max], ans.type, ans, state)
    {M.clamp(lo, v, hi), state}
  end

  defp op(op, [x | _], ans, state) when op in [:reshape, :squeeze] do
    {v, state} = lower(x, state)
    {M.reshape(v, dims(ans)), state}
  end

  defp op(:broadcast, [x, _shape, axes], ans, state) do
    {v, state} = lower(x, state)
    {M.broadcast_in_dim(v, dims(ans), axes), state}
  end

  defp op(:transpose, [x, axes], ans, state) do
    {v, state} = lower(x, state)
    {in_wide(:transpose, ans.type, [v], &M.transpose(hd(&1), axes)), state}
  end

  defp op(:reverse, [x, axes], _ans, state) do
    {v, state} = lower(x, state)
    {M.reverse(v, axes), state}
  end

  defp op(:pad, [x, value, config], ans, state) do
    {[v, pad], state} = lower_all([x, value], state)
    {lo, hi, interior} = unzip3(config)
    {M.pad(cast(v, ans.type), cast(pad, ans.type), lo, hi, interior), state}
  end

  defp op(:dot, [a, ca, ba, b, cb, bb], ans, state) do
    {[va, vb], state} = lower_all([a, b], state)

    value =
      in_wide(:dot, ans.type, [va, vb], fn [va, vb] ->
        M.dot_general(va, vb, contracting: {ca, cb}, batch: {ba, bb})
      end)

    {value, state}
  end

  defp op(:slice, [x, starts, lengths, strides], _ans, state) do
    {v, state} = lower(x, state)

    if Enum.all?(starts, &is_integer/1) do
      {M.slice(v, starts, Enum.zip_with(starts, lengths, &(&1 + &2)), strides), state}
    else
      {starts, state} = indices(starts, state)
      sliced = M.dynamic_slice(v, starts, lengths)

      if Enum.all?(strides, &(&1 == 1)),
        do: {sliced, state},
        else: {M.slice(sliced, Enum.map(lengths, fn _ -> 0 end), lengths, strides), state}
    end
  end

  defp op(:put_slice, [x, starts, slice], ans, state) do
    {[v, s], state} = lower_all([x, slice], state)
    {starts, state} = indices(starts, state)
    {M.dynamic_update_slice(cast(v, ans.type), cast(s, ans.type), starts), state}
  end

  defp op(:concatenate, [tensors, axis], ans, state) do
    {values, state} = lower_all(tensors, state)
    {in_wide(:concatenate, ans.type, values, &M.concatenate(&1, axis)), state}
  end

  defp op(:stack, [tensors, axis], ans, state) do
    {values, state} = lower_all(tensors, state)

    value =
      in_wide(:concatenate, ans.type, values, fn values ->
        values
        |> Enum.map(fn v -> M.reshape(v, List.insert_at(elem(v.type, 1), axis, 1)) end)
        |> M.concatenate(axis)
      end)

    {value, state}
  end

  defp op(:iota, [axis], ans, state) do
    {type, d} = type_of(ans)

    value =
      case axis do
        nil -> M.iota({type, [Enum.product(d)]}, 0) |> M.reshape(d)
        axis -> M.iota({type, d}, axis)
      end

    {value, state}
  end

  defp op(:eye, [], ans, state) do
    {type, d} = type_of(ans)
    rank = length(d)
    rows = M.iota({{:s, 64}, d}, rank - 2)
    cols = M.iota({{:s, 64}, d}, rank - 1)
    {cast(M.compare(:eq, rows, cols), type), state}
  end

  defp op(op, [x, opts], ans, state)
       when op in [:sum, :product, :reduce_max, :reduce_min, :all, :any] do
    {v, state} = lower(x, state)
    {_, in_dims} = v.type
    axes = opts[:axes] || Enum.to_list(0..(length(in_dims) - 1)//1)

    {v, init, combine} =
      case op do
        :sum -> {cast(v, ans.type), M.constant(0, {ans.type, []}), &M.add/2}
        :product -> {cast(v, ans.type), M.constant(1, {ans.type, []}), &M.multiply/2}
        :reduce_max -> {cast(v, ans.type), lowest(ans.type), &extremum(:max, &1, &2)}
        :reduce_min -> {cast(v, ans.type), highest(ans.type), &extremum(:min, &1, &2)}
        :all -> {to_pred(v), M.constant(true, {{:pred, 8}, []}), &M.bitwise_and/2}
        :any -> {to_pred(v), M.constant(false, {{:pred, 8}, []}), &M.bitwise_or/2}
      end

    reduced = M.reduce(v, init, axes, fn [a, b] -> combine.(a, b) end)
    {reduced |> cast(ans.type) |> M.reshape(dims(ans)), state}
  end

  defp op(op, [x, opts], ans, state) when op in [:argmax, :argmin] do
    {v, state} = lower(x, state)
    v = cast(v, computed_in(:argmax, elem_type(v)))
    {elem, in_dims} = v.type

    {v, axis, in_dims} =
      if opts[:axis] == nil,
        do: {M.reshape(v, [Enum.product(in_dims)]), 0, [Enum.product(in_dims)]},
        else: {v, opts[:axis], in_dims}

    index_type = ans.type
    indices = M.iota({index_type, in_dims}, axis)

    init = [
      if(op == :argmax, do: lowest(elem), else: highest(elem)),
      M.constant(0, {index_type, []})
    ]

    better = if op == :argmax, do: :gt, else: :lt
    tie = if opts[:tie_break] == :high, do: :gt, else: :lt

    [_, index] =
      M.reduce([v, indices], init, [axis], fn [acc_v, acc_i, x, i] ->
        # NaN wins, as in Nx: it compares as the largest (argmax) or smallest (argmin) value.
        x_nan = M.compare(:ne, x, x)
        acc_nan = M.compare(:ne, acc_v, acc_v)

        take_x =
          M.bitwise_or(M.compare(better, x, acc_v), M.bitwise_and(x_nan, M.bitwise_not(acc_nan)))

        equal = M.bitwise_or(M.compare(:eq, x, acc_v), M.bitwise_and(x_nan, acc_nan))
        take_x = M.bitwise_or(take_x, M.bitwise_and(equal, M.compare(tie, i, acc_i)))
        [M.select(take_x, x, acc_v), M.select(take_x, i, acc_i)]
      end)

    {M.reshape(index, dims(ans)), state}
  end

  defp op(:reduce, [x, acc, opts, fun], ans, state) do
    {[v, init], state} = lower_all([x, acc], state)
    {_, in_dims} = v.type
    axes = opts[:axes] || Enum.to_list(0..(length(in_dims) - 1)//1)
    v = cast(v, ans.type)
    init = cast(init, ans.type)
    reduced = M.reduce(v, init, axes, &apply_fun(fun, &1, state))
    {M.reshape(reduced, dims(ans)), state}
  end

  @windows %{
    window_sum: {:add, 0},
    window_product: {:multiply, 1},
    window_max: {:max, :lowest},
    window_min: {:min, :highest}
  }

  defp op(op, [x, window, opts], ans, state) when is_map_key(@windows, op) do
    {v, state} = lower(x, state)
    {combine, init} = @windows[op]

    init =
      case init do
        :lowest -> lowest(ans.type)
        :highest -> highest(ans.type)
        n -> M.constant(n, {ans.type, []})
      end

    value =
      M.reduce_window(
        cast(v, ans.type),
        init,
        Tuple.to_list(window),
        fn [a, b] ->
          if combine in [:max, :min],
            do: extremum(combine, a, b),
            else: apply(M, combine, [a, b])
        end,
        window_opts(opts)
      )

    {value, state}
  end

  defp op(:window_reduce, [x, acc, window, opts, fun], ans, state) do
    {[v, init], state} = lower_all([x, acc], state)

    value =
      M.reduce_window(
        cast(v, ans.type),
        cast(init, ans.type),
        Tuple.to_list(window),
        &apply_fun(fun, &1, state),
        window_opts(opts)
      )

    {value, state}
  end

  defp op(op, [x, opts], ans, state) when op in [:sort, :argsort] do
    {v, state} = lower(x, state)
    {type, in_dims} = v.type
    axis = opts[:axis] || 0
    direction = if opts[:direction] == :desc, do: :gt, else: :lt

    # As Nx: NaN (any NaN) sorts last ascending and first descending, and -0.0 ties with 0.0
    # (a total order would put -0.0 first, and -NaN first).
    compare = fn a, b ->
      ordered = M.compare(direction, a, b)

      if M.category(elem_type(a)) == :float do
        {nan, other} = if direction == :lt, do: {b, a}, else: {a, b}
        M.bitwise_or(ordered, M.bitwise_and(is_nan(nan), M.bitwise_not(is_nan(other))))
      else
        ordered
      end
    end

    case op do
      :sort ->
        sort = &M.sort(hd(&1), axis, fn [a, b] -> compare.(a, b) end, stable: true)
        {in_wide(:sort, type, [v], sort), state}

      :argsort ->
        v = cast(v, computed_in(:sort, type))
        indices = M.iota({ans.type, in_dims}, axis)

        [_, sorted] =
          M.sort([v, indices], axis, fn [a, b, _, _] -> compare.(a, b) end, stable: true)

        {sorted, state}
    end
  end

  defp op(:gather, [x, indices, opts], _ans, state) do
    {[v, idx], state} = lower_all([x, indices], state)
    {_, in_dims} = v.type
    {_, idx_dims} = idx.type
    axes = opts[:axes] || Enum.to_list(0..(List.last(idx_dims) - 1)//1)
    batch_rank = length(idx_dims) - 1
    kept = for {_, i} <- Enum.with_index(in_dims), i not in axes, do: i
    slice_sizes = for {d, i} <- Enum.with_index(in_dims), do: if(i in axes, do: 1, else: d)

    value =
      in_wide(:gather, elem_type(v), [v], fn [v] ->
        M.gather(v, idx, slice_sizes,
          offset_dims: Enum.to_list(batch_rank..(batch_rank + length(kept) - 1)//1),
          collapsed_slice_dims: axes,
          start_index_map: axes,
          index_vector_dim: batch_rank
        )
      end)

    {value, state}
  end

  defp op(op, [x, indices, updates, opts], ans, state) when op in [:indexed_add, :indexed_put] do
    {[v, idx, upd], state} = lower_all([x, indices, updates], state)
    {_, idx_dims} = idx.type
    axes = opts[:axes] || Enum.to_list(0..(List.last(idx_dims) - 1)//1)
    batch_rank = length(idx_dims) - 1
    {_, upd_dims} = upd.type
    combine = if op == :indexed_add, do: fn [a, b] -> M.add(a, b) end, else: fn [_, b] -> b end

    value =
      in_wide(:scatter, ans.type, [v, upd], fn [v, upd] ->
        M.scatter(v, idx, upd, combine,
          update_window_dims: Enum.to_list(batch_rank..(length(upd_dims) - 1)//1),
          inserted_window_dims: axes,
          scatter_dims_to_operand_dims: axes,
          index_vector_dim: batch_rank
        )
      end)

    {value, state}
  end

  defp op(:conv, [x, kernel, opts], ans, state) do
    {[v, k], state} = lower_all([x, kernel], state)
    [ib, if_ | is] = opts[:input_permutation]
    [ko, ki | ks] = opts[:kernel_permutation]
    [ob, of | os] = opts[:output_permutation]

    value =
      in_wide(:conv, ans.type, [v, k], fn [v, k] ->
        M.convolution(v, k,
          input: {ib, if_, is},
          kernel: {ki, ko, ks},
          output: {ob, of, os},
          strides: opts[:strides],
          padding: opts[:padding],
          lhs_dilation: opts[:input_dilation],
          rhs_dilation: opts[:kernel_dilation],
          feature_group_count: opts[:feature_group_size],
          batch_group_count: opts[:batch_group_size]
        )
      end)

    {value, state}
  end

  defp op(op, [x, source, init, window, opts], ans, state)
       when op in [:window_scatter_max, :window_scatter_min] do
    {[v, src, init], state} = lower_all([x, source, init], state)
    # Strict, as Nx: of equal values in a window, the last one gets the source value.
    pick = if op == :window_scatter_max, do: :gt, else: :lt

    value =
      M.select_and_scatter(
        cast(v, ans.type),
        cast(src, ans.type),
        cast(init, ans.type),
        Tuple.to_list(window),
        fn [a, b] -> M.compare(pick, a, b) end,
        fn [a, b] -> M.add(a, b) end,
        Keyword.take(window_opts(opts), [:strides, :padding])
      )

    {value, state}
  end

  # Nx solves op(a) x = b (left_side) or x op(a) = b for a triangular a (or a batch of them),
  # with b a matrix (of a's rank) or a vector (one less: a batch of vectors when a is batched),
  # solved as a column (left_side) or a row. op is a, its transpose, or its conjugate, which
  # stablehlo.triangular_solve does not have (its :adjoint also transposes): a is conjugated
  # first, as Nx's own backend does.
  defp op(:triangular_solve, [a, b, opts], ans, state) do
    {[va, vb], state} = lower_all([a, b], state)
    {va, vb} = {cast(va, ans.type), cast(vb, ans.type)}
    {_, adims} = va.type
    {_, bdims} = vb.type
    left = Keyword.get(opts, :left_side, true)
    vector = length(bdims) == length(adims) - 1
    # A column [..., m, 1] on the left, a row [..., 1, m] on the right.
    as_matrix = List.insert_at(bdims, if(left, do: -1, else: -2), 1)
    vb = if vector, do: M.reshape(vb, as_matrix), else: vb

    {va, transpose} =
      case Keyword.get(opts, :transform_a, :none) do
        :none -> {va, :no_transpose}
        :transpose -> {va, :transpose}
        :conjugate -> {conjugate(va), :no_transpose}
      end

    x =
      M.triangular_solve(va, vb,
        left_side: left,
        lower: Keyword.get(opts, :lower, true),
        transpose_a: transpose
      )

    {if(vector, do: M.reshape(x, bdims), else: x), state}
  end

  defp op(op, [x, opts], ans, state) when op in [:fft, :ifft] do
    {v, state} = lower(x, state)
    {fft_along(cast(v, ans.type), op, [opts[:axis]], [opts[:length]], opts[:eps]), state}
  end

  # Regions (loop bodies, branches, reduction functions) are lowered with a copy of the state:
  # what is first lowered inside one is not visible outside it.
  defp op(:while, [initial, arg, condition, body], ans, state) do
    {values, state} = lower_container(initial, state)
    params = Composite.flatten_list([arg])
    loop = fn state, args -> %{state | loop: Map.merge(state.loop, loop_params(params, args))} end

    results =
      M.while_loop(
        values,
        fn args -> lower_first(condition, loop.(state, args)) |> elem(0) |> to_pred() end,
        fn args ->
          {outs, _} = lower_container(body, loop.(state, args))
          Enum.zip_with(outs, values, &cast(&1, elem_type(&2)))
        end
      )

    {one_or_all(results, ans), state}
  end

  defp op(:cond, [clauses, last], ans, state) do
    {one_or_all(cond_chain(clauses, last, state), ans), state}
  end

  # A block becomes a custom call when an `XlaNode.Compiler.CustomCall` implementation says so;
  # otherwise one StableHLO op where StableHLO expresses it, and its default expression if not.
  defp op(:block, [struct, in_args, default, _fun] = args, ans, state) do
    tensors = block_tensors(in_args)
    templates = Enum.map(tensors, &Nx.to_template/1)

    case XlaNode.Compiler.CustomCall.call(
           struct,
           Nx.to_template(default),
           templates,
           state.target
         ) do
      :skip ->
        block(args, ans, state)

      {:ok, %XlaNode.Compiler.CustomCall.Spec{} = spec} ->
        custom_call(spec, tensors, default, ans, state)

      other ->
        raise ArgumentError,
              "XlaNode.Compiler.CustomCall for #{inspect(struct.__struct__)} must return :skip " <>
                "or {:ok, %XlaNode.Compiler.CustomCall.Spec{}}, got #{inspect(other)}"
    end
  end

  defp op(:runtime_call, [tensor_expr, fun, out_template, opts], _ans, state) do
    {args, state} = lower_container(tensor_expr, state)
    id = {:nx_runtime_call, make_ref()}
    templates = Composite.flatten_list([out_template])
    result_types = Enum.map(templates, &type_of/1)

    register(id, %{
      kind: :runtime_call,
      fun: fun,
      opts: opts,
      args_template: Nx.to_template(tensor_expr),
      out_template: out_template
    })

    results = M.runtime_call(state.handle, id, args, result_types)
    {single_or_list(results, out_template), state}
  end

  defp op(:hook, [tensor_expr, callback_spec, user_template, _ref], _ans, state) do
    {values, state} = lower_container(tensor_expr, state)

    {hooked, template, spec, state} =
      case callback_spec do
        {:token_hook, hooked_expr, inner} ->
          {hooked, state} = lower_container(hooked_expr, state)
          {hooked, Nx.to_template(hooked_expr), inner, state}

        spec ->
          {values, Nx.to_template(tensor_expr), spec, state}
      end

    id = {:nx_hook, make_ref()}
    register(id, %{kind: :hook, spec: spec, template: template})
    # The hooked values pass through the io_call, which keeps it in the program.
    passed = M.io_call(state.handle, id, hooked)
    values = if callback_spec == spec, do: passed, else: values
    {single_or_list(values, user_template), state}
  end

  defp op(op, _args, _ans, _state) do
    raise ArgumentError, "XlaNode.Compiler cannot lower the Nx operation #{inspect(op)} yet"
  end

  ## Blocks

  # Blocks StableHLO expresses directly: one op instead of the default expression.
  defp block([%Nx.Block.Take{axis: axis}, [x, indices], _default, _fun], ans, state) do
    {[v, idx], state} = lower_all([x, indices], state)
    {_, in_dims} = v.type
    {_, idx_dims} = idx.type
    out_rank = length(in_dims) - 1 + length(idx_dims)
    batch = Enum.to_list(axis..(axis + length(idx_dims) - 1)//1)

    value =
      in_wide(:gather, elem_type(v), [v], fn [v] ->
        M.gather(v, idx, List.replace_at(in_dims, axis, 1),
          offset_dims: Enum.to_list(0..(out_rank - 1)//1) -- batch,
          collapsed_slice_dims: [axis],
          start_index_map: [axis],
          index_vector_dim: length(idx_dims)
        )
      end)

    {cast(value, ans.type), state}
  end

  defp block([%Nx.Block.TopK{k: k}, [x], _default, _fun], _ans, state) do
    {v, state} = lower(x, state)
    type = elem_type(v)
    [values, indices] = M.top_k(cast(v, computed_in(:top_k, type)), k)
    {[cast(values, type), indices], state}
  end

  defp block([%Nx.Block.RFFT{} = b, [x], _default, _fun], ans, state) do
    {v, state} = lower(x, state)
    real = cast(v, Nx.Type.to_real(ans.type))
    {fft_along(real, :rfft, [b.axis], [b.length], b.eps), state}
  end

  defp block([%Nx.Block.IRFFT{} = b, [x], _default, _fun], ans, state) do
    {v, state} = lower(x, state)
    complex = cast(v, Nx.Type.to_complex(ans.type))
    {fft_along(complex, :irfft, [b.axis], [b.length], b.eps), state}
  end

  defp block([%struct{} = b, [x], _default, _fun], ans, state)
       when struct in [Nx.Block.FFT2, Nx.Block.IFFT2] do
    {v, state} = lower(x, state)
    kind = if struct == Nx.Block.FFT2, do: :fft, else: :ifft
    {fft_along(cast(v, ans.type), kind, b.axes, b.lengths, b.eps), state}
  end

  # A block's default expression is written over its own parameters, one per tensor argument:
  # lowered like a function body, with those as parameters.
  defp block([_struct, in_args, default, _fun], _ans, state) do
    {values, state} = lower_all(block_tensors(in_args), state)
    {value, _} = lower_first(default, %{state | params: values, cache: %{}, loop: %{}})
    {value, state}
  end

  # A block's tensor arguments: those before its options (a keyword list), if it has any.
  defp block_tensors(in_args), do: Enum.take_while(in_args, &(not is_list(&1)))

  ## Where XLA's CPU backend needs wider elements

  # XLA counts the bits of a 2- or 4-bit integer as those of its sign-extended byte: count
  # those of its zero-extended bit pattern.
  defp count_bits(op, v) do
    case elem_type(v) do
      {_, bits} = type when bits < 8 ->
        counted = v |> M.bitcast_convert({:u, bits}) |> cast({:u, 8}) |> then(&apply(M, op, [&1]))

        counted =
          if op == :count_leading_zeros,
            do: M.subtract(counted, M.constant(8 - bits, counted.type)),
            else: counted

        cast(counted, type)

      _ ->
        apply(M, op, [v])
    end
  end

  # The element type `op` runs in on the node for a result (or operand) of `type`: the ops XLA's
  # CPU backend cannot compute on 2- and 4-bit integers (listed in XlaNode.MLIR.CPUFaults) run
  # on 8-bit integers of the same signedness (narrowing back wraps, as Nx does). It has no erfc
  # of 8-bit floats: theirs runs on f32.
  defp computed_in(:erfc, {f8, 8}) when f8 in [:f, :f8_e4m3fn], do: {:f, 32}
  defp computed_in(op, type), do: XlaNode.MLIR.CPUFaults.computed_in(op, type)

  # `fun` of `values` converted to the type `op` runs in for `type`, and its result in `type`.
  defp in_wide(op, type, values, fun) do
    wide = computed_in(op, type)
    values |> Enum.map(&cast(&1, wide)) |> fun.() |> cast(type)
  end

  ## Helpers

  defp lower_first(expr, state) do
    case expr do
      %T{} -> lower(expr, state)
      container -> lower_container(container, state)
    end
  end

  # Ops with several results have a tuple type in Nx; their `elem`s pick from the list.
  defp one_or_all(values, %T{type: {:tuple, _}}), do: values
  defp one_or_all([value], _ans), do: value

  defp single_or_list(values, %T{}), do: hd(values)
  defp single_or_list(values, _template), do: values

  defp cond_chain([], last, state) do
    {values, _} = lower_container(last, state)
    values
  end

  defp cond_chain([{pred, body} | rest], last, state) do
    {p, state} = lower(pred, state)

    M.if_then_else(
      to_pred(p),
      fn -> lower_container(body, state) |> elem(0) end,
      fn -> cond_chain(rest, last, state) end
    )
  end

  # stablehlo.fft transforms the trailing dimensions: `axes` are moved there and back, each cut
  # or zero-padded to its length (an irfft's input to length / 2 + 1), and components no larger
  # than `eps` are zeroed afterwards, as Nx's own backend does.
  defp fft_along(v, kind, axes, lengths, eps) do
    {_, d} = v.type
    rank = length(d)
    to_end = (Enum.to_list(0..(rank - 1)//1) -- axes) ++ axes
    v = permute(v, to_end)
    {_, d} = v.type
    sizes = if kind == :irfft, do: List.update_at(lengths, -1, &(div(&1, 2) + 1)), else: lengths
    target = Enum.take(d, rank - length(axes)) ++ sizes
    kept = Enum.zip_with(d, target, &min/2)
    v = if kept == d, do: v, else: M.slice(v, List.duplicate(0, rank), kept)
    zeros = List.duplicate(0, rank)
    grow = Enum.zip_with(target, kept, &(&1 - &2))
    v = if target == kept, do: v, else: M.pad(v, zero_scalar(elem_type(v)), zeros, grow, zeros)

    v
    |> M.fft(kind, lengths)
    |> permute(inverse_permutation(to_end))
    |> clean_up(eps)
  end

  defp integer_pow(base, exponent) do
    {{_, bits}, _} = base.type

    {result, _, _} =
      Enum.reduce(1..bits, {one(base), base, exponent}, fn _, {acc, b, e} ->
        odd = M.compare(:ne, M.bitwise_and(e, one(e)), zero(e))

        {M.select(odd, M.multiply(acc, b), acc), M.multiply(b, b),
         M.shift_right_logical(e, one(e))}
      end)

    result
  end

  defp extremum(op, a, b) do
    value = if op == :max, do: M.maximum(a, b), else: M.minimum(a, b)

    if M.category(elem_type(a)) == :float,
      do: M.select(is_nan(a), a, M.select(is_nan(b), b, value)),
      else: value
  end

  defp is_nan(v), do: M.compare(:ne, v, v)

  # Of a complex value; a real one is its own conjugate.
  defp conjugate(v) do
    if M.category(elem_type(v)) == :complex,
      do: M.complex(M.real(v), M.negate(M.imag(v))),
      else: v
  end

  # stablehlo.cbrt is real-only: the principal root, cbrt(|z|) e^(i arg(z) / 3), as Nx's.
  defp complex_cbrt(v) do
    r = M.cbrt(M.abs(v))
    {_, d} = r.type
    theta = M.divide(M.atan2(M.imag(v), M.real(v)), M.constant(3, {elem_type(r), d}))
    M.complex(M.multiply(r, M.cosine(theta)), M.multiply(r, M.sine(theta)))
  end

  defp permute(v, perm) do
    if perm == Enum.sort(perm), do: v, else: M.transpose(v, perm)
  end

  defp inverse_permutation(perm) do
    perm |> Enum.with_index() |> Enum.sort() |> Enum.map(&elem(&1, 1))
  end

  defp clean_up(v, nil), do: v

  defp clean_up(v, eps) do
    if M.category(elem_type(v)) == :complex,
      do: M.complex(clean_up(M.real(v), eps), clean_up(M.imag(v), eps)),
      else: M.select(M.compare(:le, M.abs(v), M.constant(eps, v.type)), zero(v), v)
  end

  defp custom_call(%{target: target} = spec, tensors, default, ans, state)
       when is_binary(target) and target != "" do
    {values, state} = lower_all(tensors, state)
    types = spec.operand_types || Enum.map(values, &elem_type/1)

    if length(types) != length(values) do
      raise ArgumentError,
            "custom call #{target}: #{length(types)} operand_types for #{length(values)} operands"
    end

    results =
      M.custom_call(
        target,
        Enum.zip_with(values, types, &cast/2),
        [default] |> Composite.flatten_list() |> Enum.map(&type_of/1),
        backend_config: Enum.map(spec.attributes, fn {k, v} -> {k, M.attribute(v)} end),
        has_side_effect: spec.has_side_effect
      )

    {one_or_all(results, ans), state}
  end

  defp custom_call(spec, _tensors, _default, _ans, _state) do
    raise ArgumentError,
          "XlaNode.Compiler.CustomCall.Spec needs the kernel's target name, got #{inspect(spec)}"
  end

  defp apply_fun(%T{data: %Expr{op: :fun, args: [params, body, _mfa]}}, args, state) do
    loop = Map.merge(state.loop, loop_params(params, args))
    {[value], _} = lower_container(body, %{state | loop: loop})
    value
  end

  defp loop_params(params, args),
    do: Map.new(Enum.zip(params, args), fn {p, a} -> {p.data.id, a} end)

  defp register(id, callback) do
    Process.put(
      :xla_node_lower_callbacks,
      Map.put(Process.get(:xla_node_lower_callbacks), id, callback)
    )
  end

  defp indices(starts, state) do
    Enum.map_reduce(starts, state, fn
      i, state when is_integer(i) -> {M.constant(i, {{:s, 64}, []}), state}
      t, state -> lower(t, state) |> then(fn {v, s} -> {cast(v, {:s, 64}), s} end)
    end)
  end

  defp window_opts(opts) do
    [
      strides: opts[:strides],
      padding: opts[:padding],
      window_dilations: opts[:window_dilations]
    ]
    |> Enum.reject(fn {_, v} -> v == nil end)
  end

  defp unzip3(config) do
    {Enum.map(config, &elem(&1, 0)), Enum.map(config, &elem(&1, 1)),
     Enum.map(config, &elem(&1, 2))}
  end

  defp elem_type(%{type: {elem, _}}), do: elem

  # A convert to or from a 2- or 4-bit integer goes behind an optimization barrier: XLA would
  # move a transpose across it onto the narrow type (see computed_in/2), and it widens the
  # result of arithmetic on one without wrapping it first (s4 -8 - 1 converted to s8 was -9).
  defp cast(value, type) do
    type = type!(type)

    cond do
      elem_type(value) == type -> value
      min(bits(type), bits(elem_type(value))) < 8 -> value |> barrier() |> M.convert(type)
      true -> M.convert(value, type)
    end
  end

  defp barrier(value), do: value |> M.optimization_barrier() |> hd()

  defp bits({_, bits}), do: bits

  defp broadcast(value, dims) do
    {_, d} = value.type

    if d == dims do
      value
    else
      offset = length(dims) - length(d)
      M.broadcast_in_dim(value, dims, Enum.to_list(offset..(length(dims) - 1)//1))
    end
  end

  defp to_pred(value) do
    case elem_type(value) do
      {:pred, 8} -> value
      _ -> M.compare(:ne, value, zero(value))
    end
  end

  defp zero(value) do
    {elem, d} = value.type
    M.constant(0, {elem, d})
  end

  defp one(value) do
    {elem, d} = value.type
    M.constant(1, {elem, d})
  end

  defp zero_scalar(type), do: M.constant(0, {type!(type), []})

  defp lowest(type) do
    case type do
      {:s, bits} -> M.constant(-Bitwise.bsl(1, bits - 1), {type, []})
      {:u, _} -> M.constant(0, {type, []})
      _ -> M.constant(:neg_infinity, {type, []})
    end
  end

  defp highest(type) do
    case type do
      {:s, bits} -> M.constant(Bitwise.bsl(1, bits - 1) - 1, {type, []})
      {:u, bits} -> M.constant(Bitwise.bsl(1, bits) - 1, {type, []})
      _ -> M.constant(:infinity, {type, []})
    end
  end

  defp constant_value(%Complex{re: re, im: im}), do: {re, im}
  defp constant_value(number), do: number
end
