defmodule XlaNode.MLIR.Func do
  @moduledoc "A function of the module being built, for `XlaNode.MLIR.call/2`."
  defstruct [:name, :arg_types, :result_types]

  @type t :: %__MODULE__{
          name: String.t(),
          arg_types: [XlaNode.MLIR.type()],
          result_types: [XlaNode.MLIR.type()]
        }
end
