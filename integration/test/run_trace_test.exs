defmodule XlaNode.RunTraceTest do
  @moduledoc """
  `XLA_NODE_RUN_TRACE=1`: the node times each step of every run and `:info` reports the medians
  under `run_trace`, for runs answered once complete and runs answered at launch alike; without
  it there is no trace.
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, Load}

  defp info(node) do
    {:ok, info} = GenServer.call({:xla, node.name}, :info)
    info
  end

  defp run(node, n, opts) do
    Harness.connect!(node)
    {:ok, exe} = GenServer.call({:xla, node.name}, {:compile, Load.plus_one_program()})
    {bin, _} = x = Load.f32(1.0, 4)
    expected = Load.plus_one(bin)

    for _ <- 1..n do
      case GenServer.call({:xla, node.name}, {:run, exe, [x], opts}) do
        {:ok, [{^expected, _}]} -> :ok
        {:ok, [buffer]} when is_reference(buffer) -> :ok
      end
    end
  end

  test "with the switch on, :info has the median time of each step of a run" do
    node = Harness.start_node(env: [{"XLA_NODE_RUN_TRACE", "1"}])
    run(node, 40, [])

    # A run's sample is taken once its reply is written, after the caller may have it.
    assert %{run_trace: trace} =
             Harness.eventually(fn ->
               info = info(node)
               info.run_trace.samples == 40 and info
             end)

    steps = [
      trace.checked,
      trace.started,
      trace.entered,
      trace.launched,
      trace.completed,
      trace.converted,
      trace.replied
    ]

    assert Enum.all?(steps, &(is_float(&1) and &1 > 0))
    assert steps == Enum.sort(steps), "steps out of order: #{inspect(trace)}"

    # Answered at launch (results kept on the device): sampled too.
    run(node, 10, keep_on_device: true)
    assert Harness.eventually(fn -> info(node).run_trace.samples == 50 end)
  end

  test "off by default" do
    node = Harness.start_node()
    run(node, 3, [])
    refute Map.has_key?(info(node), :run_trace)
  end
end
