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
end
