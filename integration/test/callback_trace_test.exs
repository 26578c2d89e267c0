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

    # The custom call's thread notes its steps in order. The reply is read and delivered by the
    # connection's reader, after the request was encoded and before the thread is woken; it may
    # be read before the thread, preempted as its write woke the peer, notes `written`.
    on_its_thread = [
      trace.resolved,
      trace.registered,
      trace.built,
      trace.encoded,
      trace.written,
      trace.woken,
      trace.returned
    ]

    the_reply = [trace.encoded, trace.reply_read, trace.delivered, trace.woken]

    assert Enum.all?(on_its_thread ++ the_reply, &(is_float(&1) and &1 > 0))
    assert on_its_thread == Enum.sort(on_its_thread), "steps out of order: #{inspect(trace)}"
    assert the_reply == Enum.sort(the_reply), "steps out of order: #{inspect(trace)}"
  end

  test "off by default" do
    peer = Harness.start_peer()
    node = Harness.start_node()
    run_callbacks(node, peer, 3)
    refute Map.has_key?(callbacks_info(node), :trace)
  end
end
