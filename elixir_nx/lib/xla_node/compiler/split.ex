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

  alias Nx.Defn.{Composite, Expr, Graph, Tree}
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
          |> Enum.with_index(fn t, i -> {{stage.id, i}, output_template(t)} end)
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
    {expr, inputs} = take_elements(expr, inputs)
    run = compile_stage(expr, inputs, stage_key, node_opts, info)

    fn inputs ->
      inputs |> Tuple.to_list() |> Enum.flat_map(&elements/1) |> List.to_tuple() |> run.()
    end
  end

  defp compile_stage(expr, inputs, stage_key, node_opts, info) do
    if calls_back?(expr) do
      hooks = Keyword.get(node_opts, :hooks, %{})

      # The Evaluator outputs tensors only: a container result goes out as its elements, and
      # is a tuple of them again between stages.
      outputs = Tuple.to_list(expr)
      counts = Enum.map(outputs, &element_count/1)
      flat = outputs |> Enum.flat_map(&output_elements/1) |> List.to_tuple()

      compiled =
        Nx.Defn.compile(fn _ -> flat end, [inputs], compiler: Nx.Defn.Evaluator, hooks: hooks)

      # Copies: the stage's inputs may be needed by later stages, or be the caller's tensors.
      # The stage computes on this node, whatever the default backend.
      fn inputs ->
        inputs = inputs |> Tuple.to_list() |> Enum.map(&Nx.backend_copy/1) |> List.to_tuple()

        Nx.with_default_backend(Nx.BinaryBackend, fn -> compiled.(inputs) end)
        |> Tuple.to_list()
        |> regroup(counts)
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

  # What a stage's output is between stages: a tensor's template, or for a `runtime_call`
  # returning a container, the templates of its tensors (the Evaluator gives them as a tuple).
  defp output_template(%T{type: {:tuple, _}, data: %Expr{op: :runtime_call, args: args}}) do
    [_operands, _fun, template, _opts] = args
    [template] |> Composite.flatten_list() |> Enum.map(&Nx.to_template/1) |> List.to_tuple()
  end

  defp output_template(t), do: Nx.to_template(t)

  # A stage output's tensors: one, or those of a runtime_call's container (nil: one tensor).
  defp element_count(%T{type: {:tuple, _}} = t), do: tuple_size(output_template(t))
  defp element_count(_t), do: nil

  defp output_elements(%T{type: {:tuple, _}} = t),
    do: t |> Expr.tuple(t |> output_template() |> Tuple.to_list()) |> Tuple.to_list()

  defp output_elements(t), do: [t]

  defp regroup(values, counts) do
    {grouped, []} =
      Enum.map_reduce(counts, values, fn
        nil, [value | rest] ->
          {value, rest}

        count, values ->
          {group, rest} = Enum.split(values, count)
          {List.to_tuple(group), rest}
      end)

    List.to_tuple(grouped)
  end

  defp elements(tuple) when is_tuple(tuple), do: Tuple.to_list(tuple)
  defp elements(tensor), do: [tensor]

  # A runtime_call's container result reaches later stages as one tuple-typed parameter, which
  # neither a program nor the Evaluator takes: a stage given one takes each of its tensors as a
  # parameter of its own instead, in place of the `elem/2`s of it, and its other parameters
  # move up behind them. Returns the stage's expression and its inputs' templates, flattened.
  defp take_elements(expr, inputs) do
    templates = Tuple.to_list(inputs)

    if Enum.any?(templates, &is_tuple/1) do
      {positions, _count} =
        Enum.map_reduce(templates, 0, fn
          t, next when is_tuple(t) -> {{:elements, next}, next + tuple_size(t)}
          _t, next -> {{:tensor, next}, next + 1}
        end)

      positions = List.to_tuple(positions)
      {expr, _cache} = Composite.traverse(expr, %{}, &reparameter(&1, &2, positions))
      {expr, templates |> Enum.flat_map(&elements/1) |> List.to_tuple()}
    else
      {expr, inputs}
    end
  end

  defp reparameter(%T{data: %Expr{id: id}} = t, cache, positions) do
    case cache do
      %{^id => new} ->
        {new, cache}

      %{} ->
        {new, cache} = reparameter_node(t, cache, positions)
        {new, Map.put(cache, id, new)}
    end
  end

  defp reparameter(other, cache, _positions), do: {other, cache}

  defp reparameter_node(%T{data: %Expr{op: :elem, args: [tuple, i]}} = t, cache, positions) do
    case tuple do
      %T{data: %Expr{op: :parameter, args: [j]}} ->
        {:elements, first} = elem(positions, j)
        {Expr.parameter(t, first + i), cache}

      _ ->
        {tuple, cache} = reparameter(tuple, cache, positions)
        {put_in(t.data.args, [tuple, i]), cache}
    end
  end

  defp reparameter_node(%T{data: %Expr{op: :parameter, args: [j]}} = t, cache, positions) do
    case elem(positions, j) do
      {:tensor, position} ->
        {Expr.parameter(t, position), cache}

      {:elements, _} ->
        raise ArgumentError,
              "callbacks: :split: a stage uses a runtime_call's container result other " <>
                "than through its elements: #{inspect(t)}"
    end
  end

  # A function's parameters are its own (as are a while's block's, which :scope leaves).
  defp reparameter_node(%T{data: %Expr{op: :fun}} = t, cache, _positions), do: {t, cache}

  defp reparameter_node(t, cache, positions) do
    {args, cache} = Tree.apply_args(t, :scope, cache, &reparameter(&1, &2, positions))
    {put_in(t.data.args, args), cache}
  end

  # The stages Graph.split made for a callback output its runtime_call or hook itself.
  defp calls_back?(expr) do
    expr
    |> Tuple.to_list()
    |> Enum.any?(fn %T{data: %Expr{op: op}} -> op in [:runtime_call, :hook] end)
  end
end
