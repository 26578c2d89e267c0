# XlaNode.Pool on demand against a fixed pool: a pool with launcher: {XlaNode.Launcher.Local, ...},
# min: 0, max: 3, under the same saturating load as a pool of three nodes started beforehand, in
# alternating rounds of the same run. Invoked by bench/run.sh (`ondemand` part) in the client's
# Mix project: `elixir --sname NAME -S mix run ../bench/pool_on_demand.exs`. The binary is the
# one XlaNode.Local finds (XLA_NODE_BIN, else target/release/xla_node).

alias XlaNode.Pool
alias XlaNode.MLIR, as: M

defmodule OnDemandBench do
  def median(samples), do: samples |> Enum.sort() |> Enum.at(div(length(samples), 2))
  def ms(us), do: :erlang.float_to_binary(us / 1000, decimals: 1) <> " ms"
  def now, do: System.monotonic_time(:microsecond)

  def report(title, rows),
    do: IO.puts("\n## #{title}\n" <> Enum.map_join(rows, "\n", fn r -> "  " <> r end))

  def until(fun, tries, ms),
    do: Enum.any?(1..tries, fn _ -> fun.() || (Process.sleep(ms) && false) end)

  # main(x: f32[256,256]) = 8 chained matrix products (268 MFLOP), scaled to stay finite.
  def matmuls do
    M.module(fn ->
      M.function("main", [{{:f, 32}, [256, 256]}], fn [x] ->
        scale = M.constant(1 / 256, x.type)
        Enum.reduce(1..8, x, fn _, acc -> M.multiply(M.dot_general(acc, x), scale) end)
      end)
    end)
  end

  # `n` runs from `callers` processes: {runs per second, the up nodes at the end}.
  def round(pool, exe, arg, n, callers) do
    t0 = now()

    1..n
    |> Task.async_stream(fn _ -> {:ok, _} = XlaNode.run(pool, exe, [arg]) end,
      max_concurrency: callers,
      timeout: :infinity
    )
    |> Stream.run()

    {n / ((now() - t0) / 1_000_000), length(up(pool))}
  end

  def up(pool), do: for(%{status: :up} = n <- Pool.status(pool).nodes, do: n.node)
end

Logger.configure(level: :warning)
# One device per node, so that six callers keep one node busy and the pool grows to three.
node_opts = [pjrt_options: [cpu_device_count: 1], log: "warn"]
m = {:binary.copy(<<0.5::float-32-little>>, 256 * 256), {{:f, 32}, [256, 256]}}
{runs, callers, rounds, idle_ms} = {720, 6, 5, 1_500}

## The fixed pool: three nodes started beforehand.

locals =
  for i <- 1..3 do
    {:ok, pid} = XlaNode.Local.start_link([name: :"bench_fixed_#{i}"] ++ node_opts)
    XlaNode.Local.node(pid)
  end

{:ok, _} = Pool.start_link(name: Fixed, nodes: locals)
true = OnDemandBench.until(fn -> length(OnDemandBench.up(Fixed)) == 3 end, 500, 10)
fixed_exe = XlaNode.compile!(Fixed, OnDemandBench.matmuls())
for n <- locals, do: {:ok, _} = XlaNode.run(Fixed, fixed_exe, [m], node: n)

## The pool on demand.

{:ok, _} =
  Pool.start_link(
    name: OnDemand,
    launcher: {XlaNode.Launcher.Local, node_opts},
    min: 0,
    max: 3,
    idle_shutdown_after: idle_ms
  )

# A first call on an empty pool: its node starts, then the program compiles and runs there.
first_calls =
  for _ <- 1..5 do
    true = OnDemandBench.until(fn -> Pool.status(OnDemand).nodes == [] end, 1_000, 20)
    t0 = OnDemandBench.now()
    exe = XlaNode.compile!(OnDemand, OnDemandBench.matmuls())
    {:ok, _} = XlaNode.run(OnDemand, exe, [m])
    OnDemandBench.now() - t0
  end

{run_alone, {:ok, _}} = :timer.tc(fn -> XlaNode.run(Fixed, fixed_exe, [m]) end)
exe = XlaNode.compile!(OnDemand, OnDemandBench.matmuls())

# Alternating: the fixed pool; the pool on demand from no node (it grows during the round);
# the pool on demand again at once, with the nodes it grew to.
results =
  for _ <- 1..rounds do
    fixed = OnDemandBench.round(Fixed, fixed_exe, m, runs, callers)
    true = OnDemandBench.until(fn -> Pool.status(OnDemand).nodes == [] end, 1_000, 20)
    t0 = OnDemandBench.now()

    grown =
      Task.async(fn ->
        OnDemandBench.until(fn -> length(OnDemandBench.up(OnDemand)) == 3 end, 10_000, 5)
        OnDemandBench.now() - t0
      end)

    cold = OnDemandBench.round(OnDemand, exe, m, runs, callers)
    warm = OnDemandBench.round(OnDemand, exe, m, runs, callers)
    {fixed, cold, warm, Task.await(grown, 60_000)}
  end

status = Pool.status(OnDemand)
rate = fn picked -> results |> Enum.map(&elem(elem(&1, picked), 0)) |> OnDemandBench.median() end
{fixed, cold, warm} = {rate.(0), rate.(1), rate.(2)}
grow = results |> Enum.map(&elem(&1, 3)) |> OnDemandBench.median()
load = File.read!("/proc/loadavg") |> String.split(" ") |> Enum.take(3) |> Enum.join(" ")

OnDemandBench.report(
  "XlaNode.Pool on demand (launcher: XlaNode.Launcher.Local, min: 0, max: 3) against a fixed pool of three nodes: 8 chained 256x256 f32 matrix products per run, one device per node, #{callers} callers, #{runs} runs per round, #{rounds} rounds each, alternating",
  [
    "first call on an empty pool (start a node, compile, run): median " <>
      "#{OnDemandBench.ms(OnDemandBench.median(first_calls))} (min " <>
      "#{OnDemandBench.ms(Enum.min(first_calls))}); the run alone on a node up with the " <>
      "program compiled: #{OnDemandBench.ms(run_alone)}",
    "fixed three nodes:            median #{round(fixed)} runs/s",
    "on demand, from no node:      median #{round(cold)} runs/s " <>
      "(#{Float.round(cold / fixed, 2)}x the fixed pool); three nodes up after " <>
      "#{OnDemandBench.ms(grow)} (median)",
    "on demand, with three nodes:  median #{round(warm)} runs/s (#{Float.round(warm / fixed, 2)}x)",
    "nodes started #{status.launcher.started}, stopped #{status.launcher.stopped} (idle " <>
      "#{idle_ms} ms), failed #{status.launcher.failed}; runs failed #{status.errors}, lost " <>
      "#{status.failures}",
    "#{System.schedulers_online()} cores, load average at the end: #{load}"
  ]
)
