defmodule XlaNode.MLIRTest do
  use ExUnit.Case, async: true

  alias XlaNode.MLIR, as: M

  doctest XlaNode.MLIR
  doctest XlaNode.MLIR.CPUFaults
  doctest XlaNode.MLIR.Value
  doctest XlaNode.MLIR.Func

  @f32 {:f, 32}

  defp main(arg_types, body), do: M.module(fn -> M.function("main", arg_types, body) end)

  test "a function's text: signature, generic ops, return" do
    text = main([{@f32, [2]}, {@f32, [2]}], fn [x, y] -> [M.add(x, y), M.compare(:lt, x, y)] end)

    assert text == """
           func.func @main(%arg0: tensor<2xf32>, %arg1: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xi1>) {
             %0 = "stablehlo.add"(%arg0, %arg1) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
             %1 = "stablehlo.compare"(%arg0, %arg1) {comparison_direction = #stablehlo<comparison_direction LT>, compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xi1>
             "func.return"(%0, %1) : (tensor<2xf32>, tensor<2xi1>) -> ()
           }
           """
  end

  test "a runtime_call carries EXLA's callback id words and sizes" do
    text =
      main([{{:u, 8}, [8]}, {@f32, [4]}], fn [cb, x] ->
        M.runtime_call(cb, :my_id, [x], [{@f32, [4]}])
      end)

    # Encoded as every release since OTP 26 encodes it (SMALL_ATOM_UTF8_EXT), on OTP 25 too: the
    # same program text from every release.
    id = <<131, 119, 5, "my_id">>
    assert id == :erlang.term_to_binary(:my_id, minor_version: 2)
    <<word::signed-native-64>> = id
    assert text =~ "callback_id = array<i64: #{word}>"
    assert text =~ ~s(call_target_name = "exla_runtime_callback")
    assert text =~ "has_side_effect = true"
    assert text =~ "callback_id_size = #{byte_size(id)} : ui64"
    assert text =~ "num_aliased_data_outputs = 0 : ui64"

    assert_raise ArgumentError, ~r/the tensor<8xui8> callback handle/, fn ->
      main([{@f32, [4]}], fn [x] -> M.runtime_call(x, :id, [x], [{@f32, [4]}]) end)
    end
  end

  test "an io_call aliases each result to its operand" do
    text = main([{{:u, 8}, [8]}, {@f32, [4]}], fn [cb, x] -> M.io_call(cb, :log, [x]) end)
    assert text =~ "num_aliased_data_outputs = 1 : ui64"

    assert text =~
             "output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 1, operand_tuple_indices = []>]"
  end

  test "type errors name the op and the types" do
    assert_raise ArgumentError,
                 ~r/stablehlo.broadcast_in_dim: got tensor<3xf32>; expected broadcast_dimensions \[0\]/,
                 fn ->
                   main([{@f32, [3]}], fn [x] -> M.broadcast_in_dim(x, [2, 3], [0]) end)
                 end

    assert_raise ArgumentError,
                 ~r/stablehlo.reshape: got tensor<3xf32>; expected 4 elements/,
                 fn ->
                   main([{@f32, [3]}], fn [x] -> M.reshape(x, [2, 2]) end)
                 end

    assert_raise ArgumentError,
                 ~r/stablehlo.while: the body returned tensor<f32>; expected tensor<i32>/,
                 fn ->
                   main([{{:s, 32}, []}], fn [n] ->
                     M.while_loop([n], fn [i] -> M.compare(:lt, i, n) end, fn [_] ->
                       M.constant(1.0, {@f32, []})
                     end)
                   end)
                 end

    assert_raise ArgumentError, ~r/constant: 2 values for tensor<3xf32>/, fn ->
      main([], fn [] -> M.constant([1.0, 2.0], {@f32, [3]}) end)
    end

    assert_raise ArgumentError, ~r/the module has no "main" function/, fn ->
      M.module(fn -> M.function("helper", [], fn [] -> M.constant(1.0, {@f32, []}) end) end)
    end
  end

  test "an empty dimension list is an empty array attribute" do
    text = main([{@f32, []}], fn [x] -> M.broadcast_in_dim(x, [2], []) end)
    assert text =~ "broadcast_dimensions = array<i64>}"
  end

  describe "attributes of the module and of the arguments (an SPMD program's)" do
    test "the module's attributes wrap its functions; without them the text is unchanged" do
      body = fn -> M.function("main", [{@f32, [4]}], fn [x] -> M.add(x, x) end) end
      plain = M.module(body)
      refute plain =~ "module"

      text = M.module(body, attributes: [{"mhlo.num_partitions", "4 : i32"}])
      assert text == "module attributes {mhlo.num_partitions = 4 : i32} {\n" <> plain <> "}\n"
      assert M.module(body, attributes: []) == plain
    end

    test "each argument takes its attributes, or none" do
      sharded = [{"mhlo.sharding", ~s("{devices=[2,2]0,1,2,3}")}]

      text =
        M.module(fn ->
          M.function("main", [{@f32, [4, 4]}, {@f32, [4]}, {@f32, []}], fn [x, _, _] -> x end,
            arg_attributes: [sharded, nil, []]
          )
        end)

      assert text =~
               ~s|@main(%arg0: tensor<4x4xf32> {mhlo.sharding = "{devices=[2,2]0,1,2,3}"}, | <>
                 ~s|%arg1: tensor<4xf32>, %arg2: tensor<f32>)|
    end

    test "a wrong count or entry is an ArgumentError naming it" do
      assert_raise ArgumentError, ~r/:arg_attributes has 1 entries for 2 arguments/, fn ->
        M.module(fn ->
          M.function("main", [{@f32, []}, {@f32, []}], fn [x, _] -> x end, arg_attributes: [nil])
        end)
      end

      assert_raise ArgumentError, ~r/each of :arg_attributes must be nil or a list/, fn ->
        M.module(fn ->
          M.function("main", [{@f32, []}], fn [x] -> x end, arg_attributes: ["sharding"])
        end)
      end

      assert_raise ArgumentError, ~r/option :attributes must be/, fn ->
        M.module(fn -> M.function("main", [], fn [] -> M.constant(1.0, {@f32, []}) end) end,
          attributes: :spmd
        )
      end
    end
  end

  test "values cannot cross functions" do
    assert_raise ArgumentError, ~r/belongs to another function/, fn ->
      M.module(fn ->
        M.function("helper", [{@f32, []}], fn [x] ->
          Process.put(:leaked, x)
          x
        end)

        M.function("main", [{@f32, []}], fn [y] -> M.add(Process.get(:leaked), y) end)
      end)
    end
  end

  test "a function cannot be defined inside another" do
    assert_raise ArgumentError, ~r/function\/4 cannot be called inside another function/, fn ->
      M.module(fn ->
        M.function("main", [{@f32, []}], fn [x] ->
          M.function("inner", [{@f32, []}], fn [y] -> M.add(x, y) end)
          x
        end)
      end)
    end
  end

  test "functions belong to one module, defined once" do
    assert_raise ArgumentError,
                 ~r/function\/4 must be called inside XlaNode.MLIR.module\/1/,
                 fn ->
                   M.function("main", [], fn [] -> M.constant(1.0, {@f32, []}) end)
                 end

    assert_raise ArgumentError, ~r/XlaNode.MLIR.module\/1 calls cannot nest/, fn ->
      M.module(fn -> main([], fn [] -> M.constant(1.0, {@f32, []}) end) end)
    end

    assert_raise ArgumentError, ~r/function "main" is defined twice/, fn ->
      M.module(fn ->
        M.function("main", [], fn [] -> M.constant(1.0, {@f32, []}) end)
        M.function("main", [], fn [] -> M.constant(2.0, {@f32, []}) end)
      end)
    end

    # A failed build leaves nothing behind: the next one starts afresh.
    assert main([], fn [] -> M.constant(1.0, {@f32, []}) end) =~ "%0 = \"stablehlo.constant\""
  end

  test "a value used after its function was built is refused" do
    M.module(fn ->
      M.function("main", [{@f32, []}], fn [x] ->
        send(self(), {:leaked, x})
        x
      end)
    end)

    assert_received {:leaked, x}

    assert_raise ArgumentError, ~r/not inside XlaNode.MLIR.function\/3/, fn -> M.negate(x) end
  end

  test "a value used by another process is refused there" do
    main([{@f32, []}], fn [x] ->
      task = Task.async(fn -> catch_error(M.negate(x)) end)
      assert %ArgumentError{message: "not inside XlaNode.MLIR.function/3"} = Task.await(task)
      M.negate(x)
    end)
  end

  test "a region whose function raised leaves no op behind, and its ops' names free" do
    text =
      main([{@f32, [2]}], fn [x] ->
        zero = M.constant(0.0, {@f32, []})

        assert_raise ArgumentError, ~r/stablehlo.add: got tensor<f32>, tensor<i32>/, fn ->
          M.reduce(x, zero, [0], fn [a, b] ->
            M.multiply(a, b)
            M.add(a, M.constant(1, {{:s, 32}, []}))
          end)
        end

        M.reduce(x, zero, [0], fn [a, b] -> M.add(a, b) end)
      end)

    assert text =~ ~s|%5 = "stablehlo.add"(%3, %4)|
    assert text =~ ~s|%6 = "stablehlo.reduce"(%arg0, %0)|
    refute text =~ "stablehlo.multiply"
  end

  describe "the 2- and 4-bit integers and the 8-bit floats" do
    test "element types and constants" do
      text =
        main([{{:u, 4}, [3]}, {{:f, 8}, [2]}], fn [x, y] ->
          [
            M.add(x, M.constant([1, 2, 15], {{:u, 4}, [3]})),
            M.multiply(y, M.constant(1.5, {{:f, 8}, [2]})),
            M.convert(x, {:f8_e4m3fn, 8}),
            M.constant_binary(<<0x1E, 0x3::4>>, {{:s, 4}, [3]})
          ]
        end)

      assert text =~ "func.func @main(%arg0: tensor<3xui4>, %arg1: tensor<2xf8E5M2>)"
      assert text =~ "value = dense<[1, 2, 15]> : tensor<3xui4>"
      assert text =~ ~s(value = dense<"0x3E"> : tensor<2xf8E5M2>)
      assert text =~ "(tensor<3xui4>) -> tensor<3xf8E4M3FN>"
      assert text =~ "value = dense<[1, -2, 3]> : tensor<3xi4>"

      assert_raise ArgumentError, ~r/out of range for \{:s, 2\}/, fn ->
        main([], fn [] -> M.constant(2, {{:s, 2}, []}) end)
      end

      assert_raise ArgumentError, ~r/constant: 16 bits for tensor<3xi4> \(12 bits\)/, fn ->
        main([], fn [] -> M.constant_binary(<<0, 0>>, {{:s, 4}, [3]}) end)
      end
    end

    test "float ops take the 8-bit floats, integer ops the 2- and 4-bit integers" do
      text =
        main([{{:f8_e4m3fn, 8}, [4]}, {{:s, 2}, [4]}], fn [x, n] ->
          [M.tanh(x), M.is_finite(x), M.shift_left(n, n), M.negate(n)]
        end)

      assert text =~ "stablehlo.tanh"
      assert text =~ "(tensor<4xi2>, tensor<4xi2>) -> tensor<4xi2>"

      assert_raise ArgumentError, ~r/stablehlo.tanh: got tensor<4xi2>; expected float/, fn ->
        main([{{:s, 2}, [4]}], fn [n] -> M.tanh(n) end)
      end

      assert_raise ArgumentError, ~r/stablehlo.abs: got tensor<4xui4>/, fn ->
        main([{{:u, 4}, [4]}], fn [n] -> M.abs(n) end)
      end
    end

    test "what XLA's CPU backend cannot do on 2-bit integers raises" do
      two = {{:u, 2}, [4]}

      assert_raise ArgumentError,
                   ~r/stablehlo.concatenate of 2-bit integers \(tensor<4xui2>, tensor<4xui2>\): XLA's CPU compiler aborts on it; convert them to s8\/u8 first/,
                   fn -> main([two, two], fn [a, b] -> M.concatenate([a, b], 0) end) end

      assert_raise ArgumentError, ~r/stablehlo.sort of 2-bit integers/, fn ->
        main([two], fn [a] -> M.sort(a, 0, fn [x, y] -> M.compare(:lt, x, y) end) end)
      end

      assert_raise ArgumentError, ~r/stablehlo.dot_general of 2-bit integers/, fn ->
        main([two, two], fn [a, b] -> M.dot_general(a, b, contracting: {[0], [0]}) end)
      end

      assert_raise ArgumentError, ~r/chlo.top_k: XLA's CPU backend cannot compile it/, fn ->
        main([{{:s, 4}, [4]}], fn [a] -> M.top_k(a, 2) end)
      end

      # 4-bit integers concatenate, sort and dot.
      four = {{:s, 4}, [4]}

      assert main([four, four], fn [a, b] ->
               [
                 M.concatenate([a, b], 0),
                 M.sort(a, 0, fn [x, y] -> M.compare(:lt, x, y) end),
                 M.dot_general(a, b, contracting: {[0], [0]})
               ]
             end) =~ "stablehlo.sort"
    end
  end
end
