defmodule XlaNode.PoolHelpers do
  @moduledoc """
  Programs and a recording callback server for pool_test.exs. The server runs on a peer node
  (through `XlaNode.Harness.peer_call/5`, so it lives in test/support/): it serves
  `runtime_call`s (`:double`) and `io_call`s (`:log`) and writes down every callback it serves
  before answering, so that a test can tell whether a run's callback was served twice.
  """

  alias XlaNode.MLIR, as: M
  alias XlaNode.Tensor

  @doc """
  Starts (unlinked) a callback server, its log and its gate; each callback is written down, then
  waits while the gate is closed (`close_gate/1`, `open_gate/1`) and `delay_ms` more before it
  answers. Returns `{server, log, gate}`.
  """
  def start_recording_server(delay_ms) do
    {:ok, log} = Agent.start(fn -> [] end)
    {:ok, gate} = Agent.start(fn -> :open end)

    callbacks = %{
      double: fn [x] ->
        record(log, :double, x)
        pass(gate)
        Process.sleep(delay_ms)
        {:ok, [Tensor.from_list(Enum.map(Tensor.to_list(x), &(&1 * 2)), {:f, 32})]}
      end,
      log: fn [x] ->
        record(log, :log, x)
        pass(gate)
        Process.sleep(delay_ms)
        {:ok, []}
      end
    }

    {:ok, server} = XlaNode.CallbackServer.start(callbacks)
    {server, log, gate}
  end

  @doc "Holds every callback of the server, once written down, until `open_gate/1`."
  def close_gate(gate), do: Agent.update(gate, fn _ -> :closed end)

  @doc "Lets the held callbacks answer."
  def open_gate(gate), do: Agent.update(gate, fn _ -> :open end)

  defp pass(gate) do
    if Agent.get(gate, & &1) == :closed do
      Process.sleep(5)
      pass(gate)
    end
  end

  @doc "Every callback served so far, as `{callback_id, first element of the argument}`."
  def served(log), do: Agent.get(log, &Enum.reverse/1)

  defp record(log, id, x), do: Agent.update(log, &[{id, hd(Tensor.to_list(x))} | &1])

  @doc "main(x: s64[4]) = x added up `n` times in a while loop: CPU work with an exact result."
  def busy_sum(n) do
    M.module(fn ->
      M.function("main", [{{:s, 64}, [4]}], fn [x] ->
        zero = M.constant(0, {{:s, 64}, []})

        [_, sum] =
          M.while_loop(
            [zero, M.constant(0, {{:s, 64}, [4]})],
            fn [i, _] -> M.compare(:lt, i, M.constant(n, {{:s, 64}, []})) end,
            fn [i, acc] -> [M.add(i, M.constant(1, {{:s, 64}, []})), M.add(acc, x)] end
          )

        sum
      end)
    end)
  end

  @doc "main(cb, x: f32[4]) = runtime_call(:double, x) + 1: calls back, no side effects."
  def doubling do
    M.module(fn ->
      M.function("main", [{{:u, 8}, [8]}, {{:f, 32}, [4]}], fn [cb, x] ->
        [doubled] = M.runtime_call(cb, :double, [x], [x.type])
        M.add(doubled, M.constant(1.0, x.type))
      end)
    end)
  end

  @doc "main(cb, x: f32[4]) = io_call(:log, x): a side effect, x comes back unchanged."
  def logging do
    M.module(fn ->
      M.function("main", [{{:u, 8}, [8]}, {{:f, 32}, [4]}], fn [cb, x] ->
        [logged] = M.io_call(cb, :log, [x])
        logged
      end)
    end)
  end
end
