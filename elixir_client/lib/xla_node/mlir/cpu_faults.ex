defmodule XlaNode.MLIR.CPUFaults do
  @moduledoc """
  What XLA's CPU backend cannot compute on the 2- and 4-bit integers, written once for the
  Elixir side: `XlaNode.MLIR` raises on the ops it can see will fail, and `XlaNode.Compiler`
  runs every op listed here on 8-bit integers instead.

  Ops are named as Nx names them (`:dot`, `:conv`, `:argmax` for a reduce of two operands):

    * `:concatenate` of 2-bit integers: XLA's CPU compiler fails a check and aborts;
    * `:sort` of 2-bit integers: computed wrongly, writing outside its buffers;
    * `:dot` and `:conv` of 2-bit integers, `:top_k` of 2- and 4-bit ones: no kernel;
    * `:argmax` (and argmin) of 2-bit integers: XLA fails compiling the reduce of two operands;
    * `:transpose`, `:gather` and `:scatter` of 2- and 4-bit integers: where XLA makes a copy
      of a transpose (one result among several, or around a gather or scatter), its compiler
      throws building it.

  The builder raises on the first three kinds only: the others depend on what XLA makes of the
  program. The node checks the first two itself (`src/xla/known_faults.rs`), since it must
  not abort whatever program a client sends.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 2}, [4]}, {{:s, 2}, [4]}], fn [a, b] ->
      ...>     M.concatenate([a, b], 0)
      ...>   end)
      ...> end)
      ** (ArgumentError) stablehlo.concatenate of 2-bit integers (tensor<4xi2>, tensor<4xi2>): XLA's CPU compiler aborts on it; convert them to s8/u8 first
      iex> XlaNode.MLIR.CPUFaults.computed_in(:concatenate, {:s, 2})
      {:s, 8}
  """

  alias XlaNode.Tensor

  # {op, widest element bits that fault, what XLA does, whether XlaNode.MLIR raises on it}
  @faults [
    {:concatenate, 2, "XLA's CPU compiler aborts on it", true},
    {:sort, 2, "XLA's CPU backend sorts them wrongly, writing outside its buffers", true},
    {:dot, 2, "XLA's CPU backend has no kernel for it", true},
    {:conv, 2, "XLA's CPU backend has no kernel for it", true},
    {:top_k, 4, "XLA's CPU backend cannot compile it", true},
    {:argmax, 2, "XLA's CPU compiler fails on a reduce of two operands of them", false},
    {:transpose, 4, "XLA's compiler throws building the copy it may make of it", false},
    {:gather, 4, "XLA's compiler throws building the copy it may make around it", false},
    {:scatter, 4, "XLA's compiler throws building the copy it may make around it", false}
  ]

  @doc """
  The element type `op` must run in on XLA's CPU for elements of `type`: the 8-bit integer of
  the same signedness where it faults on `type`, `type` itself otherwise.

      iex> XlaNode.MLIR.CPUFaults.computed_in(:sort, {:u, 2})
      {:u, 8}
      iex> XlaNode.MLIR.CPUFaults.computed_in(:sort, {:s, 4})
      {:s, 4}
  """
  def computed_in(op, {kind, bits} = type) when kind in [:s, :u] do
    case List.keyfind(@faults, op, 0) do
      {^op, widest, _why, _raised} when bits <= widest -> {kind, 8}
      _ -> type
    end
  end

  def computed_in(_op, type), do: type

  # Raises `ArgumentError` naming `name` (the StableHLO op) when `op` faults on an operand among
  # `values`, for the ops `XlaNode.MLIR` refuses (its ops call it; the moduledoc shows it).
  @doc false
  def check!(op, name, values) do
    {^op, widest, why, true} = List.keyfind(@faults, op, 0)

    faulty =
      Enum.any?(values, fn %{type: {{kind, _} = elem, _}} ->
        kind in [:s, :u] and Tensor.element_bits(elem) <= widest
      end)

    cond do
      not faulty ->
        :ok

      widest == 2 ->
        raise ArgumentError,
              "#{name} of 2-bit integers (#{Enum.map_join(values, ", ", &XlaNode.MLIR.type_text(&1.type))}): " <>
                "#{why}; convert them to s8/u8 first"

      true ->
        raise ArgumentError,
              "#{name}: #{why} on 2- or 4-bit integers, " <>
                "got #{Enum.map_join(values, ", ", &XlaNode.MLIR.type_text(&1.type))}; convert to s8/u8 first"
    end
  end
end
