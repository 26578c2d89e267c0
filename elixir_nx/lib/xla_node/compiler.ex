defmodule XlaNode.Compiler do
  @moduledoc """
  An `Nx.Defn.Compiler` that runs `defn` on an xla_node compute node.

      Nx.Defn.jit(&MyModel.predict/2, compiler: XlaNode.Compiler, node: :"xla@gpu1").(params, x)

  The expression is lowered to StableHLO in Elixir (see `XlaNode.Compiler.Lower`), compiled on
  the node and run there; the caller's node needs no NIF, no XLA and no C compiler. Compiled
  programs are kept per (function, argument templates, node) by `XlaNode.Compiler.Cache`: a
  second call with the same shapes lowers and compiles nothing, new shapes compile anew. `Nx.runtime_call/4` callbacks and hooks (`print_value`,
  `hook/3`) run on the caller's node, in a callback server started for each call, while the
  program runs on the compute node.

  ## Options

    * `:node` - the compute node (required)
    * `:callback_timeout` - how long the node waits for each callback, in milliseconds
      (default: the node's `--callback-timeout`)
    * `:callbacks` - `:inside`: `runtime_call`s and hooks run as custom calls inside the
      program; `:split`: the program is cut at each of them, the pieces run on the node with
      their results kept there, and the callbacks run on this node between them (see
      `XlaNode.Compiler.Split`). Default: `:inside` where the node's platform can run host
      callbacks (CPU; `:info`'s `host_callbacks`), `:split` elsewhere
    * `:keep_on_device` - return tensors whose data stays on the node (see `XlaNode.Backend`),
      to pass into the next call without moving them (default `false`)
    * `:hooks` - a map of hook names to functions, overriding the hooks of the expression
    * `:timeout` - how long to wait for the run's result (default `:infinity`)

  ## Telemetry

  Its compiles and runs are the client's `XlaNode.compile/3` and `XlaNode.run/4`, whose
  `[:xla_node, :compile | :run, :start | :stop | :exception]` spans (see `XlaNode.Telemetry`)
  carry `compiler: XlaNode.Compiler` and `key`, the function's key as `Nx.Defn` gives it (for a
  stage of `callbacks: :split`, `{key, stage_index}`). A compile happens once per function,
  argument templates and node, in the `XlaNode.Compiler.Cache` process; its span covers the
  node's compile, not the lowering to StableHLO before it. Callbacks and hooks are
  `[:xla_node, :callback, ...]` spans, in the process that runs each.
  """

  @behaviour Nx.Defn.Compiler

  alias Nx.Defn.Composite
  alias XlaNode.Compiler.{Cache, Lower}

  @impl true
  def __partitions_options__(opts), do: [opts]

  @impl true
  def __to_backend__(_opts), do: {Nx.BinaryBackend, []}

  @impl true
  def __jit__(key, vars, fun, args_list, opts) do
    __compile__(key, vars, fun, opts).(args_list)
  end

  @impl true
  def __compile__(key, vars, fun, opts) do
    node = node!(opts)

    info = Cache.node_info(node)

    case Keyword.get_lazy(opts, :callbacks, fn -> default_callbacks(info) end) do
      :inside ->
        compile_inside(key, vars, fun, opts, node, info)

      :split ->
        XlaNode.Compiler.Split.compile(key, vars, fun, opts)

      other ->
        raise ArgumentError,
              "XlaNode.Compiler: :callbacks must be :inside or :split, got #{inspect(other)}"
    end
  end

  # Callbacks inside the program need a platform whose programs can call the node's host
  # handlers (CPU); elsewhere the program is cut at them.
  defp default_callbacks(%{host_callbacks: true}), do: :inside
  defp default_callbacks(_info), do: :split

  defp compile_inside(key, vars, fun, opts, node, info) do
    templates =
      vars
      |> Composite.flatten_list()
      |> Enum.map(&{&1.type, &1.shape, &1.names, &1.vectorized_axes})

    # Split stages are compiled from fresh closures every call: they bring a stable key.
    cache_key = {Keyword.get(opts, :stage_key, key), templates, node}

    %{exe: exe, callbacks: callbacks, outputs: outputs} =
      Cache.get(cache_key) || compile!(cache_key, node, info, vars, fun)

    hooks = Keyword.get(opts, :hooks, %{})

    run_opts =
      opts
      |> Keyword.take([:callback_timeout, :keep_on_device])
      |> Keyword.put(:telemetry_metadata, telemetry_metadata(cache_key))

    timeout = Keyword.get(opts, :timeout, :infinity)

    fn [params] ->
      args = Enum.map(params, &to_client(&1.(), node))
      results = run(node, exe, args, callbacks, hooks, run_opts, timeout)
      [from_client(results, outputs, node)]
    end
  end

  defp compile!(cache_key, node, info, vars, fun) do
    {outputs, output_templates} = outputs(vars, fun)
    target = %{node: node, platform: info.platform}

    %{text: text, callbacks: callbacks} =
      Lower.module(Composite.flatten_list(vars), Composite.flatten_list([outputs]), target)

    if callbacks != %{} and not info.host_callbacks do
      raise ArgumentError,
            "XlaNode.Compiler: #{node}'s platform (#{info.platform}) cannot run host callbacks " <>
              "inside a program. callbacks: :split (the default there) runs them between " <>
              "programs, but cannot cut inside a while or cond: move the runtime_call or hook " <>
              "out of it"
    end

    Cache.compile!(cache_key, node, text, %{callbacks: callbacks, outputs: output_templates},
      telemetry_metadata: telemetry_metadata(cache_key)
    )
  end

  # What the client's :telemetry events of this compiler's compiles and runs carry besides their
  # own: the compiler, and the function's key (a split stage's is {key, stage index}).
  defp telemetry_metadata({key, _templates, _node}), do: %{compiler: __MODULE__, key: key}

  defp node!(opts) do
    case Keyword.fetch(opts, :node) do
      {:ok, node} when is_atom(node) and node != nil ->
        node

      {:ok, other} ->
        raise ArgumentError,
              "XlaNode.Compiler: :node must be a node name (an atom), got #{inspect(other)}"

      :error ->
        raise ArgumentError, "XlaNode.Compiler needs the compute node: pass node: :\"xla@host\""
    end
  end

  defp outputs(vars, fun) do
    output = fun.(vars)

    {devectorized, templates} =
      Composite.traverse(output, [], fn t, acc ->
        t = Nx.devectorize(t)
        {t, [Nx.to_template(t) | acc]}
      end)

    {devectorized, {output, Enum.reverse(templates)}}
  end

  defp run(node, exe, args, callbacks, hooks, run_opts, timeout) do
    if callbacks == %{} do
      XlaNode.run(node, exe, args, Keyword.put(run_opts, :timeout, timeout)) |> result!()
    else
      {:ok, server} =
        XlaNode.CallbackServer.start_link(XlaNode.Compiler.Callbacks.handlers(callbacks, hooks))

      try do
        XlaNode.run(node, exe, args, run_opts ++ [callback_server: server, timeout: timeout])
        |> result!()
      after
        Process.unlink(server)
        Process.exit(server, :shutdown)
      end
    end
  end

  defp result!({:ok, results}), do: results
  defp result!({:error, error}), do: raise(error)

  # A tensor kept on this node goes as its buffer; any other as its data.
  defp to_client(%Nx.Tensor{data: %XlaNode.Backend{node: node, buffer: buffer}}, node), do: buffer

  defp to_client(%Nx.Tensor{} = t, _node) do
    t = Nx.devectorize(t)
    {Nx.to_binary(t), {t.type, Tuple.to_list(t.shape)}}
  end

  # Results come as tensors, or as buffers with keep_on_device: true.
  defp from_client(results, {output, templates}, node) do
    tensors =
      Enum.zip_with(results, templates, fn
        {bin, _}, template ->
          bin
          |> Nx.from_binary(template.type)
          |> Nx.reshape(template.shape, names: template.names)

        buffer, template when is_reference(buffer) ->
          %{template | data: %XlaNode.Backend{node: node, buffer: buffer}}
      end)

    {result, []} =
      Composite.traverse(output, tensors, fn %Nx.Tensor{} = out, [t | rest] ->
        t = if out.vectorized_axes == [], do: t, else: Nx.vectorize(t, out.vectorized_axes)
        {t, rest}
      end)

    result
  end
end
