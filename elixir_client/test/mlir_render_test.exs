defmodule XlaNode.MLIR.RenderTest do
  @moduledoc """
  How `XlaNode.MLIR` writes a function: every op its body called, in the order they were
  called, each op once, in the region whose Elixir function was running.
  """
  use ExUnit.Case, async: true

  alias XlaNode.MLIR, as: M

  @f32 {:f, 32}

  defp main(arg_types, body), do: M.module(fn -> M.function("main", arg_types, body) end)

  test "ops are written though their results are unused, side effects inside their loop" do
    text =
      main([{{:u, 8}, [8]}, {@f32, [2]}], fn [cb, x] ->
        M.outfeed(cb, [x])
        M.sine(x)

        M.while_loop(
          [x],
          fn [v] ->
            M.compare(
              :lt,
              M.reduce(v, M.constant(0.0, {@f32, []}), [0], fn [a, b] -> M.add(a, b) end),
              M.constant(9.0, {@f32, []})
            )
          end,
          fn [v] ->
            M.io_call(cb, :log, [v])
            M.add(v, v)
          end
        )

        M.negate(x)
      end)

    assert text =~ ~s(call_target_name = "exla_beam_outfeed")
    assert text =~ ~r/"stablehlo.while".*exla_runtime_callback.*"stablehlo.return"/s
    assert text =~ ~s|%1 = "stablehlo.sine"(%arg1)|
  end

  test "a loop over constants keeps its body's side effect inside, though its results are unused" do
    text =
      main([{{:u, 8}, [8]}, {@f32, [2]}], fn [cb, x] ->
        M.while_loop(
          [M.constant(0, {{:s, 32}, []})],
          fn [i] -> M.compare(:lt, i, M.constant(3, {{:s, 32}, []})) end,
          fn [i] ->
            M.io_call(cb, :log, [x])
            [M.add(i, M.constant(1, {{:s, 32}, []}))]
          end
        )

        M.negate(x)
      end)

    assert text =~ ~r/"stablehlo.while".*exla_runtime_callback.*"stablehlo.return".*\}\) :/s
    assert [_, after_loop] = String.split(text, ~s|"stablehlo.while"|)
    assert after_loop =~ "exla_runtime_callback"
  end

  test "a function's text is rendered from values built in any order, once" do
    text =
      main([{@f32, [2]}], fn [x] ->
        one = M.constant(1.0, {@f32, [2]})
        twice = M.add(x, x)
        [M.multiply(twice, one), M.add(twice, one)]
      end)

    assert text =~ ~s|%0 = "stablehlo.constant"|
    assert text =~ ~s|%1 = "stablehlo.add"(%arg0, %arg0)|
    assert text =~ ~s|%2 = "stablehlo.multiply"(%1, %0)|
    assert text =~ ~s|%3 = "stablehlo.add"(%1, %0)|
    assert text =~ ~s|"func.return"(%2, %3)|
  end

  test "a side effect on a value with a long shared history is written once per op" do
    # Each value uses the previous one twice: as a tree, the last one's history has 2^60 ops.
    text =
      main([{{:u, 8}, [8]}, {@f32, [2]}], fn [cb, x] ->
        y = Enum.reduce(1..60, x, fn _, v -> M.add(v, v) end)
        M.io_call(cb, :log, [y])
        x
      end)

    assert length(String.split(text, "stablehlo.add")) == 61
  end

  test "a value of a function already built is refused" do
    assert_raise ArgumentError, ~r/belongs to another function/, fn ->
      M.module(fn ->
        leaked =
          M.function("helper", [{@f32, []}], fn [x] ->
            send(self(), {:leaked, x})
            x
          end)

        assert_received {:leaked, x}
        M.function("main", [], fn [] -> x end)
        leaked
      end)
    end
  end
end
