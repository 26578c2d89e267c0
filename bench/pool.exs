# XlaNode.Pool benchmarks: failover time, throughput on one and two nodes, and what a run through
# a pool costs over a run sent to the node directly. Invoked by bench/run.sh (`pool` part) in the
# client's Mix project: `elixir --sname NAME --cookie C -S mix run ../bench/pool.exs BIN COOKIE`.
# It starts its own xla_node processes (BIN), kills and restarts them.

alias XlaNode.{Pool, Tensor}
alias XlaNode.MLIR, as: M

[bin, cookie] = System.argv()

defmodule PoolBench do
  @host node() |> Atom.to_string() |> String.split("@") |> List.last()

  def median(samples), do: samples |> Enum.sort() |> Enum.at(div(length(samples), 2))
  def ms(us), do: :erlang.float_to_binary(us / 1000, decimals: 1) <> " ms"
  def us(x), do: :erlang.float_to_binary(x / 1, decimals: 1) <> " us"
  def now, do: System.monotonic_time(:microsecond)

  def report(title, rows),
    do: IO.puts("\n## #{title}\n" <> Enum.map_join(rows, "\n", fn r -> "  " <> r end))

  # Starts the node under a shell that prints its pid and kills it when this VM goes (the shell
  # reads its standard input, which closes with the port).
  def start_node(bin, cookie, sname) do
    # A node of that name just killed may still be in epmd for a moment.
    until(fn -> registered(sname) == nil end, 200, 10)

    port =
      Port.open({:spawn_executable, "/bin/sh"}, [
        :binary,
        :exit_status,
        args: [
          "-c",
          ~s("$0" "$@" 2>/dev/null & echo $!; read _; kill -9 $! 2>/dev/null),
          bin,
          "--sname",
          sname,
          "--cookie",
          cookie
        ]
      ])

    os_pid =
      receive do
        {^port, {:data, line}} -> line |> String.trim() |> String.to_integer()
      after
        10_000 -> raise "#{sname} did not start"
      end

    name = :"#{sname}@#{@host}"

    until(fn -> Node.connect(name) == true and XlaNode.ping(name) == :pong end, 300, 20) ||
      raise("#{name} does not answer")

    %{name: name, sname: sname, os_pid: os_pid, port: port}
  end

  defp registered(sname) do
    with {:ok, names} <- :erl_epmd.names(),
         {_, _} = entry <- List.keyfind(names, String.to_charlist(sname), 0),
         do: entry,
         else: (_ -> nil)
  end

  # Calls `fun` until it returns true, `tries` times at most, `ms` apart; whether it did.
  def until(fun, tries, ms) do
    Enum.any?(1..tries, fn _ -> fun.() || (Process.sleep(ms) && false) end)
  end

  # Whether every thread of the node's process is stopped (SIGSTOP).
  def stopped?(node) do
    Path.wildcard("/proc/#{node.os_pid}/task/*/stat")
    |> Enum.all?(fn stat ->
      case File.read(stat) do
        # "pid (command) state ...": the state follows the command in parentheses.
        {:ok, text} -> text |> String.split(") ") |> List.last() |> String.starts_with?("T")
        {:error, _} -> true
      end
    end)
  end

  def signal(node, signal), do: System.cmd("kill", ["-#{signal}", "#{node.os_pid}"])

  def node_status(pool, node), do: Enum.find(Pool.status(pool).nodes, &(&1.node == node))

  def wait_up(pool, node) do
    until(fn -> match?(%{status: :up}, node_status(pool, node)) end, 2000, 5) ||
      raise("#{node} did not come up in the pool")
  end

  # main(x: f32[4]) = x + c: a program of its own for each c, which no node has compiled yet.
  def add(c) do
    M.module(fn ->
      M.function("main", [{{:f, 32}, [4]}], fn [x] -> M.add(x, M.constant(c * 1.0, x.type)) end)
    end)
  end

  # main(x: f32[256,256]) = 8 chained matrix products (268 MFLOP), scaled to stay finite.
  def matmuls do
    M.module(fn ->
      M.function("main", [{{:f, 32}, [256, 256]}], fn [x] ->
        scale = M.constant(1 / 256, x.type)
        Enum.reduce(1..8, x, fn _, acc -> M.multiply(M.dot_general(acc, x), scale) end)
      end)
    end)
  end

  # CPU time the processes used so far, in seconds (utime + stime in /proc/PID/stat).
  def cpu_seconds(os_pids) do
    ticks =
      for pid <- os_pids, {:ok, text} <- [File.read("/proc/#{pid}/stat")] do
        fields = text |> String.split(") ") |> List.last() |> String.split(" ")
        # After the state (field 3): utime and stime are fields 14 and 15.
        String.to_integer(Enum.at(fields, 11)) + String.to_integer(Enum.at(fields, 12))
      end

    Enum.sum(ticks) / 100
  end

  # Runs `n` runs of `exe` through `server` from `callers` processes: `{runs per second, CPU
  # cores the nodes `os_pids` kept busy meanwhile, CPU cores this BEAM used}`.
  def throughput(server, exe, arg, n, callers, os_pids) do
    beam = [List.to_integer(:os.getpid())]
    {t0, cpu0, beam0} = {now(), cpu_seconds(os_pids), cpu_seconds(beam)}

    1..n
    |> Task.async_stream(fn _ -> {:ok, _} = XlaNode.run(server, exe, [arg]) end,
      max_concurrency: callers,
      timeout: :infinity
    )
    |> Stream.run()

    seconds = (now() - t0) / 1_000_000
    {n / seconds, (cpu_seconds(os_pids) - cpu0) / seconds, (cpu_seconds(beam) - beam0) / seconds}
  end
end

x4 = Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32})
suffix = "#{System.pid()}"
a = PoolBench.start_node(bin, cookie, "pool_bench_a_#{suffix}")
b = PoolBench.start_node(bin, cookie, "pool_bench_b_#{suffix}")

## Failover: a run in flight on A (stopped with SIGSTOP, so that the run waits there), B joins
## the pool, A is killed with SIGKILL; the time from the kill to the run's result from B.

{:ok, _} = Pool.start_link(name: BenchPool, nodes: [a.name], reconnect_backoff: {20, 200})
PoolBench.wait_up(BenchPool, a.name)

trial = fn a, i, warm ->
  exe =
    XlaNode.compile!(BenchPool, PoolBench.add(1000 * i + if(warm, do: 1, else: 0)), node: a.name)

  {:ok, _} = XlaNode.run(BenchPool, exe, [x4])
  PoolBench.signal(a, "STOP")
  # A signal stops every thread of a process once each is scheduled, which can take a while on
  # a busy machine: the run must find A stopped.
  true = PoolBench.until(fn -> PoolBench.stopped?(a) end, 5000, 1)

  runner =
    Task.async(fn ->
      result = XlaNode.run(BenchPool, exe, [x4])
      {PoolBench.now(), result}
    end)

  # The run is placed on A (the only node) and sent there.
  true =
    PoolBench.until(fn -> PoolBench.node_status(BenchPool, a.name).in_flight == 1 end, 1000, 1)

  Process.sleep(20)
  :ok = Pool.add_node(BenchPool, b.name)
  PoolBench.wait_up(BenchPool, b.name)
  if warm, do: {:ok, _} = XlaNode.run(BenchPool, exe, [x4], node: b.name)

  # What compiling a program of the same shape on B takes.
  {compile_us, {:ok, _}} =
    :timer.tc(fn -> XlaNode.compile(b.name, PoolBench.add(1000 * i + 2)) end)

  t0 = PoolBench.now()
  PoolBench.signal(a, "KILL")
  killed = PoolBench.now()
  {t1, {:ok, [y]}} = Task.await(runner, 60_000)
  [_ | _] = Tensor.to_list(y)
  # The run's result came from B.
  1 = PoolBench.node_status(BenchPool, b.name).runs - if(warm, do: 1, else: 0)
  :ok = Pool.remove_node(BenchPool, b.name)

  # A comes back under the same name and rejoins (once the pool has seen it go).
  PoolBench.until(fn -> PoolBench.node_status(BenchPool, a.name).status != :up end, 2000, 5)
  Port.close(a.port)
  a = PoolBench.start_node(bin, cookie, a.sname)
  PoolBench.wait_up(BenchPool, a.name)
  {a, {t1 - t0, t1 - killed}, compile_us}
end

{a, cold, compiles} =
  Enum.reduce(1..10, {a, [], []}, fn i, {a, times, compiles} ->
    {a, us, compile_us} = trial.(a, i, false)
    {a, [us | times], [compile_us | compiles]}
  end)

{a, warm, _} =
  Enum.reduce(11..20, {a, [], []}, fn i, {a, times, compiles} ->
    {a, us, compile_us} = trial.(a, i, true)
    {a, [us | times], [compile_us | compiles]}
  end)

{cold, cold_after} = Enum.unzip(cold)
{warm, warm_after} = Enum.unzip(warm)

PoolBench.report(
  "failover: from kill -9 of the node running it to the run's result from the other node (10 trials each)",
  [
    "program already compiled on the other node: median #{PoolBench.ms(PoolBench.median(warm))} " <>
      "(min #{PoolBench.ms(Enum.min(warm))}, max #{PoolBench.ms(Enum.max(warm))})  (target < 50 ms)",
    "compiled there on the way:                  median #{PoolBench.ms(PoolBench.median(cold))} " <>
      "(min #{PoolBench.ms(Enum.min(cold))}, max #{PoolBench.ms(Enum.max(cold))}); " <>
      "compiling such a program there: median #{PoolBench.ms(PoolBench.median(compiles))}  " <>
      "(target < 50 ms + the compile)",
    "the same from the moment the kill command returned (starting it takes a few ms; the " <>
      "result may even come first): " <>
      "median #{PoolBench.ms(PoolBench.median(warm_after))} already compiled, " <>
      "#{PoolBench.ms(PoolBench.median(cold_after))} compiled on the way"
  ]
)

## What a pool adds to a run: x + 1 through the pool (one node) and straight to the node.

:ok = Pool.remove_node(BenchPool, a.name)
:ok = Pool.add_node(BenchPool, a.name)
PoolBench.wait_up(BenchPool, a.name)
pooled = XlaNode.compile!(BenchPool, PoolBench.add(1))
direct = XlaNode.compile!(a.name, PoolBench.add(1))

time = fn server, exe ->
  t0 = PoolBench.now()
  {:ok, _} = XlaNode.run(server, exe, [x4])
  PoolBench.now() - t0
end

for _ <- 1..2000, do: {time.(BenchPool, pooled), time.(a.name, direct)}

{pool_samples, direct_samples} =
  Enum.reduce(1..10, {[], []}, fn _, {p, d} ->
    {for(_ <- 1..1000, do: time.(BenchPool, pooled)) ++ p,
     for(_ <- 1..1000, do: time.(a.name, direct)) ++ d}
  end)

{mp, md} = {PoolBench.median(pool_samples), PoolBench.median(direct_samples)}

PoolBench.report(
  "a run of x + 1 through a pool of one node, against the same run sent to the node (10,000 each, interleaved)",
  [
    "through the pool: median #{PoolBench.us(mp)}",
    "to the node:      median #{PoolBench.us(md)}",
    "the pool adds #{PoolBench.us(mp - md)} per run"
  ]
)

## Throughput of a compute-bound program: the pool of one node against the pool of two.

{:ok, _} = Pool.start_link(name: BenchPool2, nodes: [a.name, b.name])
PoolBench.wait_up(BenchPool2, a.name)
PoolBench.wait_up(BenchPool2, b.name)
heavy1 = XlaNode.compile!(BenchPool, PoolBench.matmuls())
heavy2 = XlaNode.compile!(BenchPool2, PoolBench.matmuls())
m = {:binary.copy(<<0.5::float-32-little>>, 256 * 256), {{:f, 32}, [256, 256]}}

# Compiled on every node, then measured in alternating rounds.
for n <- [a.name, b.name], do: {:ok, _} = XlaNode.run(BenchPool2, heavy2, [m], node: n)
{:ok, _} = XlaNode.run(BenchPool, heavy1, [m])
{single_us, _} = :timer.tc(fn -> XlaNode.run(BenchPool, heavy1, [m]) end)

load = File.read!("/proc/loadavg") |> String.split(" ") |> Enum.take(3) |> Enum.join(" ")

{one, two} =
  Enum.reduce(1..5, {[], []}, fn _, {one, two} ->
    {[PoolBench.throughput(BenchPool, heavy1, m, 200, 8, [a.os_pid, b.os_pid]) | one],
     [PoolBench.throughput(BenchPool2, heavy2, m, 200, 8, [a.os_pid, b.os_pid]) | two]}
  end)

spread = Enum.map(Pool.status(BenchPool2).nodes, &{&1.node, &1.runs})
median = fn rounds, i -> rounds |> Enum.map(&elem(&1, i)) |> PoolBench.median() end
each = fn rounds -> rounds |> Enum.reverse() |> Enum.map_join(", ", &round(elem(&1, 0))) end

# Runs per second of the nodes' CPU time, and where the CPU time went.
per_cpu = fn rounds ->
  "#{round(median.(rounds, 0))} runs/s (rounds: #{each.(rounds)}); the nodes used " <>
    "#{Float.round(median.(rounds, 1), 2)} cores (#{round(median.(rounds, 0) / median.(rounds, 1))} " <>
    "runs per CPU second), this BEAM #{Float.round(median.(rounds, 2), 2)}"
end

PoolBench.report(
  "throughput: 8 chained 256x256 f32 matrix products per run, 8 callers, 200 runs per round, 5 rounds each, alternating",
  [
    "one run alone: #{PoolBench.ms(single_us)}",
    "one node:  median #{per_cpu.(one)}",
    "two nodes: median #{per_cpu.(two)}; runs per node #{inspect(spread)}",
    "two nodes / one node: #{Float.round(median.(two, 0) / median.(one, 0), 2)}x on " <>
      "#{System.schedulers_online()} cores (load average before: #{load})"
  ]
)
