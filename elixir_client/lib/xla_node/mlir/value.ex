defmodule XlaNode.MLIR.Value do
  @moduledoc """
  A typed SSA value of the function being built with `XlaNode.MLIR`.

  A value carries its name in the function's text, its type (`{type, dims}`) and the function
  it belongs to, whose ops it is used in (see `XlaNode.MLIR.function/4`); it is given to ops,
  and a function's body returns one or a list of them.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [2, 3]}], fn [x] ->
      ...>     send(self(), {:value, x})
      ...>     x
      ...>   end)
      ...> end)
      iex> x = receive do {:value, x} -> x end
      #MLIR.Value<%arg0 : tensor<2x3xf32>>
      iex> x.type
      {{:f, 32}, [2, 3]}
  """
  @enforce_keys [:name, :type, :function]
  defstruct [:name, :type, :function]

  @type t :: %__MODULE__{
          name: String.t(),
          type: XlaNode.MLIR.type(),
          # The function being built (the builder's own, internal structure).
          function: term()
        }

  defimpl Inspect do
    def inspect(%{name: name, type: type}, _opts),
      do: "#MLIR.Value<#{name} : #{XlaNode.MLIR.Type.text(type)}>"
  end
end
