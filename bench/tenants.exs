# One compute node, three client nodes (BEAM peers started here): what a flood from one client
# node does to the tiny runs of two others, and the throughput two saturating client nodes get
# under weights 3:1. Run by `bench/run.sh tenants` as
#
#     elixir --sname NAME --cookie COOKIE -pa CLIENT_EBIN bench/tenants.exs NODE_BIN COOKIE
#
# with XLA_NODE_BENCH_BASELINE_BIN=path/to/xla_node of another build (a build of main, which
# admits runs in arrival order) measured the same way in the same run, the builds alternating.
# XLA_NODE_BENCH_TENANTS_ROUNDS (default 3) sets the rounds.
#
# Tiny runs beside a flood: two client nodes each send 300 tiny runs, one at a time with 2 ms
# between them, first alone (unloaded), then while a third floods the node from 40 processes,
# each keeping one run in flight: more runs than the node's places. Two floods:
#   held:  the flood's runs call back to a server on its node that answers after 20 ms (runs
#          that hold a place long without using the CPU, as large runs on a GPU do); the tiny
#          runs are x + 1 with one callback, answered at once on their own node;
#   plain: the flood's runs are f32[262144] * 2 (1 MiB in, 1 MiB out); the tiny runs x + 1 on
#          f32[4].
# Reported: the tiny runs' median and p99 latency (the call to the reply, on the client node),
# unloaded and flooded, with the flooded over the unloaded (the target: p99 <= 2x); the
# node's own queue wait for them (`:info`'s tenants) where the build has it; the flood's runs
# per second. And, once per round, the same between BEAM nodes alone, an echo server on this
# node in the compute node's place: for the held flood, the tiny clients' calls and the flood's
# each relayed through a callback server on their own node (answering at once, or after 20 ms),
# as their runs call back; for the plain flood, the tiny clients ping it while the flood's node
# sends it the plain flood's bytes (1 MiB each way per call, from as many processes): the tails
# the machine and its loopback give such floods without any xla_node.
#
# Weights: a node started with `--tenant bsmalla*:weight=3` (a build without weights gets the
# same load unweighted); two client nodes each keep 40 runs in flight whose callback answers
# after 5 ms; the runs each completed in 3 s after a 1 s warm-up, and their ratio (the target:
# 3:1 within 10%).
Code.require_file("tenant_clients.ex", __DIR__)

defmodule Bench.Tenants do
  alias Bench.TenantClients, as: Clients

  @tiny """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %y = stablehlo.add %x, %one : tensor<4xf32>
    return %y : tensor<4xf32>
  }
  """

  @large 262_144
  @tiny_runs 300
  @think_ms 2
  @flood_procs 40
  @held_ms 20
  @weights_held_ms 5

  defp times_two(n) do
    """
    func.func @main(%x: tensor<#{n}xf32>) -> tensor<#{n}xf32> {
      %two = stablehlo.constant dense<2.0> : tensor<#{n}xf32>
      %y = stablehlo.multiply %x, %two : tensor<#{n}xf32>
      return %y : tensor<#{n}xf32>
    }
    """
  end

  # main(callback handle, x: f32[4]) = what its one runtime_call returns.
  defp calling_back do
    XlaNode.MLIR.module(fn ->
      XlaNode.MLIR.function("main", [{{:u, 8}, [8]}, {{:f, 32}, [4]}], fn [cb, x] ->
        XlaNode.MLIR.runtime_call(cb, :bench, [x], [{{:f, 32}, [4]}])
      end)
    end)
  end

  def main([bin, cookie]) do
    builds =
      [{"fair (this build)", bin}] ++
        case System.get_env("XLA_NODE_BENCH_BASELINE_BIN") do
          nil -> []
          base -> [{"arrival order (baseline)", base}]
        end

    rounds = String.to_integer(System.get_env("XLA_NODE_BENCH_TENANTS_ROUNDS", "3"))
    clients = for prefix <- ~w(bflood bsmalla bsmallb), do: start_peer(prefix, cookie)

    results =
      for round <- 1..rounds, {label, path} <- builds, reduce: %{} do
        acc ->
          IO.puts(:stderr, "tenants: round #{round}: #{label}")

          measured = %{
            held: fair_shares(path, cookie, clients, :held),
            plain: fair_shares(path, cookie, clients, :plain),
            weights: weights(path, cookie, clients)
          }

          Map.update(acc, label, [measured], &(&1 ++ [measured]))
      end

    # What the machine itself gives: the same clients and floods, with a BEAM node (this one)
    # in the compute node's place, once per round. The held flood keeps as many calls in flight
    # as this build's node ran runs of it at once in that round (runs per second x hold time):
    # the node's places cap the held flood, an echo server nothing.
    [{first, _} | _] = builds

    beam =
      for %{held: %{flood_per_s: per_s}} <- results[first] do
        in_flight = max(round(per_s * @held_ms / 1000), 1)

        %{
          held: beam_shares(clients, :held, in_flight),
          plain: beam_shares(clients, :plain, @flood_procs)
        }
      end

    report(builds, results)
    report_beam(beam)

    if length(builds) == 1,
      do:
        IO.puts(
          "  (XLA_NODE_BENCH_BASELINE_BIN=path/to/a/build/of/main adds arrival order, measured alike)"
        )
  end

  defp fair_shares(bin, cookie, [flood, a, b], kind) do
    {node, port} = start_node(bin, cookie, [])

    # {program, n, callback delay} of the tiny runs and of the flood's.
    {tiny, flood_run} =
      case kind do
        :held ->
          exe = compile(node, calling_back())
          {{exe, 4, 0}, {exe, 4, @held_ms}}

        :plain ->
          {{compile(node, @tiny), 4, nil}, {compile(node, times_two(@large)), @large, nil}}
      end

    {tiny_exe, tiny_n, tiny_delay} = tiny

    small = fn ->
      on_each([a, b], :latencies, [node, tiny_exe, tiny_n, @tiny_runs, @think_ms, tiny_delay])
    end

    # Warm: the programs have run from every client node.
    {flood_exe, flood_n, flood_delay} = flood_run

    for peer <- [a, b] do
      :erpc.call(peer, Clients, :latencies, [node, tiny_exe, tiny_n, 20, 1, tiny_delay], 60_000)
    end

    :erpc.call(flood, Clients, :latencies, [node, flood_exe, flood_n, 5, 1, flood_delay], 60_000)
    unloaded = small.()

    load =
      :erpc.call(flood, Clients, :start_load, [
        node,
        flood_exe,
        flood_n,
        @flood_procs,
        flood_delay
      ])

    {flooded, flood_per_s} = beside(load, small)
    {:ok, info} = GenServer.call({:xla, node}, :info)
    Clients.stop(load)
    stop_node(port)

    node_waits =
      case info do
        %{tenants: tenants} -> Enum.map([a, b], &tenants[&1].queue_wait_us)
        _ -> nil
      end

    %{
      unloaded: unloaded,
      flooded: flooded,
      flood_per_s: flood_per_s,
      node_waits: node_waits
    }
  end

  # A flood's shape between BEAM nodes alone, with an echo server on this node in the compute
  # node's place, the tiny clients calling it unloaded and flooded. Held: each tiny call is
  # relayed through a callback server on its client's node answering at once, and the flood's
  # `procs` processes each keep a call in flight whose relay a server on their node answers
  # after @held_ms, as the held flood's runs and the tiny runs call back. Plain: the
  # tiny clients ping it, and the flood's processes send it @large * 4 bytes and wait for them
  # back, as the plain flood's runs do. `procs`: the flood's processes.
  defp beam_shares([flood, a, b], kind, procs) do
    server = Clients.echo_server()

    {tiny_delay, flood_bytes, flood_delay} =
      if kind == :held, do: {0, 16, @held_ms}, else: {nil, @large * 4, nil}

    small = fn ->
      on_each([a, b], :echo_latencies, [server, @tiny_runs, @think_ms, tiny_delay])
    end

    for peer <- [a, b],
        do: :erpc.call(peer, Clients, :echo_latencies, [server, 20, 1, tiny_delay], 60_000)

    unloaded = small.()

    load =
      :erpc.call(flood, Clients, :start_echo_load, [
        server,
        flood_bytes,
        procs,
        flood_delay
      ])

    {flooded, flood_per_s} = beside(load, small)
    Clients.stop(load)
    Process.exit(server, :kill)
    %{unloaded: unloaded, flooded: flooded, flood_per_s: flood_per_s, procs: procs}
  end

  # `Clients.fun(args...)` on each of `peers` at once; their samples together.
  defp on_each(peers, fun, args) do
    peers
    |> Enum.map(fn peer ->
      Task.async(fn -> :erpc.call(peer, Clients, fun, args, :infinity) end)
    end)
    |> Enum.flat_map(&Task.await(&1, :infinity))
  end

  # `measure`'s samples once `load` has run for a second, and the load's calls per second
  # meanwhile.
  defp beside(load, measure) do
    Process.sleep(1_000)
    before = Clients.completed(load)
    t0 = System.monotonic_time(:millisecond)
    samples = measure.()
    calls = Clients.completed(load) - before
    {samples, calls * 1000 / (System.monotonic_time(:millisecond) - t0)}
  end

  defp weights(bin, cookie, [_flood, heavy, light]) do
    # A build without client nodes' weights (arrival order) gets the same load, unweighted.
    {help, 0} = System.cmd(bin, ["--help"])
    args = if help =~ "--tenant ", do: ["--tenant", "bsmalla*:weight=3"], else: []
    {node, port} = start_node(bin, cookie, args)
    exe = compile(node, calling_back())

    loads =
      for peer <- [heavy, light],
          do:
            :erpc.call(peer, Clients, :start_load, [node, exe, 4, @flood_procs, @weights_held_ms])

    Process.sleep(1_000)
    first = Enum.map(loads, &Clients.completed/1)
    Process.sleep(3_000)
    last = Enum.map(loads, &Clients.completed/1)
    Enum.each(loads, &Clients.stop/1)
    stop_node(port)
    [h, l] = Enum.zip_with(last, first, &-/2)
    %{heavy: h, light: l}
  end

  defp report(builds, results) do
    IO.puts("\n## Client nodes: tiny runs beside a flood, and weights 3:1")

    IO.puts(
      "  #{@tiny_runs} tiny runs per client node x 2, #{@think_ms} ms apart; the flood from #{@flood_procs} processes " <>
        "(held: runs whose callback answers after #{@held_ms} ms; plain: f32[#{@large}] * 2); one line per round"
    )

    for {label, _} <- builds, {measured, round} <- Enum.with_index(results[label], 1) do
      for kind <- [:held, :plain] do
        fair = measured[kind]
        {u50, u99} = {median(fair.unloaded), p99(fair.unloaded)}
        {f50, f99} = {median(fair.flooded), p99(fair.flooded)}

        node_side =
          case fair.node_waits do
            nil ->
              ""

            waits ->
              "; node queue wait p50/p99 " <>
                Enum.map_join(waits, ", ", &"#{us(&1.p50)}/#{us(&1.p99)}")
          end

        IO.puts(
          "  #{label}, round #{round}, #{kind} flood: tiny p50 #{us(u50)} -> #{us(f50)} (#{ratio(f50 / u50)}x), " <>
            "p99 #{us(u99)} -> #{us(f99)} (flooded p99 / unloaded p99 = #{ratio(f99 / u99)}x; target <= 2x)#{node_side}; " <>
            "flood #{round(fair.flood_per_s)} runs/s"
        )
      end

      %{heavy: h, light: l} = measured.weights

      IO.puts(
        "  #{label}, round #{round}, weights 3:1 (runs held #{@weights_held_ms} ms): #{h}:#{l} runs in 3 s " <>
          "(#{ratio(h / max(l, 1))}:1; target 3:1 within 10%)"
      )
    end
  end

  defp report_beam(beam) do
    for {measured, round} <- Enum.with_index(beam, 1), kind <- [:held, :plain] do
      %{unloaded: unloaded, flooded: flooded, flood_per_s: per_s} = measured[kind]
      {u50, u99} = {median(unloaded), p99(unloaded)}
      {f50, f99} = {median(flooded), p99(flooded)}

      shape =
        case kind do
          :held ->
            "calls relayed through a callback server, the flood's #{measured.held.procs} in " <>
              "flight answered after #{@held_ms} ms"

          :plain ->
            "pings beside the flood's #{div(@large * 4, 1_048_576)} MiB sent and echoed"
        end

      IO.puts(
        "  BEAM nodes alone (an echo server on a BEAM node in the compute node's place), round " <>
          "#{round}, #{kind} flood (#{shape}): p50 #{us(u50)} -> #{us(f50)} (#{ratio(f50 / u50)}x), " <>
          "p99 #{us(u99)} -> #{us(f99)} (#{ratio(f99 / u99)}x); flood #{round(per_s)} calls/s: " <>
          "what the machine gives beside that flood"
      )
    end
  end

  defp median(samples), do: samples |> Enum.sort() |> Enum.at(div(length(samples), 2))
  defp p99(samples), do: samples |> Enum.sort() |> Enum.at(div(length(samples) * 99, 100))
  defp us(x), do: :erlang.float_to_binary(x / 1, decimals: 0) <> " us"
  defp ratio(x), do: :erlang.float_to_binary(x / 1, decimals: 2)

  defp compile(node, mlir) do
    {:ok, exe} = GenServer.call({:xla, node}, {:compile, mlir}, 60_000)
    exe
  end

  defp start_peer(prefix, cookie) do
    code_path = Enum.flat_map(:code.get_path(), &[~c"-pa", &1])

    {:ok, _pid, node} =
      :peer.start(%{
        name: String.to_charlist("#{prefix}_#{System.pid()}"),
        args: [~c"-setcookie", String.to_charlist(cookie)] ++ code_path
      })

    {:ok, _} = :erpc.call(node, Application, :ensure_all_started, [:elixir])
    :erpc.call(node, Code, :require_file, [Path.expand("tenant_clients.ex", __DIR__)])
    node
  end

  defp start_node(bin, cookie, args) do
    sname = "xla_bench_tenants_#{System.unique_integer([:positive])}"
    {:ok, host} = :inet.gethostname()
    node = :"#{sname}@#{host}"
    command = ~s("$0" "$@" 2>/dev/null & pid=$!; read _; kill $pid)

    port =
      Port.open({:spawn_executable, "/bin/sh"}, [
        :binary,
        args: ["-c", command, bin, "--sname", sname, "--cookie", cookie] ++ args
      ])

    Enum.find(1..100, fn _ ->
      (Node.connect(node) == true and ping(node)) || (Process.sleep(100) && false)
    end) || raise "#{bin} did not come up"

    {node, port}
  end

  defp ping(node) do
    GenServer.call({:xla, node}, :ping, 1_000) == :pong
  catch
    :exit, _ -> false
  end

  defp stop_node(port) do
    Port.close(port)
    Process.sleep(500)
  end
end

Bench.Tenants.main(System.argv())
