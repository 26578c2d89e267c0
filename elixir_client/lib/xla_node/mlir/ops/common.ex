defmodule XlaNode.MLIR.Ops.Common do
  @moduledoc false
  # What the families of ops (XlaNode.MLIR.Ops.*) share: checking operands, types and options,
  # creating operations and regions, and the messages of type errors.

  alias XlaNode.MLIR.{Attribute, Function, Operation, Region, Type}
  alias XlaNode.Options

  @doc "The `:precision` option of contractions and convolutions."
  def precision, do: {:in, [:default, :high, :highest]}

  def type_text(type), do: Type.text(type)
  def category(element_type), do: Type.category(element_type)
  def element_text(element_type), do: Type.element_text(element_type)
  def types_text(types), do: Type.texts(types)
  def check_type!(op, type), do: Type.check!(op, type)
  def bits({_, b}), do: b

  ## Emitting

  # An op's options, checked: an unknown key or a value of the wrong kind raises ArgumentError.
  def options!(opts, function, spec),
    do: Options.validate!(opts, "XlaNode.MLIR.#{function}", spec)

  def value!(op, value), do: Function.value!(op, value)

  def mismatch!(op, values, expected) do
    raise ArgumentError,
          "#{op}: got #{Enum.map_join(values, ", ", &type_text(&1.type))}; expected #{expected}"
  end

  def emit(op, operands, result_types, attrs, regions \\ []),
    do: Operation.emit(op, operands, result_types, attrs, regions)

  def emit1(op, operands, type, attrs \\ [], regions \\ []),
    do: hd(emit(op, operands, [type], attrs, regions))

  # Ops with one result per operand return a value for one operand, a list for several.
  def one_or_list([result]), do: result
  def one_or_list(results), do: results

  def region(op, arg_types, fun), do: Region.build(op, arg_types, fun)

  def region!(op, what, arg_types, expected, fun),
    do: Region.build!(op, what, arg_types, expected, fun)

  def i64_array(list), do: Attribute.i64_array(list)
  def i64_list(list), do: "[#{Enum.join(list, ", ")}]"

  def check_axes!(op, x, axes, rank) do
    unless Enum.all?(axes, &(&1 >= 0 and &1 < rank)) and Enum.uniq(axes) == axes do
      mismatch!(op, [x], "distinct dimensions below #{rank}, got #{inspect(axes)}")
    end
  end

  def check_category!(op, values, cats) do
    for v <- values do
      {elem, _} = v.type

      unless category(elem) in cats do
        mismatch!(op, values, "#{Enum.join(cats, " or ")} tensors")
      end
    end

    :ok
  end

  def same_type!(op, values) do
    values = Enum.map(values, &value!(op, &1))
    [first | rest] = values

    if Enum.any?(rest, &(&1.type != first.type)) do
      mismatch!(op, values, "operands of one type")
    end

    values
  end

  def same_elem!(op, values) do
    values = Enum.map(values, &value!(op, &1))
    elems = Enum.map(values, fn %{type: {e, _}} -> e end)
    if length(Enum.uniq(elems)) > 1, do: mismatch!(op, values, "operands of one element type")
    values
  end

  def check_indices!(op, x, starts, rank) do
    types = Enum.map(starts, & &1.type)

    unless length(starts) == rank and
             Enum.all?(types, fn {e, d} -> d == [] and category(e) in [:signed, :unsigned] end) and
             length(Enum.uniq(types)) <= 1 do
      mismatch!(op, [x | starts], "#{rank} scalar integer start indices of one type")
    end
  end
end
