defmodule XlaNode.MLIRTest do
  use ExUnit.Case, async: true

  alias XlaNode.MLIR, as: M

  doctest XlaNode.MLIR

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

    id = :erlang.term_to_binary(:my_id)
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
end
