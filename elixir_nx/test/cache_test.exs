defmodule XlaNode.Compiler.CacheTest do
  # Not async: it counts the node's compiles, which other tests would add to.
  use ExUnit.Case, async: false

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  test "a second call with the same shapes reuses the compiled program; new shapes compile anew" do
    {:ok, %{compiles: c0, cache_hits: h0}} = GenServer.call({:xla, xla()}, :info)
    f = Nx.Defn.jit(&Nx.multiply(&1, 3), compiler: XlaNode.Compiler, node: xla())
    for x <- [1.0, 2.0, 3.0], do: assert(Nx.to_number(f.(Nx.tensor(x))) == x * 3)
    {:ok, %{compiles: c1, cache_hits: h1}} = GenServer.call({:xla, xla()}, :info)
    assert {c1 - c0, h1 - h0} == {1, 0}
    assert Nx.to_flat_list(f.(Nx.tensor([1.0, 2.0]))) == [3.0, 6.0]
    {:ok, %{compiles: c2}} = GenServer.call({:xla, xla()}, :info)
    assert c2 - c1 == 1
  end

  test "a compile error quotes the line of the generated program XLA points at" do
    text =
      "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = \"stablehlo.nonsense\"(%x) : (tensor<2xf32>) -> tensor<2xf32>\n  \"func.return\"(%y) : (tensor<2xf32>) -> ()\n}\n"

    error =
      assert_raise XlaNode.Error, fn ->
        XlaNode.Compiler.Cache.compile!({:bad, [], xla()}, xla(), text, %{})
      end

    assert error.kind == :compile_error
    assert error.message =~ ~s(in the generated program, line 2:\n%y = "stablehlo.nonsense")
  end

  test "with callbacks: :split, each node stage is compiled once" do
    split =
      Nx.Defn.jit(&XlaNode.CompilerTest.two_calls/1,
        compiler: XlaNode.Compiler,
        node: xla(),
        callbacks: :split
      )

    x = Nx.tensor([0.5, 1.0])
    split.(x)
    {:ok, %{compiles: c0, cache_hits: h0}} = GenServer.call({:xla, xla()}, :info)
    split.(x)
    {:ok, %{compiles: c1, cache_hits: h1}} = GenServer.call({:xla, xla()}, :info)
    assert {c1 - c0, h1 - h0} == {0, 0}
  end
end
