defmodule XlaNode.MLIR.Ops.Control do
  @moduledoc false
  # Ops with regions that combine or choose (reduce, sort, while, if, case), and
  # optimization_barrier.
  # XlaNode.MLIR documents them and delegates here; see XlaNode.MLIR.Ops.Common for what the
  # families share.

  import XlaNode.MLIR.Ops.Common

  alias XlaNode.MLIR.CPUFaults

  ## Regions

  def reduce(operands, inits, axes, fun) do
    operands = Enum.map(List.wrap(operands), &value!("stablehlo.reduce", &1))
    inits = Enum.map(List.wrap(inits), &value!("stablehlo.reduce", &1))
    [{_, dims} | _] = Enum.map(operands, & &1.type)
    scalars = Enum.map(operands, fn %{type: {e, _}} -> {e, []} end)

    unless length(inits) == length(operands) and
             Enum.all?(operands, fn %{type: {_, d}} -> d == dims end) and
             Enum.map(inits, & &1.type) == scalars do
      mismatch!(
        "stablehlo.reduce",
        operands ++ inits,
        "operands of one shape and one scalar init of each operand's element type"
      )
    end

    check_axes!("stablehlo.reduce", hd(operands), axes, length(dims))
    body = region!("stablehlo.reduce", "the region", scalars ++ scalars, scalars, fun)

    out_dims = for {d, i} <- Enum.with_index(dims), i not in axes, do: d
    types = Enum.map(scalars, fn {e, []} -> {e, out_dims} end)

    results =
      emit("stablehlo.reduce", operands ++ inits, types, ["dimensions = #{i64_array(axes)}"], [
        body
      ])

    one_or_list(results)
  end

  def sort(operands, dimension, comparator, opts \\ []) do
    opts = options!(opts, "sort/4", stable: :boolean)
    operands = Enum.map(List.wrap(operands), &value!("stablehlo.sort", &1))

    CPUFaults.check!(:sort, "stablehlo.sort", operands)

    [{_, dims} | _] = Enum.map(operands, & &1.type)

    unless Enum.all?(operands, fn %{type: {_, d}} -> d == dims end) and dimension >= 0 and
             dimension < length(dims) do
      mismatch!(
        "stablehlo.sort",
        operands,
        "operands of one shape and a dimension below #{length(dims)}"
      )
    end

    scalars = Enum.flat_map(operands, fn %{type: {e, _}} -> [{e, []}, {e, []}] end)
    body = region!("stablehlo.sort", "the comparator", scalars, [{{:pred, 8}, []}], comparator)

    results =
      emit(
        "stablehlo.sort",
        operands,
        Enum.map(operands, & &1.type),
        ["dimension = #{dimension} : i64", "is_stable = #{Keyword.get(opts, :stable, false)}"],
        [body]
      )

    one_or_list(results)
  end

  def while_loop(initial, cond, body) do
    initial = Enum.map(List.wrap(initial), &value!("stablehlo.while", &1))
    types = Enum.map(initial, & &1.type)
    cond_region = region!("stablehlo.while", "the condition", types, [{{:pred, 8}, []}], cond)
    body_region = region!("stablehlo.while", "the body", types, types, body)

    emit("stablehlo.while", initial, types, [], [cond_region, body_region])
  end

  def if_then_else(pred, on_true, on_false) do
    pred = value!("stablehlo.if", pred)
    if pred.type != {{:pred, 8}, []}, do: mismatch!("stablehlo.if", [pred], "a pred scalar")
    branches([on_true, on_false], "stablehlo.if", pred)
  end

  def case_of(index, [_ | _] = branches) do
    index = value!("stablehlo.case", index)
    if index.type != {{:s, 32}, []}, do: mismatch!("stablehlo.case", [index], "an s32 scalar")
    branches(branches, "stablehlo.case", index)
  end

  defp branches(funs, op, selector) do
    regions = Enum.map(funs, fn f -> region(op, [], fn [] -> f.() end) end)
    [{_, types} | _] = regions

    if Enum.any?(regions, fn {_, t} -> t != types end) do
      raise ArgumentError,
            "#{op}: the branches return #{Enum.map_join(regions, " and ", fn {_, t} -> "(#{types_text(t)})" end)}; expected one list of types"
    end

    emit(
      op,
      [selector],
      types,
      [],
      Enum.map(regions, &String.replace(elem(&1, 0), "^bb0():\n", ""))
    )
  end

  def optimization_barrier(values) do
    values = Enum.map(List.wrap(values), &value!("stablehlo.optimization_barrier", &1))
    emit("stablehlo.optimization_barrier", values, Enum.map(values, & &1.type), [])
  end
end
