defmodule XlaNode.Compiler.Program do
  @moduledoc false

  # One compiled program on a node, as `XlaNode.Compiler`, `XlaNode.Compiler.Split` (each stage)
  # and `XlaNode.Backend` (each eager operation) use it: the key it is kept under in
  # `XlaNode.Compiler.Cache`, its compile, and the function that runs it with Nx's arguments.
  #
  # ## Keys
  #
  # A program is kept under `{function_key, arguments_key, node}`:
  #
  #   * `function_key/1` names the traced function (a closure with the values it captured);
  #   * `arguments_key/1` is the whole of the arguments as `Nx.Defn.Composite.traverse/2` gives
  #     them, each tensor replaced by its type, shape, names and vectorized axes: container kinds
  #     and keys, and the `keep:` fields of `Nx.Container` structs, are part of it, as in Nx's
  #     own compilers. The same tensors in a tuple and in a map, or in a struct whose kept field
  #     differs, are different programs (their results have another structure, or another
  #     computation);
  #   * the node, or for an `XlaNode.Pool` the pool's process (`stored_key/1`).
  #
  # ## Arguments
  #
  # Only the arguments the traced expression uses are parameters of the program: at a run, only
  # their functions (Nx hands the compiler one per tensor) are called and only their data is sent
  # to the node, as `Nx.Defn.Evaluator` reads only what it uses. An argument the expression does
  # not use may be a template (`Nx.template/3`), a lazy container's member that must not be
  # computed, or a large tensor the function ignores.

  require Logger

  alias Nx.Defn.{Composite, Expr, Tree}
  alias Nx.Tensor, as: T
  alias XlaNode.Backend.Transfer
  alias XlaNode.Compiler.{Cache, Callbacks, Lower}

  @typedoc "Where a program is kept: `{function_key, arguments_key, node or pool}`."
  @type key :: {term(), term(), node() | XlaNode.Pool.t()}

  @doc """
  The function Nx calls with the arguments (`[params]`, a list of one function per tensor) to
  run `fun` on `node`, from the cache under `key` (see `stored_key/1`) or lowered and compiled
  now.

  `opts` are the compiler's, with `:keep_on_device` decided: `:hooks`, `:callback_timeout`,
  `:queue_timeout`, `:priority`, `:timeout`, `:wait`, `:debug` (log the lowered module and how long lowering
  and compiling took, as `EXLA`'s `:debug` does) and `:inline_results` (results that stay on
  the node come back in the reply instead when they are small, `XlaNode.Backend.Transfer.inline?/1`). `info` is `XlaNode.Compiler.Cache.node_info/1`'s.

  The expression `fun` returns stays in this process: what the cache keeps, and the returned
  function captures (`Nx.Serving` runs it in other processes), are templates, the executable,
  the used arguments' positions and the callbacks' functions.
  """
  @spec runner(key(), [Nx.Container.t()], (list -> Nx.Container.t()), keyword(), map()) ::
          ([[(-> Nx.Tensor.t())]] -> [Nx.Container.t()])
  def runner({_, _, node} = key, vars, fun, opts, info) do
    stored_key = stored_key(key)
    debug? = Keyword.get(opts, :debug, false)

    %{exe: exe, callbacks: callbacks, outputs: outputs, used: used} =
      case Cache.get(stored_key) do
        nil ->
          compile!(stored_key, node, info, vars, fun, debug?)

        entry ->
          if debug?, do: Logger.debug("XlaNode.Compiler: #{inspect(key_of(stored_key))} cached")
          entry
      end

    hooks = Keyword.get(opts, :hooks, %{})

    keep? = Keyword.fetch!(opts, :keep_on_device)
    inline? = keep? and Keyword.get(opts, :inline_results, false)

    run_opts =
      opts
      |> Keyword.take([:callback_timeout, :queue_timeout, :wait, :priority])
      |> then(&if(device = opts[:device_id], do: [{:device, device} | &1], else: &1))
      |> Keyword.put(:keep_on_device, kept_results(keep?, inline?, outputs))
      |> Keyword.put(:telemetry_metadata, telemetry_metadata(stored_key))
      |> Keyword.merge(if keep?, do: Transfer.owner(), else: [])

    timeout = Keyword.get(opts, :timeout, :infinity)

    fn [params] ->
      args = params |> take_used(used) |> Enum.map(& &1.()) |> Transfer.args(node)
      results = run(node, exe, args, callbacks, hooks, run_opts, timeout)
      [from_client(results, outputs, node, inline?)]
    end
  end

  @doc """
  What a program's key holds of its arguments (a list, one entry per argument): each argument
  as `Nx.Defn.Composite.traverse/2` gives it, with every tensor as `{type, shape, names,
  vectorized_axes}`. Container kinds, map keys and the `keep:` fields of `Nx.Container`
  structs stay as they are.
  """
  @spec arguments_key([Nx.Container.t()]) :: [term()]
  def arguments_key(vars) when is_list(vars) do
    Enum.map(vars, fn var ->
      Composite.traverse(var, fn %T{} = t -> {t.type, t.shape, t.names, t.vectorized_axes} end)
    end)
  end

  @doc """
  The function Nx traced, as a program's key. A closure is compared with the values it
  captured, which go into ETS with the key, except for defn expressions (the stages of
  `Nx.Defn.Graph.run/3` capture theirs): an expression graph shares its nodes, which neither
  hashing nor copying a term preserves, so each goes as its id, which names it.
  """
  @spec function_key(function()) :: term()
  def function_key(fun) when is_function(fun) do
    case Function.info(fun, :env) do
      {:env, []} ->
        fun

      {:env, env} ->
        info = Function.info(fun)
        {:closure, info[:module], info[:new_uniq], info[:new_index], Enum.map(env, &key_term/1)}
    end
  end

  defp key_term(%T{data: %Expr{id: id}}), do: {Expr, id}

  # A tensor on a node stands for its buffer: the key must not hold its token (the cache would
  # keep the buffer for ever).
  defp key_term(%T{data: %XlaNode.Backend{token: token}} = tensor) when token != nil,
    do: put_in(tensor.data.token, nil)

  defp key_term(%T{} = tensor), do: tensor
  defp key_term(fun) when is_function(fun), do: function_key(fun)
  defp key_term(list) when is_list(list), do: key_list(list)

  defp key_term(tuple) when is_tuple(tuple),
    do: tuple |> Tuple.to_list() |> key_list() |> List.to_tuple()

  defp key_term(map) when is_map(map), do: :maps.map(fn _key, value -> key_term(value) end, map)
  defp key_term(other), do: other

  # Improper lists too.
  defp key_list([head | tail]), do: [key_term(head) | key_list(tail)]
  defp key_list([]), do: []
  defp key_list(tail), do: key_term(tail)

  @doc """
  The key a program for `{function_key, arguments_key, node}` is stored under in
  `XlaNode.Compiler.Cache`: the same, except that a pool's programs are kept per pool process
  (a pool restarted under the same name has none; the pool compiles its executable on each of
  its nodes itself).
  """
  @spec stored_key(key()) :: key()
  def stored_key({key, arguments, node}) do
    if XlaNode.Pool.pool?(node),
      do: {key, arguments, {XlaNode.Pool, GenServer.whereis(node)}},
      else: {key, arguments, node}
  end

  @doc """
  The positions (see `parameters/1`) of the root parameters `expr` (an expression or a container of them) uses, ascending, as `Nx.Defn.Tree`
  walks it: into `while` loops, `cond` branches, functions, hooks and `runtime_call`s. A block's
  default expression is written over parameters of its own (its arguments) and is not walked;
  its arguments are.
  """
  @spec used_parameters(Nx.Container.t()) :: [non_neg_integer()]
  def used_parameters(expr) do
    {_seen, used} = Composite.reduce(expr, {%{}, %{}}, &collect_parameters/2)
    used |> Map.keys() |> Enum.sort()
  end

  defp collect_parameters(%T{data: %Expr{id: id} = expr} = t, {seen, used} = acc) do
    cond do
      Map.has_key?(seen, id) ->
        acc

      expr.op == :parameter and expr.context == :root ->
        [i] = expr.args
        {Map.put(seen, id, true), Map.put(used, i, true)}

      expr.op == :block ->
        [_struct, in_args, _default, _fun] = expr.args

        in_args
        |> Enum.filter(&match?(%T{}, &1))
        |> Enum.reduce({Map.put(seen, id, true), used}, &collect_parameters/2)

      true ->
        {_args, acc} =
          Tree.apply_args(t, {Map.put(seen, id, true), used}, fn arg, acc ->
            {arg, collect_parameters(arg, acc)}
          end)

        acc
    end
  end

  # Tensors that are not expressions (constants captured as tensors) use no parameter.
  defp collect_parameters(_other, acc), do: acc

  @doc """
  The root parameters in `vars` (the arguments as Nx hands them to a compiler), in the order of
  their positions, which is the order of the functions Nx passes for them at a run. That is the
  order in which the arguments' `Nx.LazyContainer` implementations visit their tensors, not
  always `Nx.Defn.Composite.flatten_list/1`'s (a lazy container that returns a map visits its
  members in its own order; the map's keys are flattened sorted). Templates instead of
  parameters (a stage of `XlaNode.Compiler.Split`, whose expression numbers its parameters by
  its inputs) stand in flatten order.
  """
  @spec parameters([Nx.Container.t()]) :: [Nx.Tensor.t()]
  def parameters(vars) do
    flat = Composite.flatten_list(vars)

    if Enum.all?(flat, &match?(%T{data: %Expr{op: :parameter}}, &1)),
      do: Enum.sort_by(flat, fn %T{data: %Expr{args: [i]}} -> i end),
      else: flat
  end

  @doc """
  The entries of `arguments` (one per parameter, in the order of `parameters/1`) at the
  positions `used` (a program's `:used`, from `used_parameters/1`): what a run of the
  program takes.
  """
  @spec take_used([term()], [non_neg_integer()]) :: [term()]
  # `used` holds distinct positions: as many as the arguments, it names every one.
  def take_used(arguments, used) when length(arguments) == length(used), do: arguments

  def take_used(arguments, used) do
    used_set = MapSet.new(used)

    arguments
    |> Enum.with_index()
    |> Enum.flat_map(fn {argument, i} ->
      if MapSet.member?(used_set, i), do: [argument], else: []
    end)
  end

  defp compile!(stored_key, node, info, vars, fun, debug?) do
    {lower_us, {text, callbacks, outputs, used}} =
      :timer.tc(fn ->
        {output, outputs} = outputs(vars, fun)
        used = used_parameters(output)
        parameters = vars |> parameters() |> only_used(used)
        target = %{node: node, platform: info.platform}

        %{text: text, callbacks: callbacks} =
          Lower.module(parameters, Composite.flatten_list([output]), target)

        {text, callbacks, outputs, used}
      end)

    if callbacks != %{} and not info.host_callbacks do
      raise ArgumentError,
            "XlaNode.Compiler: #{node}'s platform (#{info.platform}) cannot run host callbacks " <>
              "inside a program. callbacks: :split (the default there) runs them between " <>
              "programs, but cannot cut inside a while or cond: move the runtime_call or hook " <>
              "out of it"
    end

    {compile_us, entry} =
      :timer.tc(fn ->
        Cache.compile!(
          stored_key,
          node,
          text,
          %{callbacks: callbacks, outputs: outputs, used: used},
          telemetry_metadata: telemetry_metadata(stored_key)
        )
      end)

    if debug? do
      Logger.debug(
        "XlaNode.Compiler: #{inspect(key_of(stored_key))} lowered in #{ms(lower_us)}ms, " <>
          "compiled on #{inspect(node)} in #{ms(compile_us)}ms; the module:\n" <> text
      )
    end

    entry
  end

  defp key_of({key, _arguments, _node}), do: key
  defp ms(microseconds), do: Float.round(microseconds / 1000, 1)

  # The parameters as `Lower.module/3` takes them: `nil` where the expression does not use one.
  defp only_used(parameters, used) do
    used_set = MapSet.new(used)

    Enum.with_index(parameters, fn parameter, i ->
      if MapSet.member?(used_set, i), do: parameter
    end)
  end

  # What the client's :telemetry events of this compiler's compiles and runs carry besides their
  # own: the compiler, and the function's key (a split stage's is {{:split, key, arguments_key},
  # stage index}).
  defp telemetry_metadata({key, _arguments, _node}),
    do: %{compiler: XlaNode.Compiler, key: key}

  @doc """
  The traced expression, devectorized for lowering, and the templates of the result: its
  structure with each tensor's template, then each devectorized output's template.
  """
  def outputs(vars, fun) do
    output = fun.(vars)

    {devectorized, templates} =
      Composite.traverse(output, [], fn t, acc ->
        t = Nx.devectorize(t)
        {t, [Nx.to_template(t) | acc]}
      end)

    {devectorized, {Composite.traverse(output, &Nx.to_template/1), Enum.reverse(templates)}}
  end

  defp run(node, exe, args, callbacks, hooks, run_opts, timeout) do
    if callbacks == %{} do
      Transfer.run!(node, exe, args, Keyword.put(run_opts, :timeout, timeout))
    else
      # A callback that fails tells this process how (Callbacks.handlers/3), which then fails
      # as the callback did, as under Nx.Defn.Evaluator.
      report_to = :erlang.alias()
      handlers = Callbacks.handlers(callbacks, hooks, report_to)
      {:ok, server} = XlaNode.CallbackServer.start_link(handlers)

      try do
        Transfer.run!(node, exe, args, run_opts ++ [callback_server: server, timeout: timeout])
      rescue
        error in XlaNode.Error -> Callbacks.raise_failure(report_to, error, __STACKTRACE__)
      after
        Process.unlink(server)
        Process.exit(server, :shutdown)
        Callbacks.close(report_to)
      end
    end
  end

  @doc """
  Which results a run keeps on the node when its tensors are to be `XlaNode.Backend`'s (`keep?`):
  all, or with `inline?` all but the small ones (`Transfer.inline?/1`), which come back in the
  run's reply and stay here, so that reading a loss needs no request of its own. `outputs` are
  `{structure, templates}`, the templates of the results as the node gives them.
  """
  def kept_results(false, _inline?, _outputs), do: false
  def kept_results(true, false, _outputs), do: true

  def kept_results(true, true, {_structure, templates}) do
    kept = for {t, i} <- Enum.with_index(templates), not Transfer.inline?(t), do: i
    if length(kept) == length(templates), do: true, else: kept
  end

  @doc """
  A run's results (tensors, inline `XlaNode.Backend` ones where the rest stay on the node, or
  buffers) as the output container: `structure` with each tensor made from the template at its
  place in `templates`.
  """
  def from_client(results, {structure, templates}, node, inline?) do
    # The buffers kept are tracked together: one message to the keeper.
    kept = Transfer.data(node, Enum.filter(results, &is_reference/1))

    {tensors, []} =
      Enum.zip(results, templates)
      |> Enum.map_reduce(kept, fn
        {{data, _}, template}, kept when inline? ->
          {Transfer.inline(template, node, data), kept}

        {{data, _}, template}, kept ->
          {Transfer.host_tensor(template, data), kept}

        {buffer, template}, [data | kept] when is_reference(buffer) ->
          {%{template | data: data}, kept}
      end)

    {result, []} =
      Composite.traverse(structure, tensors, fn %T{} = out, [t | rest] ->
        t = if out.vectorized_axes == [], do: t, else: Nx.vectorize(t, out.vectorized_axes)
        {t, rest}
      end)

    result
  end
end
