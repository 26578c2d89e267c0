defmodule XlaNode.Compiler.Shard do
  @moduledoc false

  # `Nx.Defn.shard_jit/3` with `XlaNode.Compiler`: one SPMD program over the devices of an
  # `Nx.Mesh`, compiled once on the node (`XlaNode.compile/3`'s `devices:`) and run with one
  # argument list per device.
  #
  # Each argument list holds a device's *shard* of each argument, as under EXLA; the program is
  # written over the whole tensors (each shard's shape times the devices its dimensions are split
  # over), with an `mhlo.sharding` on each parameter of `@main` saying how (GSPMD's notation), and
  # `mhlo.num_partitions` on the module. The mesh's devices, in row-major order, are partitions
  # `0..n-1`, on the node's devices `device_id..device_id + n - 1` (`device_id` defaults to 0, as
  # EXLA puts a mesh on devices `0..n-1`). A dimension split over several mesh axes is split over
  # them major to minor, in the order the sharding lists them; the mesh axes an argument does not
  # use hold copies of it (partial replication).
  #
  # The results' shardings are left to XLA's partitioner, as EXLA leaves them: each device's
  # result is its shard of each output, with the shape the node's `XlaNode.describe/3` gives
  # for the compiled program (whole on every device for a replicated output).

  alias Nx.Defn.Composite
  alias Nx.Tensor, as: T
  alias XlaNode.Backend.Transfer
  alias XlaNode.Compiler.{Cache, Lower, Program}

  @doc """
  Compiles (or takes from the cache) and runs `fun` over `mesh`, `vars` being the first
  partition's parameters and `args_list` one list of argument functions per partition, as
  `Nx.Defn.Compiler.__shard_jit__/6` gives them. `opts` are the compiler's, with `:node` a
  node (not a pool), `:keep_on_device` decided and `:input_shardings` as `Nx.Defn.shard_jit/3`
  takes them. Returns one result per partition.
  """
  def run(key, %Nx.Mesh{} = mesh, vars, fun, args_list, opts) do
    node = Keyword.fetch!(opts, :node)
    mesh_shape = mesh_shape!(mesh)
    partitions = Enum.reduce(mesh_shape, 1, &(&1 * &2))
    first_device = Keyword.get(opts, :device_id, 0)

    if length(args_list) != partitions do
      raise ArgumentError,
            "shard_jit takes one argument list per device of the mesh #{inspect(mesh.shape)} " <>
              "(#{partitions}), got #{length(args_list)}"
    end

    # Kept under the shardings as given: they are checked, and each dimension's mesh axes
    # worked out, when the program is compiled, not at every call.
    input_shardings = Keyword.get(opts, :input_shardings)

    stored_key =
      {{:shard, Program.function_key(key), mesh_shape, input_shardings, first_device},
       Program.arguments_key(vars), node}

    entry =
      Cache.get(stored_key) ||
        compile!(stored_key, node, mesh, vars, fun, input_shardings, first_device, key)

    run_compiled(entry, node, args_list, opts, key)
  end

  def run(_key, mesh, _vars, _fun, _args_list, _opts) do
    raise ArgumentError, "shard_jit takes an %Nx.Mesh{} as its mesh, got: #{inspect(mesh)}"
  end

  ## Shardings

  defp mesh_shape!(%Nx.Mesh{shape: shape} = mesh) do
    sizes = if is_tuple(shape), do: Tuple.to_list(shape), else: nil

    unless sizes != nil and sizes != [] and Enum.all?(sizes, &(is_integer(&1) and &1 > 0)) do
      raise ArgumentError,
            "the mesh's shape must be a tuple of positive integers, got: #{inspect(mesh.shape)}"
    end

    sizes
  end

  # One entry per argument: for each of its dimensions, the mesh axes it is split over.
  defp shardings!(input_shardings, vars, mesh_shape) when is_list(input_shardings) do
    if length(input_shardings) != length(vars) do
      raise ArgumentError,
            "expected #{length(vars)} input sharding(s), one per argument, got " <>
              "#{length(input_shardings)}"
    end

    axes = length(mesh_shape)

    Enum.zip_with([input_shardings, vars, Enum.to_list(0..(length(vars) - 1)//1)], fn
      [sharding, var, i] when is_map(sharding) ->
        tensor_shardings(sharding, var, i, axes)

      [sharding, _var, i] ->
        raise ArgumentError,
              "the input sharding of argument #{i} must be a map of %{dimension => [mesh " <>
                "axes]}, got: #{inspect(sharding)}"
    end)
  end

  defp shardings!(other, _vars, _mesh_shape) do
    raise ArgumentError,
          "shard_jit with XlaNode.Compiler needs input_shardings: a list with one map per " <>
            "argument, %{dimension => [mesh axes]} (dimensions not named are whole on every " <>
            "device), got: #{inspect(other)}"
  end

  # The same sharding holds for every tensor of a container argument: one entry per tensor, in
  # `Nx.Defn.Composite.flatten_list/1`'s order.
  defp tensor_shardings(sharding, var, i, axes) do
    [var]
    |> Composite.flatten_list()
    |> Enum.map(&dimension_axes(sharding, &1, i, axes))
  end

  defp dimension_axes(sharding, %T{} = tensor, i, axes) do
    by_dimension =
      Enum.reduce(sharding, %{}, fn {dimension, mesh_axes}, acc ->
        index = Nx.axis_index(tensor, dimension)

        if Map.has_key?(acc, index) do
          raise ArgumentError,
                "the input sharding of argument #{i} names dimension #{index} twice " <>
                  "(as #{inspect(dimension)})"
        end

        unless is_list(mesh_axes) do
          raise ArgumentError,
                "the input sharding of argument #{i}: dimension #{inspect(dimension)} must map " <>
                  "to a list of mesh axes, got: #{inspect(mesh_axes)}"
        end

        Map.put(acc, index, mesh_axes)
      end)

    used = by_dimension |> Map.values() |> List.flatten()

    for axis <- used do
      unless is_integer(axis) and axis >= 0 and axis < axes do
        raise ArgumentError,
              "the input sharding of argument #{i} names mesh axis #{inspect(axis)}, but the " <>
                "mesh has #{axes} axes (0..#{axes - 1})"
      end
    end

    if twice = used |> Enum.frequencies() |> Enum.find_value(fn {a, n} -> n > 1 and a end) do
      raise ArgumentError,
            "the input sharding of argument #{i} uses mesh axis #{twice} twice: an axis splits " <>
              "one dimension at most"
    end

    for dimension <- 0..(tuple_size(tensor.shape) - 1)//1,
        do: Map.get(by_dimension, dimension, [])
  end

  @doc """
  GSPMD's `mhlo.sharding` text for a tensor whose dimension `i` is split over the mesh axes
  `Enum.at(dimension_axes, i)` of a mesh of `mesh_shape` (a list), its devices numbered
  row-major: `"{replicated}"`, `"{devices=[2,2]0,1,2,3}"`, or with the unused axes' copies last,
  `"{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"`.

      iex> XlaNode.Compiler.Shard.gspmd_sharding([[0], [1]], [2, 2])
      "{devices=[2,2]0,1,2,3}"
      iex> XlaNode.Compiler.Shard.gspmd_sharding([[1], []], [2, 2])
      "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}"
      iex> XlaNode.Compiler.Shard.gspmd_sharding([[], []], [4])
      "{replicated}"
  """
  def gspmd_sharding(dimension_axes, mesh_shape) do
    used = List.flatten(dimension_axes)
    unused = Enum.to_list(0..(length(mesh_shape) - 1)) -- used
    size = &Enum.reduce(&1, 1, fn axis, acc -> acc * Enum.at(mesh_shape, axis) end)
    tiles = Enum.map(dimension_axes, size)
    copies = size.(unused)

    if used == [] do
      "{replicated}"
    else
      # The device ids in the order of the tiles: the mesh's axes permuted to the order the
      # dimensions use them, the unused ones last.
      ids = Enum.join(permuted_devices(mesh_shape, used ++ unused), ",")

      if copies == 1,
        do: "{devices=[#{Enum.join(tiles, ",")}]#{ids}}",
        else: "{devices=[#{Enum.join(tiles ++ [copies], ",")}]#{ids} last_tile_dim_replicate}"
    end
  end

  # The row-major device ids of a mesh, read with its axes in the order `permutation` gives.
  defp permuted_devices(mesh_shape, permutation) do
    strides =
      mesh_shape
      |> Enum.reverse()
      |> Enum.map_reduce(1, fn size, stride -> {stride, stride * size} end)
      |> elem(0)
      |> Enum.reverse()

    permutation
    |> Enum.map(&{Enum.at(mesh_shape, &1), Enum.at(strides, &1)})
    |> Enum.reduce([0], fn {size, stride}, ids ->
      for id <- ids, k <- 0..(size - 1), do: id + k * stride
    end)
  end

  ## Compile

  defp compile!(stored_key, node, mesh, vars, fun, input_shardings, first_device, key) do
    mesh_shape = Tuple.to_list(mesh.shape)
    shardings = shardings!(input_shardings, vars, mesh_shape)
    partitions = Enum.reduce(mesh_shape, 1, &(&1 * &2))
    devices = Enum.to_list(first_device..(first_device + partitions - 1)//1)
    {:ok, %{devices: node_devices}} = ok!(XlaNode.info(node))
    last = List.last(devices)

    if last >= length(node_devices) do
      raise ArgumentError,
            "the mesh #{inspect(mesh.shape)} needs #{length(devices)} devices (from device " <>
              "#{hd(devices)}), but #{inspect(node)} has #{length(node_devices)}"
    end

    whole_vars = whole(vars, shardings, mesh_shape)
    {output, outputs} = Program.outputs(whole_vars, fun)

    if Lower.has_op?(Composite.flatten_list([output]), [:runtime_call, :hook]) do
      raise ArgumentError,
            "shard_jit with XlaNode.Compiler: an SPMD program cannot call back to this node " <>
              "(runtime_call, hooks, print_value): move them out of the sharded function"
    end

    used = Program.used_parameters(output)
    used_set = MapSet.new(used)

    {parameters, attributes} =
      whole_vars
      |> parameter_shardings(shardings)
      |> Enum.with_index(fn {parameter, dimension_axes}, i ->
        if MapSet.member?(used_set, i),
          do:
            {parameter, [{"mhlo.sharding", ~s("#{gspmd_sharding(dimension_axes, mesh_shape)}")}]},
          else: {nil, nil}
      end)
      |> Enum.unzip()

    info = Cache.node_info(node)

    %{text: text} =
      Lower.module(
        parameters,
        Composite.flatten_list([output]),
        %{node: node, platform: info.platform},
        parameter_attributes: attributes,
        module_attributes: [
          {"mhlo.num_partitions", "#{length(devices)} : i32"},
          {"mhlo.num_replicas", "1 : i32"}
        ]
      )

    Cache.compile!(stored_key, node, text, %{outputs: outputs, used: used},
      devices: devices,
      describe: true,
      telemetry_metadata: %{compiler: XlaNode.Compiler, key: key}
    )
  end

  defp ok!({:ok, _} = ok), do: ok
  defp ok!({:error, error}), do: raise(error)

  # The arguments as whole tensors: each shard's dimensions times the devices they are split over.
  defp whole(vars, shardings, mesh_shape) do
    Enum.zip_with(vars, shardings, fn var, tensor_shardings ->
      {var, []} =
        Composite.traverse(var, tensor_shardings, fn %T{shape: shape} = t, [axes | rest] ->
          sizes =
            Enum.map(axes, fn axes -> Enum.reduce(axes, 1, &(Enum.at(mesh_shape, &1) * &2)) end)

          shape = shape |> Tuple.to_list() |> Enum.zip_with(sizes, &*/2) |> List.to_tuple()
          {%{t | shape: shape}, rest}
        end)

      var
    end)
  end

  # Each parameter (in the order of `Program.parameters/1`) with its dimensions' mesh axes.
  defp parameter_shardings(vars, shardings) do
    by_position =
      Enum.zip_with(vars, shardings, fn var, tensor_shardings ->
        Enum.zip_with(Composite.flatten_list([var]), tensor_shardings, fn
          %T{data: %Nx.Defn.Expr{args: [i]}}, axes -> {i, axes}
        end)
      end)
      |> List.flatten()
      |> Map.new()

    for %T{data: %Nx.Defn.Expr{args: [i]}} = parameter <- Program.parameters(vars),
        do: {parameter, Map.fetch!(by_position, i)}
  end

  ## Run

  defp run_compiled(entry, node, args_list, opts, key) do
    %{exe: exe, outputs: {structure, _whole}, used: used, description: description} = entry
    templates = shard_templates(entry.outputs, description.results)

    keep? = Keyword.fetch!(opts, :keep_on_device)
    inline? = keep? and Keyword.get(opts, :inline_results, false)

    run_opts =
      opts
      |> Keyword.take([:queue_timeout, :wait, :timeout, :priority])
      |> Keyword.put(
        :keep_on_device,
        Program.kept_results(keep?, inline?, {structure, templates})
      )
      |> Keyword.put(:telemetry_metadata, %{compiler: XlaNode.Compiler, key: key})
      |> Keyword.merge(if keep?, do: Transfer.owner(), else: [])

    args =
      args_list
      |> Enum.with_index()
      |> Enum.map(fn {params, partition} ->
        params
        |> Program.take_used(used)
        |> Enum.map(& &1.())
        |> check_shards!(description.parameters, partition)
        |> Transfer.args(node)
      end)

    node
    |> Transfer.run!(exe, args, run_opts)
    |> Enum.map(&Program.from_client(&1, {structure, templates}, node, inline?))
  end

  # The output templates with each result's shape as the node's partitioned program gives it.
  defp shard_templates({_structure, templates}, results) do
    Enum.zip_with(templates, results, fn template, {_type, dims} ->
      %{template | shape: List.to_tuple(dims)}
    end)
  end

  # Every partition's shards must have the shapes the program was compiled for (the first
  # partition's).
  defp check_shards!(tensors, parameters, partition) do
    Enum.zip_with(tensors, parameters, fn %T{} = t, {type, dims} ->
      if t.type == type and Tuple.to_list(t.shape) == dims,
        do: t,
        else: mismatch!(t, type, dims, partition)
    end)
  end

  defp mismatch!(t, type, dims, partition) do
    raise ArgumentError,
          "shard_jit: partition #{partition} gives a shard of type #{inspect(t.type)} and shape " <>
            "#{inspect(t.shape)} where the program, compiled for partition 0's shards, takes " <>
            "#{inspect(type)} of shape #{inspect(List.to_tuple(dims))}: every partition's " <>
            "shards must have the same shapes"
  end
end
