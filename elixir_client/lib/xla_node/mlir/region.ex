defmodule XlaNode.MLIR.Region do
  @moduledoc false
  # A region of an op (a reduce's combiner, a while's condition and body, an if's branches):
  # one block, whose arguments are values of the given types, returning values with
  # `stablehlo.return`. Its arguments and ops are values and ops of the function whose body
  # runs, numbered on from its last (XlaNode.MLIR.Function); the ops its Elixir function makes
  # are written in its block, which its op's line holds.

  alias XlaNode.MLIR.{Function, Type, Value}

  @doc """
  A region of `op`: `fun` receives block arguments of `arg_types` and returns a value or a list
  of values. Returns the region's text and the types of its results.
  """
  def build(op, arg_types, fun) do
    function = Function.current!()

    args =
      for t <- arg_types,
          do: %Value{name: "%#{Function.next_number(function)}", type: t, function: function}

    first = Function.peek_number(function)

    results =
      try do
        fun.(args) |> List.wrap() |> Enum.map(&Function.value!(op, &1))
      catch
        kind, reason ->
          Function.discard_from(function, first)
          :erlang.raise(kind, reason, __STACKTRACE__)
      end

    lines = Function.take_from(function, first)
    result_types = Enum.map(results, & &1.type)

    text =
      IO.iodata_to_binary([
        "{\n  ^bb0(",
        Enum.map_join(args, ", ", &"#{&1.name}: #{Type.text(&1.type)}"),
        "):\n",
        Enum.map(lines, &["  ", &1]),
        "    \"stablehlo.return\"(#{Function.names(results)}) : (#{Type.texts(result_types)}) -> ()\n  }"
      ])

    {text, result_types}
  end

  @doc "Like `build/3`, raising `ArgumentError` unless the results are of `expected` types."
  def build!(op, what, arg_types, expected, fun) do
    {text, results} = build(op, arg_types, fun)

    if results != expected do
      raise ArgumentError,
            "#{op}: #{what} returned #{Type.texts(results)}; expected #{Type.texts(expected)}"
    end

    text
  end
end
