# The devices benchmark (part of bench/run.sh nx): throughput of a compute-bound Nx.Serving (an
# MLP forward pass, batch 64) on one device of the node (partitions: false) and on every device
# (partitions: true, one partition per device), with twice as many clients as the node has devices
# sending batches for a fixed time. Prints batches per second for each, and the node's runs per
# device.
#
# Runs inside the elixir_nx Mix project, which needs Nx (NX_PATH) and Elixir >= 1.17:
#   cd elixir_nx && elixir --sname NAME --cookie COOKIE -S mix run ../bench/nx_devices.exs XLA_NODE_SNAME

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
