# What the client nodes of bench/tenants.exs run: loops of raw `{:run, exe, [x]}` calls to a
# compute node, timed or counted. Loaded with Code.require_file/1 on each client node (BEAM peers
# started by bench/tenants.exs), so that the loops run as compiled code there.
defmodule Bench.TenantClients do
  @doc "An f32[n] tensor of ones."
  def ones(n), do: {:binary.copy(<<1.0::float-32-little>>, n), {{:f, 32}, [n]}}

  @doc """
  A callback server on this node for programs whose one `runtime_call` returns its argument:
  it answers each after `delay_ms` (each on a process of its own, so that delays overlap).
  """
  def callback_server(delay_ms) do
    spawn(fn -> serve(delay_ms) end)
  end

  defp serve(delay_ms) do
    receive do
      {:exla_runtime_call, _id, [{bin, _spec}], {pid, ref}} ->
        if delay_ms == 0 do
          send(pid, {ref, {:ok, [bin]}})
        else
          spawn(fn ->
            Process.sleep(delay_ms)
            send(pid, {ref, {:ok, [bin]}})
          end)
        end
    end

    serve(delay_ms)
  end

  @doc """
  The run options of a program that calls back (`callback_delay_ms` an integer: a callback
  server on this node answering after that long), or none (`nil`).
  """
  def run_options(nil), do: []
  def run_options(delay_ms), do: [callback_server: callback_server(delay_ms)]

  @doc """
  `count` runs of `exe` on `ones(n)`, one after another with `think_ms` between them; the
  microseconds each took, from the call to the reply. `callback_delay_ms`: see `run_options/1`.
  """
  def latencies(node, exe, n, count, think_ms, callback_delay_ms \\ nil) do
    x = ones(n)
    request = {:run, exe, [x], run_options(callback_delay_ms)}

    for _ <- 1..count do
      Process.sleep(think_ms)
      t0 = System.monotonic_time(:nanosecond)
      {:ok, [_]} = GenServer.call({:xla, node}, request, :infinity)
      (System.monotonic_time(:nanosecond) - t0) / 1000
    end
  end

  @doc """
  Starts `procs` processes that each run `exe` on `ones(n)` over and over until `stop/1`; returns
  the process that stops them. Each keeps one run in flight. `callback_delay_ms`: see
  `run_options/1`.
  """
  def start_load(node, exe, n, procs, callback_delay_ms \\ nil) do
    start_calls(procs, fn ->
      request = {:run, exe, [ones(n)], run_options(callback_delay_ms)}
      fn -> {:ok, [_]} = GenServer.call({:xla, node}, request, :infinity) end
    end)
  end

  # A load: `procs` processes that each make one call over and over until `stop/1`, counted.
  # `setup` runs in the load's own process (which then holds what it makes, such as a callback
  # server) and returns the call.
  defp start_calls(procs, setup) do
    spawn(fn ->
      call = setup.()
      counter = :counters.new(1, [:atomics])
      stop = :atomics.new(1, [])
      workers = for _ <- 1..procs, do: spawn_link(fn -> loop(call, counter, stop) end)
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

  @doc """
  A BEAM process standing in for the compute node: it answers `{:echo, from, ref, term}` with
  `{ref, term}`, each from a process of its own (as the node runs requests side by side);
  `{:ping, from, ref}` with `{ref, :pong}`; and `{:relay, from, ref, term, callback}` as a run
  that calls back does: from a process of its own, it sends `term` to `callback` (a
  `callback_server/1`) in the node's callback message, and answers `{ref, term}` once that
  answered.
  """
  def echo_server do
    spawn(fn -> echo_loop() end)
  end

  defp echo_loop do
    receive do
      {:echo, from, ref, term} -> spawn(fn -> send(from, {ref, term}) end)
      {:ping, from, ref} -> send(from, {ref, :pong})
      {:relay, from, ref, term, callback} -> spawn(fn -> relay(from, ref, term, callback) end)
    end

    echo_loop()
  end

  defp relay(from, ref, term, callback) do
    call = make_ref()
    send(callback, {:exla_runtime_call, 0, [{term, nil}], {self(), call}})
    receive(do: ({^call, {:ok, [back]}} -> send(from, {ref, back})))
  end

  @doc """
  `count` calls of `server` (an `echo_server/0`, maybe on another node), one after another with
  `think_ms` between them; the microseconds each took, as `latencies/6` gives for runs. A ping,
  or with `callback_delay_ms` an integer, a relay of 16 bytes through a callback server on this
  node answering after that long (the shape of a run that calls back).
  """
  def echo_latencies(server, count, think_ms, callback_delay_ms \\ nil) do
    message =
      if callback_delay_ms,
        do: relay_request(16, callback_delay_ms),
        else: fn ref -> {:ping, self(), ref} end

    for _ <- 1..count do
      Process.sleep(think_ms)
      t0 = System.monotonic_time(:nanosecond)
      ref = make_ref()
      send(server, message.(ref))
      receive(do: ({^ref, _} -> :ok))
      (System.monotonic_time(:nanosecond) - t0) / 1000
    end
  end

  @doc """
  As `start_load/5`, with `server` (an `echo_server/0`) in the node's place: `procs` processes
  that each send it `bytes` and wait for them back, over and over until `stop/1`; with
  `callback_delay_ms` an integer, relayed through a callback server on this node answering after
  that long.
  """
  def start_echo_load(server, bytes, procs, callback_delay_ms \\ nil) do
    start_calls(procs, fn ->
      message =
        if callback_delay_ms do
          relay_request(bytes, callback_delay_ms)
        else
          payload = :binary.copy(<<1>>, bytes)
          fn ref -> {:echo, self(), ref, payload} end
        end

      fn ->
        ref = make_ref()
        send(server, message.(ref))
        receive(do: ({^ref, _} -> :ok))
      end
    end)
  end

  # The message of a call relayed through a callback server made here, given its ref.
  defp relay_request(bytes, callback_delay_ms) do
    payload = :binary.copy(<<1>>, bytes)
    callback = callback_server(callback_delay_ms)
    fn ref -> {:relay, self(), ref, payload, callback} end
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

  defp loop(call, counter, stop) do
    if :atomics.get(stop, 1) == 0 do
      call.()
      :counters.add(counter, 1, 1)
      loop(call, counter, stop)
    end
  end
end
