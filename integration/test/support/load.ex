defmodule XlaNode.Load do
  @moduledoc """
  Load that runs on peer nodes (see `XlaNode.LivenessTest`): client processes looping over
  requests to `{:xla, node}`, callback servers, and one-shot bursts of runs. Every result is
  checked against the value computed here; everything returns plain data (counts and the first
  few failures), so nothing but terms crosses nodes.
  """

  @call_timeout 20_000

  @doc """
  A callback server for `{:exla_runtime_call, id, [{f32 binary, spec}], {pid, ref}}` that replies
  `x + 1`, after `delay_ms` (each request on a process of its own, so slow replies overlap).
  Registered as `name` when given.
  """
  def callback_server(delay_ms, name \\ nil) do
    pid = spawn(fn -> serve(delay_ms) end)
    if name, do: Process.register(pid, name)
    pid
  end

  defp serve(delay_ms) do
    receive do
      {:exla_runtime_call, _id, [{bin, _spec}], {pid, ref}} ->
        reply = fn -> send(pid, {ref, {:ok, [plus_one(bin)]}}) end

        if delay_ms == 0 do
          reply.()
        else
          spawn(fn ->
            Process.sleep(delay_ms)
            reply.()
          end)
        end
    end

    serve(delay_ms)
  end

  @doc """
  `main(callback handle, x: f32[4]) -> f32[4]`, whose result is what the run's callback server
  answers to one `runtime_call` with `id` (EXLA's custom call, built with `XlaNode.MLIR`).
  """
  def callback_program(id) do
    XlaNode.MLIR.module(fn ->
      XlaNode.MLIR.function("main", [{{:u, 8}, [8]}, {{:f, 32}, [4]}], fn [cb, x] ->
        XlaNode.MLIR.runtime_call(cb, id, [x], [{{:f, 32}, [4]}])
      end)
    end)
  end

  @doc "`main(x: f32[4]) = x + 1` as MLIR text: the program of `{:tiny, exe}` requests."
  def plus_one_program do
    """
    func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %one = stablehlo.constant dense<1.0> : tensor<4xf32>
      %y = stablehlo.add %x, %one : tensor<4xf32>
      return %y : tensor<4xf32>
    }
    """
  end

  @doc "`main(x: f32[4]) -> f32[n]`: x's first element, broadcast (a run of `n * 4` bytes of results)."
  def wide_program(n) do
    """
    func.func @main(%x: tensor<4xf32>) -> tensor<#{n}xf32> {
      %s = stablehlo.slice %x [0:1] : (tensor<4xf32>) -> tensor<1xf32>
      %y = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<1xf32>) -> tensor<#{n}xf32>
      return %y : tensor<#{n}xf32>
    }
    """
  end

  @doc "Each f32 of `bin` plus one."
  def plus_one(bin),
    do: for(<<v::float-32-little <- bin>>, into: <<>>, do: <<v + 1.0::float-32-little>>)

  @doc "Each f32 of `bin` times two."
  def times_two(bin),
    do: for(<<v::float-32-little <- bin>>, into: <<>>, do: <<v * 2.0::float-32-little>>)

  @doc "`n` f32 values starting at `first`, as a tensor term."
  def f32(first, n) do
    {for(i <- 0..(n - 1), into: <<>>, do: <<first + i * 1.0::float-32-little>>), {{:f, 32}, [n]}}
  end

  @doc """
  Starts a task that runs the `x + 1` program `exe` (`plus_one_program/0`) over and over,
  checking each result, until `stop_runs/1`: load that must go on while the test does something
  to the node.
  """
  def start_runs(node, exe), do: Task.async(fn -> run_loop(node, exe, 0, []) end)

  @doc """
  Stops a `start_runs/2` task; returns `{runs that succeeded, what the others gave}` (the
  first five replies that were not the expected result, in order).
  """
  def stop_runs(task) do
    send(task.pid, :stop)
    Task.await(task, 2 * @call_timeout)
  end

  defp run_loop(node, exe, ok, failed) do
    receive do
      :stop -> {ok, Enum.reverse(failed)}
    after
      0 ->
        {bin, _} = x = f32(ok, 4)
        expected = plus_one(bin)

        case GenServer.call({:xla, node.name}, {:run, exe, [x]}, 10_000) do
          {:ok, [{^expected, _}]} -> run_loop(node, exe, ok + 1, failed)
          other when length(failed) < 5 -> run_loop(node, exe, ok, [other | failed])
          _ -> run_loop(node, exe, ok, failed)
        end
    end
  end

  @doc """
  Starts `clients` processes on this node, each looping until `duration_ms` has passed over the
  requests named in `mix` (see `request/3`), in turn; waits for them and returns
  `%{ok: count, failed: count, failures: [first few], by_kind: %{kind => count}}`.
  """
  def run_clients(node, clients, duration_ms, mix) do
    deadline = System.monotonic_time(:millisecond) + duration_ms

    1..clients
    |> Enum.map(fn c ->
      Task.async(fn -> client_loop(node, mix, deadline, c * 1000, 0, %{}) end)
    end)
    |> Enum.map(&Task.await(&1, duration_ms + 3 * @call_timeout))
    |> Enum.reduce(%{ok: 0, failed: 0, failures: [], by_kind: %{}}, &merge/2)
  end

  @doc """
  Starts `count` runs of the callback program `exe` at once, one process each, and waits for
  them all; returns the same summary as `run_clients/4`.
  """
  def burst(node, exe, server, count) do
    1..count
    |> Enum.map(fn i ->
      Task.async(fn -> tally(%{}, :burst, request(node, {:callback, exe, server}, i)) end)
    end)
    |> Enum.map(&Task.await(&1, 3 * @call_timeout))
    |> Enum.reduce(%{ok: 0, failed: 0, failures: [], by_kind: %{}}, &merge/2)
  end

  defp client_loop(node, mix, deadline, i, turn, acc) do
    if System.monotonic_time(:millisecond) >= deadline do
      acc
    else
      kind = Enum.at(mix, rem(turn, length(mix)))
      acc = tally(acc, elem(kind, 0), request(node, kind, i))
      client_loop(node, mix, deadline, i + 1, turn + 1, acc)
    end
  end

  @doc """
  One request, its result checked: `{:tiny, exe}` (x + 1 on f32[4]), `{:big, exe}` (2 * x on
  f32[65536]), `{:callback, exe, server}` (a program whose callback returns x + 1). Returns
  `:ok` or `{:error, what}`.
  """
  def request(node, {:tiny, exe}, i) do
    {bin, _} = x = f32(i, 4)
    check(call(node, {:run, exe, [x]}), plus_one(bin))
  end

  def request(node, {:big, exe}, i) do
    {bin, _} = x = f32(rem(i, 1000), 65_536)
    check(call(node, {:run, exe, [x]}), times_two(bin))
  end

  def request(node, {:callback, exe, server}, i) do
    {bin, _} = x = f32(i, 4)
    check(call(node, {:run, exe, [x], [callback_server: server]}), plus_one(bin))
  end

  defp call(node, request) do
    GenServer.call({:xla, node}, request, @call_timeout)
  catch
    :exit, reason -> {:exit, reason}
  end

  defp check({:ok, [{bin, _}]}, bin), do: :ok

  defp check({:ok, [{other, _}]}, _expected),
    do: {:error, {:wrong_result, binary_part(other, 0, min(16, byte_size(other)))}}

  defp check({:exit, {reason, _}}, _), do: {:error, {:exit, reason}}
  defp check(other, _), do: {:error, other}

  defp tally(acc, kind, :ok) do
    acc
    |> Map.update(:ok, 1, &(&1 + 1))
    |> Map.update(:by_kind, %{kind => 1}, &Map.update(&1, kind, 1, fn n -> n + 1 end))
  end

  defp tally(acc, kind, {:error, what}) do
    acc
    |> Map.update(:failed, 1, &(&1 + 1))
    |> Map.update(:failures, [{kind, what}], &Enum.take([{kind, what} | &1], 5))
  end

  defp merge(part, total) do
    %{
      ok: total.ok + Map.get(part, :ok, 0),
      failed: total.failed + Map.get(part, :failed, 0),
      failures: Enum.take(total.failures ++ Map.get(part, :failures, []), 10),
      by_kind: Map.merge(total.by_kind, Map.get(part, :by_kind, %{}), fn _, a, b -> a + b end)
    }
  end
end
