defmodule XlaNode.LinAlgTest do
  # Not async: it measures this VM's CPU time, which tests running beside it would add to.
  use ExUnit.Case, async: false

  import XlaNode.NxTest.Compare

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  # Symmetric positive definite (cholesky needs it), and its lower triangle.
  @spd Nx.tensor([
         [4.0, 1.0, 0.5, 0.2],
         [1.0, 3.0, 0.3, 0.1],
         [0.5, 0.3, 2.0, 0.4],
         [0.2, 0.1, 0.4, 1.0]
       ])
  @general Nx.tensor([
             [2.0, -1.0, 0.5, 3.0],
             [1.0, 4.0, -2.0, 0.5],
             [0.0, 1.5, 3.0, -1.0],
             [-2.0, 0.5, 1.0, 2.5]
           ])
  @b Nx.tensor([1.0, -2.0, 3.0, 0.5])

  # Nx's default expressions for these are what the node runs; eigh and svd are while loops
  # whose bodies reuse their state many times over (the shape of graph that once took the
  # caller's VM down), and iterate, hence their wider tolerance.
  defp cases do
    iterative = [atol: 1.0e-4, rtol: 1.0e-3]

    [
      {"eigh", &Nx.LinAlg.eigh/1, [@spd], iterative},
      {"eigh, batched", &Nx.LinAlg.eigh/1, [Nx.stack([@spd, Nx.multiply(@spd, 2)])], iterative},
      {"svd", &Nx.LinAlg.svd/1, [@general], iterative},
      {"qr", &Nx.LinAlg.qr/1, [@general], []},
      {"qr, complete", &Nx.LinAlg.qr(&1, mode: :complete), [@general], []},
      {"lu", &Nx.LinAlg.lu/1, [@general], []},
      {"cholesky", &Nx.LinAlg.cholesky/1, [@spd], []},
      {"triangular_solve", &Nx.LinAlg.triangular_solve/2, [Nx.tril(@spd), @b], []},
      {"solve", &Nx.LinAlg.solve/2, [@general, @b], []},
      {"invert", &Nx.LinAlg.invert/1, [@general], []},
      {"determinant", &Nx.LinAlg.determinant/1, [@general], []},
      {"norm, Frobenius", &Nx.LinAlg.norm/1, [@general], []},
      {"norm, ord 1", &Nx.LinAlg.norm(&1, ord: 1), [@general], []},
      {"norm, ord :inf", &Nx.LinAlg.norm(&1, ord: :inf), [@general], []},
      {"norm, ord 2 (svd)", &Nx.LinAlg.norm(&1, ord: 2), [@general], iterative},
      {"norm, nuclear (svd)", &Nx.LinAlg.norm(&1, ord: :nuclear), [@general], iterative},
      {"norm of a vector, ord 3", &Nx.LinAlg.norm(&1, ord: 3), [@b], []}
    ]
  end

  test "linear algebra runs on the node, as the Evaluator computes it, cheaply once compiled" do
    for {name, fun, args, tolerance} <- cases() do
      jitted = Nx.Defn.jit(fun, compiler: XlaNode.Compiler, node: xla())
      # The first call lowers and compiles.
      ours = apply(jitted, args)
      theirs = apply(Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator), args)
      assert_match(ours, theirs, tolerance)

      # Later calls find the program in the cache: the caller only moves the data. Measured on
      # the caller's side, in CPU (this VM's, and the calling process's reductions; lowering
      # svd alone takes some 800,000), never in wall-clock time.
      {again, runtime_ms, reductions} = caller_cost(fn -> apply(jitted, args) end)
      assert_match(again, theirs, tolerance)
      assert runtime_ms < 250, "#{name}: #{runtime_ms} ms of CPU for a compiled call"
      assert reductions < 20_000, "#{name}: #{reductions} reductions for a compiled call"
    end
  end

  defp caller_cost(fun) do
    {runtime0, _} = :erlang.statistics(:runtime)
    {:reductions, reductions0} = Process.info(self(), :reductions)
    result = fun.()
    {:reductions, reductions1} = Process.info(self(), :reductions)
    {runtime1, _} = :erlang.statistics(:runtime)
    {result, runtime1 - runtime0, reductions1 - reductions0}
  end
end
