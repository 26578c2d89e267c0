defmodule XlaNode.NxTest.Loop do
  @moduledoc "A `while` loop in `defn`, for the op tables of ops_test.exs and types_test.exs."

  import Nx.Defn

  @doc "`x` doubled three times in a `while` loop (wrapping, for integers)."
  defn doubled_three_times(x) do
    {_, x} =
      while {i = 0, x}, i < 3 do
        {i + 1, x + x}
      end

    x
  end
end
