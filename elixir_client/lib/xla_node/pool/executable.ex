defmodule XlaNode.Pool.Executable do
  @moduledoc """
  A program compiled through an `XlaNode.Pool`: what `XlaNode.compile/3` returns when given a
  pool.

  It stands for the program on every node of the pool: the pool compiles it on a node the first
  time a run goes there and keeps that node's executable for the next runs. `XlaNode.free/3`
  with the handle frees it on every node. The handle works only with the pool that made it (and
  only while that pool runs: a restarted pool starts with no programs).

  Fields: `:pool` (the pool's name, or its pid when it has none), `:id` (the program's number in
  that pool) and `:effects` (see `XlaNode.Pool.Effects`).

      {:ok, _} = XlaNode.Pool.start_link(name: MyPool, nodes: [:"xla1@host", :"xla2@host"])
      mlir = "func.func @main(%x: tensor<f32>) -> tensor<f32> { return %x : tensor<f32> }"
      {:ok, exe} = XlaNode.compile(MyPool, mlir)
      %XlaNode.Pool.Executable{pool: MyPool, id: 1, effects: :pure} = exe
      :ok = XlaNode.free(MyPool, exe)
  """

  @enforce_keys [:pool, :pool_ref, :id, :effects]
  defstruct [:pool, :pool_ref, :id, :effects]

  @type t :: %__MODULE__{
          pool: atom() | pid(),
          pool_ref: reference(),
          id: pos_integer(),
          effects: XlaNode.Pool.Effects.t()
        }

  defimpl Inspect do
    def inspect(%{pool: pool, id: id}, _opts),
      do: "#XlaNode.Pool.Executable<#{Kernel.inspect(pool)}, #{id}>"
  end
end
