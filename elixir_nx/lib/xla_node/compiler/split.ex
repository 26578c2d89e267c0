defmodule XlaNode.Compiler.Split do
  @moduledoc """
  `callbacks: :split`: runs a `defn` whose `runtime_call`s run between programs instead of
  inside one.

  The expression is cut at each `runtime_call` (`Nx.Defn.Graph.split/2`). Every stage without
  one is compiled and run on the node with its outputs kept there as buffers
  (`XlaNode.Backend`), so that the next stage takes them without a round trip; each stage
  with one runs on the calling node (`Nx.Defn.Evaluator`), on its inputs read back from the
  node. The results are the same as with callbacks inside the program; this mode suits
  platforms that cannot run host callbacks.
  """

  alias Nx.Defn.{Composite, Expr, Graph}
  alias Nx.Tensor, as: T

  @doc "Returns the function `XlaNode.Compiler.__compile__/4` returns, for `:split` mode."
  def compile(vars, fun, opts) do
    output = fun.(vars)
    output_expr = [output] |> Composite.flatten_list() |> List.to_tuple()
    chain = Graph.split(output_expr, &cut/1)
    node_opts = opts |> Keyword.delete(:callbacks) |> Keyword.put(:keep_on_device, true)

    fn [params] ->
      args = Enum.map(params, & &1.())
      results = run(chain, args, node_opts) |> Tuple.to_list() |> Enum.map(&Nx.backend_transfer/1)

      {result, []} = Composite.traverse(output, results, fn _, [t | rest] -> {t, rest} end)
      [result]
    end
  end

  defp cut(%T{data: %Expr{op: :runtime_call}}), do: :both
  defp cut(_), do: :none

  # As Nx.Defn.Graph.run/3, choosing where each stage runs.
  defp run(chain, args, node_opts) do
    scope = args |> Enum.with_index(fn arg, i -> {{nil, i}, arg} end) |> Map.new()

    {result, _} =
      Enum.reduce(chain, {nil, scope}, fn %{id: id, expr: expr, arguments: arguments},
                                          {_, scope} ->
        inputs = Enum.map(arguments, &Map.fetch!(scope, &1.source))

        result =
          if calls_back?(expr) do
            inputs = Enum.map(inputs, &Nx.backend_transfer/1)

            Nx.Defn.jit_apply(fn _ -> expr end, [List.to_tuple(inputs)],
              compiler: Nx.Defn.Evaluator
            )
          else
            Nx.Defn.jit_apply(
              fn _ -> expr end,
              [List.to_tuple(inputs)],
              [compiler: XlaNode.Compiler] ++ node_opts
            )
          end

        outputs = if is_tuple(result), do: Tuple.to_list(result), else: [result]

        scope =
          outputs
          |> Enum.with_index()
          |> Enum.reduce(scope, fn {t, i}, acc -> Map.put(acc, {id, i}, t) end)

        {result, scope}
      end)

    if is_tuple(result), do: result, else: {result}
  end

  # Hooks stay inside node programs (as io_calls); only runtime calls run on this node.
  defp calls_back?(expr), do: XlaNode.Compiler.Lower.has_op?(expr, [:runtime_call])
end
