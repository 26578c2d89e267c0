defmodule XlaNode.BusyWaitTest do
  @moduledoc """
  The busy wait (`--busy-wait-us`): after traffic one thread keeps a CPU awake, as the BEAM's
  schedulers do; once the node idles it sleeps and the node uses no CPU.
  """
  use ExUnit.Case, async: true

  alias XlaNode.Harness

  # The busy-wait thread, as `top -H` shows it (thread names are cut to 15 bytes).
  @thread_name "xla_node-busy-w"

  defp threads(node) do
    for tid <- File.ls!("/proc/#{node.os_pid}/task"),
        comm = File.read!("/proc/#{node.os_pid}/task/#{tid}/comm") |> String.trim(),
        do: {tid, comm}
  end

  # CPU time (user + system, in clock ticks) of the whole process, or of one of its threads.
  defp cpu_ticks(node, tid \\ nil) do
    path = if tid, do: "/proc/#{node.os_pid}/task/#{tid}/stat", else: "/proc/#{node.os_pid}/stat"
    # Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    [_, rest] = File.read!(path) |> String.split(") ", parts: 2)
    fields = String.split(rest)
    String.to_integer(Enum.at(fields, 11)) + String.to_integer(Enum.at(fields, 12))
  end

  defp burst(node, n) do
    for _ <- 1..n, do: assert(GenServer.call({:xla, node.name}, :ping) == :pong)
  end

  test "after a burst of calls the idle node stops using CPU" do
    node = Harness.start_node()
    Harness.connect!(node)
    assert [{tid, _}] = Enum.filter(threads(node), fn {_, comm} -> comm == @thread_name end)

    burst(node, 2_000)
    Process.sleep(100)
    {process, thread} = {cpu_ticks(node), cpu_ticks(node, tid)}
    Process.sleep(1_000)
    # A thread spinning through that second would show about 100 ticks; allow for stray work.
    assert cpu_ticks(node) - process <= 5
    assert cpu_ticks(node, tid) - thread <= 1, "the busy-wait thread kept running while idle"
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end

  test "with --busy-wait-us 0 there is no busy-wait thread and calls answer as before" do
    node = Harness.start_node(args: ["--busy-wait-us", "0"])
    Harness.connect!(node)
    refute Enum.any?(threads(node), fn {_, comm} -> comm == @thread_name end)
    burst(node, 500)
  end
end
