# Times building modules with XlaNode.MLIR. With MLIR_BASELINE_REF=<git ref>, the XlaNode.MLIR
# of that commit is built beside this one (renamed Baseline.MLIR) and the two alternate, round by
# round, with their texts compared byte for byte.
#
# The programs: a module of two ops (what a module costs besides its ops); a synthetic one of N
# steps, each a constant, a while loop whose condition compares two reduces, a multiply and a
# tanh (about 26 ops and block arguments a step); and,
# where Nx is loaded (run from elixir_nx), XlaNode.Compiler's lowering of defns: an MLP's
# forward pass, the gradient of its loss and a training step (bench/nx_mlp.exs's model), and
# the gradient of a deeper MLP (32 layers). For those the baseline builds with the lowering of
# the same commit (XlaNode.Compiler.Lower renamed Baseline.Compiler.Lower).
#
#   cd elixir_client && MLIR_BASELINE_REF=main mix run ../bench/mlir_build.exs
#   source /work/nxenv/env.sh; cd elixir_nx && MLIR_BASELINE_REF=main mix run ../bench/mlir_build.exs
#
# MLIR_BENCH_ONLY=<text> keeps the programs whose names contain it; MLIR_BENCH_ROUNDS=<n> runs n
# rounds (3).
#
# Each measurement runs in a fresh process; it reports the CPU time and the garbage collections (the
# VM's, which runs nothing else) and the reductions of the process, which other load on the
# machine does not change.

defmodule MLIRBuildBench do
  @runs 7

  def run do
    ref = System.get_env("MLIR_BASELINE_REF")
    builders = [{"this", builder(XlaNode.MLIR, lower())} | baseline(ref)]
    only = System.get_env("MLIR_BENCH_ONLY", "")
    programs = Enum.filter(synthetic_programs() ++ nx_programs(), &(elem(&1, 0) =~ only))

    for {program, _, _} <- programs, {name, b} <- builders do
      IO.puts("#{program} #{name}: #{byte_size(build(b, programs, program))} bytes")
    end

    if ref do
      [{_, this}, {_, base}] = builders

      for {program, _, _} <- programs do
        same = build(this, programs, program) == build(base, programs, program)
        IO.puts("#{program}: text #{if same, do: "identical to", else: "DIFFERS from"} #{ref}'s")
      end
    end

    for round <- 1..String.to_integer(System.get_env("MLIR_BENCH_ROUNDS", "3")),
        {program, builds, fun} <- programs,
        {name, b} <- Enum.reverse(builders) do
      runs = for _ <- 1..@runs, do: measure(b, fun, builds)
      cpu = runs |> Enum.map(&elem(&1, 0)) |> Enum.sort()
      reductions = runs |> Enum.map(&elem(&1, 1)) |> Enum.min()
      collections = runs |> Enum.map(&elem(&1, 2)) |> Enum.min()

      IO.puts(
        "round #{round} #{program} #{name}: cpu median #{ms(Enum.at(cpu, div(@runs, 2)), builds)} ms, " <>
          "best #{ms(hd(cpu), builds)} ms, reductions #{div(reductions, builds)}, " <>
          "collections #{Float.round(collections / builds, 1)} (a build, of #{builds} in a process)"
      )
    end
  end

  defp builder(mlir, lower), do: %{mlir: mlir, lower: lower}

  defp lower, do: if(Code.ensure_loaded?(XlaNode.Compiler.Lower), do: XlaNode.Compiler.Lower)

  defp build(builder, programs, program) do
    {_, _, fun} = List.keyfind(programs, program, 0)
    fun.(builder)
  end

  defp ms(total, builds), do: Float.round(total / builds, 3)

  # The CPU time, reductions and garbage collections (the VM's, which runs nothing else) of
  # `builds` builds in a fresh process (the runtime's clock counts milliseconds: small programs
  # are built many times).
  defp measure(builder, fun, builds) do
    me = self()

    spawn(fn ->
      {_, _} = :erlang.statistics(:runtime)
      {collections, _, _} = :erlang.statistics(:garbage_collection)
      for _ <- 1..builds, do: fun.(builder)
      {_, cpu} = :erlang.statistics(:runtime)
      {collected, _, _} = :erlang.statistics(:garbage_collection)
      {:reductions, reductions} = Process.info(self(), :reductions)
      send(me, {:measured, cpu, reductions, collected - collections})
    end)

    receive do
      {:measured, cpu, reductions, collections} -> {cpu, reductions, collections}
    end
  end

  defp synthetic_programs do
    [{"two ops", 2000, &two_ops(&1.mlir)}] ++
      Enum.map([{200, 10}, {2000, 1}], fn {n, builds} ->
        {"synthetic n=#{n}", builds, &synthetic(&1.mlir, n)}
      end)
  end

  # What a module costs besides its ops.
  defp two_ops(m) do
    type = {{:f, 32}, [4]}
    m.module(fn -> m.function("main", [type], fn [x] -> m.add(x, m.constant(1.0, type)) end) end)
  end

  defp synthetic(m, n) do
    f32 = {:f, 32}
    zero = fn -> m.constant(0.0, {f32, []}) end
    sum = fn x -> m.reduce(x, zero.(), [0], fn [p, q] -> m.add(p, q) end) end

    m.module(fn ->
      m.function("main", [{f32, [16]}], fn [x] ->
        Enum.reduce(1..n, x, fn i, v ->
          c = m.constant(i * 1.0, {f32, [16]})
          cond = fn [a] -> m.compare(:lt, sum.(a), sum.(c)) end
          [w] = m.while_loop([v], cond, fn [a] -> m.add(a, c) end)
          m.tanh(m.multiply(w, v))
        end)
      end)
    end)
  end

  # XlaNode.Compiler's lowering of defns, from their expressions (built once, here).
  defp nx_programs do
    if lower() do
      for {name, builds, parameters, outputs} <- apply(MLIRBuildBench.Models, :expressions, []),
          do: {name, builds, fn b -> b.lower.module(parameters, outputs).text end}
    else
      []
    end
  end

  # The builder of `ref`, every module under XlaNode.MLIR renamed Baseline.MLIR, and its
  # XlaNode.Compiler.Lower (where Nx is loaded) renamed Baseline.Compiler.Lower.
  defp baseline(nil), do: []

  defp baseline(ref) do
    root = String.trim(elem(System.cmd("git", ["rev-parse", "--show-toplevel"]), 0))
    paths = ["elixir_client/lib/xla_node/mlir.ex", "elixir_client/lib/xla_node/mlir"]
    paths = if lower(), do: paths ++ ["elixir_nx/lib/xla_node/compiler/lower.ex"], else: paths

    {files, 0} =
      System.cmd("git", ["-C", root, "ls-tree", "-r", "--name-only", ref, "--" | paths])

    dir = Path.join(System.tmp_dir!(), "mlir_baseline_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)

    sources =
      for file <- String.split(files, "\n", trim: true) do
        {source, 0} = System.cmd("git", ["-C", root, "show", "#{ref}:#{file}"])

        source =
          source
          |> String.replace("XlaNode.MLIR", "Baseline.MLIR")
          |> String.replace("XlaNode.Compiler.Lower", "Baseline.Compiler.Lower")

        path = Path.join(dir, String.replace(file, "/", "_"))
        File.write!(path, source)
        path
      end

    {:ok, _modules, _warnings} = Kernel.ParallelCompiler.compile(sources)
    File.rm_rf!(dir)
    [{ref, builder(Baseline.MLIR, if(lower(), do: Baseline.Compiler.Lower))}]
  end
end

if Code.ensure_loaded?(Nx) do
  defmodule MLIRBuildBench.Models do
    @moduledoc "bench/nx_mlp.exs's model (three dense layers, tanh, MSE loss) and a deeper one."
    import Nx.Defn

    defn forward(params, x) do
      h1 = Nx.tanh(Nx.dot(x, params.w1) + params.b1)
      h2 = Nx.tanh(Nx.dot(h1, params.w2) + params.b2)
      Nx.dot(h2, params.w3) + params.b3
    end

    defn(loss(params, x, y), do: Nx.mean((forward(params, x) - y) ** 2))
    defn(loss_grad(params, x, y), do: grad(params, &loss(&1, x, y)))

    defn train_step(params, x, y) do
      {loss, grads} = value_and_grad(params, &loss(&1, x, y))
      {sgd(params, grads), loss}
    end

    deftransformp sgd(params, grads) do
      Map.new(params, fn {name, p} -> {name, Nx.subtract(p, Nx.multiply(0.01, grads[name]))} end)
    end

    defn(deep_loss(layers, x, y), do: Nx.mean((stack(layers, x) - y) ** 2))

    deftransformp stack(layers, x) do
      layers
      |> Tuple.to_list()
      |> Enum.reduce(x, fn w, h -> Nx.tanh(Nx.add(Nx.dot(h, w), 0.1)) end)
    end

    defn(deep_grad(layers, x, y), do: grad(layers, &deep_loss(&1, x, y)))

    @doc "The programs: their names, parameter templates and output expressions."
    def expressions do
      f32 = {:f, 32}
      x = Nx.iota({32, 64}, type: f32)
      y = Nx.iota({32, 64}, type: f32)

      params =
        Map.new([w1: {64, 64}, b1: {64}, w2: {64, 64}, b2: {64}, w3: {64, 64}, b3: {64}], fn
          {k, shape} -> {k, Nx.iota(shape, type: f32)}
        end)

      layers = List.to_tuple(for _ <- 1..32, do: Nx.iota({64, 64}, type: f32))

      for {name, builds, fun, args} <- [
            {"mlp forward", 400, &forward/2, [params, x]},
            {"mlp grad", 100, &loss_grad/3, [params, x, y]},
            {"mlp train step", 100, &train_step/3, [params, x, y]},
            {"deep mlp grad (32 layers)", 20, &deep_grad/3, [layers, x, y]}
          ] do
        expr = apply(Nx.Defn.debug_expr(fun), args)

        templates =
          Enum.map(Nx.Defn.Composite.flatten_list(args), &Nx.template(&1.shape, &1.type))

        {name, builds, templates, Nx.Defn.Composite.flatten_list([expr])}
      end
    end
  end
end

MLIRBuildBench.run()
