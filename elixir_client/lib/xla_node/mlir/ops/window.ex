defmodule XlaNode.MLIR.Ops.Window do
  @moduledoc false
  # Ops with dimension numbers: gather, scatter, reduce_window, select_and_scatter, convolution.
  # XlaNode.MLIR documents them and delegates here; see XlaNode.MLIR.Ops.Common for what the
  # families share.

  import XlaNode.MLIR.Ops.Common

  alias XlaNode.MLIR.{Attribute, CPUFaults}

  ## Gather, scatter, windows, convolution

  def gather(operand, indices, slice_sizes, opts) do
    opts =
      options!(opts, "gather/4",
        offset_dims: :integers,
        collapsed_slice_dims: :integers,
        start_index_map: :integers,
        index_vector_dim: :non_neg_integer,
        operand_batching_dims: :integers,
        start_indices_batching_dims: :integers,
        indices_are_sorted: :boolean
      )

    [operand, indices] = Enum.map([operand, indices], &value!("stablehlo.gather", &1))
    {elem, dims} = operand.type
    {ielem, idims} = indices.type
    offset_dims = Keyword.fetch!(opts, :offset_dims)
    collapsed = Keyword.get(opts, :collapsed_slice_dims, [])
    start_index_map = Keyword.fetch!(opts, :start_index_map)
    index_vector_dim = Keyword.get(opts, :index_vector_dim, length(idims) - 1)
    operand_batching = Keyword.get(opts, :operand_batching_dims, [])
    indices_batching = Keyword.get(opts, :start_indices_batching_dims, [])

    batch_dims =
      idims
      |> Enum.with_index()
      |> Enum.reject(fn {_, i} -> i == index_vector_dim end)
      |> Enum.map(&elem(&1, 0))

    offsets =
      for {s, i} <- Enum.with_index(slice_sizes),
          i not in collapsed and i not in operand_batching,
          do: s

    ok =
      category(ielem) in [:signed, :unsigned] and length(slice_sizes) == length(dims) and
        Enum.all?(Enum.zip(slice_sizes, dims), fn {s, d} -> s <= d end) and
        length(offsets) == length(offset_dims) and
        Enum.all?(collapsed ++ operand_batching, &(Enum.at(slice_sizes, &1) in [0, 1]))

    unless ok do
      mismatch!(
        "stablehlo.gather",
        [operand, indices],
        "integer indices and slice_sizes #{inspect(slice_sizes)} that fit the operand, one per offset dimension once collapsed"
      )
    end

    rank = length(batch_dims) + length(offsets)

    {out, _, _} =
      Enum.reduce(0..(rank - 1)//1, {[], batch_dims, offsets}, fn i, {acc, batch, offs} ->
        if i in offset_dims,
          do: {[hd(offs) | acc], batch, tl(offs)},
          else: {[hd(batch) | acc], tl(batch), offs}
      end)

    numbers =
      ["offset_dims = #{i64_list(offset_dims)}", "collapsed_slice_dims = #{i64_list(collapsed)}"] ++
        if(operand_batching == [],
          do: [],
          else: [
            "operand_batching_dims = #{i64_list(operand_batching)}",
            "start_indices_batching_dims = #{i64_list(indices_batching)}"
          ]
        ) ++
        [
          "start_index_map = #{i64_list(start_index_map)}",
          "index_vector_dim = #{index_vector_dim}"
        ]

    emit1("stablehlo.gather", [operand, indices], {elem, Enum.reverse(out)}, [
      "dimension_numbers = #stablehlo.gather<#{Enum.join(numbers, ", ")}>",
      "slice_sizes = #{i64_array(slice_sizes)}",
      "indices_are_sorted = #{Keyword.get(opts, :indices_are_sorted, false)}"
    ])
  end

  def scatter(inputs, indices, updates, fun, opts) do
    opts =
      options!(opts, "scatter/5",
        update_window_dims: :integers,
        inserted_window_dims: :integers,
        scatter_dims_to_operand_dims: :integers,
        index_vector_dim: :non_neg_integer,
        input_batching_dims: :integers,
        scatter_indices_batching_dims: :integers,
        indices_are_sorted: :boolean,
        unique_indices: :boolean
      )

    inputs = Enum.map(List.wrap(inputs), &value!("stablehlo.scatter", &1))
    updates = Enum.map(List.wrap(updates), &value!("stablehlo.scatter", &1))
    indices = value!("stablehlo.scatter", indices)
    {ielem, idims} = indices.type
    scalars = Enum.map(inputs, fn %{type: {e, _}} -> {e, []} end)

    unless category(ielem) in [:signed, :unsigned] and length(inputs) == length(updates) and
             Enum.map(updates, fn %{type: {e, _}} -> {e, []} end) == scalars do
      mismatch!(
        "stablehlo.scatter",
        inputs ++ [indices | updates],
        "integer indices and one update per input, of its element type"
      )
    end

    body = region!("stablehlo.scatter", "the region", scalars ++ scalars, scalars, fun)

    batching = Keyword.get(opts, :input_batching_dims, [])

    numbers =
      [
        "update_window_dims = #{i64_list(Keyword.fetch!(opts, :update_window_dims))}",
        "inserted_window_dims = #{i64_list(Keyword.get(opts, :inserted_window_dims, []))}"
      ] ++
        if(batching == [],
          do: [],
          else: [
            "input_batching_dims = #{i64_list(batching)}",
            "scatter_indices_batching_dims = #{i64_list(Keyword.get(opts, :scatter_indices_batching_dims, []))}"
          ]
        ) ++
        [
          "scatter_dims_to_operand_dims = #{i64_list(Keyword.fetch!(opts, :scatter_dims_to_operand_dims))}",
          "index_vector_dim = #{Keyword.get(opts, :index_vector_dim, length(idims) - 1)}"
        ]

    results =
      emit(
        "stablehlo.scatter",
        inputs ++ [indices | updates],
        Enum.map(inputs, & &1.type),
        [
          "scatter_dimension_numbers = #stablehlo.scatter<#{Enum.join(numbers, ", ")}>",
          "indices_are_sorted = #{Keyword.get(opts, :indices_are_sorted, false)}",
          "unique_indices = #{Keyword.get(opts, :unique_indices, false)}"
        ],
        [body]
      )

    one_or_list(results)
  end

  def reduce_window(operands, inits, window, fun, opts \\ []) do
    opts =
      options!(opts, "reduce_window/5",
        strides: :integers,
        base_dilations: :integers,
        window_dilations: :integers,
        padding: :integer_pairs
      )

    operands = Enum.map(List.wrap(operands), &value!("stablehlo.reduce_window", &1))
    inits = Enum.map(List.wrap(inits), &value!("stablehlo.reduce_window", &1))
    [{_, dims} | _] = Enum.map(operands, & &1.type)
    scalars = Enum.map(operands, fn %{type: {e, _}} -> {e, []} end)

    unless length(inits) == length(operands) and
             Enum.all?(operands, fn %{type: {_, d}} -> d == dims end) and
             Enum.map(inits, & &1.type) == scalars and length(window) == length(dims) do
      mismatch!(
        "stablehlo.reduce_window",
        operands ++ inits,
        "operands of one shape, a scalar init of each one's element type and a window of rank #{length(dims)}"
      )
    end

    w = window_options(dims, opts)
    body = region!("stablehlo.reduce_window", "the region", scalars ++ scalars, scalars, fun)

    out = windowed_dims(dims, window, w)

    results =
      emit(
        "stablehlo.reduce_window",
        operands ++ inits,
        Enum.map(scalars, fn {e, []} -> {e, out} end),
        [
          "window_dimensions = #{i64_array(window)}",
          "window_strides = #{i64_array(w.strides)}",
          "base_dilations = #{i64_array(w.base)}",
          "window_dilations = #{i64_array(w.dilations)}",
          "padding = #{padding_attr(w.padding)}"
        ],
        [body]
      )

    one_or_list(results)
  end

  def select_and_scatter(operand, source, init, window, select, scatter, opts \\ []) do
    opts = options!(opts, "select_and_scatter/7", strides: :integers, padding: :integer_pairs)

    [operand, source, init] =
      Enum.map([operand, source, init], &value!("stablehlo.select_and_scatter", &1))

    {elem, dims} = operand.type
    w = window_options(dims, opts)
    out = windowed_dims(dims, window, w)

    unless source.type == {elem, out} and init.type == {elem, []} do
      mismatch!(
        "stablehlo.select_and_scatter",
        [operand, source, init],
        "a source of the windows' shape #{type_text({elem, out})} and a scalar init"
      )
    end

    scalar = {elem, []}
    op = "stablehlo.select_and_scatter"
    select_region = region!(op, "select", [scalar, scalar], [{{:pred, 8}, []}], select)
    scatter_region = region!(op, "scatter", [scalar, scalar], [scalar], scatter)

    emit1(
      "stablehlo.select_and_scatter",
      [operand, source, init],
      operand.type,
      [
        "window_dimensions = #{i64_array(window)}",
        "window_strides = #{i64_array(w.strides)}",
        "padding = #{padding_attr(w.padding)}"
      ],
      [select_region, scatter_region]
    )
  end

  defp window_options(dims, opts) do
    ones = Enum.map(dims, fn _ -> 1 end)

    %{
      strides: Keyword.get(opts, :strides, ones),
      base: Keyword.get(opts, :base_dilations, ones),
      dilations: Keyword.get(opts, :window_dilations, ones),
      padding: Keyword.get(opts, :padding, Enum.map(dims, fn _ -> {0, 0} end))
    }
  end

  defp windowed_dims(dims, window, w) do
    Enum.zip_with([dims, window, w.strides, w.base, w.dilations, w.padding], fn [
                                                                                  d,
                                                                                  k,
                                                                                  s,
                                                                                  b,
                                                                                  dil,
                                                                                  {lo, hi}
                                                                                ] ->
      padded = if(d == 0, do: 0, else: (d - 1) * b + 1) + lo + hi
      effective = (k - 1) * dil + 1
      if padded < effective, do: 0, else: div(padded - effective, s) + 1
    end)
  end

  defp padding_attr(padding), do: Attribute.padding(padding)

  def convolution(lhs, rhs, opts \\ []) do
    opts =
      options!(opts, "convolution/3",
        input: :dimension_layout,
        kernel: :dimension_layout,
        output: :dimension_layout,
        strides: :integers,
        lhs_dilation: :integers,
        rhs_dilation: :integers,
        padding: :integer_pairs,
        feature_group_count: :pos_integer,
        batch_group_count: :pos_integer,
        precision: precision()
      )

    [lhs, rhs] = Enum.map([lhs, rhs], &value!("stablehlo.convolution", &1))
    CPUFaults.check!(:conv, "stablehlo.convolution", [lhs, rhs])
    {elem, ldims} = lhs.type
    {relem, rdims} = rhs.type
    n = length(ldims) - 2
    spatial = Enum.to_list(2..(n + 1)//1)
    {ib, if_, is} = Keyword.get(opts, :input, {0, 1, spatial})
    {ki, ko, ks} = Keyword.get(opts, :kernel, {1, 0, spatial})
    {ob, of, os} = Keyword.get(opts, :output, {ib, if_, is})
    ones = List.duplicate(1, n)
    strides = Keyword.get(opts, :strides, ones)
    lhs_dil = Keyword.get(opts, :lhs_dilation, ones)
    rhs_dil = Keyword.get(opts, :rhs_dilation, ones)
    padding = Keyword.get(opts, :padding, List.duplicate({0, 0}, n))
    fgc = Keyword.get(opts, :feature_group_count, 1)
    bgc = Keyword.get(opts, :batch_group_count, 1)
    at = fn dims, i -> Enum.at(dims, i) end

    ok =
      elem == relem and length(rdims) == length(ldims) and length(is) == n and length(ks) == n and
        length(os) == n and
        at.(ldims, if_) == at.(rdims, ki) * fgc and rem(at.(rdims, ko), fgc * bgc) == 0 and
        rem(at.(ldims, ib), bgc) == 0

    unless ok do
      mismatch!(
        "stablehlo.convolution",
        [lhs, rhs],
        "one element type, input features = kernel input features x feature_group_count (#{fgc}), and groups that divide the batch and output features"
      )
    end

    sizes =
      windowed_dims(Enum.map(is, &at.(ldims, &1)), Enum.map(ks, &at.(rdims, &1)), %{
        strides: strides,
        base: lhs_dil,
        dilations: rhs_dil,
        padding: padding
      })

    out =
      Enum.map(0..(n + 1), fn p ->
        cond do
          p == ob -> div(at.(ldims, ib), bgc)
          p == of -> at.(rdims, ko)
          true -> Enum.at(sizes, Enum.find_index(os, &(&1 == p)))
        end
      end)

    layout = fn rank, named ->
      "[" <>
        Enum.map_join(0..(rank - 1), ", ", fn p ->
          Enum.find_value(named, fn {label, dims} ->
            if is_list(dims),
              do: (i = Enum.find_index(dims, &(&1 == p))) && "#{i}",
              else: dims == p && label
          end)
        end) <> "]"
    end

    numbers =
      layout.(n + 2, [{"b", ib}, {"f", if_}, {"s", is}]) <>
        "x" <>
        layout.(n + 2, [{"i", ki}, {"o", ko}, {"s", ks}]) <>
        "->" <> layout.(n + 2, [{"b", ob}, {"f", of}, {"s", os}])

    precision = opts |> Keyword.get(:precision, :default) |> Atom.to_string() |> String.upcase()

    emit1("stablehlo.convolution", [lhs, rhs], {elem, out}, [
      "dimension_numbers = #stablehlo.conv<#{numbers}>",
      "window_strides = #{i64_array(strides)}",
      "padding = #{padding_attr(padding)}",
      "lhs_dilation = #{i64_array(lhs_dil)}",
      "rhs_dilation = #{i64_array(rhs_dil)}",
      "feature_group_count = #{fgc} : i64",
      "batch_group_count = #{bgc} : i64",
      "precision_config = [#stablehlo<precision #{precision}>, #stablehlo<precision #{precision}>]"
    ])
  end
end
