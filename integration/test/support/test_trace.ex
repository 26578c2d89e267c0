defmodule XlaNode.TestTrace do
  @moduledoc """
  An ExUnit formatter that writes a line to a file as each test starts and as it finishes,
  with the suite's own concurrency: where a run is stopped from outside (a time limit on a
  machine lent for a while, as scripts/gpu_check.sh meets), the tests that started and never
  finished are the ones it was waiting on. `XLA_NODE_TEST_TRACE=FILE` turns it on
  (test_helper.exs).
  """
  use GenServer

  @impl true
  def init(_opts) do
    path = System.fetch_env!("XLA_NODE_TEST_TRACE")
    File.mkdir_p!(Path.dirname(path))
    {:ok, File.open!(path, [:append, :utf8])}
  end

  @impl true
  def handle_cast({:test_started, %ExUnit.Test{} = test}, file) do
    IO.puts(file, "#{stamp()} started #{inspect(test.module)} #{test.name}")
    {:noreply, file}
  end

  def handle_cast({:test_finished, %ExUnit.Test{} = test}, file) do
    outcome = if test.state, do: elem(test.state, 0), else: :passed

    IO.puts(
      file,
      "#{stamp()} #{outcome} #{inspect(test.module)} #{test.name} (#{div(test.time, 1000)} ms)"
    )

    {:noreply, file}
  end

  def handle_cast({:module_started, %ExUnit.TestModule{name: name}}, file) do
    IO.puts(file, "#{stamp()} module #{inspect(name)}")
    {:noreply, file}
  end

  def handle_cast(_event, file), do: {:noreply, file}

  defp stamp, do: Time.utc_now() |> Time.truncate(:millisecond) |> Time.to_iso8601()
end
