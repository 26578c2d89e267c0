defmodule XlaNode.MLIR.Func do
  @moduledoc """
  A function of the module being built, as `XlaNode.MLIR.function/4` returns it, for
  `XlaNode.MLIR.call/2`: its name, and the types of its arguments and results.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   double = M.function("double", [{{:f, 32}, [3]}], fn [x] -> M.add(x, x) end)
      ...>   send(self(), {:func, double})
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.call(double, [x]) end)
      ...> end)
      iex> receive do {:func, double} -> double end
      %XlaNode.MLIR.Func{name: "double", arg_types: [{{:f, 32}, [3]}], result_types: [{{:f, 32}, [3]}]}
  """
  defstruct [:name, :arg_types, :result_types]

  @type t :: %__MODULE__{
          name: String.t(),
          arg_types: [XlaNode.MLIR.type()],
          result_types: [XlaNode.MLIR.type()]
        }
end
