defmodule XlaNode.Compiler.Split do
  @moduledoc false

  # `callbacks: :split`: runs a `defn` whose `runtime_call`s and hooks run between programs
  # instead of inside one.
  #
  # The expression is cut at each `runtime_call` and hook (`Nx.Defn.Graph.split/2`). Every stage
  # without one is compiled and run on the node with its outputs kept there as buffers
  # (`XlaNode.Backend`), so that the next stage takes them without a round trip; each stage
  # with one runs on the calling node (`Nx.Defn.Evaluator`, with the call's `:hooks`), on its
  # inputs read back from the node. The results are the same as with callbacks inside the
  # program; this is the default on platforms that cannot run host callbacks. `Nx.Defn.Graph`
  # does not cut inside a `while` or `cond`: a callback there stays in the node's program.
  #
  # Every stage is compiled when the function is, and the function returned holds only what runs
  # them: executables, templates, and the stages that call back, each a `runtime_call` or hook on
  # its parameters. The expression itself stays in the process that traced it (`Nx.Serving`, for
  # one, runs the function in other processes, and a copy does not keep an expression graph's
  # sharing).

  alias Nx.Defn.{Composite, Expr, Graph}
  alias Nx.Tensor, as: T
  alias XlaNode.Compiler.Program

  @doc """
  Returns the function `XlaNode.Compiler.__compile__/4` returns, for `:split` mode; `key` is
  the traced function's key (`XlaNode.Compiler.Program.function_key/1`). As without `:split`,
  only the arguments some stage uses are read and sent.
  """
  def compile(key, vars, fun, opts, info) do
    output = fun.(vars)
    structure = Composite.traverse(output, &Nx.to_template/1)
    chain = [output] |> Composite.flatten_list() |> List.to_tuple() |> Graph.split(&cut/1)

    # Node stages have no callbacks left to cut, except inside a while or cond. They are
    # compiled under a key of their own, stable from call to call, so that each is compiled
    # once: the function, its arguments' templates, and the stage's place in the chain.
    node_opts = opts |> Keyword.put(:callbacks, :inside) |> Keyword.put(:keep_on_device, true)
    split_key = {:split, key, Program.arguments_key(vars)}

    scope =
      vars
      |> Program.parameters()
      |> Enum.with_index(fn t, i -> {{nil, i}, Nx.to_template(t)} end)
      |> Map.new()

    {stages, _scope} =
      chain
      |> Enum.with_index()
      |> Enum.map_reduce(scope, fn {stage, index}, scope ->
        sources = Enum.map(stage.arguments, & &1.source)
        inputs = List.to_tuple(Enum.map(sources, &Map.fetch!(scope, &1)))
        run = stage_runner(stage.expr, inputs, {split_key, index}, node_opts, info)

        scope =
          stage.expr
          |> Tuple.to_list()
          |> Enum.with_index(fn t, i -> {{stage.id, i}, Nx.to_template(t)} end)
          |> Enum.into(scope)

        {{stage.id, sources, run}, scope}
      end)

    {keep, node} = {opts[:keep_on_device], opts[:node]}
    used = for {_id, sources, _run} <- stages, {nil, i} <- sources, uniq: true, do: i

    fn [params] ->
      # Only the arguments a stage takes are read, each once.
      scope = for i <- used, into: %{}, do: {{nil, i}, Enum.fetch!(params, i).()}

      # The stages' buffers are freed when the call ends, except those it returns.
      results =
        XlaNode.Backend.scope(fn ->
          stages |> run(scope) |> Enum.map(&result(&1, keep, node))
        end)

      {result, []} = Composite.traverse(structure, results, fn _, [t | rest] -> {t, rest} end)
      [result]
    end
  end

  # Results stay on the node, or come back, as without :split.
  defp result(%T{data: %XlaNode.Backend{}} = t, true, _node), do: t
  defp result(t, true, node), do: Nx.backend_copy(t, {XlaNode.Backend, node: node})
  defp result(t, _keep, _node), do: Nx.backend_copy(t, Nx.BinaryBackend)

  defp cut(%T{data: %Expr{op: op}}) when op in [:runtime_call, :hook], do: :both
  defp cut(_), do: :none

  # As Nx.Defn.Graph.run/3, with each stage's runner chosen and compiled beforehand. Returns
  # the last stage's outputs.
  defp run(stages, scope) do
    {outputs, _scope} =
      Enum.reduce(stages, {[], scope}, fn {id, sources, run}, {_, scope} ->
        inputs = sources |> Enum.map(&Map.fetch!(scope, &1)) |> List.to_tuple()
        outputs = inputs |> run.() |> Tuple.to_list()
        scope = outputs |> Enum.with_index(fn t, i -> {{id, i}, t} end) |> Enum.into(scope)
        {outputs, scope}
      end)

    outputs
  end

  # A stage the cut made for a callback runs on this node; any other on the compute node.
  defp stage_runner(expr, inputs, stage_key, node_opts, info) do
    if calls_back?(expr) do
      hooks = Keyword.get(node_opts, :hooks, %{})

      compiled =
        Nx.Defn.compile(fn _ -> expr end, [inputs], compiler: Nx.Defn.Evaluator, hooks: hooks)

      # Copies: the stage's inputs may be needed by later stages, or be the caller's tensors.
      # The stage computes on this node, whatever the default backend.
      fn inputs ->
        inputs = inputs |> Tuple.to_list() |> Enum.map(&Nx.backend_copy/1) |> List.to_tuple()
        Nx.with_default_backend(Nx.BinaryBackend, fn -> compiled.(inputs) end)
      end
    else
      vars = [inputs]

      program =
        Program.runner(
          {stage_key, Program.arguments_key(vars), node_opts[:node]},
          vars,
          fn _ -> expr end,
          node_opts,
          info
        )

      fn inputs ->
        [outputs] = program.([inputs |> Tuple.to_list() |> Enum.map(&fn -> &1 end)])
        outputs
      end
    end
  end

  # The stages Graph.split made for a callback output its runtime_call or hook itself.
  defp calls_back?(expr) do
    expr
    |> Tuple.to_list()
    |> Enum.any?(fn %T{data: %Expr{op: op}} -> op in [:runtime_call, :hook] end)
  end
end
