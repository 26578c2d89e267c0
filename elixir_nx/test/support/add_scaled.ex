defmodule XlaNode.NxTest.AddScaled do
  @moduledoc """
  A block for `x * n + sin(x)` that `XlaNode.Compiler` lowers to the test kernel library's
  `xn_add_scaled` (`integration/kernels/test_kernels.cc`) on CPU nodes, for f32 only; any other
  type, platform or compiler runs the default expression.
  """
  defstruct n: 1.0

  def add_scaled(x, n) do
    Nx.block(%__MODULE__{n: n}, [x], x, fn %{n: n}, x -> Nx.add(Nx.multiply(x, n), Nx.sin(x)) end)
  end
end

defimpl XlaNode.Compiler.CustomCall, for: XlaNode.NxTest.AddScaled do
  def call(%{n: n}, %{type: {:f, 32}}, [_x], %{platform: "cpu"}) do
    {:ok, %XlaNode.Compiler.CustomCall.Spec{target: "xn_add_scaled", attributes: [{"n", n}]}}
  end

  def call(_block, _out, _args, _target), do: :skip
end
