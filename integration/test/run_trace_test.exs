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

  test "with a trace file as well, each run is a line of its steps by the system clock" do
    file = Path.join(System.tmp_dir!(), "xla_run_trace_#{System.unique_integer([:positive])}")
    on_exit(fn -> File.rm(file) end)

    node =
      Harness.start_node(env: [{"XLA_NODE_RUN_TRACE", "1"}, {"XLA_NODE_RUN_TRACE_FILE", file}])

    before = :os.system_time(:nanosecond)
    run(node, 5, [])
    answered = :os.system_time(:nanosecond)

    # A run's line is written once its reply is, after the caller may have it.
    runs = Harness.eventually(fn -> (runs = trace_lines(file)) |> length() == 5 and runs end)

    for [received, _checked, _started, _entered, _launched, _completed, converted, _replied] =
          steps <- runs do
      assert steps == Enum.sort(steps), "steps out of order: #{inspect(steps)}"
      # The caller's clock and the node's are the same: each run within the caller's calls.
      assert before <= received and converted <= answered, inspect({before, steps, answered})
    end
  end

  test "a trace file without the switch stays unwritten" do
    file = Path.join(System.tmp_dir!(), "xla_run_trace_#{System.unique_integer([:positive])}")
    node = Harness.start_node(env: [{"XLA_NODE_RUN_TRACE_FILE", file}])
    run(node, 3, [])
    refute File.exists?(file)
  end

  # The file's runs, each a list of step times; none before its first line is written.
  defp trace_lines(file) do
    with {:ok, text} <- File.read(file) do
      text |> String.split("\n", trim: true) |> Enum.map(&integers/1)
    else
      {:error, :enoent} -> []
    end
  end

  defp integers(line), do: line |> String.split() |> Enum.map(&String.to_integer/1)

  test "off by default" do
    node = Harness.start_node()
    run(node, 3, [])
    refute Map.has_key?(info(node), :run_trace)
  end
end
