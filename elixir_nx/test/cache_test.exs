defmodule XlaNode.Compiler.CacheTest do
  # Not async: it counts the node's compiles, which other tests would add to.
  use ExUnit.Case, async: false

  alias XlaNode.Compiler.Cache

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

  test "callers of one program wait for its one compile; its entry goes when its node does" do
    second = XlaNode.NxTest.Node.start!("xla_nx_cache_#{System.pid()}")
    on_exit(fn -> XlaNode.NxTest.Node.stop(second) end)
    {:ok, %{compiles: c0}} = GenServer.call({:xla, second.name}, :info)

    f = Nx.Defn.jit(&Nx.subtract(&1, 7), compiler: XlaNode.Compiler, node: second.name)

    results =
      1..8
      |> Task.async_stream(fn i -> Nx.to_number(f.(Nx.tensor(i * 1.0))) end, max_concurrency: 8)
      |> Enum.map(fn {:ok, v} -> v end)

    assert results == Enum.map(1..8, &(&1 - 7.0))
    {:ok, %{compiles: c1, executables: held}} = GenServer.call({:xla, second.name}, :info)
    assert {c1 - c0, held} == {1, 1}
    assert [[%{exe: _}]] = :ets.match(Cache, {{:_, :_, second.name}, :"$1"})

    # The node is hidden, and its going still empties its entries.
    XlaNode.NxTest.Node.stop(second)

    assert Enum.any?(1..100, fn _ ->
             :ets.match(Cache, {{:_, :_, second.name}, :_}) == [] || (Process.sleep(50) && false)
           end)
  end

  test "a compile that never gets an answer keeps no other compile waiting" do
    # This VM as a "node" whose :xla accepts calls and never answers.
    silent = spawn(fn -> Process.sleep(:infinity) end)
    Process.register(silent, :xla)
    on_exit(fn -> Process.exit(silent, :kill) end)

    hung =
      Task.async(fn -> catch_error(Cache.compile!({:hung, [], node()}, node(), "x", %{})) end)

    f = Nx.Defn.jit(&Nx.add(&1, 11), compiler: XlaNode.Compiler, node: xla())
    assert Nx.to_number(f.(Nx.tensor(1.0))) == 12.0

    # The silent server going away fails the compile that waited on it, nothing else.
    Process.exit(silent, :kill)
    assert %XlaNode.Error{} = Task.await(hung, 30_000)
  end
end
