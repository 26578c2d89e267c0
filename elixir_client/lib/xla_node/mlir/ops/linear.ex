defmodule XlaNode.MLIR.Ops.Linear do
  @moduledoc false
  # Contractions and linear algebra: dot_general, fft, triangular_solve, top_k.
  # XlaNode.MLIR documents them and delegates here; see XlaNode.MLIR.Ops.Common for what the
  # families share.

  import XlaNode.MLIR.Ops.Common

  alias XlaNode.MLIR.CPUFaults

  ## Contractions

  def dot_general(lhs, rhs, opts \\ []) do
    opts =
      options!(opts, "dot_general/3",
        contracting: :integer_lists,
        batch: :integer_lists,
        precision: precision()
      )

    [lhs, rhs] = Enum.map([lhs, rhs], &value!("stablehlo.dot_general", &1))
    CPUFaults.check!(:dot, "stablehlo.dot_general", [lhs, rhs])
    {elem, ldims} = lhs.type
    {relem, rdims} = rhs.type
    {lb, rb} = Keyword.get(opts, :batch, {[], []})

    {lc, rc} =
      Keyword.get(
        opts,
        :contracting,
        {[length(ldims) - 1], [Enum.at(Enum.to_list(0..(length(rdims) - 1)//1) -- rb, 0)]}
      )

    at = fn dims, axes -> Enum.map(axes, &Enum.at(dims, &1)) end
    all = fn dims -> Enum.to_list(0..(length(dims) - 1)//1) end

    ok =
      elem == relem and length(lb) == length(rb) and length(lc) == length(rc) and
        at.(ldims, lb) == at.(rdims, rb) and at.(ldims, lc) == at.(rdims, rc) and
        Enum.all?(lb ++ lc, &(&1 in all.(ldims))) and Enum.all?(rb ++ rc, &(&1 in all.(rdims)))

    unless ok do
      mismatch!(
        "stablehlo.dot_general",
        [lhs, rhs],
        "one element type and matching batch #{inspect({lb, rb})} and contracting #{inspect({lc, rc})} dimensions"
      )
    end

    out =
      at.(ldims, lb) ++
        at.(ldims, all.(ldims) -- (lb ++ lc)) ++ at.(rdims, all.(rdims) -- (rb ++ rc))

    precision = opts |> Keyword.get(:precision, :default) |> Atom.to_string() |> String.upcase()

    emit1("stablehlo.dot_general", [lhs, rhs], {elem, out}, [
      "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = #{i64_list(lb)}, rhs_batching_dimensions = #{i64_list(rb)}, lhs_contracting_dimensions = #{i64_list(lc)}, rhs_contracting_dimensions = #{i64_list(rc)}>",
      "precision_config = [#stablehlo<precision #{precision}>, #stablehlo<precision #{precision}>]"
    ])
  end

  def fft(x, type, lengths) when type in [:fft, :ifft, :rfft, :irfft] do
    x = value!("stablehlo.fft", x)
    {elem, dims} = x.type
    {lead, _} = Enum.split(dims, length(dims) - length(lengths))

    result =
      case {type, elem} do
        {t, {:c, _}} when t in [:fft, :ifft] ->
          {elem, dims}

        {:rfft, {:f, 32}} ->
          {{:c, 64}, lead ++ List.update_at(lengths, -1, &(div(&1, 2) + 1))}

        {:rfft, {:f, 64}} ->
          {{:c, 128}, lead ++ List.update_at(lengths, -1, &(div(&1, 2) + 1))}

        {:irfft, {:c, 64}} ->
          {{:f, 32}, lead ++ lengths}

        {:irfft, {:c, 128}} ->
          {{:f, 64}, lead ++ lengths}

        _ ->
          mismatch!(
            "stablehlo.fft",
            [x],
            "a complex tensor (fft, ifft, irfft) or an f32/f64 one (rfft)"
          )
      end

    t = type |> Atom.to_string() |> String.upcase()

    emit1("stablehlo.fft", [x], result, [
      "fft_type = #stablehlo<fft_type #{t}>",
      "fft_length = #{i64_array(lengths)}"
    ])
  end

  def triangular_solve(a, b, opts \\ []) do
    opts =
      options!(opts, "triangular_solve/3",
        left_side: :boolean,
        lower: :boolean,
        unit_diagonal: :boolean,
        transpose_a: {:in, [:no_transpose, :transpose, :adjoint]}
      )

    [a, b] = same_elem!("stablehlo.triangular_solve", [a, b])
    {_, adims} = a.type
    {_, bdims} = b.type
    left = Keyword.get(opts, :left_side, true)
    m = List.last(adims)
    solved = if left, do: Enum.at(bdims, -2), else: List.last(bdims)

    unless length(adims) >= 2 and length(adims) == length(bdims) and Enum.at(adims, -2) == m and
             solved == m and Enum.drop(adims, -2) == Enum.drop(bdims, -2) do
      mismatch!(
        "stablehlo.triangular_solve",
        [a, b],
        "a square [..., m, m] and b of the same rank whose #{if left, do: "second to last", else: "last"} dimension is m"
      )
    end

    transpose =
      opts |> Keyword.get(:transpose_a, :no_transpose) |> Atom.to_string() |> String.upcase()

    emit1("stablehlo.triangular_solve", [a, b], b.type, [
      "left_side = #{left}",
      "lower = #{Keyword.get(opts, :lower, true)}",
      "unit_diagonal = #{Keyword.get(opts, :unit_diagonal, false)}",
      "transpose_a = #stablehlo<transpose #{transpose}>"
    ])
  end

  def top_k(x, k) do
    x = value!("chlo.top_k", x)
    {elem, dims} = x.type

    CPUFaults.check!(:top_k, "chlo.top_k", [x])

    if dims == [] or k > List.last(dims),
      do: mismatch!("chlo.top_k", [x], "a last dimension of at least #{k}")

    out = List.replace_at(dims, -1, k)
    emit("chlo.top_k", [x], [{elem, out}, {{:s, 32}, out}], ["k = #{k} : i64"])
  end
end
