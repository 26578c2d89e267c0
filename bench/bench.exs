# Benchmarks of xla_node against a BEAM baseline in the same run. Invoked by bench/run.sh.
# Every figure is a median over many round trips; each comparison interleaves the two sides in
# rounds so that machine noise hits both alike.

[xla_name, parts] = System.argv()
host = node() |> Atom.to_string() |> String.split("@") |> List.last()
xla = :"#{xla_name}@#{host}"
true = Node.connect(xla)

# The baseline: a BEAM node running a GenServer with the same requests as :xla, and a process
# that echoes plain messages and answers callbacks the way a callback server would.
[{mod, bin}] =
  Code.compile_string("""
  defmodule Bench.Baseline do
    use GenServer
    def init(_), do: {:ok, nil}
    def handle_call(:ping, _from, s), do: {:reply, :pong, s}
    def handle_call({:echo, t}, _from, s), do: {:reply, t, s}

    def echo_loop do
      receive do
        {:exla_runtime_call, _id, [{bin, _shape} | _], {pid, ref}} -> send(pid, {ref, {:ok, [bin]}})
        {from, msg} -> send(from, msg)
      end

      echo_loop()
    end
  end
  """)

# Over TLS distribution (bench/run.sh tls), the baseline node gets the same `erl` arguments as
# this one (-proto_dist inet_tls -ssl_dist_optfile FILE), and every figure is over TLS.
tls_args = System.get_env("XLA_NODE_BENCH_TLS_ARGS", "") |> String.split(" ", trim: true)
over = if tls_args == [], do: "", else: ", over TLS distribution (inet_tls)"

{:ok, peer, base} =
  :peer.start_link(%{
    name: :"bench_base_#{System.os_time()}",
    # The peer runs Elixir code (GenServer), so it needs Elixir's code path.
    args:
      Enum.map(tls_args, &String.to_charlist/1) ++
        [~c"-setcookie", Atom.to_charlist(Node.get_cookie()), ~c"-pa" | :code.get_path()]
  })

{:module, _} = :erpc.call(base, :code, :load_binary, [mod, ~c"bench_baseline.beam", bin])
{:ok, _} = :erpc.call(base, GenServer, :start, [Bench.Baseline, nil, [name: :baseline]])
echo = :erpc.call(base, :erlang, :spawn, [Bench.Baseline, :echo_loop, []])
_ = peer

Code.require_file("timing.exs", __DIR__)

defmodule Bench do
  defdelegate median(samples), to: Bench.Timing
  defdelegate p99(samples), to: Bench.Timing
  defdelegate time(fun), to: Bench.Timing
  defdelegate interleave(funs, rounds, n, opts \\ []), to: Bench.Timing

  def report(title, rows), do: IO.puts("\n## #{title}\n" <> Enum.map_join(rows, "\n", fn r -> "  " <> r end))
  # With XLA_NODE_CALLBACK_TRACE=1 in the node's environment, :info has the median time from a
  # custom call's start to each step of its callback, over the last 100,000 callbacks
  # (docs/performance.md names the steps); [] otherwise.
  def trace(xla) do
    case GenServer.call({:xla, xla}, :info) do
      {:ok, %{callbacks: %{trace: t}}} ->
        steps = [:resolved, :registered, :built, :encoded, :written, :reply_read, :delivered, :woken, :returned]
        ["  steps inside the node (XLA_NODE_CALLBACK_TRACE=1; median us from the custom call's start, over #{t.samples} callbacks):"] ++
          Enum.map(steps, fn step -> "    #{step}: #{Float.round(t[step], 1)}" end)

      _ ->
        []
    end
  end

  def us(x), do: :erlang.float_to_binary(x / 1, decimals: 1) <> " us"

  # main(x: f32[4]) = x + 1, the tiny program several parts run, and an argument for it.
  def add_one do
    """
    func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %one = stablehlo.constant dense<1.0> : tensor<4xf32>
      %y = stablehlo.add %x, %one : tensor<4xf32>
      return %y : tensor<4xf32>
    }
    """
  end

  def f32x4, do: {<<1.0::float-32-little, 2.0::float-32-little, 3.0::float-32-little, 4.0::float-32-little>>, {{:f, 32}, [4]}}
end

if parts in ["all", "node"] do
  for _ <- 1..2000, do: GenServer.call({:xla, xla}, :ping)
  for _ <- 1..2000, do: GenServer.call({:baseline, base}, :ping)

  s = Bench.interleave([xla: fn -> GenServer.call({:xla, xla}, :ping) end, beam: fn -> GenServer.call({:baseline, base}, :ping) end], 10, 2000)
  {mx, mb} = {Bench.median(s.xla), Bench.median(s.beam)}
  Bench.report("tiny GenServer.call (20,000 each, interleaved#{over})", [
    "xla_node: median #{Bench.us(mx)}, p99 #{Bench.us(Bench.p99(s.xla))}",
    "BEAM:     median #{Bench.us(mb)}, p99 #{Bench.us(Bench.p99(s.beam))}",
    "ratio xla_node/BEAM median latency: #{Float.round(mx / mb, 3)}  (target <= 1.1)"
  ])

  big = :crypto.strong_rand_bytes(16 * 1024 * 1024)
  s = Bench.interleave([xla: fn -> ^big = GenServer.call({:xla, xla}, {:echo, big}, 60_000) end, beam: fn -> ^big = GenServer.call({:baseline, base}, {:echo, big}, 60_000) end], 10, 10)
  mbps = fn samples -> 16 / (Bench.median(samples) / 1_000_000) end
  Bench.report("16 MiB echo (100 each, interleaved#{over}; MiB echoed per second of round trip)", [
    "xla_node: #{Float.round(mbps.(s.xla), 1)} MiB/s",
    "BEAM:     #{Float.round(mbps.(s.beam), 1)} MiB/s",
    "ratio xla_node/BEAM throughput: #{Float.round(mbps.(s.xla) / mbps.(s.beam), 3)}  (target >= 1.2)"
  ])

  # 1 GiB to the node and back as XlaNode.to_device/3 and read/3 move it (in chunks below the
  # node's message limit, XlaNode.Transfer, on the code path from bench/run.sh), against a BEAM
  # node echoing the same bytes.
  gib = :binary.copy(:crypto.strong_rand_bytes(16 * 1024 * 1024), 64)
  tensor = {gib, {{:u, 8}, [byte_size(gib)]}}

  round_trip = fn ->
    {:ok, buffer} = XlaNode.Transfer.call({:xla, xla}, {:to_device, tensor}, 600_000)
    {:ok, {^gib, _}} = XlaNode.Transfer.call({:xla, xla}, {:read, buffer}, 600_000)
    :ok = GenServer.call({:xla, xla}, {:free, buffer})
  end

  s = Bench.interleave([xla: round_trip, beam: fn -> ^gib = GenServer.call({:baseline, base}, {:echo, gib}, 600_000) end], 3, 1)
  gibps = fn samples -> 1024 / (Bench.median(samples) / 1_000_000) end
  Bench.report("1 GiB to the node and back (XlaNode.to_device + read, in chunks) against a BEAM echo of it (3 each, interleaved#{over}; MiB each way per second)", [
    "xla_node: #{Float.round(gibps.(s.xla), 1)} MiB/s",
    "BEAM:     #{Float.round(gibps.(s.beam), 1)} MiB/s",
    "ratio xla_node/BEAM throughput: #{Float.round(gibps.(s.xla) / gibps.(s.beam), 3)}  (target >= 1.0)"
  ])
end

if parts in ["all", "xla"] do
  {:ok, exe} = GenServer.call({:xla, xla}, {:compile, Bench.add_one()})
  x = Bench.f32x4()
  run = fn -> {:ok, [_]} = GenServer.call({:xla, xla}, {:run, exe, [x]}) end
  for _ <- 1..2000, do: run.()
  beam = fn -> GenServer.call({:baseline, base}, :ping) end
  # Five rounds, as for callbacks below: the BEAM call is bimodal from one stretch of seconds to
  # the next, so the honest figure is the best round's run over the fastest round's call.
  rounds =
    for _ <- 1..5 do
      s = Bench.interleave([run: run, beam: beam], 4, 500, rotate: true)
      %{run: Bench.median(s.run), beam: Bench.median(s.beam), p99: Bench.p99(s.run)}
    end

  {best, fastest} = {Enum.min(Enum.map(rounds, & &1.run)), Enum.min(Enum.map(rounds, & &1.beam))}
  Bench.report("{:run, exe, [f32[4]]} of x + 1 (5 rounds of 2,000 each, interleaved)", [
    "run on xla_node, per round:           medians #{Enum.map_join(rounds, ", ", &Float.round(&1.run, 1))} us; p99 #{Enum.map_join(rounds, ", ", &Float.round(&1.p99, 1))} us",
    "trivial call to BEAM node, per round: medians #{Enum.map_join(rounds, ", ", &Float.round(&1.beam, 1))} us",
    "added over the baseline, per round: #{Enum.map_join(rounds, ", ", &Float.round(&1.run - &1.beam, 1))} us",
    "the best round's run over the fastest round's call: #{Bench.us(best - fastest)}  (target <= +20 us)"
  ])
end

if parts in ["all", "callbacks"] do
  id = 7
  idbin = :erlang.term_to_binary(id)
  padded = idbin <> :binary.copy(<<0>>, rem(8 - rem(byte_size(idbin), 8), 8))
  words = for <<w::signed-little-64 <- padded>>, do: w

  with_cb = fn shape ->
    """
    func.func @main(%cb: tensor<8xui8>, %x: #{shape}) -> #{shape} {
      %r = stablehlo.custom_call @exla_runtime_callback(%cb, %x) {api_version = 4 : i32, has_side_effect = true, backend_config = {callback_id = array<i64: #{Enum.join(words, ", ")}>, callback_id_size = #{byte_size(idbin)} : ui64, num_aliased_data_outputs = 0 : ui64}} : (tensor<8xui8>, #{shape}) -> #{shape}
      return %r : #{shape}
    }
    """
  end

  without_cb = """
  func.func @main(%cb: tensor<8xui8>, %x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
  """

  # The same custom call position, served by a native kernel that returns at once (the node's
  # kernel path: no message), with and without has_side_effect: what XLA itself adds for a
  # custom call, apart from what the callback's node and network add.
  with_kernel = fn side_effect ->
    """
    func.func @main(%cb: tensor<8xui8>, %x: tensor<4xf32>) -> tensor<4xf32> {
      %r = stablehlo.custom_call @xn_increment(%x) {api_version = 4 : i32, has_side_effect = #{side_effect}, backend_config = {}} : (tensor<4xf32>) -> tensor<4xf32>
      return %r : tensor<4xf32>
    }
    """
  end

  {:ok, cb_exe} = GenServer.call({:xla, xla}, {:compile, with_cb.("tensor<4xf32>")})
  {:ok, plain_exe} = GenServer.call({:xla, xla}, {:compile, without_cb})
  {:ok, kernel_exe} = GenServer.call({:xla, xla}, {:compile, with_kernel.(false)})
  {:ok, kernel_se_exe} = GenServer.call({:xla, xla}, {:compile, with_kernel.(true)})
  x = Bench.f32x4()
  opts = [callback_server: echo]
  run = fn exe -> fn -> {:ok, [_]} = GenServer.call({:xla, xla}, {:run, exe, [x], opts}) end end

  round_trip = fn ->
    send(echo, {self(), :pong})

    receive do
      :pong -> :ok
    end
  end

  sides = [with: run.(cb_exe), without: run.(plain_exe), kernel: run.(kernel_exe), kernel_se: run.(kernel_se_exe), rt: round_trip]
  for _ <- 1..1000, {_, f} <- sides, do: f.()
  waited = fn -> {:ok, %{callbacks: c}} = GenServer.call({:xla, xla}, :info); {c.reply_wait_us, c.replies} end
  {wait0, replies0} = waited.()
  # Five rounds: on these machines the BEAM round trip is bimodal from one stretch of seconds to
  # the next (its schedulers spinning or not), while a callback's cost is not, so a ratio taken
  # round by round says more about the baseline's mode than about the node. The honest figure
  # is the best callback over the fastest round trip seen in the whole run.
  rounds =
    for _ <- 1..5 do
      s = Bench.interleave(sides, 4, 500, rotate: true)
      m = Map.new(s, fn {k, v} -> {k, Bench.median(v)} end)
      # The same round trip once both BEAM nodes have idled for a millisecond. Between two
      # callbacks the callback server's node idles for as long as a run lasts; back to back,
      # the two nodes never idle and their schedulers keep spinning.
      Map.put(m, :idle_rt, Bench.median(for _ <- 1..500, do: (Process.sleep(1); Bench.time(round_trip))))
    end

  {wait1, replies1} = waited.()
  med = fn k -> Bench.median(Enum.map(rounds, & &1[k])) end
  extras = Enum.map(rounds, &(&1.with - &1.without))
  rt = Enum.min(Enum.map(rounds, & &1.rt))
  idle_rt = Enum.min(Enum.map(rounds, & &1.idle_rt))
  fastest_rt = min(rt, idle_rt)
  extra = Bench.median(extras)
  trace = Bench.trace(xla)

  decomposition =
    case GenServer.call({:xla, xla}, :info) do
      {:ok, %{callbacks: %{trace: t}}} ->
        own = t.written + (t.returned - t.reply_read)
        [
          "  where the extra latency goes (medians; the custom call's steps from the trace above):",
          "    the node's own steps (start to written, reply_read to returned): #{Bench.us(own)}  (target <= 6 us)",
          "      of which the request's write (encoded to written): #{Bench.us(t.written - t.encoded)}, waking the waiting thread (delivered to woken): #{Bench.us(t.woken - t.delivered)}",
          "      and the node's own code (start to encoded, woken to returned): #{Bench.us(t.encoded + t.returned - t.woken)}",
          "    the network and the callback server's node (written to reply_read): #{Bench.us(t.reply_read - t.written)}",
          "    outside the custom call (extra latency minus the custom call's own time: XLA's work around it, and the run's reply to a caller that has idled longer): #{Bench.us(extra - t.returned)}"
        ]

      _ ->
        ["  (start the node with XLA_NODE_CALLBACK_TRACE=1 for the steps inside the node)"]
    end

  Bench.report("one callback to a process on another BEAM node (5 rounds of 2,000 each, interleaved)", [
    "run without a custom call: median #{Bench.us(med.(:without))}",
    "run with a native-kernel custom call (xn_increment, no message), has_side_effect = false: #{Bench.us(med.(:kernel))} (+#{Bench.us(med.(:kernel) - med.(:without))})",
    "run with the same custom call, has_side_effect = true: #{Bench.us(med.(:kernel_se))} (+#{Bench.us(med.(:kernel_se) - med.(:without))})",
    "run with a callback:       median #{Bench.us(med.(:with))}",
    "extra latency of one callback: #{Bench.us(extra)} (rounds: #{Enum.map_join(extras, ", ", &Float.round(&1, 1))})",
    "  of which the node waited for the reply (request written to reply in hand; mean, from :info): #{Bench.us((wait1 - wait0) / max(replies1 - replies0, 1))}"
  ] ++ trace ++ decomposition ++ [
    "BEAM-to-BEAM message round trip, per round: back to back #{Enum.map_join(rounds, ", ", &Float.round(&1.rt, 1))} us; after both nodes idled 1 ms #{Enum.map_join(rounds, ", ", &Float.round(&1.idle_rt, 1))} us",
    "ratio callback/round trip, per round (back to back): #{Enum.map_join(rounds, ", ", &Float.round((&1.with - &1.without) / &1.rt, 2))}",
    "ratio of the best round's callback to the fastest round trip of the run: #{Float.round(Enum.min(extras) / fastest_rt, 3)}  (target <= 1.5)"
  ])

  # Callbacks back to back: a while loop whose body makes one callback, so neither side idles
  # between two of them. Compared with the faster of the two round trips above.
  iterations = 10_000
  loop_cb = """
  func.func @main(%cb: tensor<8xui8>, %x: tensor<4xf32>) -> tensor<4xf32> {
    %zero = stablehlo.constant dense<0> : tensor<i64>
    %one = stablehlo.constant dense<1> : tensor<i64>
    %n = stablehlo.constant dense<#{iterations}> : tensor<i64>
    %r:3 = stablehlo.while(%i = %zero, %c = %cb, %v = %x) : tensor<i64>, tensor<8xui8>, tensor<4xf32>
    cond {
      %more = stablehlo.compare LT, %i, %n : (tensor<i64>, tensor<i64>) -> tensor<i1>
      stablehlo.return %more : tensor<i1>
    } do {
      %y = stablehlo.custom_call @exla_runtime_callback(%c, %v) {api_version = 4 : i32, has_side_effect = true, backend_config = {callback_id = array<i64: #{Enum.join(words, ", ")}>, callback_id_size = #{byte_size(idbin)} : ui64, num_aliased_data_outputs = 0 : ui64}} : (tensor<8xui8>, tensor<4xf32>) -> tensor<4xf32>
      %next = stablehlo.add %i, %one : tensor<i64>
      stablehlo.return %next, %c, %y : tensor<i64>, tensor<8xui8>, tensor<4xf32>
    }
    return %r#2 : tensor<4xf32>
  }
  """

  {:ok, loop_exe} = GenServer.call({:xla, xla}, {:compile, loop_cb})
  {:ok, [^x]} = GenServer.call({:xla, xla}, {:run, loop_exe, [x], opts}, 60_000)
  # Ten runs: the trace's last 100,000 callbacks are then all the loop's.
  loop_runs = for _ <- 1..10, do: Bench.time(fn -> {:ok, [_]} = GenServer.call({:xla, xla}, {:run, loop_exe, [x], opts}, 60_000) end)
  per_iteration = Bench.median(loop_runs) / iterations
  Bench.report("#{iterations} callbacks in a while loop (10 runs)", [
    "per iteration: median #{Bench.us(per_iteration)}",
    "ratio per iteration/the faster of the two round trips: #{Float.round(per_iteration / fastest_rt, 3)}  (target <= 2)"
  ] ++ Bench.trace(xla))

  n = 16 * 1024 * 1024
  {:ok, big_exe} = GenServer.call({:xla, xla}, {:compile, with_cb.("tensor<#{n}xui8>")})
  big = {:crypto.strong_rand_bytes(n), {{:u, 8}, [n]}}
  samples = for _ <- 1..10, do: Bench.time(fn -> {:ok, [_]} = GenServer.call({:xla, xla}, {:run, big_exe, [big], opts}, 60_000) end)
  Bench.report("callback moving 16 MiB each way (10 runs)", [
    "median run: #{Bench.us(Bench.median(samples))}; callback payload throughput (16 MiB out + 16 MiB back, including the request and reply legs of the run): #{Float.round(32 / (Bench.median(samples) / 1_000_000), 1)} MiB/s"
  ])
end

if parts in ["all", "kernels"] do
  # The identical program on both sides: JAX lowers fori_loop(0, n, xn_increment) and writes the
  # module, which the node then runs; both call the same kernel library. A JAX process serves
  # timed runs one at a time, so that JAX's runs and the node's alternate one by one and machine
  # noise (which here shifts over seconds) hits both alike.
  library = System.fetch_env!("XLA_NODE_BENCH_KERNELS")

  kernel_loop = fn iterations, pairs ->
    module_file = Path.join(System.tmp_dir!(), "xla_node_bench_kernel_loop_#{System.os_time()}.mlir")

    jax =
      Port.open({:spawn_executable, System.find_executable("python3")}, [
        :binary,
        {:line, 1024},
        args: ["bench/kernels_jax.py", "--library", library, "--iterations", "#{iterations}", "--module-out", module_file, "--serve"],
        env: [{~c"PYTHONPATH", String.to_charlist(System.fetch_env!("XLA_NODE_BENCH_JAX"))}]
      ])

    jax_line = fn ->
      receive do
        {^jax, {:data, {:eol, line}}} -> line
      after
        120_000 -> raise "bench/kernels_jax.py did not answer"
      end
    end

    "ready" = jax_line.()
    jax_run = fn -> Port.command(jax, "time\n"); String.to_float(jax_line.()) end
    {:ok, exe} = GenServer.call({:xla, xla}, {:compile, File.read!(module_file)})
    File.rm(module_file)
    x = {<<0.0::float-32-little>>, {{:f, 32}, []}}
    expected = {<<iterations * 1.0::float-32-little>>, {{:f, 32}, []}}
    node_run = fn -> Bench.time(fn -> {:ok, [^expected]} = GenServer.call({:xla, xla}, {:run, exe, [x]}, 60_000) end) end
    for _ <- 1..10, do: {jax_run.(), node_run.()}
    samples = for _ <- 1..pairs, do: {jax_run.(), node_run.()}
    Port.close(jax)
    GenServer.call({:xla, xla}, {:free, exe})

    %{
      jax: Bench.median(Enum.map(samples, &elem(&1, 0))),
      node: Bench.median(Enum.map(samples, &elem(&1, 1))),
      pair_ratio: Bench.median(Enum.map(samples, fn {j, n} -> n / j end))
    }
  end

  loops = for n <- [10_000, 100_000], do: {n, kernel_loop.(n, if(n > 10_000, do: 50, else: 200))}

  one_call = """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %y = stablehlo.custom_call @xn_increment(%x) {api_version = 4 : i32, backend_config = {}} : (tensor<4xf32>) -> tensor<4xf32>
    return %y : tensor<4xf32>
  }
  """

  {:ok, call_exe} = GenServer.call({:xla, xla}, {:compile, one_call})
  {:ok, plain_exe} = GenServer.call({:xla, xla}, {:compile, Bench.add_one()})
  x4 = Bench.f32x4()
  with_call = fn -> {:ok, [_]} = GenServer.call({:xla, xla}, {:run, call_exe, [x4]}) end
  without_call = fn -> {:ok, [_]} = GenServer.call({:xla, xla}, {:run, plain_exe, [x4]}) end
  for _ <- 1..2000, do: {with_call.(), without_call.()}
  s = Bench.interleave([with: with_call, without: without_call], 10, 1000)
  fixed = Bench.median(s.without)

  rows =
    Enum.flat_map(loops, fn {n, r} ->
      [
        "fori_loop of #{n} kernel calls (JAX's module on the node; runs alternating with JAX's), per iteration:",
        "  xla_node: #{Float.round(r.node / n, 4)} us   JAX: #{Float.round(r.jax / n, 4)} us   ratio #{Float.round(r.node / r.jax, 3)} (median of pair ratios #{Float.round(r.pair_ratio, 3)})#{if n == 10_000, do: "  (target <= 1.1)", else: ""}",
        "  xla_node less the fixed cost of a run from another node (the x + 1 run below): #{Float.round((r.node - fixed) / n, 4)} us, ratio #{Float.round((r.node - fixed) / r.jax, 3)}"
      ]
    end)

  Bench.report("native kernel xn_increment (the same library in JAX 0.8.1 and on the node)", rows ++ [
    "one run of x + 1 on f32[4] from a BEAM node (10,000 each, interleaved):",
    "  as one kernel call:  median #{Bench.us(Bench.median(s.with))}",
    "  as stablehlo.add:    median #{Bench.us(fixed)}",
    "  ratio with/without the kernel: #{Float.round(Bench.median(s.with) / fixed, 3)}"
  ])
end

if parts in ["all", "metrics"] do
  # Two nodes of this build: `off` without --metrics-addr, `on` with it and scraped every second
  # throughout (Prometheus scrapes every 15 s to 1 min). Both record their counters and
  # histograms, which `:info` reports whatever the flag; XLA_NODE_BENCH_BASELINE_BIN adds a node
  # of another build (one from before the metrics, say) to compare the recording with. Rounds
  # of 400 calls to each node, 50 of them, in an order that rotates.
  on = :"#{System.fetch_env!("XLA_NODE_BENCH_METRICS_NODE")}@#{host}"
  url = String.to_charlist(System.fetch_env!("XLA_NODE_BENCH_METRICS_URL"))
  baseline = System.get_env("XLA_NODE_BENCH_BASELINE_NODE")
  nodes = [off: xla, on: on] ++ if(baseline, do: [baseline: :"#{baseline}@#{host}"], else: [])
  for {_, n} <- nodes, do: true = Node.connect(n)
  {:ok, _} = Application.ensure_all_started(:inets)
  parent = self()

  scraper =
    spawn_link(fn ->
      scrape = fn scrape, count ->
        {:ok, {{_, 200, _}, _, _}} = :httpc.request(:get, {url, []}, [], body_format: :binary)

        receive do
          :stop -> send(parent, {:scrapes, count + 1})
        after
          1_000 -> scrape.(scrape, count + 1)
        end
      end

      scrape.(scrape, 0)
    end)

  x = Bench.f32x4()
  exes = Map.new(nodes, fn {k, n} -> {k, elem(GenServer.call({:xla, n}, {:compile, Bench.add_one()}), 1)} end)
  ping = fn n -> fn -> :pong = GenServer.call({:xla, n}, :ping) end end
  run = fn k, n -> fn -> {:ok, [_]} = GenServer.call({:xla, n}, {:run, exes[k], [x]}) end end

  for {k, n} <- nodes, _ <- 1..2000, do: {ping.(n).(), run.(k, n).()}
  pings = Bench.interleave(for({k, n} <- nodes, do: {k, ping.(n)}), 50, 400, rotate: true)
  runs = Bench.interleave(for({k, n} <- nodes, do: {k, run.(k, n)}), 50, 400, rotate: true)
  send(scraper, :stop)
  scrapes = receive do: ({:scrapes, count} -> count)

  rows = fn samples ->
    off = Bench.median(samples.off)

    Enum.map(nodes, fn {k, _} ->
      m = Bench.median(samples[k])
      "#{String.pad_trailing(Atom.to_string(k), 9)} median #{Bench.us(m)}, p99 #{Bench.us(Bench.p99(samples[k]))}, over off #{Float.round(m / off, 3)}"
    end)
  end

  Bench.report(
    "metrics: tiny calls with --metrics-addr (on, scraped every second: #{scrapes} scrapes) and without (off), 20,000 each, interleaved",
    ["GenServer.call :ping"] ++ rows.(pings) ++ ["{:run, exe, [f32[4]]} of x + 1"] ++ rows.(runs) ++
      ["target: on within 2% of off (ratio <= 1.02)"]
  )
end
