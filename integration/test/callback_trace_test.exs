defmodule XlaNode.CallbackTraceTest do
  @moduledoc """
  `XLA_NODE_CALLBACK_TRACE=1`: the node times each step of every callback and `:info` reports
  the medians under `callbacks.trace`; without it there is no trace.
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, Load}

  defp callbacks_info(node) do
    {:ok, %{callbacks: callbacks}} = GenServer.call({:xla, node.name}, :info)
    callbacks
  end

  defp run_callbacks(node, peer, n) do
    Harness.connect!(node)
    server = Harness.peer_call(peer, Load, :callback_server, [0])
    {:ok, exe} = GenServer.call({:xla, node.name}, {:compile, Load.callback_program(:traced)})
    {bin, _} = x = Load.f32(1.0, 4)
    expected = Load.plus_one(bin)

    for _ <- 1..n do
      assert {:ok, [{^expected, _}]} =
               GenServer.call({:xla, node.name}, {:run, exe, [x], [callback_server: server]})
    end
  end

  test "with the switch on, :info has the median time of each step of a callback" do
    peer = Harness.start_peer()
    node = Harness.start_node(env: [{"XLA_NODE_CALLBACK_TRACE", "1"}])
    run_callbacks(node, peer, 50)

    assert %{trace: trace} = callbacks_info(node)
    assert trace.samples == 50

    steps = [
      trace.resolved,
      trace.registered,
      trace.built,
      trace.encoded,
      trace.written,
      trace.reply_read,
      trace.delivered,
      trace.woken,
      trace.returned
    ]

    assert Enum.all?(steps, &(is_float(&1) and &1 > 0))
    assert steps == Enum.sort(steps), "steps out of order: #{inspect(trace)}"
  end

  test "off by default" do
    peer = Harness.start_peer()
    node = Harness.start_node()
    run_callbacks(node, peer, 3)
    refute Map.has_key?(callbacks_info(node), :trace)
  end
end
