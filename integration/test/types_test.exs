defmodule XlaNode.TypesTest do
  @moduledoc """
  The types Nx has beyond the classic ones (`{:s, 2}`, `{:s, 4}`, `{:u, 2}`, `{:u, 4}`,
  `{:f, 8}` (E5M2), `{:f8_e4m3fn, 8}`) through the `:xla` server, with raw `GenServer.call`s:
  tensors are `{binary, {type, dims}}` whose binaries are made here the way Nx's binary backend
  makes them (each element `x::size(bits)-native`, concatenated: a bitstring for 2- and 4-bit
  types), and must come back the same, bit for bit, from `:to_device`/`:read`, `:run` and the
  callbacks of a run. Then the same through the client library and `XlaNode.MLIR`.
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, Tensor}
  alias XlaNode.MLIR, as: M

  @root Path.expand("../..", __DIR__)

  setup_all do
    Harness.start_shared_node()
  end

  @types [{:s, 2}, {:s, 4}, {:u, 2}, {:u, 4}, {:f, 8}, {:f8_e4m3fn, 8}]

  defp call(node, request, timeout \\ 30_000),
    do: GenServer.call({:xla, node.name}, request, timeout)

  defp mlir({:s, bits}), do: "i#{bits}"
  defp mlir({:u, bits}), do: "ui#{bits}"
  defp mlir({:f, 8}), do: "f8E5M2"
  defp mlir({:f8_e4m3fn, 8}), do: "f8E4M3FN"

  defp tensor_type(type, dims), do: "tensor<#{Enum.map_join(dims, &"#{&1}x")}#{mlir(type)}>"

  # Nx's binary backend: `number_to_binary` writes `x::signed|unsigned-integer-native-size(bits)`
  # for integers; the 8-bit floats are one byte each (their bit patterns are given here).
  defp nx_binary(values, {:s, bits}),
    do: for(x <- values, into: <<>>, do: <<x::signed-integer-native-size(bits)>>)

  defp nx_binary(values, {:u, bits}),
    do: for(x <- values, into: <<>>, do: <<x::unsigned-integer-native-size(bits)>>)

  defp nx_binary(patterns, {_, 8}), do: :binary.list_to_bin(patterns)

  defp nx_values(binary, {:s, 4}), do: for(<<x::signed-integer-native-4 <- binary>>, do: x)

  # Every value of a type: the integers of a 2- or 4-bit type, the 256 bit patterns of an 8-bit
  # float; with the f32 each converts to (computed here from the fields, NaN as :nan).
  defp every_value({kind, bits} = type) when kind in [:s, :u] do
    values =
      if kind == :s,
        do: Enum.to_list(-Bitwise.bsl(1, bits - 1)..(Bitwise.bsl(1, bits - 1) - 1)),
        else: Enum.to_list(0..(Bitwise.bsl(1, bits) - 1))

    {nx_binary(values, type), Enum.map(values, &(&1 * 1.0))}
  end

  defp every_value(type) do
    patterns = Enum.to_list(0..255)
    {nx_binary(patterns, type), Enum.map(patterns, &f8_value(&1, type))}
  end

  defp f8_value(b, type) do
    {e_bits, bias} = if type == {:f, 8}, do: {5, 15}, else: {4, 7}
    m_bits = 7 - e_bits
    sign = if b >= 0x80, do: -1.0, else: 1.0
    e = Bitwise.band(b, 0x7F) |> Bitwise.bsr(m_bits)
    m = Bitwise.band(b, Bitwise.bsl(1, m_bits) - 1)
    max_e = Bitwise.bsl(1, e_bits) - 1

    cond do
      type == {:f, 8} and e == max_e and m == 0 -> if sign > 0, do: :infinity, else: :neg_infinity
      type == {:f, 8} and e == max_e -> :nan
      type == {:f8_e4m3fn, 8} and e == max_e and m == 7 -> :nan
      e == 0 -> sign * m / Bitwise.bsl(1, m_bits) * :math.pow(2, 1 - bias)
      true -> sign * (1 + m / Bitwise.bsl(1, m_bits)) * :math.pow(2, e - bias)
    end
  end

  defp f32s(bin) do
    for <<x::binary-4 <- bin>> do
      case x do
        <<v::float-32-little>> -> v
        <<0x7F800000::32-little>> -> :infinity
        <<0xFF800000::32-little>> -> :neg_infinity
        _ -> :nan
      end
    end
  end

  # Floats compare by their bits, so that -0.0 is not 0.0.
  defp same_value?(a, b) when is_float(a) and is_float(b), do: <<a::float-64>> == <<b::float-64>>

  defp same_value?(a, b), do: a == b

  # The first `count` bits of a bitstring (a size read from a variable would need a pin from
  # Elixir 1.20 on, which Elixir 1.14 refuses).
  defp first_bits(data, count) do
    bits = for <<b::1 <- data>>, do: b
    for b <- Enum.take(bits, count), into: <<>>, do: <<b::1>>
  end

  defp compile!(node, text) do
    assert {:ok, exe} = call(node, {:compile, text})
    exe
  end

  test "to_device and read give back every type's tensors bit for bit", %{node: node} do
    for type <- @types, dims <- [[], [1], [3], [5], [2, 3], [7, 9], [0, 4]] do
      {all, _} = every_value(type)
      n = Enum.product(dims)
      {_, bits} = type
      # The first n elements of a repeated run of every value.
      data = all |> List.duplicate(n + 1) |> Enum.reduce(<<>>, &<<&2::bitstring, &1::bitstring>>)
      data = first_bits(data, n * bits)
      tensor = {data, {type, dims}}

      assert {:ok, buf} = call(node, {:to_device, tensor}), inspect(tensor)
      assert call(node, {:read, buf}) == {:ok, tensor}, "#{inspect(type)} #{inspect(dims)}"
      assert :ok = call(node, {:free, buf})
    end
  end

  test "a run converts every value to f32 and back", %{node: node} do
    for type <- @types do
      {data, expected} = every_value(type)
      n = length(expected)
      t = tensor_type(type, [n])
      f = "tensor<#{n}xf32>"

      exe =
        compile!(node, """
        func.func @main(%a: #{t}) -> (#{f}, #{t}) {
          %0 = stablehlo.convert %a : (#{t}) -> #{f}
          %1 = stablehlo.convert %0 : (#{f}) -> #{t}
          return %0, %1 : #{f}, #{t}
        }
        """)

      assert {:ok, [{floats, {{:f, 32}, [^n]}}, {back, {^type, [^n]}}]} =
               call(node, {:run, exe, [{data, {type, [n]}}]})

      for {got, want} <- Enum.zip(f32s(floats), expected) do
        assert same_value?(got, want), "#{inspect(type)}: #{inspect(got)} for #{inspect(want)}"
      end

      if elem(type, 1) < 8 do
        assert back == data
      else
        # Back from f32 every bit pattern comes back, but a NaN may come back as another NaN.
        for {b, a} <- Enum.zip(:binary.bin_to_list(back), :binary.bin_to_list(data)) do
          assert b == a or (f8_value(a, type) == :nan and f8_value(b, type) == :nan)
        end
      end
    end
  end

  # main(a, b) = op(a, b), both of type `t`.
  defp binary_program(op, t) do
    """
    func.func @main(%a: #{t}, %b: #{t}) -> #{t} {
      %0 = stablehlo.#{op} %a, %b : #{t}
      return %0 : #{t}
    }
    """
  end

  test "arithmetic, and buffers kept on the device", %{node: node} do
    s4 = {:s, 4}
    exe = compile!(node, binary_program("add", tensor_type(s4, [3])))

    a = {nx_binary([7, -8, 3], s4), {s4, [3]}}
    b = {nx_binary([1, -1, -5], s4), {s4, [3]}}
    # 4-bit integers wrap: 7 + 1 = -8, -8 - 1 = 7.
    assert {:ok, [{sum, {^s4, [3]}}]} = call(node, {:run, exe, [a, b]})
    assert bit_size(sum) == 12
    assert nx_values(sum, s4) == [-8, 7, -2]

    assert {:ok, [buf]} = call(node, {:run, exe, [a, b], [keep_on_device: true]})
    assert {:ok, [{twice, _}]} = call(node, {:run, exe, [buf, buf]})
    assert nx_values(twice, s4) == [0, -2, -4]

    f8 = {:f8_e4m3fn, 8}
    exe = compile!(node, binary_program("multiply", tensor_type(f8, [2])))

    # [1.5, -2.0] * [2.0, 0.25] = [3.0, -0.5]
    assert {:ok, [{<<0x44, 0xB0>>, {^f8, [2]}}]} =
             call(node, {:run, exe, [{<<0x3C, 0xC0>>, {f8, [2]}}, {<<0x40, 0x28>>, {f8, [2]}}]})
  end

  test "sizes are checked in bits, and 2-bit concatenates are refused, the node serving on", %{
    node: node
  } do
    assert {:error, {:argument_error, m}} =
             call(node, {:to_device, {<<0x12, 0x30>>, {{:u, 4}, [3]}}})

    assert m =~ "16 bits given for u4[3] (12 bits expected)"

    assert {:error, {:argument_error, m}} =
             call(node, {:to_device, {<<1, 2, 3>>, {{:f, 8}, [2]}}})

    assert m =~ "3 bytes given for f8e5m2[2] (2 bytes expected)"

    t = tensor_type({:u, 4}, [3])
    exe = compile!(node, "func.func @main(%a: #{t}) -> #{t} {\n  return %a : #{t}\n}\n")
    assert {:error, {:argument_error, m}} = call(node, {:run, exe, [{<<0::8>>, {{:u, 4}, [3]}}]})
    assert m =~ "argument 0: 8 bits given for u4[3] (12 bits expected)"

    concat = """
    func.func @main(%a: tensor<3xi2>, %b: tensor<2xi2>) -> tensor<5xi2> {
      %0 = stablehlo.concatenate %a, %b, dim = 0 : (tensor<3xi2>, tensor<2xi2>) -> tensor<5xi2>
      return %0 : tensor<5xi2>
    }
    """

    assert {:error, {:compile_error, m}} = call(node, {:compile, concat})
    assert m =~ "concatenate of 2-bit integers (s2/u2), which this node refuses"
    assert call(node, :ping) == :pong
    assert {:ok, _} = call(node, {:compile, String.replace(concat, "i2>", "i4>")})
  end

  # XLA's CPU compiler throws a C++ exception building the copy it makes of this transpose (a
  # result among several); the node catches it at the plugin boundary.
  @tag :cpu_only
  test "a transpose of 4-bit integers XLA's compiler throws on is a compile error, as MLIR text " <>
         "and as JAX's bytecode, the node serving on",
       %{node: node} do
    for type <- [{:s, 4}, {:u, 2}] do
      [t, tt] = [tensor_type(type, [2, 3]), tensor_type(type, [3, 2])]

      transpose = """
      func.func @main(%a: #{t}) -> (#{tt}, #{t}) {
        %0 = stablehlo.transpose %a, dims = [1, 0] : (#{t}) -> #{tt}
        return %0, %a : #{tt}, #{t}
      }
      """

      assert {:error, {:compile_error, m}} = call(node, {:compile, transpose})
      assert m =~ "XLA's compiler failed: it threw a C++ exception ("
      assert m =~ "so the node refuses this program"
    end

    # The same program as JAX lowers and serializes it (`jit(lambda x: (x.T, x))` on s4[2, 3]).
    Harness.ensure_kernels!()
    out = Path.join(System.tmp_dir!(), "xn_types_#{System.unique_integer([:positive])}.mlirbc")
    on_exit(fn -> File.rm(out) end)

    {log, status} =
      System.cmd(
        "python3",
        [Path.join(@root, "integration/jax/bytecode.py"), out, "int4_transpose"],
        env: [{"PYTHONPATH", Harness.jax_path()}],
        stderr_to_stdout: true
      )

    assert status == 0, "integration/jax/bytecode.py failed:\n#{log}"
    assert <<"ML", 0xEF, "R", _::binary>> = bytecode = File.read!(out)
    assert {:error, {:compile_error, m}} = call(node, {:compile, bytecode})
    assert m =~ "XLA's compiler failed: it threw a C++ exception ("

    # The node still answers, compiles and runs: the same transpose of 8-bit integers.
    assert call(node, :ping) == :pong
    assert {:ok, %{compile_errors: errors}} = call(node, :info)
    assert errors >= 3
    [t, tt] = [tensor_type({:s, 8}, [2, 3]), tensor_type({:s, 8}, [3, 2])]

    exe =
      compile!(node, """
      func.func @main(%a: #{t}) -> (#{tt}, #{t}) {
        %0 = stablehlo.transpose %a, dims = [1, 0] : (#{t}) -> #{tt}
        return %0, %a : #{tt}, #{t}
      }
      """)

    x = {<<1, 2, 3, 4, 5, 6>>, {{:s, 8}, [2, 3]}}

    assert {:ok, [{<<1, 4, 2, 5, 3, 6>>, {{:s, 8}, [3, 2]}}, ^x]} = call(node, {:run, exe, [x]})
  end

  # A module in EXLA's form: parameter 0 the callback handle, one runtime callback taking the
  # other parameters and returning `result_types`.
  defp callback_module(arg_types, result_types) do
    id = :erlang.term_to_binary(:types)
    padded = id <> :binary.copy(<<0>>, rem(8 - rem(byte_size(id), 8), 8))
    words = for <<w::signed-native-64 <- padded>>, do: w
    args = arg_types |> Enum.with_index() |> Enum.map(fn {t, i} -> {"%a#{i}", t} end)
    results = Enum.join(result_types, ", ")

    """
    func.func @main(%cb: tensor<8xui8>, #{Enum.map_join(args, ", ", fn {n, t} -> "#{n}: #{t}" end)}) -> (#{results}) {
      %r:#{length(result_types)} = stablehlo.custom_call @exla_runtime_callback(%cb, #{Enum.map_join(args, ", ", &elem(&1, 0))}) {api_version = 4 : i32, has_side_effect = true, backend_config = {callback_id = array<i64: #{Enum.join(words, ", ")}>, callback_id_size = #{byte_size(id)} : ui64, num_aliased_data_outputs = 0 : ui64}} : (tensor<8xui8>, #{Enum.map_join(args, ", ", &elem(&1, 1))}) -> (#{results})
      return #{Enum.map_join(0..(length(result_types) - 1), ", ", &"%r##{&1}")} : #{results}
    }
    """
  end

  # A callback server that hands each call's arguments to the test and answers `reply`.
  defp callback_server(reply) do
    test = self()

    spawn_link(fn ->
      receive do
        {:exla_runtime_call, :types, args, {pid, ref}} ->
          send(test, {:callback_args, args})
          send(pid, {ref, reply})
      end
    end)
  end

  test "callbacks take and return them as Nx's binaries", %{node: node} do
    u4 = {nx_binary([1, 2, 3, 4, 5], {:u, 4}), {{:u, 4}, [5]}}
    s2 = {nx_binary([1, -2, -1], {:s, 2}), {{:s, 2}, [3]}}
    f8 = {<<0x3C, 0xC2>>, {{:f, 8}, [2]}}
    e4 = {<<0x38>>, {{:f8_e4m3fn, 8}, []}}

    exe =
      compile!(
        node,
        callback_module(
          ["tensor<5xui4>", "tensor<3xi2>", "tensor<2xf8E5M2>", "tensor<f8E4M3FN>"],
          ["tensor<3xi4>", "tensor<5xui2>", "tensor<f8E4M3FN>"]
        )
      )

    results = [nx_binary([-1, 2, -8], {:s, 4}), nx_binary([3, 0, 1, 2, 3], {:u, 2}), <<0xB8>>]
    server = callback_server({:ok, results})

    assert {:ok, [r0, r1, r2]} =
             call(node, {:run, exe, [u4, s2, f8, e4], [callback_server: server]})

    assert_receive {:callback_args, [^u4, ^s2, ^f8, ^e4]}
    # u4 [1, 2, 3, 4, 5] is a bitstring of 20 bits, s2 [1, -2, -1] of 6.
    assert bit_size(elem(u4, 0)) == 20 and bit_size(elem(s2, 0)) == 6
    assert r0 == {Enum.at(results, 0), {{:s, 4}, [3]}}
    assert r1 == {Enum.at(results, 1), {{:u, 2}, [5]}}
    assert r2 == {<<0xB8>>, {{:f8_e4m3fn, 8}, []}}

    # A reply of the wrong size names it in bits.
    exe = compile!(node, callback_module(["tensor<3xi4>"], ["tensor<3xi4>"]))
    server = callback_server({:ok, [<<0::16>>]})
    s4 = {nx_binary([1, 2, 3], {:s, 4}), {{:s, 4}, [3]}}

    assert {:error, {:runtime_error, m}} =
             call(node, {:run, exe, [s4], [callback_server: server]})

    assert m =~ "expected 1 binary [s4[3] (12 bits)], got 1 [16 bits]"
  end

  test "through the client and XlaNode.MLIR", %{node: node} do
    text =
      M.module(fn ->
        M.function("main", [{{:u, 4}, [4]}, {{:f, 8}, [3]}], fn [x, y] ->
          sixteen = M.constant(3, {{:u, 4}, [4]})

          [
            M.multiply(x, sixteen),
            M.convert(x, {:f, 32}),
            M.add(y, M.constant([0.5, 1.0, :infinity], {{:f, 8}, [3]})),
            M.convert(M.iota({{:s, 2}, [4]}, 0), {:f8_e4m3fn, 8})
          ]
        end)
      end)

    exe = XlaNode.compile!(node.name, text)
    x = Tensor.from_list([1, 5, 6, 15], :u4)
    y = Tensor.from_list([1.0, -3.0, 2.5], :f8)
    [a, b, c, d] = XlaNode.run!(node.name, exe, [x, y])
    assert Tensor.to_list(a) == [3, 15, 2, 13]
    assert Tensor.to_list(b) == [1.0, 5.0, 6.0, 15.0]
    assert Tensor.to_list(c) == [1.5, -2.0, :infinity]
    # iota of 2-bit integers wraps: [0, 1, -2, -1]
    assert Tensor.to_list(d) == [0.0, 1.0, -2.0, -1.0]

    buf = XlaNode.to_device!(node.name, x)
    assert XlaNode.read!(node.name, buf) == x
  end
end
