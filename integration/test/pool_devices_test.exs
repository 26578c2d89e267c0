defmodule XlaNode.PoolDevicesTest do
  @moduledoc """
  `XlaNode.Pool` over nodes of four CPU devices each: runs with host arguments spread over
  every device of one node and over the eight of two nodes (seen in the nodes' own per-device
  counters, `:info`'s `device_info`, and in the pool's status), runs with buffers run on the
  device the buffers live on (buffers the pool scattered over two devices of a node meet on
  one), failover when a node is killed, and tensors over the nodes' `--max-message-bytes`
  placed and read through the pool in chunks.
  """
  use ExUnit.Case, async: false

  alias XlaNode.{Error, Harness, Pool, PoolHelpers, Tensor}

  # :telemetry is there only when TELEMETRY_PATH is (see XlaNode.TelemetryLibrary).
  @compile {:no_warn_undefined, [:telemetry, :telemetry_test]}

  # The device count is the CPU plugin's option.
  @moduletag :cpu_only
  @moduletag timeout: 300_000

  @devices 4
  @mib 1024 * 1024

  @add """
  func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xf32> {
    %y = stablehlo.add %a, %b : tensor<3xf32>
    return %y : tensor<3xf32>
  }
  """

  setup do
    args = ["--pjrt-option", "cpu_device_count=#{@devices}", "--max-message-bytes", "8M"]
    xlas = for _ <- 1..2, do: Harness.start_node(args: args)
    %{xlas: xlas, names: Enum.map(xlas, & &1.name)}
  end

  defp start_pool(nodes) do
    pool = :"pool_#{System.unique_integer([:positive])}"
    start_supervised!({Pool, name: pool, nodes: nodes, reconnect_backoff: {50, 500}}, id: pool)

    Harness.eventually(fn -> Enum.all?(Pool.status(pool).nodes, &(&1.status == :up)) end, 30_000) ||
      flunk("pool nodes not up: #{inspect(Pool.status(pool).nodes)}")

    pool
  end

  defp f32(list), do: Tensor.from_list(list, {:f, 32})
  defp s64(list), do: Tensor.from_list(list, {:s, 64})

  # {node, device} => runs started, as the nodes count them: `running` as well as `runs`, since
  # a node counts a run executed just after it answers it.
  defp device_runs(nodes) do
    for node <- nodes,
        {:ok, %{device_info: devices}} = XlaNode.info(node),
        %{id: id, runs: runs, running: running} <- devices,
        into: %{},
        do: {{node, id}, runs + running}
  end

  defp since(now, before), do: Map.new(now, fn {slot, runs} -> {slot, runs - before[slot]} end)

  # {node, device} => runs, as the pool's status counts them.
  defp pool_device_runs(pool) do
    for %{node: node, devices: devices} <- Pool.status(pool).nodes,
        %{device: device, runs: runs} <- devices,
        into: %{},
        do: {{node, device}, runs}
  end

  # A callback server whose every callback takes 30 ms, so that a run takes about as long on
  # every device and the share each gets shows placement alone (as in pool_test.exs).
  defp slow_doubling_server do
    {:ok, server} =
      XlaNode.CallbackServer.start_link(%{
        double: fn [x] ->
          Process.sleep(30)
          {:ok, [f32(Enum.map(Tensor.to_list(x), &(&1 * 2)))]}
        end
      })

    server
  end

  # `count` runs of the doubling program through the pool, `concurrency` at a time, after a few
  # on each device of each node (a device: option through the pool) so that compiling and the
  # first callbacks are behind.
  defp spread(pool, nodes, count, concurrency) do
    server = slow_doubling_server()
    exe = XlaNode.compile!(pool, PoolHelpers.doubling())

    for node <- nodes, device <- 0..(@devices - 1) do
      opts = [node: node, device: device, callback_server: server]
      assert {:ok, [_]} = XlaNode.run(pool, exe, [f32([0, 0, 0, 0])], opts)
    end

    before = device_runs(nodes)
    pool_before = pool_device_runs(pool)

    1..count
    |> Task.async_stream(
      fn i -> {i, XlaNode.run(pool, exe, [f32([i, 1, 2, 3])], callback_server: server)} end,
      max_concurrency: concurrency,
      timeout: :infinity
    )
    |> Enum.each(fn {:ok, {i, result}} ->
      assert {:ok, [y]} = result
      assert Tensor.to_list(y) == [2 * i + 1.0, 3.0, 5.0, 7.0]
    end)

    counted = since(device_runs(nodes), before)
    # The pool counts per device what the nodes count: every run went to the device it chose.
    assert since(pool_device_runs(pool), pool_before) == counted
    assert Enum.sum(Map.values(counted)) == count
    assert %{in_flight: 0, failures: 0, retries: 0} = Pool.status(pool)
    counted
  end

  test "a pool of one node spreads concurrent runs over its four devices", %{names: [a | _]} do
    pool = start_pool([a])
    counted = spread(pool, [a], 160, 8)

    # 40 each if even; each device gets at least half of that.
    for device <- 0..(@devices - 1) do
      assert counted[{a, device}] >= 20, "#{inspect(counted)}"
    end

    assert [%{devices: devices}] = Pool.status(pool).nodes

    assert Enum.map(devices, &Map.take(&1, [:device, :name, :in_flight])) ==
             for(d <- 0..(@devices - 1), do: %{device: d, name: "cpu:#{d}", in_flight: 0})
  end

  test "a pool of two nodes spreads concurrent runs over their eight devices",
       %{names: names} do
    pool = start_pool(names)
    counted = spread(pool, names, 240, 16)
    assert map_size(counted) == 2 * @devices

    # 30 each if even; each device gets at least half of that, each node within 20% of half.
    for {slot, runs} <- counted, do: assert(runs >= 15, "#{inspect(slot)}: #{inspect(counted)}")

    for node <- names do
      runs = for {{^node, _}, n} <- counted, reduce: 0, do: (sum -> sum + n)
      assert runs in 96..144, "#{node} ran #{runs} of 240: #{inspect(counted)}"
    end
  end

  test "a run with buffers runs on their device; buffers on two devices of a node meet on one",
       %{names: names} do
    pool = start_pool(names)
    exe = XlaNode.compile!(pool, @add)

    # Tensors placed through the pool land on devices of its nodes; each run that takes one runs
    # there, and keeps its results there.
    placed =
      for i <- 1..16 do
        buffer = XlaNode.to_device!(pool, f32([i, i, i]))
        before = device_runs(names)

        assert [kept] =
                 XlaNode.run!(pool, exe, [buffer, f32([1, 1, 1])],
                   keep_on_device: true,
                   wait: true
                 )

        assert [{slot, 1}] = Enum.reject(since(device_runs(names), before), &(elem(&1, 1) == 0))
        assert elem(slot, 0) == node(buffer)

        # The result is on the same device: it runs there with the buffer.
        before = device_runs(names)
        assert [y] = XlaNode.run!(pool, exe, [kept, buffer])
        assert Tensor.to_list(y) == [2.0 * i + 1, 2.0 * i + 1, 2.0 * i + 1]
        assert [{^slot, 1}] = Enum.reject(since(device_runs(names), before), &(elem(&1, 1) == 0))
        slot
      end

    # Sixteen tensors placed with no runs in flight: over more than one device.
    assert length(Enum.uniq(placed)) > 1

    # Two buffers on two devices of one node (the first placed by the pool on device 1, the
    # second on that node's device 2): the run goes to the first one's device, the second is
    # copied there.
    on_1 = XlaNode.to_device!(pool, f32([1, 2, 3]), device: 1)
    node = node(on_1)
    on_2 = XlaNode.to_device!(node, f32([10, 20, 30]), device: 2)
    {:ok, %{buffers: buffers}} = XlaNode.info(node)
    before = device_runs(names)
    assert [sum] = XlaNode.run!(pool, exe, [on_1, on_2])
    assert Tensor.to_list(sum) == [11.0, 22.0, 33.0]
    assert [{{^node, 1}, 1}] = Enum.reject(since(device_runs(names), before), &(elem(&1, 1) == 0))
    # The copy is freed once the run is answered.
    Harness.eventually(fn -> match?({:ok, %{buffers: ^buffers}}, XlaNode.info(node)) end) ||
      flunk("the copy of the second buffer was left on #{node}")

    # A run that names its device is the caller's choice: refused as the node refuses it.
    assert {:error, %Error{kind: :argument_error, message: message}} =
             XlaNode.run(pool, exe, [on_1, on_2], device: 1)

    assert message =~ "argument 1 is on device cpu:2, but the run is on device cpu:1"

    # A device no node has: the node's refusal, and nothing left counted in flight.
    for result <- [
          XlaNode.run(pool, exe, [f32([1, 1, 1]), f32([1, 1, 1])], device: @devices),
          XlaNode.to_device(pool, f32([1, 1, 1]), device: @devices)
        ] do
      assert {:error, %Error{kind: :argument_error, message: message}} = result
      assert message =~ "device #{@devices} is out of range"
    end

    assert %{in_flight: 0} = Pool.status(pool)
  end

  test "a node killed in the middle of runs: its runs finish on the other node's devices",
       %{xlas: [victim, survivor], names: names} do
    pool = start_pool(names)
    busy = XlaNode.compile!(pool, PoolHelpers.busy_sum(5_000_000))

    # Enough runs that some are still to come once the victim has answered 5, however the
    # machine's load shares them between the nodes.
    runner =
      Task.async(fn ->
        1..300
        |> Task.async_stream(&{&1, XlaNode.run(pool, busy, [s64([&1, 1, 2, 3])])},
          max_concurrency: 12,
          timeout: :infinity
        )
        |> Enum.map(fn {:ok, result} -> result end)
      end)

    in_flight = fn -> Enum.find(Pool.status(pool).nodes, &(&1.node == victim.name)) end

    Harness.eventually(fn -> in_flight.().runs >= 5 end, 120_000, 5) ||
      flunk("the runs never got going: #{inspect(Pool.status(pool))}")

    # The node is stopped (SIGSTOP) before it is killed, so that the runs the pool counts in
    # flight there cannot complete in between (the replies it sent before are let arrive); it
    # is let go again while it has none.
    stopped_with_runs? = fn ->
      Harness.signal(victim, "STOP")
      Process.sleep(100)

      if in_flight.().in_flight > 0 do
        true
      else
        Harness.signal(victim, "CONT")
        false
      end
    end

    Harness.eventually(stopped_with_runs?, 120_000, 5) ||
      flunk("no run in flight on #{victim.name}: #{inspect(Pool.status(pool))}")

    before = device_runs([survivor.name])
    Harness.stop_node(victim, "KILL")
    results = Task.await(runner, :infinity)

    for {i, result} <- results do
      assert {:ok, [sum]} = result
      assert Tensor.to_list(sum) == Enum.map([i, 1, 2, 3], &(&1 * 5_000_000))
    end

    status = Pool.status(pool)
    assert status.retries > 0
    assert status.in_flight == 0
    # Nothing left counted in flight on any device, the lost node's included.
    for %{devices: devices} <- status.nodes,
        %{in_flight: in_flight} <- devices,
        do: assert(in_flight == 0)

    # The re-sent runs and the rest went to the survivor's devices, more than one of them.
    counted = since(device_runs([survivor.name]), before)
    assert Enum.count(counted, fn {_, runs} -> runs > 0 end) > 1
  end

  test "a tensor over the nodes' message limit goes through the pool and back in chunks, " <>
         "bit for bit; the connection and its other buffers stay",
       %{names: names} do
    pool = start_pool(names)
    small = XlaNode.to_device!(pool, f32([1, 2]))
    {data, _} = tensor = {:crypto.strong_rand_bytes(40 * @mib), {{:f, 32}, [10 * @mib]}}

    for opts <- [[], [device: 3]] do
      received = for node <- names, into: %{}, do: {node, traffic(node)}
      assert {:ok, big} = XlaNode.to_device(pool, tensor, opts)
      # At least five chunks of at most 8 MiB (less the envelope), each its own message.
      assert traffic(node(big)) - received[node(big)] >= 6
      assert {:ok, {^data, {{:f, 32}, [10_485_760]}}} = XlaNode.read(pool, big)
      assert :ok = XlaNode.free(pool, big)
    end

    assert Tensor.to_list(XlaNode.read!(pool, small)) == [1.0, 2.0]
    for node <- names, do: assert(node in Node.list(:hidden))
  end

  if reason = XlaNode.TelemetryLibrary.unavailable() do
    IO.puts("XlaNode.PoolDevicesTest: the :telemetry test is skipped: #{reason}")
  end

  @tag skip: XlaNode.TelemetryLibrary.unavailable()
  test "a run's :telemetry stop names the device the pool chose; nil where its buffers chose",
       %{names: names} do
    :ok = XlaNode.TelemetryLibrary.start()
    ref = :telemetry_test.attach_event_handlers(self(), [[:xla_node, :run, :stop]])
    on_exit(fn -> :telemetry.detach(ref) end)
    pool = start_pool(names)
    exe = XlaNode.compile!(pool, @add)
    tagged = [telemetry_metadata: %{test: ref}]

    before = device_runs(names)

    [kept] =
      XlaNode.run!(
        pool,
        exe,
        [f32([1, 1, 1]), f32([2, 2, 2])],
        [keep_on_device: true, wait: true] ++ tagged
      )

    assert_receive {[:xla_node, :run, :stop], ^ref, _, %{test: ^ref} = stop}
    assert stop.node in names and stop.device in 0..(@devices - 1)
    assert since(device_runs(names), before)[{stop.node, stop.device}] == 1

    [_] = XlaNode.run!(pool, exe, [kept, f32([1, 1, 1])], tagged)
    assert_receive {[:xla_node, :run, :stop], ^ref, _, %{test: ^ref} = stop}
    assert %{node: node, device: nil, attempts: 1} = stop
    assert node == node(kept)
  end

  defp traffic(node) do
    {:ok, %{traffic: %{received_messages: received}}} = XlaNode.info(node)
    received
  end
end
