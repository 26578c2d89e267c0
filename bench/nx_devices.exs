# The devices benchmark (part of bench/run.sh nx): throughput of a compute-bound Nx.Serving (an
# MLP forward pass, batch 64) on one device of the node (partitions: false) and on every device
# (partitions: true, one partition per device), with twice as many clients as the node has devices
# sending batches for a fixed time. Prints batches per second for each, and the node's runs per
# device. Then, with one caller calling in a loop and the weights held on the devices as
# arguments: the same forward pass jitted on one device, and sharded with Nx.Defn.shard_jit
# over every device (the batch split over a 1-D mesh, the weights whole on each), against JAX's
# jax.jit on one device and with NamedSharding over as many CPU devices (bench/nx_devices_jax.py,
# jaxlib's CPU client with --xla_force_host_platform_device_count set to the node's device count),
# in the same run. Last, the most any caller on a BEAM node could reach there: JAX's computation
# alone (the batch already on the devices) plus the faster of two round trips that carry the
# call's bytes, one between two BEAM nodes (to a process on a peer node this script starts with
# :peer), one to the node (the same run request, refused before XLA).
#
# Runs inside the elixir_nx Mix project, which needs Nx (NX_PATH) and Elixir >= 1.17:
#   cd elixir_nx && elixir --sname NAME --cookie COOKIE -S mix run ../bench/nx_devices.exs XLA_NODE_SNAME
# with XLA_NODE_BENCH_JAX naming the folder that holds JAX (scripts/kernels.sh installs it; the
# JAX lines are skipped, saying so, without it). Where a jit and a shard_jit call's time goes,
# stretch by stretch between the two processes, with the node started with XLA_NODE_RUN_TRACE=1
# and XLA_NODE_RUN_TRACE_FILE=PATH on this machine, and XLA_NODE_BENCH_CALL_TRACE=PATH here.

[xla_name] = System.argv()
host = node() |> Atom.to_string() |> String.split("@") |> List.last()
xla = :"#{xla_name}@#{host}"
true = Node.connect(xla)

defmodule Bench.NxDevices do
  import Nx.Defn

  @width 512

  def width, do: @width

  defn forward(params, x) do
    h = Nx.tanh(Nx.dot(x, params.w1))
    h = Nx.tanh(Nx.dot(h, params.w2))
    Nx.dot(h, params.w3)
  end

  def params do
    key = Nx.Random.key(7)
    {w1, key} = Nx.Random.normal(key, 0.0, 0.05, shape: {@width, @width})
    {w2, key} = Nx.Random.normal(key, 0.0, 0.05, shape: {@width, @width})
    {w3, _key} = Nx.Random.normal(key, 0.0, 0.05, shape: {@width, 16})
    %{w1: w1, w2: w2, w3: w3}
  end

  # Calls per second of `call` (one batch each) from one caller over `seconds`, after a first
  # call that compiles.
  def sequential(call, seconds) do
    call.()
    deadline = System.monotonic_time(:millisecond) + seconds * 1000
    calls(call, deadline, 0) / seconds
  end

  defp calls(call, deadline, n) do
    if System.monotonic_time(:millisecond) >= deadline do
      n
    else
      call.()
      calls(call, deadline, n + 1)
    end
  end

  # Calls per second from this node to a process on a peer BEAM node, each sending `payload` and
  # getting `reply_bytes` back, over `seconds`. `echo` is Bench.RoundTripEcho's object code.
  def round_trip({echo, beam}, payload, reply_bytes, seconds) do
    cookie = ~c"#{Node.get_cookie()}"
    name = :"bench_round_trip_#{System.unique_integer([:positive])}"
    {:ok, peer, peer_node} = :peer.start_link(%{name: name, args: [~c"-setcookie", cookie]})
    {:module, ^echo} = :erpc.call(peer_node, :code, :load_binary, [echo, ~c"nofile", beam])
    pid = :erpc.call(peer_node, echo, :start, [reply_bytes])

    call = fn ->
      ref = make_ref()
      send(pid, {self(), ref, payload})

      receive do
        {^ref, _reply} -> :ok
      end
    end

    rate = sequential(call, seconds)
    :peer.stop(peer)
    rate
  end

  # `n` calls of `call`, each stamped here (before it, the start and stop of its XlaNode.run,
  # after it) and paired with the line the node wrote for its run in `trace_file` (the node's
  # XLA_NODE_RUN_TRACE_FILE), both by the system clock; prints the median of each stretch of a
  # call, in microseconds.
  def call_trace(label, call, trace_file, n) do
    Code.ensure_loaded!(:telemetry)
    stamps = :ets.new(:call_trace, [:public])
    handler = "bench-call-trace-#{System.unique_integer([:positive])}"

    :telemetry.attach_many(
      handler,
      [[:xla_node, :run, :start], [:xla_node, :run, :stop]],
      &__MODULE__.stamp/4,
      stamps
    )

    written = trace_lines(trace_file)

    calls =
      for _ <- 1..n do
        before = :os.system_time(:nanosecond)
        call.()
        after_call = :os.system_time(:nanosecond)
        [{:start, start}] = :ets.lookup(stamps, :start)
        [{:stop, stop}] = :ets.lookup(stamps, :stop)
        {before, start, stop, after_call}
      end

    :telemetry.detach(handler)
    # The node writes a run's line once its reply is out: the last may come a moment later.
    runs = await_lines(trace_file, length(written) + n, 50) |> Enum.drop(length(written))

    stretches =
      Enum.zip_with(calls, runs, fn {before, start, stop, after_call}, run ->
        [received, _, _, _, launched, completed, converted, _replied] = run

        [
          {"the caller, to its request", start - before},
          {"to the node (the request's way in)", received - start},
          {"the node, to XLA's launch", launched - received},
          {"XLA, from its launch to the results", completed - launched},
          {"the node, the results to terms", converted - completed},
          {"back to the caller (the reply's way out)", stop - converted},
          {"the caller, after the reply", after_call - stop},
          {"the whole call", after_call - before}
        ]
      end)

    IO.puts("  where a #{label} call's time goes, median us of #{n} calls:")

    for {name, _} <- hd(stretches) do
      values = stretches |> Enum.map(&List.keyfind!(&1, name, 0)) |> Enum.map(&elem(&1, 1))
      median = values |> Enum.sort() |> Enum.at(div(length(values), 2))
      IO.puts("    #{name}: #{Float.round(median / 1000, 1)}")
    end
  end

  @doc false
  # call_trace/4's telemetry handler: the time of a run's start or stop, by the system clock.
  def stamp([_, _, event], _measurements, _metadata, stamps),
    do: :ets.insert(stamps, {event, :os.system_time(:nanosecond)})

  defp trace_lines(file) do
    case File.read(file) do
      {:ok, text} ->
        for line <- String.split(text, "\n", trim: true),
            do: line |> String.split() |> Enum.map(&String.to_integer/1)

      {:error, :enoent} ->
        []
    end
  end

  defp await_lines(file, count, tries) do
    lines = trace_lines(file)

    cond do
      length(lines) >= count ->
        lines

      tries == 0 ->
        raise "#{file} has #{length(lines)} runs, not #{count}: is it this node's " <>
                "XLA_NODE_RUN_TRACE_FILE, with XLA_NODE_RUN_TRACE=1?"

      true ->
        Process.sleep(100)
        await_lines(file, count, tries - 1)
    end
  end

  # Batches per second through `name` from `clients` processes over `seconds`.
  def throughput(name, batch, clients, seconds) do
    deadline = System.monotonic_time(:millisecond) + seconds * 1000

    counts =
      1..clients
      |> Task.async_stream(fn _ -> loop(name, batch, deadline, 0) end,
        max_concurrency: clients,
        timeout: :infinity
      )
      |> Enum.map(fn {:ok, n} -> n end)

    Enum.sum(counts) / seconds
  end

  defp loop(name, batch, deadline, n) do
    if System.monotonic_time(:millisecond) >= deadline do
      n
    else
      Nx.Serving.batched_run(name, batch)
      loop(name, batch, deadline, n + 1)
    end
  end
end

# The process the round trip below calls, on a peer node: it answers each message with a binary
# of a result's size. Its object code is loaded there.
{:module, echo, echo_beam, _} =
  defmodule Bench.RoundTripEcho do
    def start(reply_bytes), do: spawn(fn -> loop(:binary.copy(<<0>>, reply_bytes)) end)

    defp loop(reply) do
      receive do
        {from, ref, _payload} ->
          send(from, {ref, reply})
          loop(reply)
      end
    end
  end

params = Bench.NxDevices.params()
batch_size = 64

batch =
  Nx.Batch.stack(
    for i <- 1..batch_size, do: Nx.broadcast(i / batch_size, {Bench.NxDevices.width()})
  )

{:ok, %{devices: devices}} = XlaNode.info(xla)
seconds = String.to_integer(System.get_env("XLA_NODE_BENCH_SECONDS", "10"))

runs = fn ->
  {:ok, %{device_info: info}} = XlaNode.info(xla)
  Enum.map(info, & &1.runs)
end

IO.puts(
  "\n## Nx.Serving on the devices of a node (#{length(devices)} devices: #{Enum.join(devices, ", ")})"
)

IO.puts(
  "MLP forward #{batch_size}x#{Bench.NxDevices.width()} -> 2 x #{Bench.NxDevices.width()} -> 16, f32, #{seconds} s each\n"
)

for {label, partitions} <- [
      {"one device (partitions: false)", false},
      {"every device (partitions: true)", true}
    ] do
  serving =
    Nx.Serving.jit(&Bench.NxDevices.forward(params, &1), compiler: XlaNode.Compiler, node: xla)
    |> Nx.Serving.batch_size(batch_size)

  name = :"bench_serving_#{partitions}"

  {:ok, pid} =
    Nx.Serving.start_link(serving: serving, name: name, batch_timeout: 1, partitions: partitions)

  clients = 2 * length(devices)
  # Warm: compiles once.
  Nx.Serving.batched_run(name, batch)
  before = runs.()
  rate = Bench.NxDevices.throughput(name, batch, clients, seconds)
  per_device = Enum.zip_with(runs.(), before, &(&1 - &2))

  IO.puts(
    "  #{label}: #{Float.round(rate, 1)} batches/s, #{clients} clients; runs per device #{inspect(per_device)}"
  )

  Supervisor.stop(pid)
end

IO.puts("\nOne caller in a loop, the weights on the devices as arguments, #{seconds} s each:")
x = Nx.stack(for i <- 1..batch_size, do: Nx.broadcast(i / batch_size, {Bench.NxDevices.width()}))
count = length(devices)

# The weights as arguments, a copy on each device, as JAX's side holds them: a function that
# closes over them would make them part of the compiler's cache key, looked up at each call.
params_on =
  for device <- 0..(count - 1),
      do: Nx.backend_copy(params, {XlaNode.Backend, node: xla, device_id: device})

jitted = Nx.Defn.jit(&Bench.NxDevices.forward/2, compiler: XlaNode.Compiler, node: xla)
jit_rate = Bench.NxDevices.sequential(fn -> jitted.(hd(params_on), x) end, seconds)
IO.puts("  xla_node jit on one device: #{Float.round(jit_rate, 1)} batches/s")

mesh = %Nx.Mesh{name: "batch", shape: {count}}

sharded =
  Nx.Defn.shard_jit(&Bench.NxDevices.forward/2, mesh,
    compiler: XlaNode.Compiler,
    node: xla,
    input_shardings: [%{}, %{0 => [0]}]
  )

shard_rows = div(batch_size, count)

split = fn ->
  for {p, k} <- Enum.with_index(params_on),
      do: [p, Nx.slice_along_axis(x, k * shard_rows, shard_rows)]
end

before = runs.()
shard_rate = Bench.NxDevices.sequential(fn -> sharded.(split.()) end, seconds)
per_device = Enum.zip_with(runs.(), before, &(&1 - &2))

IO.puts(
  "  xla_node shard_jit over #{count} devices (mesh {#{count}}, batch split): " <>
    "#{Float.round(shard_rate, 1)} batches/s; runs per device #{inspect(per_device)}"
)

# Where a call's time goes, between this node and the node, when the node writes its runs' steps
# (started with XLA_NODE_RUN_TRACE=1 and XLA_NODE_RUN_TRACE_FILE, which this variable names).
case System.get_env("XLA_NODE_BENCH_CALL_TRACE") do
  nil ->
    :ok

  trace_file ->
    Bench.NxDevices.call_trace("jit", fn -> jitted.(hd(params_on), x) end, trace_file, 3000)
    Bench.NxDevices.call_trace("shard_jit", fn -> sharded.(split.()) end, trace_file, 3000)

    # The same bytes in and out with nothing to compute: what the two ways cost by themselves.
    slice = fn x -> Nx.slice(x, [0, 0], [batch_size, 16]) end
    sliced = Nx.Defn.jit(slice, compiler: XlaNode.Compiler, node: xla)
    Bench.NxDevices.call_trace("slice (no computation)", fn -> sliced.(x) end, trace_file, 3000)
end

# What a call pays besides the computation: a round trip that carries its bytes (the batch in, the
# result out). Between two BEAM nodes, what any executor on another node would pay; to the node,
# the same run request refused before XLA (a program it does not hold), its own way in and out.
# JAX's computation alone plus the faster of the two is the most a caller on a BEAM node can
# reach: a node adding nothing else.
batch_bin = Nx.to_binary(x)
result_bytes = batch_size * 16 * 4
beam_trip = Bench.NxDevices.round_trip({echo, echo_beam}, batch_bin, result_bytes, seconds)
unknown = make_ref()
request = {:run, unknown, [{batch_bin, {{:f, 32}, {batch_size, Bench.NxDevices.width()}}}]}

node_trip =
  Bench.NxDevices.sequential(
    fn -> {:error, {:argument_error, _}} = GenServer.call({:xla, xla}, request) end,
    seconds
  )

round_trip = max(beam_trip, node_trip)
per_call = fn rate -> "#{Float.round(rate, 1)} calls/s (#{Float.round(1.0e6 / rate, 1)} us)" end

IO.puts(
  "  round trip between two BEAM nodes, #{byte_size(batch_bin)} bytes in and #{result_bytes} " <>
    "out: #{per_call.(beam_trip)}"
)

IO.puts(
  "  round trip of the same run request to the node, refused before XLA (an unknown program): " <>
    per_call.(node_trip)
)

case System.get_env("XLA_NODE_BENCH_JAX") do
  nil ->
    IO.puts("  JAX: skipped: XLA_NODE_BENCH_JAX does not name a JAX install")

  jax_dir ->
    {out, status} =
      System.cmd(
        "python3",
        [Path.join(__DIR__, "nx_devices_jax.py"), "--devices", "#{count}"] ++
          ["--batch", "#{batch_size}", "--width", "#{Bench.NxDevices.width()}"] ++
          ["--seconds", "#{seconds}"],
        env: [
          {"PYTHONPATH", jax_dir},
          {"XLA_FLAGS", "--xla_force_host_platform_device_count=#{count}"}
        ],
        stderr_to_stdout: true
      )

    if status == 0 do
      rates =
        for line <- String.split(out, "\n", trim: true), line =~ "batches/s", into: %{} do
          IO.puts("  JAX " <> line)

          [label, rate] =
            Regex.run(~r/^(.*): ([0-9.]+) batches\/s/, line, capture: :all_but_first)

          {label, String.to_float(rate)}
        end

      # A call through another process takes at least the computation and a round trip.
      for {what, label, ours} <- [
            {"one device", "jit on one device", jit_rate},
            {"#{count} devices", "jit over #{count} devices (NamedSharding)", shard_rate}
          ] do
        bound = 1 / (1 / rates[label <> ", computation alone"] + 1 / round_trip)

        IO.puts(
          "  on #{what}: the most a caller on a BEAM node can reach (JAX's computation alone " <>
            "plus the faster round trip) #{Float.round(bound, 1)} batches/s, " <>
            "#{Float.round(bound / rates[label], 2)}x JAX's; xla_node " <>
            "#{Float.round(ours / rates[label], 2)}x JAX's, #{Float.round(ours / bound, 2)}x that most"
        )
      end
    else
      IO.puts("  JAX: failed (status #{status}): " <> String.slice(out, -500, 500))
    end
end
