defmodule XlaNode.MLIR.Value do
  @moduledoc """
  A typed SSA value of the function being built with `XlaNode.MLIR`.

  A value carries its name in the function's text, its type and the function it belongs to,
  whose ops it is used in (see `XlaNode.MLIR.function/4`).
  """
  @enforce_keys [:name, :type, :function]
  defstruct [:name, :type, :function]

  @type t :: %__MODULE__{
          name: String.t(),
          type: XlaNode.MLIR.type(),
          function: XlaNode.MLIR.Function.t()
        }

  defimpl Inspect do
    def inspect(%{name: name, type: type}, _opts),
      do: "#MLIR.Value<#{name} : #{XlaNode.MLIR.Type.text(type)}>"
  end
end
