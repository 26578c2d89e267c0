defmodule XlaNode.TensorTest do
  use ExUnit.Case, async: true

  alias XlaNode.Tensor

  doctest XlaNode.Tensor

  defp bits({binary, _}, size) when bit_size(binary) == size do
    :binary.decode_unsigned(binary, :little)
  end

  describe "round trips" do
    test "signed integers at their limits" do
      for bits <- [8, 16, 32, 64] do
        min = -Integer.pow(2, bits - 1)
        max = Integer.pow(2, bits - 1) - 1
        values = [min, -1, 0, 1, max]
        t = Tensor.from_list(values, {:s, bits})
        assert byte_size(elem(t, 0)) == 5 * div(bits, 8)
        assert Tensor.to_list(t) == values
      end
    end

    test "unsigned integers at their limits" do
      for bits <- [8, 16, 32, 64] do
        values = [0, 1, Integer.pow(2, bits) - 1]
        assert values |> Tensor.from_list({:u, bits}) |> Tensor.to_list() == values
      end
    end

    test "integers out of range raise" do
      assert_raise ArgumentError, ~r/out of range/, fn -> Tensor.from_list([128], {:s, 8}) end
      assert_raise ArgumentError, ~r/out of range/, fn -> Tensor.from_list([-1], {:u, 32}) end
      assert_raise ArgumentError, fn -> Tensor.from_list([1.5], {:s, 32}) end
    end

    test "f32 and f64 with special values" do
      values = [0.0, 1.5, -2.25, 7.888609052210118e-31, :infinity, :neg_infinity, :nan]

      for bits <- [32, 64] do
        assert values |> Tensor.from_list({:f, bits}) |> Tensor.to_list() == values
      end

      assert Tensor.from_list([3.0e38, 1.0e300], :f64) |> Tensor.to_list() == [3.0e38, 1.0e300]
      # f32 overflow becomes infinity, underflow zero
      assert Tensor.from_list([1.0e39, -1.0e39, 1.0e-50], :f32) |> Tensor.to_list() ==
               [:infinity, :neg_infinity, 0.0]

      # integers are accepted for float types
      assert Tensor.from_list([1, -2], :f32) |> Tensor.to_list() == [1.0, -2.0]
    end

    test "f32 bit patterns" do
      assert bits(Tensor.scalar(1.0, :f32), 32) == 0x3F800000
      assert bits(Tensor.scalar(:infinity, :f32), 32) == 0x7F800000
      assert bits(Tensor.scalar(:neg_infinity, :f32), 32) == 0xFF800000
      assert bits(Tensor.scalar(:nan, :f32), 32) == 0x7FC00000
      assert bits(Tensor.scalar(:nan, :f64), 64) == 0x7FF8000000000000
      # smallest subnormal
      assert bits(Tensor.scalar(1.401298464324817e-45, :f32), 32) == 1
    end

    test "f16 edge values" do
      cases = [
        {0.0, 0x0000},
        {-0.0, 0x8000},
        {1.0, 0x3C00},
        {-2.0, 0xC000},
        {0.5, 0x3800},
        {65504.0, 0x7BFF},
        {-65504.0, 0xFBFF},
        # smallest normal and subnormals
        {6.103515625e-5, 0x0400},
        {5.960464477539063e-8, 0x0001},
        {6.097555160522461e-5, 0x03FF},
        {:infinity, 0x7C00},
        {:neg_infinity, 0xFC00},
        {:nan, 0x7E00},
        {1.0009765625, 0x3C01},
        {0.333251953125, 0x3555}
      ]

      for {value, expected} <- cases do
        t = Tensor.scalar(value, {:f, 16})

        assert bits(t, 16) == expected,
               "#{inspect(value)}: got #{inspect(bits(t, 16), base: :hex)}"

        assert Tensor.to_number(t) == value
      end
    end

    test "f16 rounding and overflow" do
      # halfway between 1.0 and 1.0009765625 rounds to even (1.0); just above rounds up
      assert bits(Tensor.scalar(1.00048828125, :f16), 16) == 0x3C00
      assert bits(Tensor.scalar(1.00146484375, :f16), 16) == 0x3C02
      assert bits(Tensor.scalar(1.00048828126, :f16), 16) == 0x3C01
      # 65519 rounds down to the largest finite value, 65520 overflows
      assert bits(Tensor.scalar(65519.0, :f16), 16) == 0x7BFF
      assert bits(Tensor.scalar(65520.0, :f16), 16) == 0x7C00
      assert bits(Tensor.scalar(1.0e10, :f16), 16) == 0x7C00
      assert bits(Tensor.scalar(-1.0e10, :f16), 16) == 0xFC00
      # half the smallest subnormal rounds to zero (even), a bit more rounds up
      assert bits(Tensor.scalar(2.9802322387695312e-8, :f16), 16) == 0x0000
      assert bits(Tensor.scalar(2.99e-8, :f16), 16) == 0x0001
      assert bits(Tensor.scalar(1.0e-10, :f16), 16) == 0x0000
      # subnormal rounding up into the normals
      assert bits(Tensor.scalar(6.102e-5, :f16), 16) == 0x0400
      # integers
      assert bits(Tensor.scalar(2048, :f16), 16) == 0x6800
      assert bits(Tensor.scalar(2049, :f16), 16) == 0x6800
      assert bits(Tensor.scalar(2051, :f16), 16) == 0x6802
      assert bits(Tensor.scalar(100_000, :f16), 16) == 0x7C00
    end

    test "f16 decodes every bit pattern and re-encodes it" do
      for b <- 0..0xFFFF do
        t = {<<b::little-16>>, {{:f, 16}, []}}

        case Tensor.to_number(t) do
          :nan ->
            assert rem(div(b, 1024), 32) == 31 and rem(b, 1024) != 0

          value ->
            assert bits(Tensor.scalar(value, :f16), 16) == b
        end
      end
    end

    test "bf16 edge values and rounding" do
      cases = [
        {0.0, 0x0000},
        {1.0, 0x3F80},
        {-1.0, 0xBF80},
        {3.3895313892515355e38, 0x7F7F},
        {1.1754943508222875e-38, 0x0080},
        {9.183549615799121e-41, 0x0001},
        {:infinity, 0x7F80},
        {:neg_infinity, 0xFF80},
        {:nan, 0x7FC0}
      ]

      for {value, expected} <- cases do
        t = Tensor.scalar(value, :bf16)
        assert bits(t, 16) == expected
        assert Tensor.to_number(t) == value
      end

      # ties to even
      assert bits(Tensor.scalar(1.00390625, :bf16), 16) == 0x3F80
      assert bits(Tensor.scalar(1.01171875, :bf16), 16) == 0x3F82
      assert bits(Tensor.scalar(1.0039063, :bf16), 16) == 0x3F81
      # overflow
      assert bits(Tensor.scalar(3.4e38, :bf16), 16) == 0x7F80
      # bf16 is the top half of f32
      {<<_::16, top::binary-2>>, _} = Tensor.scalar(3.140625, :f32)
      assert elem(Tensor.scalar(3.140625, :bf16), 0) == top
    end

    test "bf16 decodes every bit pattern and re-encodes it" do
      for b <- 0..0xFFFF do
        case Tensor.to_number({<<b::little-16>>, {{:bf, 16}, []}}) do
          :nan -> :ok
          value -> assert bits(Tensor.scalar(value, :bf16), 16) == b
        end
      end
    end

    test "complex numbers" do
      for type <- [{:c, 64}, {:c, 128}] do
        t = Tensor.from_list([{1.0, -2.0}, %{re: 0.5, im: 3}, 4, {:infinity, :nan}], type)
        assert byte_size(elem(t, 0)) == 4 * Tensor.element_size(type)

        assert Tensor.to_list(t) ==
                 [{1.0, -2.0}, {0.5, 3.0}, {4.0, 0.0}, {:infinity, :nan}]
      end

      # re then im, each little-endian
      assert Tensor.scalar({1.0, 2.0}, :c64) ==
               {<<1.0::float-little-32, 2.0::float-little-32>>, {{:c, 64}, []}}
    end

    test "pred" do
      t = Tensor.from_list([true, false, 1, 0], {:pred, 8})
      assert t == {<<1, 0, 1, 0>>, {{:pred, 8}, [4]}}
      assert Tensor.to_list(t) == [1, 0, 1, 0]
      assert Tensor.to_list({<<7, 0>>, {{:pred, 8}, [2]}}) == [1, 0]
      assert_raise ArgumentError, fn -> Tensor.from_list([2], :pred) end
    end
  end

  describe "shapes" do
    test "dims are inferred from nesting" do
      t = Tensor.from_list([[[1], [2]], [[3], [4]], [[5], [6]]], :s16)
      assert Tensor.shape(t) == [3, 2, 1]
      assert Tensor.size(t) == 6
      assert Tensor.to_list(t) == [[[1], [2]], [[3], [4]], [[5], [6]]]
      assert Tensor.to_flat_list(t) == [1, 2, 3, 4, 5, 6]
    end

    test "explicit dims" do
      t = Tensor.from_list([1, 2, 3, 4, 5, 6], :u8, [3, 2])
      assert Tensor.to_list(t) == [[1, 2], [3, 4], [5, 6]]

      assert Tensor.from_list([[1, 2, 3], [4, 5, 6]], :u8, [6]) |> Tensor.to_list() ==
               [1, 2, 3, 4, 5, 6]

      assert_raise ArgumentError, ~r/5 values given/, fn ->
        Tensor.from_list([1, 2, 3, 4, 5], :u8, [3, 2])
      end
    end

    test "empty tensors" do
      assert Tensor.from_list([], :f32) == {<<>>, {{:f, 32}, [0]}}
      assert Tensor.from_list([], :f32, [2, 0]) |> Tensor.to_list() == [[], []]
      assert Tensor.from_list([], :f32, [0, 3]) |> Tensor.to_list() == []
    end

    test "ragged lists raise" do
      assert_raise ArgumentError, ~r/rectangular/, fn -> Tensor.from_list([[1, 2], [3]], :s8) end
      assert_raise ArgumentError, ~r/rectangular/, fn -> Tensor.from_list([[1], 2], :s8) end
      assert_raise ArgumentError, ~r/rectangular/, fn -> Tensor.from_list([1, [2]], :s8) end
    end

    test "scalars" do
      t = Tensor.scalar(2.5, {:f, 64})
      assert Tensor.shape(t) == []
      assert Tensor.type(t) == {:f, 64}
      assert Tensor.to_list(t) == 2.5
      assert Tensor.to_number(t) == 2.5
    end

    test "from_binary checks the size" do
      assert Tensor.from_binary(<<0::32>>, :f32, []) == {<<0::32>>, {{:f, 32}, []}}

      assert_raise ArgumentError, ~r/3 bytes given/, fn ->
        Tensor.from_binary(<<0::24>>, :f32, [])
      end

      assert_raise ArgumentError, fn -> Tensor.to_list({<<0::24>>, {{:f, 32}, [1]}}) end
    end
  end

  describe "types" do
    test "short atoms and tuples" do
      for {short, full} <- [
            s8: {:s, 8},
            s64: {:s, 64},
            u16: {:u, 16},
            f16: {:f, 16},
            f64: {:f, 64},
            bf16: {:bf, 16},
            c128: {:c, 128},
            pred: {:pred, 8},
            pred8: {:pred, 8},
            s2: {:s, 2},
            u4: {:u, 4},
            f8: {:f, 8},
            f8_e4m3fn: {:f8_e4m3fn, 8}
          ] do
        assert Tensor.normalize_type(short) == full
        assert Tensor.normalize_type(full) == full
      end

      for bad <- [:f4, :u1, :bf32, {:s, 7}, {:f8_e4m3fn, 16}, :nope, "f32", nil] do
        assert_raise ArgumentError, fn -> Tensor.normalize_type(bad) end
      end
    end

    test "every type round trips" do
      for type <- Tensor.types() do
        values =
          case type do
            {:pred, _} -> [0, 1]
            {:c, _} -> [{1.0, 2.0}, {-0.5, 0.0}]
            {kind, _} when kind in [:f, :bf, :f8_e4m3fn] -> [1.5, -3.0]
            {:s, bits} when bits < 8 -> [1, -1]
            {:u, bits} when bits < 8 -> [1, 3]
            _ -> [1, 100]
          end

        t = Tensor.from_list(values, type)
        assert bit_size(elem(t, 0)) == 2 * Tensor.element_bits(type)
        assert Tensor.bit_size(type, [2]) == 2 * Tensor.element_bits(type)
        assert Tensor.to_list(t) == values, inspect(type)
      end
    end
  end

  describe "2- and 4-bit integers" do
    # How Nx's binary backend writes them: each element `x::size(bits)-native`, concatenated.
    defp nx_binary(values, {:s, bits}),
      do: for(x <- values, into: <<>>, do: <<x::signed-integer-native-size(bits)>>)

    defp nx_binary(values, {:u, bits}),
      do: for(x <- values, into: <<>>, do: <<x::unsigned-integer-native-size(bits)>>)

    test "are packed as Nx packs them: without padding, element 0 in the high bits" do
      assert Tensor.from_list([1, 2, 3], :u4) == {<<0x12, 0x3::4>>, {{:u, 4}, [3]}}
      assert Tensor.from_list([7, -8, -1], :s4) == {<<0x78, 0xF::4>>, {{:s, 4}, [3]}}
      assert Tensor.from_list([1, 2, 3, 0], :u2) == {<<0x6C>>, {{:u, 2}, [4]}}
      assert Tensor.from_list([-2, 1, -1], :s2) == {<<0b10_01_11::6>>, {{:s, 2}, [3]}}

      for type <- [{:s, 2}, {:s, 4}, {:u, 2}, {:u, 4}], n <- [0, 1, 3, 8, 9] do
        {_, bits} = type

        {min, max} =
          if elem(type, 0) == :s,
            do: {-Bitwise.bsl(1, bits - 1), Bitwise.bsl(1, bits - 1) - 1},
            else: {0, Bitwise.bsl(1, bits) - 1}

        values = Enum.map(0..(n - 1)//1, &(min + rem(&1 * 5, max - min + 1)))
        {binary, _} = t = Tensor.from_list(values, type)
        assert binary == nx_binary(values, type)
        assert bit_size(binary) == n * bits
        assert Tensor.to_flat_list(t) == values
      end
    end

    test "limits and range" do
      assert Tensor.from_list([-8, 7], :s4) |> Tensor.to_list() == [-8, 7]
      assert Tensor.from_list([0, 15], :u4) |> Tensor.to_list() == [0, 15]
      assert Tensor.from_list([-2, 1], :s2) |> Tensor.to_list() == [-2, 1]

      assert_raise ArgumentError, ~r/out of range for \{:s, 4\}/, fn ->
        Tensor.from_list([8], :s4)
      end

      assert_raise ArgumentError, ~r/out of range for \{:u, 2\}/, fn ->
        Tensor.from_list([4], :u2)
      end

      assert_raise ArgumentError, ~r/out of range/, fn -> Tensor.from_list([-3], :s2) end
    end

    test "sizes are counted in bits" do
      assert Tensor.element_bits(:s2) == 2
      assert Tensor.bit_size({:u, 4}, [3, 3]) == 36

      assert_raise ArgumentError, ~r/take 4 bits, not whole bytes/, fn ->
        Tensor.element_size(:u4)
      end

      assert Tensor.from_binary(<<0x12, 0x3::4>>, :u4, [3]) |> Tensor.to_list() == [1, 2, 3]

      assert_raise ArgumentError, "16 bits given for {:u, 4} [3] (12 bits expected)", fn ->
        Tensor.from_binary(<<0x12, 0x30>>, :u4, [3])
      end

      assert_raise ArgumentError,
                   ~r/12 bits in a tensor of \{:s, 2\} \[3\] \(6 bits expected\)/,
                   fn ->
                     Tensor.to_list({<<0::12>>, {{:s, 2}, [3]}})
                   end
    end
  end

  describe "8-bit floats" do
    test "f8 (E5M2) edge values" do
      cases = [
        {0.0, 0x00},
        {-0.0, 0x80},
        {1.0, 0x3C},
        {-2.0, 0xC0},
        {1.5, 0x3E},
        {57344.0, 0x7B},
        {6.103515625e-5, 0x04},
        {1.52587890625e-5, 0x01},
        {:infinity, 0x7C},
        {:neg_infinity, 0xFC},
        {:nan, 0x7E}
      ]

      for {value, expected} <- cases do
        t = Tensor.scalar(value, :f8)
        assert t == {<<expected>>, {{:f, 8}, []}}, inspect(value)
        assert Tensor.to_number(t) == value
      end

      # round to nearest even; beyond the largest finite value, infinity
      assert Tensor.scalar(1.125, :f8) == Tensor.scalar(1.0, :f8)
      assert Tensor.scalar(1.375, :f8) == Tensor.scalar(1.5, :f8)
      assert Tensor.scalar(61439.0, :f8) == Tensor.scalar(57344.0, :f8)
      assert Tensor.scalar(61440.0, :f8) == Tensor.scalar(:infinity, :f8)
      assert Tensor.scalar(-1.0e6, :f8) == Tensor.scalar(:neg_infinity, :f8)
    end

    test "f8_e4m3fn edge values: no infinities, 448 the largest, 0x7F NaN" do
      cases = [
        {0.0, 0x00},
        {-0.0, 0x80},
        {1.0, 0x38},
        {-2.0, 0xC0},
        {448.0, 0x7E},
        {-448.0, 0xFE},
        {256.0, 0x78},
        {0.015625, 0x08},
        {0.001953125, 0x01},
        {:nan, 0x7F}
      ]

      for {value, expected} <- cases do
        t = Tensor.scalar(value, :f8_e4m3fn)
        assert t == {<<expected>>, {{:f8_e4m3fn, 8}, []}}, inspect(value)
        assert Tensor.to_number(t) == value
      end

      # beyond 448 and the infinities saturate, as in Nx
      for value <- [464.0, 480.0, 1.0e6, :infinity] do
        assert Tensor.scalar(value, :f8_e4m3fn) == {<<0x7E>>, {{:f8_e4m3fn, 8}, []}}
      end

      assert Tensor.scalar(:neg_infinity, :f8_e4m3fn) == {<<0xFE>>, {{:f8_e4m3fn, 8}, []}}
      # half the smallest subnormal rounds to zero (even)
      assert Tensor.scalar(0.0009765625, :f8_e4m3fn) == {<<0>>, {{:f8_e4m3fn, 8}, []}}
      assert Tensor.to_number({<<0xFF>>, {{:f8_e4m3fn, 8}, []}}) == :nan
    end

    test "every bit pattern decodes and re-encodes" do
      for type <- [{:f, 8}, {:f8_e4m3fn, 8}], b <- 0..255 do
        case Tensor.to_number({<<b>>, {type, []}}) do
          :nan ->
            :ok

          value ->
            assert Tensor.scalar(value, type) == {<<b>>, {type, []}}, "#{inspect(type)} #{b}"
        end
      end
    end
  end
end
