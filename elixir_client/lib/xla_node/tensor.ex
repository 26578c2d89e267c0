defmodule XlaNode.Tensor do
  @moduledoc """
  Builds and reads the tensors `xla_node` exchanges, without Nx.

  A tensor is the tuple `{binary, {type, dims}}`:

    * `type` - an Nx type: `{:s, 2 | 4 | 8 | 16 | 32 | 64}`, `{:u, 2 | 4 | 8 | 16 | 32 | 64}`,
      `{:f, 8 | 16 | 32 | 64}` (`{:f, 8}` is E5M2), `{:f8_e4m3fn, 8}`, `{:bf, 16}`,
      `{:c, 64 | 128}` or `{:pred, 8}`. Functions here also accept the short atoms `:s32`, `:u4`,
      `:f8`, `:f8_e4m3fn`, `:bf16`, `:c64`, `:pred`, ...
    * `dims` - a list of non-negative integers (`[]` for a scalar)
    * `binary` - the elements in row-major order, little-endian, exactly as `Nx.to_binary/1`
      gives them. 2- and 4-bit elements are packed without padding, element 0 in the most
      significant bits (`<<x::4, y::4>>`), so their binary is a bitstring of `size * bits` bits,
      not always a whole number of bytes: `u4 [1, 2, 3]` is `<<0x12, 0x3::4>>`.

  ## Element values

    * integers (`:s`, `:u`) - Elixir integers; values out of the type's range raise
    * floats (`:f`, `:bf`, `:f8_e4m3fn`) - floats or integers; `:infinity`, `:neg_infinity` and
      `:nan` stand for the IEEE special values (read back the same way, like Nx). `f16`, `bf16`
      and the 8-bit floats are encoded by hand with round-to-nearest-even, as XLA converts (Nx
      itself truncates to `f8`); values too large for the type become infinities, except in
      `f8_e4m3fn`, which has none: there they become ±448, its largest value, as in Nx.
    * complex (`:c`) - `{re, im}` tuples, maps/structs with `:re` and `:im` (such as `Complex`),
      or plain real numbers; read back as `{re, im}` tuples of floats
    * `:pred` - `true`/`false` or `0`/`1`; read back as `0`/`1`, like Nx

  ## Examples

      iex> t = XlaNode.Tensor.from_list([[1, 2], [3, 4]], {:s, 32})
      iex> XlaNode.Tensor.shape(t)
      [2, 2]
      iex> XlaNode.Tensor.to_list(t)
      [[1, 2], [3, 4]]

      iex> XlaNode.Tensor.from_list([1.0, 65504.0, 1.0e6], :f16) |> XlaNode.Tensor.to_list()
      [1.0, 65504.0, :infinity]

      iex> XlaNode.Tensor.from_list([1, 2, 3], {:u, 4})
      {<<0x12, 0x3::4>>, {{:u, 4}, [3]}}
  """

  import Bitwise

  @typedoc "An Nx-style element type."
  @type type ::
          {:s, 2 | 4 | 8 | 16 | 32 | 64}
          | {:u, 2 | 4 | 8 | 16 | 32 | 64}
          | {:f, 8 | 16 | 32 | 64}
          | {:f8_e4m3fn, 8}
          | {:bf, 16}
          | {:c, 64 | 128}
          | {:pred, 8}

  @typedoc "A type, or one of the short atoms `:f32`, `:bf16`, `:s64`, `:u8`, `:c64`, `:pred`, ..."
  @type type_input :: type() | atom()

  @type dims :: [non_neg_integer()]

  @type t :: {bitstring(), {type(), dims()}}

  @typedoc "An element value; see the module documentation."
  @type value ::
          number()
          | :infinity
          | :neg_infinity
          | :nan
          | boolean()
          | {number() | atom(), number() | atom()}
          | %{re: number(), im: number()}

  # The largest finite f32.
  @f32_max 3.4028234663852886e38

  @types [
    {:s, 2},
    {:s, 4},
    {:s, 8},
    {:s, 16},
    {:s, 32},
    {:s, 64},
    {:u, 2},
    {:u, 4},
    {:u, 8},
    {:u, 16},
    {:u, 32},
    {:u, 64},
    {:f, 8},
    {:f8_e4m3fn, 8},
    {:f, 16},
    {:f, 32},
    {:f, 64},
    {:bf, 16},
    {:c, 64},
    {:c, 128},
    {:pred, 8}
  ]

  @doc """
  The supported types.

      iex> {:bf, 16} in XlaNode.Tensor.types()
      true
  """
  @spec types() :: [type()]
  def types, do: @types

  @doc """
  Normalises a type: `:f32` becomes `{:f, 32}`, `:pred` becomes `{:pred, 8}`. Raises
  `ArgumentError` for unsupported types.

      iex> XlaNode.Tensor.normalize_type(:bf16)
      {:bf, 16}
      iex> XlaNode.Tensor.normalize_type({:u, 8})
      {:u, 8}
  """
  @spec normalize_type(type_input()) :: type()
  def normalize_type(type) when type in @types, do: type
  def normalize_type(:pred), do: {:pred, 8}
  def normalize_type(:f8_e4m3fn), do: {:f8_e4m3fn, 8}

  def normalize_type(type) when is_atom(type) and type != nil do
    case Regex.run(~r/^(s|u|f|bf|c|pred)(\d+)$/, Atom.to_string(type)) do
      [_, kind, bits] -> normalize_type({String.to_atom(kind), String.to_integer(bits)})
      _ -> raise ArgumentError, "unsupported tensor type #{inspect(type)}"
    end
  end

  def normalize_type(type), do: raise(ArgumentError, "unsupported tensor type #{inspect(type)}")

  @doc """
  Bytes per element of a type. The 2- and 4-bit types take no whole number of bytes and raise
  `ArgumentError`: see `element_bits/1`.

      iex> XlaNode.Tensor.element_size({:c, 64})
      8
      iex> XlaNode.Tensor.element_size(:bf16)
      2
  """
  @spec element_size(type_input()) :: pos_integer()
  def element_size(type) do
    case element_bits(type) do
      bits when bits >= 8 ->
        div(bits, 8)

      bits ->
        raise ArgumentError,
              "#{inspect(normalize_type(type))} elements take #{bits} bits, not whole bytes"
    end
  end

  @doc """
  Bits per element of a type, as the tensor's binary holds them.

      iex> XlaNode.Tensor.element_bits(:u4)
      4
      iex> XlaNode.Tensor.element_bits({:pred, 8})
      8
  """
  @spec element_bits(type_input()) :: pos_integer()
  def element_bits(type) do
    {_, bits} = normalize_type(type)
    bits
  end

  @doc """
  Builds a tensor from a (possibly nested) list of values.

  Without `dims`, the shape is the nesting of the list, which must be rectangular. With `dims`,
  the list (flattened) must hold exactly `product(dims)` values.

      iex> XlaNode.Tensor.from_list([1, 2, 3], {:u, 8})
      {<<1, 2, 3>>, {{:u, 8}, [3]}}

      iex> XlaNode.Tensor.from_list([1, 2, 3, 4, 5, 6], :s8, [2, 3]) |> XlaNode.Tensor.to_list()
      [[1, 2, 3], [4, 5, 6]]

      iex> XlaNode.Tensor.from_list([true, false], :pred)
      {<<1, 0>>, {{:pred, 8}, [2]}}
  """
  @spec from_list(list(), type_input(), dims() | nil) :: t()
  def from_list(list, type, dims \\ nil) when is_list(list) do
    type = normalize_type(type)

    {values, dims} =
      case dims do
        nil ->
          {List.flatten(list), infer_dims(list)}

        dims when is_list(dims) ->
          values = List.flatten(list)
          check_dims!(dims)

          if length(values) != product(dims) do
            raise ArgumentError,
                  "#{length(values)} values given for dims #{inspect(dims)} " <>
                    "(#{product(dims)} expected)"
          end

          {values, dims}

        other ->
          raise ArgumentError,
                "dims must be a list of non-negative integers, got #{inspect(other)}"
      end

    {encode(values, type), {type, dims}}
  end

  @doc """
  Builds a rank-0 tensor.

      iex> XlaNode.Tensor.scalar(1.5, {:f, 32})
      {<<0, 0, 192, 63>>, {{:f, 32}, []}}
      iex> XlaNode.Tensor.scalar({1, -1}, :c64) |> XlaNode.Tensor.to_list()
      {1.0, -1.0}
  """
  @spec scalar(value(), type_input()) :: t()
  def scalar(value, type) do
    type = normalize_type(type)
    {encode([value], type), {type, []}}
  end

  @doc """
  Wraps a binary (a bitstring for 2- and 4-bit types, as `Nx.to_binary/1` gives it) in a
  tensor, checking that its size fits the type and dims.

      iex> XlaNode.Tensor.from_binary(<<1, 0, 2, 0>>, {:s, 16}, [2]) |> XlaNode.Tensor.to_list()
      [1, 2]
      iex> XlaNode.Tensor.from_binary(<<0x1E, 0x3::4>>, {:s, 4}, [3]) |> XlaNode.Tensor.to_list()
      [1, -2, 3]
  """
  @spec from_binary(bitstring(), type_input(), dims()) :: t()
  def from_binary(binary, type, dims) when is_bitstring(binary) and is_list(dims) do
    type = normalize_type(type)
    check_dims!(dims)
    check_size!(binary, type, dims, "given for")
    {binary, {type, dims}}
  end

  @doc """
  The size in bits of the binary of a tensor of `type` and `dims`: `size * bits`, a whole number
  of bytes but for some tensors of 2- and 4-bit types.

      iex> XlaNode.Tensor.bit_size({:u, 4}, [3])
      12
      iex> XlaNode.Tensor.bit_size(:f32, [2, 2])
      128
  """
  @spec bit_size(type_input(), dims()) :: non_neg_integer()
  def bit_size(type, dims), do: element_bits(type) * product(dims)

  @doc false
  # A data size for error texts: bits for 2- and 4-bit types and for sizes that are not whole
  # bytes, bytes otherwise (what the node says too).
  def size_text(bits, type) do
    if element_bits(type) < 8 or rem(bits, 8) != 0,
      do: "#{bits} bits",
      else: "#{div(bits, 8)} bytes"
  end

  defp check_size!(binary, type, dims, verb) do
    expected = bit_size(type, dims)

    if bit_size(binary) != expected do
      raise ArgumentError,
            "#{size_text(bit_size(binary), type)} #{verb} #{inspect(type)} #{inspect(dims)} " <>
              "(#{size_text(expected, type)} expected)"
    end
  end

  @doc """
  The tensor's values as a nested list following its dims; a scalar gives its value.

      iex> XlaNode.Tensor.from_list([[1.0], [2.0]], :f64) |> XlaNode.Tensor.to_list()
      [[1.0], [2.0]]
      iex> XlaNode.Tensor.scalar(7, :s64) |> XlaNode.Tensor.to_list()
      7
  """
  @spec to_list(t()) :: value() | list()
  def to_list({_binary, {_type, dims}} = tensor) do
    values = to_flat_list(tensor)

    case dims do
      [] -> hd(values)
      _ -> nest(values, dims)
    end
  end

  @doc """
  The tensor's values as a flat list, in row-major order.

      iex> XlaNode.Tensor.from_list([[1, 2], [3, 4]], :u16) |> XlaNode.Tensor.to_flat_list()
      [1, 2, 3, 4]
  """
  @spec to_flat_list(t()) :: [value()]
  def to_flat_list({binary, {type, dims}}) when is_bitstring(binary) do
    type = normalize_type(type)
    check_size!(binary, type, dims, "in a tensor of")
    decode(binary, type)
  end

  @doc """
  The value of a tensor with exactly one element.

      iex> XlaNode.Tensor.scalar(3.0, :bf16) |> XlaNode.Tensor.to_number()
      3.0
  """
  @spec to_number(t()) :: value()
  def to_number(tensor) do
    case to_flat_list(tensor) do
      [value] -> value
      values -> raise ArgumentError, "expected a tensor of one element, got #{length(values)}"
    end
  end

  @doc """
  The dims of a tensor.

      iex> XlaNode.Tensor.shape(XlaNode.Tensor.from_list([[1, 2, 3]], :s32))
      [1, 3]
  """
  @spec shape(t()) :: dims()
  def shape({_binary, {_type, dims}}), do: dims

  @doc """
  The type of a tensor.

      iex> XlaNode.Tensor.type(XlaNode.Tensor.scalar(1, :u64))
      {:u, 64}
  """
  @spec type(t()) :: type()
  def type({_binary, {type, _dims}}), do: type

  @doc """
  The number of elements.

      iex> XlaNode.Tensor.size(XlaNode.Tensor.from_list([1, 2, 3, 4], :s8, [2, 2]))
      4
  """
  @spec size(t()) :: non_neg_integer()
  def size({_binary, {_type, dims}}), do: product(dims)

  ## Shapes

  defp infer_dims([]), do: [0]

  defp infer_dims([first | _] = list) when is_list(first) do
    inner = infer_dims(first)

    Enum.each(list, fn
      sub when is_list(sub) ->
        if infer_dims(sub) != inner, do: raise(ArgumentError, "the list is not rectangular")

      _ ->
        raise ArgumentError, "the list is not rectangular"
    end)

    [length(list) | inner]
  end

  defp infer_dims(list) do
    if Enum.any?(list, &is_list/1), do: raise(ArgumentError, "the list is not rectangular")
    [length(list)]
  end

  defp check_dims!(dims) do
    unless Enum.all?(dims, &(is_integer(&1) and &1 >= 0)) do
      raise ArgumentError, "dims must be a list of non-negative integers, got #{inspect(dims)}"
    end
  end

  defp product(dims), do: Enum.reduce(dims, 1, &(&1 * &2))

  defp nest(values, [_]), do: values

  defp nest(values, [d | inner]) do
    case product(inner) do
      0 -> List.duplicate(nest([], inner), d)
      n -> values |> Enum.chunk_every(n) |> Enum.map(&nest(&1, inner))
    end
  end

  ## Encoding

  defp encode(values, type) do
    for value <- values, into: <<>>, do: encode_value(value, type)
  end

  defp encode_value(v, {:pred, 8}) do
    case v do
      true -> <<1>>
      false -> <<0>>
      1 -> <<1>>
      0 -> <<0>>
      other -> raise ArgumentError, "expected a boolean or 0/1 for :pred, got #{inspect(other)}"
    end
  end

  defp encode_value(v, {:s, bits}) when is_integer(v) do
    limit = 1 <<< (bits - 1)

    if v < -limit or v >= limit,
      do: raise(ArgumentError, "#{v} is out of range for {:s, #{bits}}")

    <<v::signed-little-size(bits)>>
  end

  defp encode_value(v, {:u, bits}) when is_integer(v) do
    if v < 0 or v >= 1 <<< bits,
      do: raise(ArgumentError, "#{v} is out of range for {:u, #{bits}}")

    <<v::unsigned-little-size(bits)>>
  end

  # Finite floats take the native path (Erlang rounds to nearest even like C); the rest (special
  # values, f32 overflow, integers too big for a double) go through float_bits/3.
  defp encode_value(v, {:f, 64}) when is_float(v), do: <<v::float-little-64>>

  defp encode_value(v, {:f, 32}) when is_float(v) and abs(v) <= @f32_max,
    do: <<v::float-little-32>>

  defp encode_value(v, {:f, 64}), do: float_bits(v, 11, 52) |> then(&<<&1::little-64>>)
  defp encode_value(v, {:f, 32}), do: float_bits(v, 8, 23) |> then(&<<&1::little-32>>)
  defp encode_value(v, {:f, 16}), do: float_bits(v, 5, 10) |> then(&<<&1::little-16>>)
  defp encode_value(v, {:bf, 16}), do: float_bits(v, 8, 7) |> then(&<<&1::little-16>>)
  defp encode_value(v, {:f, 8}), do: <<float_bits(v, 5, 2)::8>>
  defp encode_value(v, {:f8_e4m3fn, 8}), do: <<e4m3fn_bits(v)::8>>

  defp encode_value(v, {:c, bits}) do
    part = {:f, div(bits, 2)}
    {re, im} = complex_parts(v)
    encode_value(re, part) <> encode_value(im, part)
  end

  defp encode_value(v, type),
    do: raise(ArgumentError, "cannot encode #{inspect(v)} as #{inspect(type)}")

  defp complex_parts({re, im}), do: {re, im}
  defp complex_parts(%{re: re, im: im}), do: {re, im}
  defp complex_parts(v) when is_number(v) or v in [:infinity, :neg_infinity, :nan], do: {v, 0}

  defp complex_parts(v),
    do:
      raise(ArgumentError, "expected {re, im} or a number for a complex type, got #{inspect(v)}")

  # E4M3FN lays its fields out as an IEEE format with 4 exponent and 3 mantissa bits, but it has
  # no infinities: the top exponent holds finite values up to 448 (0x7E), and 0x7F is NaN.
  # Values beyond 448 saturate there, as in Nx.
  defp e4m3fn_bits(:nan), do: 0x7F
  defp e4m3fn_bits(:infinity), do: 0x7E
  defp e4m3fn_bits(:neg_infinity), do: 0xFE
  defp e4m3fn_bits(v), do: float_bits(v, 4, 3, 0x7E)

  # IEEE 754 binary interchange bits of `v` for a format with `e` exponent bits and `m` mantissa
  # bits, rounding to nearest even; magnitudes round to at most `max` (the infinity's bits unless
  # given). Works from the exact value of the double (or integer).
  defp float_bits(v, e, m, max \\ nil) do
    inf = ((1 <<< e) - 1) <<< m
    max = max || inf
    sign_bit = 1 <<< (e + m)

    case v do
      :infinity ->
        inf

      :neg_infinity ->
        sign_bit ||| inf

      :nan ->
        inf ||| 1 <<< (m - 1)

      v when is_integer(v) ->
        sign = if v < 0, do: sign_bit, else: 0
        # An integer is mantissa `abs(v)` times 2^0.
        sign ||| min(round_to_format(abs(v), 0, e, m), max)

      v when is_float(v) ->
        <<s::1, exp::11, frac::52>> = <<v::float-64>>
        sign = if s == 1, do: sign_bit, else: 0

        cond do
          exp == 0 and frac == 0 -> sign
          exp == 0 -> sign ||| min(round_to_format(frac, -1074, e, m), max)
          true -> sign ||| min(round_to_format(frac ||| 1 <<< 52, exp - 1075, e, m), max)
        end

      other ->
        raise ArgumentError,
              "expected a number, :infinity, :neg_infinity or :nan, got #{inspect(other)}"
    end
  end

  # Bits (without sign) of the nearest value to `mant * 2^exp2` (mant > 0) in the format, with
  # an exponent field as wide as needed (the caller caps it).
  defp round_to_format(0, _exp2, _e, _m), do: 0

  defp round_to_format(mant, exp2, e, m) do
    bias = (1 <<< (e - 1)) - 1
    emin = 1 - bias
    # Unbiased exponent of the leading bit of the value.
    lead = exp2 + bit_length(mant) - 1
    q = max(lead, emin) - m
    # The value in units of 2^q, rounded half to even.
    r = shift_round(mant, q - exp2)
    ((max(lead, emin) - emin) <<< m) + r
  end

  defp shift_round(mant, shift) when shift <= 0, do: mant <<< -shift

  defp shift_round(mant, shift) do
    r = mant >>> shift
    rem = mant &&& (1 <<< shift) - 1
    half = 1 <<< (shift - 1)

    cond do
      rem > half -> r + 1
      rem == half and (r &&& 1) == 1 -> r + 1
      true -> r
    end
  end

  defp bit_length(n), do: length(Integer.digits(n, 2))

  ## Decoding

  defp decode(binary, {:pred, 8}), do: for(<<b <- binary>>, do: if(b == 0, do: 0, else: 1))

  # One clause per width: a literal size reads the same on every Elixir release (a variable
  # bound outside the generator needs a pin from Elixir 1.20 on, which 1.14 refuses).
  for bits <- [2, 4, 8, 16, 32, 64] do
    defp decode(binary, {:s, unquote(bits)}),
      do: for(<<v::signed-little-size(unquote(bits)) <- binary>>, do: v)

    defp decode(binary, {:u, unquote(bits)}),
      do: for(<<v::unsigned-little-size(unquote(bits)) <- binary>>, do: v)
  end

  defp decode(binary, {:f, 64}), do: for(<<x::binary-8 <- binary>>, do: decode_f64(x))
  defp decode(binary, {:f, 32}), do: for(<<x::binary-4 <- binary>>, do: decode_f32(x))
  defp decode(binary, {:f, 16}), do: for(<<b::little-16 <- binary>>, do: float_value(b, 5, 10))
  defp decode(binary, {:bf, 16}), do: for(<<b::little-16 <- binary>>, do: float_value(b, 8, 7))
  defp decode(binary, {:f, 8}), do: for(<<b <- binary>>, do: float_value(b, 5, 2))

  defp decode(binary, {:f8_e4m3fn, 8}),
    do: for(<<b <- binary>>, do: if((b &&& 0x7F) == 0x7F, do: :nan, else: finite_value(b, 4, 3)))

  defp decode(binary, {:c, 64}),
    do: for(<<re::binary-4, im::binary-4 <- binary>>, do: {decode_f32(re), decode_f32(im)})

  defp decode(binary, {:c, 128}),
    do: for(<<re::binary-8, im::binary-8 <- binary>>, do: {decode_f64(re), decode_f64(im)})

  # Finite values decode natively; binary matching refuses infinities and NaNs.
  defp decode_f64(<<f::float-little-64>>), do: f
  defp decode_f64(<<b::little-64>>), do: float_value(b, 11, 52)

  defp decode_f32(<<f::float-little-32>>), do: f
  defp decode_f32(<<b::little-32>>), do: float_value(b, 8, 23)

  defp float_value(bits, e, m) do
    sign = bits >>> (e + m)
    exp = bits >>> m &&& (1 <<< e) - 1
    frac = bits &&& (1 <<< m) - 1

    cond do
      exp == (1 <<< e) - 1 and frac != 0 -> :nan
      exp == (1 <<< e) - 1 -> if sign == 1, do: :neg_infinity, else: :infinity
      true -> finite_value(bits, e, m)
    end
  end

  # The value of the bits of a finite number in a format with `e` exponent and `m` mantissa bits.
  defp finite_value(bits, e, m) do
    sign = bits >>> (e + m)
    exp = bits >>> m &&& (1 <<< e) - 1
    frac = bits &&& (1 <<< m) - 1
    bias = (1 <<< (e - 1)) - 1

    magnitude =
      if exp == 0,
        do: frac * pow2(1 - bias - m),
        else: ((1 <<< m) + frac) * pow2(exp - bias - m)

    if sign == 1, do: -1.0 * magnitude, else: magnitude
  end

  # 2^k as an exact float (f64 never gets here with a finite value).
  defp pow2(k) when k >= 0, do: (1 <<< k) * 1.0
  defp pow2(k), do: 1.0 / (1 <<< -k)
end
