defmodule XlaNode.MLIR.Operation do
  @moduledoc false
  # One op of a function being built: its line of MLIR, written into its function (that of its
  # operands, or the one whose body runs for an op without operands) under the number that
  # names its results, and the values of its results.

  alias XlaNode.MLIR.{Function, Type, Value}

  @doc """
  Writes `"op"(operands) ({regions}) {attrs} : (operand types) -> (result types)` and returns
  the result values. `operands` were checked with `XlaNode.MLIR.Function.value!/2`; `attrs`
  are MLIR attribute text (`"name = value"`), `regions` the texts of `XlaNode.MLIR.Region`s.
  """
  def emit(op, operands, result_types, attrs, regions \\ []) do
    function = Function.of(operands)
    n = Function.next_number(function)
    count = length(result_types)

    {lhs, results} =
      case count do
        0 ->
          {"", []}

        1 ->
          {"%#{n} = ", [%Value{name: "%#{n}", type: hd(result_types), function: function}]}

        _ ->
          {"%#{n}:#{count} = ",
           for(
             {t, i} <- Enum.with_index(result_types),
             do: %Value{name: "%#{n}##{i}", type: t, function: function}
           )}
      end

    attrs = if attrs == [], do: "", else: " {" <> Enum.join(attrs, ", ") <> "}"
    regions = if regions == [], do: "", else: " (" <> Enum.join(regions, ", ") <> ")"

    results_text =
      if count == 1, do: Type.text(hd(result_types)), else: "(#{Type.texts(result_types)})"

    line =
      "  #{lhs}\"#{op}\"(#{Function.names(operands)})#{regions}#{attrs} : (#{Type.texts(Enum.map(operands, & &1.type))}) -> #{results_text}\n"

    Function.write(function, n, line)
    results
  end
end
