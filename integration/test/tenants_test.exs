defmodule XlaNode.TenantsTest do
  @moduledoc """
  One compute node, several client nodes (real BEAM peers): fair shares, weights, priorities,
  per-node device memory quotas, the bound on queued runs, and what `:info` and `/metrics` show
  per client node; `--tenant` and `--tenant-config` checked at start-up.

  Nothing here is timed. The node is saturated with runs that call back to this test process,
  which holds each on its callback: a run's callback arriving is the run's admission, so
  answering one callback at a time frees one place at a time, and the order in which the next
  callbacks arrive is the order in which the node admits the queued runs. The timed figures
  (queue waits under a flood, throughput under weights) are in bench/tenants.exs.
  """
  use ExUnit.Case, async: false

  alias XlaNode.{Harness, Load, TenantLoad}

  @moduletag timeout: 180_000

  # Places the node gives runs that call back at once (of 28 in all), and those a client node
  # with runs in flight leaves to nodes with none.
  @calling_back_places 24
  @reserved 2

  setup_all do
    {:ok, _} = Application.ensure_all_started(:inets)

    peers =
      for prefix <- ~w(tflood tsmalla tsmallb) do
        Harness.start_peer(Harness.unique_name(prefix), [], cleanup: false)
      end

    on_exit(fn -> Enum.each(peers, &Harness.stop_peer/1) end)
    [flood, small_a, small_b] = peers
    %{flood: flood, small_a: small_a, small_b: small_b}
  end

  # The pattern that names `peer` alone: its name's prefix and the unique part.
  defp pattern(peer), do: peer.node |> Atom.to_string() |> String.split("@") |> hd()

  defp start(args) do
    node = Harness.start_node(args: args)
    Harness.connect!(node)
    {:ok, exe} = call(node, {:compile, Load.callback_program(:tenants)})
    {:ok, tiny} = call(node, {:compile, Load.plus_one_program()})
    %{node: node, exe: exe, tiny: tiny}
  end

  defp call(node, request, timeout \\ 30_000),
    do: GenServer.call({:xla, node.name}, request, timeout)

  defp info(node) do
    {:ok, info} = call(node, :info)
    info
  end

  defp tenant(node, peer), do: info(node).tenants[peer.node]

  # Runs of `peer` waiting for a place (0 before the node has heard of it).
  defp queued(node, peer), do: get_in(info(node), [:tenants, peer.node, :runs_queued]) || 0

  # Sends runs of `exe` from `peer`, held on their callbacks by this process, tagged `tag`.
  defp submit(ctx, peer, tag, seqs, opts \\ []) do
    opts = [callback_server: self()] ++ opts

    :ok =
      Harness.peer_call(peer, TenantLoad, :submit, [
        ctx.node.name,
        ctx.exe,
        tag,
        seqs,
        opts,
        self()
      ])
  end

  defp until(fun, what) do
    assert Harness.eventually(fun, 10_000, 20), "timed out waiting for #{what}"
  end

  # The next `n` callbacks to arrive, in order: [{tag, seq, {pid, ref}, bin}].
  defp callbacks(n) do
    for _ <- 1..n//1 do
      receive do
        {:exla_runtime_call, _id, [{bin, _}], from} ->
          {tag, seq} = TenantLoad.tag_of(bin)
          {tag, seq, from, bin}
      after
        10_000 -> flunk("no callback within 10 s")
      end
    end
  end

  defp answer({_tag, _seq, {pid, ref}, bin}), do: send(pid, {ref, {:ok, [Load.plus_one(bin)]}})

  # Answers the held callbacks one at a time, oldest first, until the node has admitted `n`
  # queued runs. After each answer it waits, on `:info`, until the node has counted the
  # answered run out: then the place it freed is either taken by a queued run, whose callback
  # is then awaited, or left free (the places a node with runs in flight leaves to nodes with
  # none). Returns the admitted runs' {tag, seq} in order and the callbacks still held.
  defp admit(node, held, n), do: admit(node, held, n, [])

  defp admit(_node, held, 0, order), do: {Enum.reverse(order), held}

  defp admit(node, [oldest | rest], n, order) do
    %{runs_running: running, runs_queued: queued} = info(node)
    answer(oldest)

    %{runs_running: now} =
      Harness.eventually(
        fn ->
          info = info(node)
          info.runs_running + info.runs_queued == running + queued - 1 && info
        end,
        10_000,
        10
      ) || flunk("the answered run was not counted out")

    if now == running do
      [next] = callbacks(1)
      admit(node, rest ++ [next], n - 1, [{elem(next, 0), elem(next, 1)} | order])
    else
      admit(node, rest, n, order)
    end
  end

  # Answers every callback until `runs` runs have been answered; returns their replies.
  defp finish(held, runs) do
    Enum.each(held, &answer/1)
    collect(runs, [])
  end

  defp collect(0, replies), do: replies

  defp collect(left, replies) do
    receive do
      {:exla_runtime_call, _, _, _} = call ->
        {:exla_runtime_call, _id, [{bin, _}], from} = call
        answer({nil, nil, from, bin})
        collect(left, replies)

      {:answered, tag_seq, reply} ->
        collect(left - 1, [{tag_seq, reply} | replies])
    after
      20_000 -> flunk("#{left} runs still unanswered after 20 s")
    end
  end

  # The node's places for runs that call back, all those `peer` may take (all but the reserved
  # ones) taken by its runs (tag `tag`), with `waiting` more of them queued. Returns the
  # callbacks held.
  defp saturate(ctx, peer, tag, waiting) do
    submit(ctx, peer, tag, 1..(@calling_back_places - @reserved + waiting))
    held = callbacks(@calling_back_places - @reserved)
    until(fn -> queued(ctx.node, peer) == waiting end, "#{waiting} queued runs")
    held
  end

  defp all_ok(replies) do
    for {tag_seq, reply} <- replies do
      assert {:ok, [{_, {{:f, 32}, [4]}}]} = reply, "run #{inspect(tag_seq)}: #{inspect(reply)}"
    end
  end

  describe "fair shares" do
    test "a node flooding every place does not make two others' runs wait behind its queue",
         %{flood: flood, small_a: small_a, small_b: small_b} do
      ctx = start([])
      held = saturate(ctx, flood, 1, 16)

      # A node with nothing in flight gets one of the places the flood leaves at once; its next
      # runs queue.
      submit(ctx, small_a, 2, 1..4)
      submit(ctx, small_b, 3, 1..4)
      held = held ++ callbacks(2)
      until(fn -> queued(ctx.node, small_b) == 3 end, "small_b's runs queued")
      assert %{runs_running: 24, runs_queued: 22} = info(ctx.node)
      assert %{runs_running: 1, runs_queued: 3} = tenant(ctx.node, small_a)

      {order, held} = admit(ctx.node, held, 9)
      tags = Enum.map(order, &elem(&1, 0))

      # In arrival order the flood's 16 queued runs would all go first. Fairly, the places go
      # round the three nodes: each small node's run waits for at most one of the flood's.
      assert Enum.count(tags, &(&1 != 1)) == 6, "admitted: #{inspect(order)}"
      assert Enum.filter(order, &(elem(&1, 0) == 2)) == for(s <- 2..4, do: {2, s})
      assert Enum.filter(order, &(elem(&1, 0) == 3)) == for(s <- 2..4, do: {3, s})

      for chunk <- Enum.chunk_every(tags, 3) do
        assert Enum.sort(chunk) == [1, 2, 3], "admitted: #{inspect(order)}"
      end

      all_ok(finish(held, 38 + 8))

      # Each node's figures.
      tenants = info(ctx.node).tenants

      assert %{runs: 38, runs_running: 0, runs_queued: 0, weight: 1, rule: "default"} =
               tenants[flood.node]

      assert %{runs: 4, refusals: %{overloaded: 0, quota: 0, timeout: 0}} = tenants[small_a.node]
      assert %{count: 38} = tenants[flood.node].queue_wait_us
      assert %{count: 4, p50: p50, p99: p99} = tenants[small_b.node].queue_wait_us
      assert p50 > 0 and p99 >= p50
    end

    test "weights 3:1 give two saturating nodes places in the ratio 3:1",
         %{flood: heavy, small_a: light} do
      ctx = start(["--tenant", "#{pattern(heavy)}:weight=3"])
      held = saturate(ctx, heavy, 1, 70)
      submit(ctx, light, 2, 1..30)
      held = held ++ callbacks(1)
      until(fn -> queued(ctx.node, light) == 29 end, "light's runs queued")

      # Both keep runs waiting for all 80 admissions.
      {order, held} = admit(ctx.node, held, 80)
      of_heavy = Enum.count(order, &(elem(&1, 0) == 1))
      of_light = Enum.count(order, &(elem(&1, 0) == 2))
      assert of_heavy + of_light == 80
      assert of_heavy / of_light >= 2.7 and of_heavy / of_light <= 3.3, "#{of_heavy}:#{of_light}"
      # Within every window of 8 admissions, 6 and 2, give or take one.
      for window <- Enum.chunk_every(order, 8) do
        assert Enum.count(window, &(elem(&1, 0) == 2)) in 1..3, "admitted: #{inspect(order)}"
      end

      assert %{weight: 3, rule: rule} = tenant(ctx.node, heavy)
      assert rule == pattern(heavy)
      assert %{weight: 1} = tenant(ctx.node, light)
      all_ok(finish(held, 92 + 30))
    end
  end

  describe "priorities" do
    test "with the node saturated, a node's :high runs overtake its :normal ones, which overtake its :low",
         %{small_a: client, small_b: other} do
      ctx = start([])
      held = saturate(ctx, client, 1, 0)

      submit(ctx, client, 2, 1..3, priority: :low)
      submit(ctx, client, 3, 1..3, priority: :normal)
      submit(ctx, client, 4, 1..3, priority: :high)
      # Through the client library, as an application sends it.
      :ok =
        Harness.peer_call(client, TenantLoad, :submit_with_client, [
          ctx.node.name,
          ctx.exe,
          5,
          1..2,
          [priority: :high, callback_server: self()],
          self()
        ])

      until(fn -> queued(ctx.node, client) == 11 end, "11 queued runs")

      {order, held} = admit(ctx.node, held, 11)
      tags = Enum.map(order, &elem(&1, 0))
      assert Enum.sort(Enum.take(tags, 5)) == [4, 4, 4, 5, 5], "admitted: #{inspect(order)}"
      assert Enum.slice(tags, 5, 3) == [3, 3, 3]
      assert Enum.slice(tags, 8, 3) == [2, 2, 2]

      # A priority orders runs within their node only: another node's :low run is not put
      # behind this node's :high ones.
      before = tenant(ctx.node, client)
      submit(ctx, client, 6, 1..6, priority: :high)

      %{runs_running: running} =
        Harness.eventually(
          fn ->
            t = tenant(ctx.node, client)
            t.runs_running + t.runs_queued == before.runs_running + before.runs_queued + 6 && t
          end,
          10_000,
          10
        ) || flunk("the :high runs did not arrive")

      held = held ++ callbacks(running - before.runs_running)
      assert %{runs_queued: still} = tenant(ctx.node, client)
      assert still > 0
      submit(ctx, other, 7, 1..1, priority: :low)
      assert [{7, 1, _, _} = admitted] = callbacks(1)
      assert %{runs_queued: ^still} = tenant(ctx.node, client)
      held = held ++ [admitted]

      replies = finish(held, 22 + 11 + 7)
      {client_lib, raw} = Enum.split_with(replies, fn {{tag, _}, _} -> tag == 5 end)
      all_ok(raw)
      for {_, result} <- client_lib, do: assert({:ok, [{_, {{:f, 32}, [4]}}]} = result)
    end

    test "an unknown priority is refused in the reply, and by the client library before sending" do
      ctx = start([])
      x = TenantLoad.arg(1, 1)

      for bad <- [:urgent, "high", 1] do
        assert {:error, {:argument_error, text}} =
                 call(ctx.node, {:run, ctx.tiny, [x], [priority: bad]})

        assert text =~ "priority must be :high, :normal or :low, got"
      end

      assert {:ok, [_]} = call(ctx.node, {:run, ctx.tiny, [x], [priority: :low]})

      error =
        assert_raise ArgumentError, fn ->
          XlaNode.run(ctx.node.name, ctx.tiny, [x], priority: :urgent)
        end

      message = Exception.message(error)
      assert message =~ "option :priority must be one of :high, :normal, :low"
    end
  end

  describe "the bound on queued runs" do
    test "beyond max_queued a run is refused at once as overloaded; other nodes queue on",
         %{flood: busy, small_a: other} do
      ctx =
        start(["--tenant", "#{pattern(busy)}:max_queued=2", "--tenant", "default:max_queued=100"])

      held = saturate(ctx, busy, 1, 2)
      x = TenantLoad.arg(1, 99)

      assert {:error, {:overloaded, text}} =
               Harness.peer_call(busy, GenServer, :call, [
                 {:xla, ctx.node.name},
                 {:run, ctx.exe, [x], [callback_server: self()]}
               ])

      assert text =~ "node #{busy.node} has 2 runs waiting for a place, its max_queued of 2"
      assert text =~ "--tenant #{pattern(busy)}"
      # At once: the run never waited, and nothing of the node's changed.
      assert %{runs_queued: 2, runs_running: 22, refusals: %{overloaded: 1}} =
               tenant(ctx.node, busy)

      # Another node's runs still start (one at once) and queue, and share the next places.
      submit(ctx, other, 2, 1..3)
      held = held ++ callbacks(1)
      until(fn -> queued(ctx.node, other) == 2 end, "the other node's runs queued")
      assert %{max_queued: 100, refusals: %{overloaded: 0}} = tenant(ctx.node, other)

      {order, held} = admit(ctx.node, held, 4)
      assert Enum.count(order, &(elem(&1, 0) == 2)) == 2, "admitted: #{inspect(order)}"
      all_ok(finish(held, 24 + 3))

      %{request_errors: errors} = info(ctx.node)
      assert %{overloaded: 1} = errors
    end
  end

  describe "device memory quotas" do
    # 600 KiB of f32: one such buffer fits a 1 MiB quota, two do not.
    @quota 1024 * 1024
    @big_n div(600 * 1024, 4)

    test "a node over its quota is refused, naming it; others' buffers are untouched; it fits once freed",
         %{flood: capped, small_a: free} do
      ctx = start(["--tenant", "#{pattern(capped)}:max_device_bytes=1M"])
      big = Load.f32(0, @big_n)
      capped_holder = Harness.peer_call(capped, TenantLoad, :holder, [ctx.node.name])
      free_holder = Harness.peer_call(free, TenantLoad, :holder, [ctx.node.name])

      assert {:ok, first} = TenantLoad.ask(capped_holder, {:to_device, big})
      assert {:ok, other_first} = TenantLoad.ask(free_holder, {:to_device, big})

      assert {:error, {:quota, text}} = TenantLoad.ask(capped_holder, {:to_device, big})
      assert text =~ "node #{capped.node} holds #{@big_n * 4}"
      assert text =~ "its quota is #{@quota}"
      assert text =~ "needs #{@big_n * 4} bytes"

      # A run whose kept results would not fit is refused too, when it arrives.
      {:ok, wide} = call(ctx.node, {:compile, Load.wide_program(@big_n)})

      assert {:error, {:quota, run_text}} =
               TenantLoad.ask(
                 capped_holder,
                 {:run, wide, [Load.f32(1, 4)], [keep_on_device: true]}
               )

      assert run_text =~ "the run needs #{@big_n * 4 + 16} bytes"

      # Nothing of its own or of anyone else's was freed; the other node allocates on.
      assert {:ok, {data, _}} = TenantLoad.ask(capped_holder, {:read, first})
      assert data == elem(big, 0)
      assert {:ok, other_second} = TenantLoad.ask(free_holder, {:to_device, big})
      assert {:ok, {^data, _}} = TenantLoad.ask(free_holder, {:read, other_first})

      tenants = info(ctx.node).tenants

      assert %{
               max_device_bytes: @quota,
               device_bytes: held,
               buffer_bytes: held,
               refusals: %{quota: 2}
             } = tenants[capped.node]

      assert held == @big_n * 4
      assert %{max_device_bytes: :infinity, device_bytes: other_held} = tenants[free.node]
      assert other_held == 2 * @big_n * 4

      # Once it frees, the same request fits.
      assert :ok = TenantLoad.ask(capped_holder, {:free, first})
      assert {:ok, second} = TenantLoad.ask(capped_holder, {:to_device, big})
      assert {:ok, {^data, _}} = TenantLoad.ask(capped_holder, {:read, second})
      assert {:ok, {^data, _}} = TenantLoad.ask(free_holder, {:read, other_second})
    end
  end

  describe "options" do
    test "a malformed --tenant or --tenant-config stops start-up with a message naming it" do
      config =
        Path.join(System.tmp_dir!(), "tenants_#{System.unique_integer([:positive])}.config")

      on_exit(fn -> File.rm(config) end)

      File.write!(config, "[{\"web*@*\", [{weight, 3}, {colour, red}]}].")

      cases = [
        {["--tenant", "web"], "is not NODE_PATTERN:key=value"},
        {["--tenant", "web:colour=red"], ~s(unknown key "colour")},
        {["--tenant", "web:max_device_bytes=-5"],
         "max_device_bytes must be a positive byte count"},
        {["--tenant", "web:weight=0"], "weight must be an integer from 1 to 1000"},
        {["--tenant", "web:max_queued=lots"],
         "max_queued must be a non-negative integer or infinity"},
        {["--tenant", "we b:weight=2"], "the node pattern"},
        {["--tenant-config", config], ~s(entry 1: web*@*: unknown key "colour")},
        {["--tenant-config", config <> ".absent"], "--tenant-config #{config}.absent"}
      ]

      for {args, message} <- cases do
        {output, status} =
          System.cmd(Harness.bin_path(), ["--sname", Harness.unique_name()] ++ args,
            stderr_to_stdout: true
          )

        assert status != 0, "#{inspect(args)} started"
        assert output =~ message, "#{inspect(args)}: #{output}"
      end
    end

    test "the README's three applications: a --tenant-config file and flags, as :info and /metrics show them",
         %{flood: web, small_a: etl, small_b: training} do
      config =
        Path.join(System.tmp_dir!(), "tenants_#{System.unique_integer([:positive])}.config")

      on_exit(fn -> File.rm(config) end)

      File.write!(config, """
      %% Three applications on one GPU box.
      [{"#{pattern(web)}", [{weight, 4}, {max_device_bytes, "2G"}]},
       {"#{pattern(etl)}", [{weight, 1}, {max_device_bytes, "1G"}, {max_queued, 50}]},
       {default, [{max_device_bytes, "4G"}, {max_queued, 1000}]}].
      """)

      node =
        Harness.start_node(
          args: [
            "--tenant-config",
            config,
            "--tenant",
            "#{pattern(etl)}:weight=2",
            "--metrics-addr",
            "127.0.0.1:0"
          ]
        )

      {:ok, line} = Harness.wait_for_log(node, "serving metrics at")
      [_, url] = Regex.run(~r{(http://127\.0\.0\.1:\d+)/metrics}, line)
      {:ok, tiny} = GenServer.call({:xla, node.name}, {:compile, Load.plus_one_program()})

      for peer <- [web, etl, training] do
        assert {:ok, [_]} =
                 Harness.peer_call(peer, GenServer, :call, [
                   {:xla, node.name},
                   {:run, tiny, [Load.f32(1, 4)]}
                 ])
      end

      {:ok, %{tenants: tenants}} = GenServer.call({:xla, node.name}, :info)

      assert %{weight: 4, max_device_bytes: 2_147_483_648, max_queued: 1000, runs: 1} =
               tenants[web.node]

      assert %{weight: 2, max_device_bytes: 1_073_741_824, max_queued: 50} = tenants[etl.node]

      assert %{weight: 1, max_device_bytes: 4_294_967_296, rule: "default"} =
               tenants[training.node]

      {:ok, {{_, 200, _}, _, body}} =
        :httpc.request(:get, {~c"#{url}/metrics", []}, [], body_format: :binary)

      assert body =~ ~s(xla_node_tenant_weight{node="#{web.node}"} 4)
      assert body =~ ~s(xla_node_tenant_device_quota_bytes{node="#{etl.node}"} 1073741824)
      assert body =~ ~s(xla_node_tenant_runs_total{node="#{training.node}"} 1)
      assert body =~ ~s(xla_node_tenant_refusals_total{node="#{web.node}",reason="overloaded"} 0)
      assert body =~ ~s(xla_node_tenant_run_queue_wait_seconds_count{node="#{etl.node}"} 1)
      assert body =~ ~s(xla_node_tenant_runs_queued{node="#{web.node}"} 0)
    end
  end
end
