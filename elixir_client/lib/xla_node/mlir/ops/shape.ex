defmodule XlaNode.MLIR.Ops.Shape do
  @moduledoc false
  # Ops that move elements: broadcast, reshape, transpose, reverse, slices, concatenate, pad.
  # XlaNode.MLIR documents them and delegates here; see XlaNode.MLIR.Ops.Common for what the
  # families share.

  import XlaNode.MLIR.Ops.Common

  alias XlaNode.MLIR.CPUFaults

  ## Shapes

  def broadcast_in_dim(x, dims, axes) do
    x = value!("stablehlo.broadcast_in_dim", x)
    {elem, xdims} = x.type

    ok =
      length(axes) == length(xdims) and axes == Enum.sort(Enum.uniq(axes)) and
        Enum.all?(Enum.zip(xdims, axes), fn {d, a} ->
          a < length(dims) and d in [1, Enum.at(dims, a)]
        end)

    unless ok do
      mismatch!(
        "stablehlo.broadcast_in_dim",
        [x],
        "broadcast_dimensions #{inspect(axes)} that map the operand's dimensions onto #{inspect(dims)}"
      )
    end

    emit1("stablehlo.broadcast_in_dim", [x], {elem, dims}, [
      "broadcast_dimensions = #{i64_array(axes)}"
    ])
  end

  def reshape(x, dims) do
    x = value!("stablehlo.reshape", x)
    {elem, xdims} = x.type

    if Enum.product(xdims) != Enum.product(dims) do
      mismatch!(
        "stablehlo.reshape",
        [x],
        "#{Enum.product(dims)} elements for dims #{inspect(dims)}"
      )
    end

    emit1("stablehlo.reshape", [x], {elem, dims})
  end

  def transpose(x, permutation) do
    x = value!("stablehlo.transpose", x)
    {elem, dims} = x.type

    if Enum.sort(permutation) != Enum.to_list(0..(length(dims) - 1)//1) do
      mismatch!(
        "stablehlo.transpose",
        [x],
        "a permutation of #{length(dims)} dimensions, got #{inspect(permutation)}"
      )
    end

    emit1("stablehlo.transpose", [x], {elem, Enum.map(permutation, &Enum.at(dims, &1))}, [
      "permutation = #{i64_array(permutation)}"
    ])
  end

  def reverse(x, axes) do
    x = value!("stablehlo.reverse", x)
    {_, dims} = x.type
    check_axes!("stablehlo.reverse", x, axes, length(dims))
    emit1("stablehlo.reverse", [x], x.type, ["dimensions = #{i64_array(axes)}"])
  end

  def slice(x, start, limit, strides \\ nil) do
    x = value!("stablehlo.slice", x)
    {elem, dims} = x.type
    strides = strides || Enum.map(dims, fn _ -> 1 end)

    ok =
      Enum.all?([start, limit, strides], &(length(&1) == length(dims))) and
        Enum.all?(Enum.zip([start, limit, strides, dims]), fn {s, l, st, d} ->
          0 <= s and s <= l and l <= d and st > 0
        end)

    unless ok,
      do:
        mismatch!(
          "stablehlo.slice",
          [x],
          "start <= limit <= dims and positive strides, got #{inspect({start, limit, strides})}"
        )

    out = Enum.zip_with([start, limit, strides], fn [s, l, st] -> div(l - s + st - 1, st) end)

    emit1("stablehlo.slice", [x], {elem, out}, [
      "start_indices = #{i64_array(start)}",
      "limit_indices = #{i64_array(limit)}",
      "strides = #{i64_array(strides)}"
    ])
  end

  def dynamic_slice(x, starts, sizes) do
    x = value!("stablehlo.dynamic_slice", x)
    starts = Enum.map(starts, &value!("stablehlo.dynamic_slice", &1))
    {elem, dims} = x.type
    check_indices!("stablehlo.dynamic_slice", x, starts, length(dims))

    unless length(sizes) == length(dims) and
             Enum.all?(Enum.zip(sizes, dims), fn {s, d} -> s >= 0 and s <= d end) do
      mismatch!(
        "stablehlo.dynamic_slice",
        [x],
        "slice_sizes within #{inspect(dims)}, got #{inspect(sizes)}"
      )
    end

    emit1("stablehlo.dynamic_slice", [x | starts], {elem, sizes}, [
      "slice_sizes = #{i64_array(sizes)}"
    ])
  end

  def dynamic_update_slice(x, update, starts) do
    [x, update] = Enum.map([x, update], &value!("stablehlo.dynamic_update_slice", &1))
    starts = Enum.map(starts, &value!("stablehlo.dynamic_update_slice", &1))
    {elem, dims} = x.type
    {uelem, udims} = update.type
    check_indices!("stablehlo.dynamic_update_slice", x, starts, length(dims))

    unless uelem == elem and length(udims) == length(dims) and
             Enum.all?(Enum.zip(udims, dims), fn {u, d} -> u <= d end) do
      mismatch!(
        "stablehlo.dynamic_update_slice",
        [x, update],
        "an update of the operand's element type that fits in it"
      )
    end

    emit1("stablehlo.dynamic_update_slice", [x, update | starts], x.type)
  end

  def concatenate([_ | _] = values, dimension) do
    values = Enum.map(values, &value!("stablehlo.concatenate", &1))
    CPUFaults.check!(:concatenate, "stablehlo.concatenate", values)
    [{elem, dims} | _] = Enum.map(values, & &1.type)
    drop = fn d -> List.delete_at(d, dimension) end

    unless dimension >= 0 and dimension < length(dims) and
             Enum.all?(values, fn %{type: {e, d}} ->
               e == elem and length(d) == length(dims) and drop.(d) == drop.(dims)
             end) do
      mismatch!(
        "stablehlo.concatenate",
        values,
        "tensors of one element type that differ only in dimension #{dimension}"
      )
    end

    total = values |> Enum.map(fn %{type: {_, d}} -> Enum.at(d, dimension) end) |> Enum.sum()

    emit1("stablehlo.concatenate", values, {elem, List.replace_at(dims, dimension, total)}, [
      "dimension = #{dimension} : i64"
    ])
  end

  def pad(x, value, low, high, interior \\ nil) do
    [x, value] = Enum.map([x, value], &value!("stablehlo.pad", &1))
    {elem, dims} = x.type
    interior = interior || Enum.map(dims, fn _ -> 0 end)

    unless value.type == {elem, []} and
             Enum.all?([low, high, interior], &(length(&1) == length(dims))) and
             Enum.all?(interior, &(&1 >= 0)) do
      mismatch!(
        "stablehlo.pad",
        [x, value],
        "a scalar padding value of the operand's element type and one low, high and interior padding per dimension"
      )
    end

    out =
      Enum.zip_with([dims, low, high, interior], fn [d, l, h, i] ->
        l + d + h + max(d - 1, 0) * i
      end)

    emit1("stablehlo.pad", [x, value], {elem, out}, [
      "edge_padding_low = #{i64_array(low)}",
      "edge_padding_high = #{i64_array(high)}",
      "interior_padding = #{i64_array(interior)}"
    ])
  end
end
