# What the client nodes of bench/tenants.exs run: loops of raw `{:run, exe, [x]}` calls to a
# compute node, timed or counted. Loaded with Code.require_file/1 on each client node (BEAM peers
# started by bench/tenants.exs), so that the loops run as compiled code there.
defmodule Bench.TenantClients do
  @doc "An f32[n] tensor of ones."
  def ones(n), do: {:binary.copy(<<1.0::float-32-little>>, n), {{:f, 32}, [n]}}

  @doc """
  `count` runs of `exe` on `ones(n)`, one after another with `think_ms` between them; the
  microseconds each took, from the call to the reply.
  """
  def latencies(node, exe, n, count, think_ms) do
    x = ones(n)

    for _ <- 1..count do
      Process.sleep(think_ms)
      t0 = System.monotonic_time(:nanosecond)
      {:ok, [_]} = GenServer.call({:xla, node}, {:run, exe, [x]}, :infinity)
      (System.monotonic_time(:nanosecond) - t0) / 1000
    end
  end

  @doc """
  Starts `procs` processes that each run `exe` on `ones(n)` over and over until `stop/1`; returns
  the process that stops them. Each keeps one run in flight.
  """
  def start_load(node, exe, n, procs) do
    spawn(fn ->
      x = ones(n)
      counter = :counters.new(1, [:atomics])
      stop = :atomics.new(1, [])

      workers =
        for _ <- 1..procs do
          spawn_link(fn -> loop(node, exe, x, counter, stop) end)
        end

      serve_load(workers, counter, stop)
    end)
  end

  defp serve_load(workers, counter, stop) do
    receive do
      {:count, from} ->
        send(from, {:count, :counters.get(counter, 1)})
        serve_load(workers, counter, stop)

      {:stop, from} ->
        :atomics.put(stop, 1, 1)
        refs = Enum.map(workers, &Process.monitor/1)
        for ref <- refs, do: receive(do: ({:DOWN, ^ref, _, _, _} -> :ok))
        send(from, {:stopped, :counters.get(counter, 1)})
    end
  end

  @doc "Stops a load started by `start_load/4`; the runs it completed."
  def stop(load) do
    send(load, {:stop, self()})

    receive do
      {:stopped, runs} -> runs
    after
      120_000 -> raise "the load did not stop"
    end
  end

  @doc "The runs a load started by `start_load/4` completed so far."
  def completed(load) do
    send(load, {:count, self()})

    receive do
      {:count, runs} -> runs
    after
      30_000 -> raise "the load did not answer"
    end
  end

  defp loop(node, exe, x, counter, stop) do
    if :atomics.get(stop, 1) == 0 do
      {:ok, [_]} = GenServer.call({:xla, node}, {:run, exe, [x]}, :infinity)
      :counters.add(counter, 1, 1)
      loop(node, exe, x, counter, stop)
    end
  end
end
