defmodule XlaNode.Compiler.Split do
  @moduledoc """
  `callbacks: :split`: runs a `defn` whose `runtime_call`s and hooks run between programs
  instead of inside one.

  The expression is cut at each `runtime_call` and hook (`Nx.Defn.Graph.split/2`). Every stage
  without one is compiled and run on the node with its outputs kept there as buffers
  (`XlaNode.Backend`), so that the next stage takes them without a round trip; each stage
  with one runs on the calling node (`Nx.Defn.Evaluator`, with the call's `:hooks`), on its
  inputs read back from the node. The results are the same as with callbacks inside the
  program; this is the default on platforms that cannot run host callbacks. `Nx.Defn.Graph`
  does not cut inside a `while` or `cond`: a callback there stays in the node's program.
  """

  alias Nx.Defn.{Composite, Expr, Graph}
  alias Nx.Tensor, as: T

  @doc "Returns the function `XlaNode.Compiler.__compile__/4` returns, for `:split` mode."
  def compile(key, vars, fun, opts) do
    output = fun.(vars)
    output_expr = [output] |> Composite.flatten_list() |> List.to_tuple()
    chain = Graph.split(output_expr, &cut/1)
    # Node stages have no callbacks left to cut, except inside a while or cond.
    node_opts = opts |> Keyword.put(:callbacks, :inside) |> Keyword.put(:keep_on_device, true)

    fn [params] ->
      args = Enum.map(params, & &1.())

      # The stages' buffers are freed when the call ends, except those it returns.
      results =
        XlaNode.Backend.scope(fn ->
          chain
          |> run(args, key, node_opts)
          |> Tuple.to_list()
          |> Enum.map(&result(&1, opts[:keep_on_device], opts[:node]))
        end)

      {result, []} = Composite.traverse(output, results, fn _, [t | rest] -> {t, rest} end)
      [result]
    end
  end

  # Results stay on the node, or come back, as without :split.
  defp result(%T{data: %XlaNode.Backend{}} = t, true, _node), do: t
  defp result(t, true, node), do: Nx.backend_copy(t, {XlaNode.Backend, node: node})
  defp result(t, _keep, _node), do: Nx.backend_copy(t, Nx.BinaryBackend)

  defp cut(%T{data: %Expr{op: op}}) when op in [:runtime_call, :hook], do: :both
  defp cut(_), do: :none

  # As Nx.Defn.Graph.run/3, choosing where each stage runs. Node stages are compiled under a
  # key of their own, stable from call to call, so that each is compiled once.
  defp run(chain, args, key, node_opts) do
    scope = args |> Enum.with_index(fn arg, i -> {{nil, i}, arg} end) |> Map.new()

    {result, _} =
      chain
      |> Enum.with_index()
      |> Enum.reduce({nil, scope}, fn {stage, index}, {_, scope} ->
        inputs = stage.arguments |> Enum.map(&Map.fetch!(scope, &1.source)) |> List.to_tuple()
        result = run_stage(stage.expr, inputs, {key, index}, node_opts)
        outputs = if is_tuple(result), do: Tuple.to_list(result), else: [result]

        scope =
          outputs
          |> Enum.with_index()
          |> Enum.reduce(scope, fn {t, i}, acc -> Map.put(acc, {stage.id, i}, t) end)

        {result, scope}
      end)

    if is_tuple(result), do: result, else: {result}
  end

  defp run_stage(expr, inputs, stage_key, node_opts) do
    if calls_back?(expr) do
      # Copies: the stage's inputs may be needed by later stages, or be the caller's tensors.
      inputs = inputs |> Tuple.to_list() |> Enum.map(&Nx.backend_copy/1) |> List.to_tuple()
      evaluator_opts = [compiler: Nx.Defn.Evaluator, hooks: Keyword.get(node_opts, :hooks, %{})]

      Nx.with_default_backend(Nx.BinaryBackend, fn ->
        Nx.Defn.jit_apply(fn _ -> expr end, [inputs], evaluator_opts)
      end)
    else
      opts = [compiler: XlaNode.Compiler, stage_key: stage_key] ++ node_opts
      Nx.Defn.jit_apply(fn _ -> expr end, [inputs], opts)
    end
  end

  defp calls_back?(expr), do: XlaNode.Compiler.Lower.has_op?(expr, [:runtime_call, :hook])
end
