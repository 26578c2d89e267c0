defmodule XlaNode.NxTest.Moded do
  @moduledoc """
  A container whose kept field chooses the computation, as a library's options struct does.
  In `test/support` so that its protocol implementation is consolidated with Nx's.
  """
  @derive {Nx.Container, containers: [:x], keep: [:mode]}
  defstruct [:x, :mode]
end

defmodule XlaNode.NxTest.LazyBatch do
  @moduledoc """
  A lazy container, as a data pipeline hands one to a training step: `x` and `y` are read when
  used; the member made from `poison_template` raises if it is ever computed.
  """
  defstruct [:x, :y, :poison_template]

  defimpl Nx.LazyContainer do
    def traverse(%{x: x, y: y, poison_template: poison}, acc, fun) do
      {x, acc} = fun.(Nx.to_template(x), fn -> x end, acc)
      {y, acc} = fun.(Nx.to_template(y), fn -> y end, acc)
      {poison, acc} = fun.(poison, fn -> raise "the unused member was computed" end, acc)
      {%{x: x, y: y, poison: poison}, acc}
    end
  end
end
