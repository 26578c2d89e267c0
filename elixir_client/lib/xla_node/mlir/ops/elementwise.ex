defmodule XlaNode.MLIR.Ops.Elementwise do
  @moduledoc false
  # Constants, iota, random bits, and the elementwise ops: unary and binary arithmetic, bitwise
  # ops, comparisons, select, clamp and converts.
  # XlaNode.MLIR documents them and delegates here; see XlaNode.MLIR.Ops.Common for what the
  # families share.

  import Kernel, except: [abs: 1, floor: 1, ceil: 1]
  import XlaNode.MLIR.Ops.Common

  alias XlaNode.Tensor

  ## Constants and iota

  def constant(value, type) do
    {elem, dims} = check_type!("constant", type)
    size = Enum.product(dims)

    values =
      case value do
        list when is_list(list) ->
          list = List.flatten(list)

          if length(list) != size do
            raise ArgumentError,
                  "constant: #{length(list)} values for #{type_text({elem, dims})} (#{size} elements)"
          end

          list

        single ->
          [single]
      end

    literal =
      case elem do
        {:pred, 8} ->
          bools = Enum.map(values, &if(&1 in [true, 1], do: "true", else: "false"))
          if length(bools) == 1, do: hd(bools), else: "[" <> Enum.join(bools, ", ") <> "]"

        {_, bits} when bits < 8 ->
          # Checked, then written as decimal integers: MLIR's hex form would take a byte each.
          values |> Tensor.from_list(elem, [length(values)]) |> Tensor.to_flat_list() |> ints()

        _ ->
          {bin, _} = Tensor.from_list(values, elem, [length(values)])
          ~s("0x#{Base.encode16(bin)}")
      end

    emit1("stablehlo.constant", [], {elem, dims}, [
      "value = dense<#{literal}> : #{type_text({elem, dims})}"
    ])
  end

  defp ints([value]), do: "#{value}"
  defp ints(values), do: "[" <> Enum.join(values, ", ") <> "]"

  def constant_binary(binary, type) when is_bitstring(binary) do
    {elem, dims} = check_type!("constant", type)
    size = Tensor.bit_size(elem, dims)

    if bit_size(binary) != size do
      raise ArgumentError,
            "constant: #{Tensor.size_text(bit_size(binary), elem)} for " <>
              "#{type_text({elem, dims})} (#{Tensor.size_text(size, elem)})"
    end

    if elem == {:pred, 8} or Tensor.element_bits(elem) < 8 do
      constant(Tensor.to_flat_list({binary, {elem, [Enum.product(dims)]}}), {elem, dims})
    else
      emit1("stablehlo.constant", [], {elem, dims}, [
        ~s(value = dense<"0x#{Base.encode16(binary)}"> : #{type_text({elem, dims})})
      ])
    end
  end

  def iota(type, dimension) do
    {elem, dims} = check_type!("iota", type)

    if dimension < 0 or dimension >= length(dims),
      do:
        raise(
          ArgumentError,
          "iota: dimension #{dimension} out of range for #{type_text({elem, dims})}"
        )

    emit1("stablehlo.iota", [], {elem, dims}, ["iota_dimension = #{dimension} : i64"])
  end

  ## Elementwise ops

  @float_unary ~w(exponential exponential_minus_one log log_plus_one logistic sqrt rsqrt cbrt sine cosine tan tanh)a
  @rounding ~w(floor ceil round_nearest_even round_nearest_afz)a
  @chlo_unary ~w(erf erfc erf_inv lgamma digamma asin acos atan sinh cosh asinh acosh atanh)a

  for op <- @float_unary do
    def unquote(op)(x), do: unary(unquote("stablehlo.#{op}"), x, [:float, :complex])
  end

  for op <- @rounding do
    def unquote(op)(x), do: unary(unquote("stablehlo.#{op}"), x, [:float])
  end

  for op <- @chlo_unary do
    def unquote(op)(x) do
      cats =
        if unquote(op) in [:asin, :acos, :atan, :sinh, :cosh, :asinh, :acosh, :atanh],
          do: [:float, :complex],
          else: [:float]

      unary(unquote("chlo.#{op}"), x, cats)
    end
  end

  def negate(x), do: unary("stablehlo.negate", x, [:float, :complex, :signed, :unsigned])

  def sign(x), do: unary("stablehlo.sign", x, [:float, :complex, :signed])

  def abs(x) do
    x = value!("stablehlo.abs", x)
    {elem, dims} = x.type
    check_category!("stablehlo.abs", [x], [:float, :complex, :signed])

    result =
      if elem == {:c, 64}, do: {:f, 32}, else: if(elem == {:c, 128}, do: {:f, 64}, else: elem)

    emit1("stablehlo.abs", [x], {result, dims})
  end

  def bitwise_not(x), do: unary("stablehlo.not", x, [:signed, :unsigned, :pred])

  def population_count(x), do: unary("stablehlo.popcnt", x, [:signed, :unsigned])

  def count_leading_zeros(x), do: unary("stablehlo.count_leading_zeros", x, [:signed, :unsigned])

  def is_finite(x), do: predicate("stablehlo.is_finite", x)

  def is_inf(x), do: predicate("chlo.is_inf", x)

  def is_pos_inf(x), do: predicate("chlo.is_pos_inf", x)

  def is_neg_inf(x), do: predicate("chlo.is_neg_inf", x)

  def real(x), do: complex_part("stablehlo.real", x)

  def imag(x), do: complex_part("stablehlo.imag", x)

  defp unary(op, x, cats) do
    x = value!(op, x)
    check_category!(op, [x], cats)
    emit1(op, [x], x.type)
  end

  defp predicate(op, x) do
    x = value!(op, x)
    check_category!(op, [x], [:float])
    {_, dims} = x.type
    emit1(op, [x], {{:pred, 8}, dims})
  end

  defp complex_part(op, x) do
    x = value!(op, x)
    check_category!(op, [x], [:float, :complex])
    {elem, dims} = x.type
    part = %{{:c, 64} => {:f, 32}, {:c, 128} => {:f, 64}}[elem] || elem
    emit1(op, [x], {part, dims})
  end

  @arith ~w(add subtract multiply divide remainder power maximum minimum)a
  @bitwise ~w(and or xor)a
  @shifts ~w(shift_left shift_right_arithmetic shift_right_logical)a

  for op <- @arith do
    def unquote(op)(a, b),
      do:
        binary(
          unquote("stablehlo.#{op}"),
          a,
          b,
          [:float, :complex, :signed, :unsigned] ++
            if(unquote(op) in [:add, :multiply, :maximum, :minimum], do: [:pred], else: [])
        )
  end

  for op <- @bitwise do
    def unquote(:"bitwise_#{op}")(a, b),
      do: binary(unquote("stablehlo.#{op}"), a, b, [:signed, :unsigned, :pred])
  end

  for op <- @shifts do
    def unquote(op)(a, b), do: binary(unquote("stablehlo.#{op}"), a, b, [:signed, :unsigned])
  end

  def atan2(a, b), do: binary("stablehlo.atan2", a, b, [:float, :complex])

  def complex(re, im) do
    [re, im] = same_type!("stablehlo.complex", [re, im])
    {elem, dims} = re.type

    result =
      case elem do
        {:f, 32} -> {:c, 64}
        {:f, 64} -> {:c, 128}
        _ -> mismatch!("stablehlo.complex", [re, im], "f32 or f64 tensors")
      end

    emit1("stablehlo.complex", [re, im], {result, dims})
  end

  defp binary(op, a, b, cats) do
    [a, b] = same_type!(op, [a, b])
    check_category!(op, [a, b], cats)
    emit1(op, [a, b], a.type)
  end

  def compare(direction, a, b, compare_type \\ nil)
      when direction in [:eq, :ne, :lt, :le, :gt, :ge] do
    [a, b] = same_type!("stablehlo.compare", [a, b])
    {elem, dims} = a.type

    compare_type =
      compare_type ||
        case category(elem) do
          c when c in [:float, :complex] -> :float
          :signed -> :signed
          _ -> :unsigned
        end

    dir = direction |> Atom.to_string() |> String.upcase()
    ct = compare_type |> Atom.to_string() |> String.upcase()

    emit1("stablehlo.compare", [a, b], {{:pred, 8}, dims}, [
      "comparison_direction = #stablehlo<comparison_direction #{dir}>",
      "compare_type = #stablehlo<comparison_type #{ct}>"
    ])
  end

  def select(pred, on_true, on_false) do
    pred = value!("stablehlo.select", pred)
    [t, f] = same_type!("stablehlo.select", [on_true, on_false])
    {pelem, pdims} = pred.type
    {_, dims} = t.type

    unless pelem == {:pred, 8} and pdims in [[], dims] do
      mismatch!(
        "stablehlo.select",
        [pred, t, f],
        "a pred tensor of the branches' shape (or a scalar) and two branches of one type"
      )
    end

    emit1("stablehlo.select", [pred, t, f], t.type)
  end

  def clamp(min, x, max) do
    [min, x, max] = Enum.map([min, x, max], &value!("stablehlo.clamp", &1))
    {elem, _} = x.type

    for bound <- [min, max], bound.type != x.type and bound.type != {elem, []} do
      mismatch!(
        "stablehlo.clamp",
        [min, x, max],
        "bounds of the operand's type or scalars of its element type"
      )
    end

    emit1("stablehlo.clamp", [min, x, max], x.type)
  end

  def convert(x, type) do
    x = value!("stablehlo.convert", x)
    {_, dims} = x.type
    emit1("stablehlo.convert", [x], {Tensor.normalize_type(type), dims})
  end

  def bitcast_convert(x, type) do
    x = value!("stablehlo.bitcast_convert", x)
    {elem, dims} = x.type
    type = Tensor.normalize_type(type)
    {from, to} = {bits(elem), bits(type)}

    dims =
      cond do
        from == to ->
          dims

        from > to ->
          dims ++ [div(from, to)]

        List.last(dims) == div(to, from) ->
          Enum.drop(dims, -1)

        true ->
          mismatch!(
            "stablehlo.bitcast_convert",
            [x],
            "a last dimension of #{div(to, from)} to convert to #{element_text(type)}"
          )
      end

    emit1("stablehlo.bitcast_convert", [x], {type, dims})
  end

  def rng_bit_generator(state, type, algorithm \\ :default) do
    state = value!("stablehlo.rng_bit_generator", state)
    type = check_type!("stablehlo.rng_bit_generator", type)
    alg = algorithm |> Atom.to_string() |> String.upcase()

    emit("stablehlo.rng_bit_generator", [state], [state.type, type], [
      "rng_algorithm = #stablehlo<rng_algorithm #{alg}>"
    ])
  end
end
