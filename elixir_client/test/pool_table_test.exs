defmodule XlaNode.PoolTableTest do
  @moduledoc """
  The devices in an `XlaNode.Pool`'s table, without nodes: what placement reads (each device's
  runs in flight), what `XlaNode.Pool.status/1` shows, and the counters of a node whose devices
  change when it rejoins. Placement over real nodes' devices is in
  ../integration/test/pool_devices_test.exs.
  """
  use ExUnit.Case, async: true

  alias XlaNode.Pool.Table

  @node :xla@host

  setup do
    tab = Table.new()
    Table.put_node(tab, @node)
    %{tab: tab}
  end

  test "runs in flight and answered count on their device and on the node", %{tab: tab} do
    :ok = Table.put_devices(tab, @node, ["cpu:0", "cpu:1", "cpu:2"])
    assert Table.device_loads(tab, @node) == [{0, 0}, {1, 0}, {2, 0}]

    on_1 = Table.start_run(tab, @node, 1)
    on_2 = Table.start_run(tab, @node, 2)
    # A run whose device the node chooses (by its buffers) counts on the node alone.
    anywhere = Table.start_run(tab, @node, nil)
    assert Table.device_loads(tab, @node) == [{0, 0}, {1, 1}, {2, 1}]
    assert {_status, _generation, 3} = Table.load(tab, @node)

    Table.end_run(tab, on_1)
    Table.count_device_run(tab, @node, 1)
    # Ending a run twice (the caller and the pool both may) counts once.
    Table.end_run(tab, on_1)
    Table.end_run(tab, anywhere)
    assert Table.device_loads(tab, @node) == [{0, 0}, {1, 0}, {2, 1}]
    assert {_status, _generation, 1} = Table.load(tab, @node)

    assert Table.device_info(tab, @node) == [
             %{device: 0, name: "cpu:0", in_flight: 0, runs: 0},
             %{device: 1, name: "cpu:1", in_flight: 0, runs: 1},
             %{device: 2, name: "cpu:2", in_flight: 1, runs: 0}
           ]

    Table.end_run(tab, on_2)
  end

  test "a device the node does not have counts nowhere; a node without devices has none",
       %{tab: tab} do
    :ok = Table.put_devices(tab, @node, ["cpu:0"])
    beyond = Table.start_run(tab, @node, 5)
    Table.count_device_run(tab, @node, 5)
    assert Table.device_info(tab, @node) == [%{device: 0, name: "cpu:0", in_flight: 0, runs: 0}]
    Table.end_run(tab, beyond)
    assert Table.device_loads(tab, @node) == [{0, 0}]

    :ok = Table.put_devices(tab, @node, nil)
    assert Table.device_loads(tab, @node) == []
    assert Table.device_info(tab, @node) == []
    assert Table.device_loads(tab, :other@host) == []
  end

  test "a node that rejoins keeps the counters of the devices it still has", %{tab: tab} do
    :ok = Table.put_devices(tab, @node, ["cpu:0", "cpu:1"])
    Table.count_device_run(tab, @node, 0)
    Table.count_device_run(tab, @node, 1)
    :ok = Table.put_devices(tab, @node, ["cpu:0", "cpu:1", "cpu:2"])
    assert Enum.map(Table.device_info(tab, @node), & &1.runs) == [1, 1, 0]
    :ok = Table.put_devices(tab, @node, ["cpu:0"])
    assert Enum.map(Table.device_info(tab, @node), & &1.runs) == [1]

    Table.delete_node(tab, @node)
    assert Table.device_info(tab, @node) == []
  end
end
