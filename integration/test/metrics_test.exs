defmodule XlaNode.MetricsTest do
  @moduledoc """
  What operators watch: `--metrics-addr` serves `GET /metrics`, scraped here with OTP's
  `:httpc`, and the client's `:telemetry` spans, both over one known sequence of compiles, runs,
  failing runs, callbacks, a callback timeout and a queue timeout. Every counter and histogram
  count moves by exactly what happened, `:info` reads the same counters, bad paths get 404, and
  without the flag the node listens on its distribution port alone.
  """
  use ExUnit.Case, async: true

  # :telemetry is there only when TELEMETRY_PATH is (see XlaNode.TelemetryLibrary).
  @compile {:no_warn_undefined, [:telemetry, :telemetry_test]}

  alias XlaNode.{CallbackServer, Harness, Load, TelemetryLibrary, Tensor}

  @add_one """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %y = stablehlo.add %x, %one : tensor<4xf32>
    return %y : tensor<4xf32>
  }
  """

  setup_all do
    {:ok, _} = Application.ensure_all_started(:inets)
    :ok
  end

  ## The node and its endpoint

  defp start_metrics_node do
    node = Harness.start_node(args: ["--metrics-addr", "127.0.0.1:0"])
    {:ok, line} = Harness.wait_for_log(node, "serving metrics at")
    [_, port] = Regex.run(~r{http://127\.0\.0\.1:(\d+)/metrics}, line)
    Harness.connect!(node)
    Map.merge(node, %{metrics_port: String.to_integer(port), url: "http://127.0.0.1:#{port}"})
  end

  defp http(method, url) do
    request = {String.to_charlist(url), []}

    {:ok, {{_, status, _}, headers, body}} =
      :httpc.request(method, request, [timeout: 5_000], body_format: :binary)

    {status, Map.new(headers, fn {k, v} -> {List.to_string(k), List.to_string(v)} end), body}
  end

  # GET /metrics, parsed: %{{name, labels} => value}.
  defp scrape(node) do
    {200, headers, body} = http(:get, node.url <> "/metrics")
    assert headers["content-type"] =~ "application/openmetrics-text"
    assert String.ends_with?(body, "# EOF\n")
    parse(body)
  end

  defp parse(text) do
    for line <- String.split(text, "\n", trim: true),
        not String.starts_with?(line, "#"),
        into: %{} do
      [_, name, labels, value] = Regex.run(~r/^([a-z_]+)(?:\{(.*)\})? (\S+)$/, line)

      labels =
        for [_, k, v] <- Regex.scan(~r/([a-z_]+)="((?:[^"\\]|\\.)*)"/, labels),
            into: %{},
            do: {k, v}

      {{name, labels}, number(value)}
    end
  end

  defp number("+Inf"), do: :infinity

  defp number(text) do
    case Float.parse(text) do
      {value, ""} -> if value == trunc(value), do: trunc(value), else: value
    end
  end

  defp value(metrics, name, labels \\ %{}) do
    Map.fetch!(metrics, {name, labels})
  end

  # A histogram's count, after checking its buckets add up: cumulative, and +Inf is the count.
  defp histogram_count(metrics, name) do
    count = value(metrics, name <> "_count")

    buckets = buckets(metrics, name)
    counts = Enum.map(buckets, &elem(&1, 1))
    assert counts == Enum.sort(counts), "#{name} buckets are not cumulative: #{inspect(buckets)}"
    assert List.last(buckets) == {:infinity, count}
    count
  end

  # [{le, cumulative count}] in order of `le`.
  defp buckets(metrics, name) do
    bucket = name <> "_bucket"

    for({{^bucket, %{"le" => le}}, n} <- metrics, do: {number(le), n})
    |> Enum.sort_by(fn {le, _} -> if le == :infinity, do: 1.0e300, else: le end)
  end

  # The bounds, in microseconds, of the bucket /metrics shows that holds the q-quantile.
  defp quantile_bucket_us(metrics, name, q) do
    buckets = buckets(metrics, name)
    {_, count} = List.last(buckets)
    index = Enum.find_index(buckets, fn {_, n} -> n >= q * count end)
    lower = if index == 0, do: 0, else: elem(Enum.at(buckets, index - 1), 0) * 1.0e6
    {lower, elem(Enum.at(buckets, index), 0) * 1.0e6}
  end

  defp delta(after_, before, name, labels \\ %{}),
    do: value(after_, name, labels) - value(before, name, labels)

  defp info(node) do
    {:ok, info} = GenServer.call({:xla, node.name}, :info)
    info
  end

  ## The sequence

  # The callback every run of `cb_exe` makes, chosen by its argument's first element:
  # 1.0 answers x + 1; 2.0 an error; 3.0 answers after 600 ms (past a 150 ms callback_timeout);
  # 4.0 waits for :go; 5.0 raises.
  defp callbacks(test) do
    fn [t] ->
      {bin, _} = t
      ok = {:ok, [Load.plus_one(bin)]}

      case hd(Tensor.to_list(t)) do
        1.0 ->
          ok

        2.0 ->
          {:error, {:bad_value, "two is not welcome"}}

        3.0 ->
          Process.sleep(600)
          ok

        4.0 ->
          send(test, {:blocked, self()})

          receive do
            :go -> ok
          end

        5.0 ->
          raise ArgumentError, "five is right out"
      end
    end
  end

  # Runs the sequence through the client library; returns what it made.
  defp sequence(node) do
    n = node.name
    x = Load.f32(1.0, 4)
    {bin, _} = x
    expected = Load.plus_one(bin)
    arg = fn first -> Load.f32(first, 4) end

    # Compiles: new, the same again (a cache hit), and one that fails.
    exe = XlaNode.compile!(n, @add_one)
    _same = XlaNode.compile!(n, @add_one)
    assert {:error, %XlaNode.Error{kind: :compile_error}} = XlaNode.compile(n, "nonsense")

    # Runs: three that succeed, one whose argument does not fit (refused before it executes).
    for _ <- 1..3, do: assert({:ok, [{^expected, _}]} = XlaNode.run(n, exe, [x]))

    assert {:error, %XlaNode.Error{kind: :argument_error}} =
             XlaNode.run(n, exe, [Load.f32(1.0, 3)])

    # Runs with a callback: two that succeed, one answered with an error, one whose callback
    # raises, one that times out, one whose callback server is not alive.
    cb_exe = XlaNode.compile!(n, Load.callback_program(:metrics))
    {:ok, server} = CallbackServer.start_link(%{metrics: callbacks(self())})

    run = fn first, opts ->
      XlaNode.run(n, cb_exe, [arg.(first)], [callback_server: server] ++ opts)
    end

    for _ <- 1..2, do: assert({:ok, [{^expected, _}]} = run.(1.0, []))
    assert {:error, %XlaNode.Error{kind: :runtime_error, message: m}} = run.(2.0, [])
    assert m =~ "two is not welcome"
    assert {:error, %XlaNode.Error{kind: :runtime_error, message: m}} = run.(5.0, [])
    assert m =~ "five is right out"

    assert {:error, %XlaNode.Error{kind: :runtime_error, message: m}} =
             run.(3.0, callback_timeout: 150)

    assert m =~ "timed out"
    dead = spawn(fn -> :ok end)
    ref = Process.monitor(dead)
    assert_receive {:DOWN, ^ref, _, _, _}

    assert {:error, %XlaNode.Error{kind: :runtime_error, message: m}} =
             XlaNode.run(n, cb_exe, [x], callback_server: dead)

    assert m =~ "not alive"

    # 24 runs whose callbacks wait: 22 take every place runs that call back of one client node
    # may have (it leaves 2 to nodes with nothing in flight), 2 queue, and one more cannot start
    # within its 100 ms queue_timeout.
    blocked = for _ <- 1..24, do: Task.async(fn -> run.(4.0, []) end)

    go = fn n ->
      for _ <- 1..n,
          do:
            receive(
              do: ({:blocked, pid} -> send(pid, :go)),
              after: (10_000 -> flunk("the runs' callbacks did not start"))
            )
    end

    waiting =
      for _ <- 1..22 do
        receive do
          {:blocked, pid} -> pid
        after
          10_000 -> flunk("the runs' callbacks did not start")
        end
      end

    assert {:error, %XlaNode.Error{kind: :timeout}} = run.(4.0, queue_timeout: 100)
    Enum.each(waiting, &send(&1, :go))
    go.(2)
    for task <- blocked, do: assert({:ok, [_]} = Task.await(task, 10_000))

    # A request :xla does not know; a buffer kept on the device.
    assert {:error, {:bad_request, _}} = GenServer.call({:xla, n}, :no_such_request)
    {:ok, _buffer} = XlaNode.to_device(n, x)
    # The late reply of the callback that timed out has arrived (and was dropped) by now.
    Process.sleep(600)
    %{exe: exe, cb_exe: cb_exe, server: server}
  end

  ## Prometheus

  test "every figure moves by exactly what happened, and :info reads the same counters" do
    node = start_metrics_node()
    before = scrape(node)

    assert value(before, "xla_node_build_info", %{
             "version" => "0.1.0",
             "platform" => Harness.platform(),
             "platform_version" => info(node).platform_version,
             "pjrt_api_version" => info(node).pjrt_api_version
           }) == 1

    sequence(node)
    after_ = scrape(node)

    runs = fn outcome -> delta(after_, before, "xla_node_runs_total", %{"outcome" => outcome}) end

    assert {runs.("ok"), runs.("error"), runs.("timeout"), runs.("overloaded")} ==
             {3 + 2 + 24, 1 + 4, 1, 0}

    compiles = &delta(after_, before, "xla_node_compiles_total", %{"outcome" => &1})
    assert {compiles.("compiled"), compiles.("cache_hit"), compiles.("error")} == {2, 1, 1}

    callbacks = &delta(after_, before, "xla_node_callbacks_total", %{"outcome" => &1})

    assert Map.new(~w(ok error timeout target_down abandoned), &{&1, callbacks.(&1)}) ==
             %{"ok" => 2 + 24, "error" => 2, "timeout" => 1, "target_down" => 1, "abandoned" => 0}

    errors = &delta(after_, before, "xla_node_request_errors_total", %{"kind" => &1})

    assert Map.new(
             ~w(bad_request argument_error compile_error runtime_error timeout kernel_error resource_exhausted quota overloaded),
             &{&1, errors.(&1)}
           ) == %{
             "bad_request" => 1,
             "argument_error" => 1,
             "compile_error" => 1,
             "runtime_error" => 4,
             "timeout" => 1,
             "kernel_error" => 0,
             "resource_exhausted" => 0,
             "quota" => 0,
             "overloaded" => 0
           }

    # Runs that executed (not the one refused for its argument, nor the one that never started).
    executed = 3 + 2 + 4 + 24
    histogram = &(histogram_count(after_, &1) - histogram_count(before, &1))
    assert histogram.("xla_node_run_duration_seconds") == executed
    assert histogram.("xla_node_run_queue_wait_seconds") == executed
    assert histogram.("xla_node_compile_duration_seconds") == 4
    # Replies received: the callbacks that answered, errors included, not the one that timed out.
    assert histogram.("xla_node_callback_round_trip_seconds") == 2 + 24 + 2
    assert delta(after_, before, "xla_node_run_duration_seconds_sum") > 0

    assert value(after_, "xla_node_runs_running") == 0
    assert value(after_, "xla_node_runs_queued") == 0
    assert value(after_, "xla_node_callbacks_pending") == 0
    # Held by this test process: three executables (a cache hit is a reference of its own) and
    # one f32[4] buffer.
    assert value(after_, "xla_node_executables") == 3
    assert value(after_, "xla_node_buffers") == 1
    assert value(after_, "xla_node_buffer_bytes") == 16
    assert value(after_, "xla_node_peers") == 1
    assert delta(after_, before, "xla_node_dist_received_messages_total") > 40
    assert delta(after_, before, "xla_node_dist_sent_bytes_total") > 0

    # :info reads the same counters.
    info = info(node)
    assert {info.runs, info.run_errors, info.queue_timeouts} == {34, 5, 1}
    assert {info.compiles, info.cache_hits, info.compile_errors} == {2, 1, 1}
    assert {info.executables, info.buffers, info.buffer_bytes} == {3, 1, 16}
    assert info.processes == value(after_, "xla_node_processes")

    assert %{ok: 26, error_replies: 2, timeouts: 1, target_down: 1, abandoned: 0, replies: 28} =
             info.callbacks

    assert info.request_errors == %{
             bad_request: 1,
             argument_error: 1,
             compile_error: 1,
             runtime_error: 4,
             timeout: 1,
             kernel_error: 0,
             resource_exhausted: 0,
             quota: 0,
             overloaded: 0
           }

    # This node is the only client: its figures are the node's.
    me = %{"node" => Atom.to_string(node())}
    assert value(after_, "xla_node_tenant_runs_total", me) == 34
    assert value(after_, "xla_node_tenant_refusals_total", Map.put(me, "reason", "timeout")) == 1
    assert value(after_, "xla_node_tenant_runs_running", me) == 0
    assert value(after_, "xla_node_tenant_device_bytes", me) == 16
    assert value(after_, "xla_node_tenant_run_queue_wait_seconds_count", me) == executed

    assert %{runs: 34, runs_running: 0, runs_queued: 0, device_bytes: 16, refusals: %{timeout: 1}} =
             info.tenants[node()]

    assert info.traffic.received_messages ==
             value(after_, "xla_node_dist_received_messages_total") + 2,
           "the :info call itself is two more messages (its monitor and its request)"

    # p50 and p99 from the same histograms: each lies in the bucket /metrics shows for it.
    for {key, name, count} <- [
          {:run, "xla_node_run_duration_seconds", executed},
          {:queue_wait, "xla_node_run_queue_wait_seconds", executed},
          {:compile, "xla_node_compile_duration_seconds", 4},
          {:callback, "xla_node_callback_round_trip_seconds", 28}
        ] do
      latency = info.latency_us[key]
      assert latency.count == count
      assert latency.p50 > 0 and latency.p50 <= latency.p99

      for {q, estimate} <- [{0.5, latency.p50}, {0.99, latency.p99}] do
        {lower, upper} = quantile_bucket_us(after_, name, q)
        assert estimate >= lower and estimate <= upper, "#{key} p#{q * 100}: #{estimate} us"
      end
    end
  end

  test "every error reply of a run counts as a failed run, lookups included" do
    node = start_metrics_node()
    call = &GenServer.call({:xla, node.name}, &1)
    {:ok, exe} = call.({:compile, @add_one})
    {:ok, buf} = call.({:to_device, {<<0::128>>, {{:f, 32}, [4]}}})
    before = scrape(node)
    %{runs: runs, run_errors: errors} = info(node)

    # The executable or a buffer looked up in vain, a buffer named as the executable, an
    # executable named as a buffer, arguments that do not fit: each answered and counted alike.
    assert {:error, {:argument_error, _}} = call.({:run, make_ref(), []})
    assert {:error, {:argument_error, _}} = call.({:run, exe, [make_ref()]})
    assert {:error, {:argument_error, _}} = call.({:run, buf, []})
    assert {:error, {:argument_error, _}} = call.({:run, exe, [exe]})
    assert {:error, {:argument_error, _}} = call.({:run, exe, []})
    assert {:ok, [_]} = call.({:run, exe, [buf]})

    assert %{runs: runs_after, run_errors: errors_after} = info(node)
    assert {runs_after - runs, errors_after - errors} == {6, 5}
    after_ = scrape(node)
    runs_total = &delta(after_, before, "xla_node_runs_total", %{"outcome" => &1})
    assert {runs_total.("ok"), runs_total.("error")} == {1, 5}
  end

  test "messages and bytes in and out: exactly one message each way per call" do
    node = start_metrics_node()
    # Let the end of the connecting call (its demonitor) arrive first.
    Process.sleep(100)
    before = scrape(node)

    # gen_server calls with a plain {pid, ref} tag: no monitor, no alias, one message each way.
    for _ <- 1..10 do
      ref = make_ref()
      send({:xla, node.name}, {:"$gen_call", {self(), ref}, :ping})
      assert_receive {^ref, :pong}, 5_000
    end

    after_ = scrape(node)
    assert delta(after_, before, "xla_node_dist_received_messages_total") == 10
    assert delta(after_, before, "xla_node_dist_sent_messages_total") == 10
    assert delta(after_, before, "xla_node_dist_received_bytes_total") > 10 * 20
    assert delta(after_, before, "xla_node_dist_sent_bytes_total") > 10 * 20
  end

  test "/metrics answers GET and HEAD; other paths 404, other methods 405" do
    node = start_metrics_node()

    {200, headers, body} = http(:get, node.url <> "/metrics?format=text")
    assert body =~ "# TYPE xla_node_runs counter"

    {200, head_headers, ""} = http(:head, node.url <> "/metrics")
    assert head_headers["content-type"] == headers["content-type"]

    for path <- ["/", "/metric", "/metrics/", "/metrics/x", "/favicon.ico"] do
      assert {404, _, body} = http(:get, node.url <> path)
      assert body =~ "/metrics"
    end

    for method <- [:post, :put, :delete] do
      request =
        if method == :delete,
          do: {String.to_charlist(node.url <> "/metrics"), []},
          else: {String.to_charlist(node.url <> "/metrics"), [], ~c"text/plain", ""}

      {:ok, {{_, status, _}, headers, _}} = :httpc.request(method, request, [], [])
      assert status == 405
      assert {~c"allow", ~c"GET, HEAD"} in headers
    end

    # A client that sends garbage gets its connection closed; the endpoint and the node serve on.
    {:ok, socket} = :gen_tcp.connect(~c"127.0.0.1", node.metrics_port, [:binary, active: false])
    :ok = :gen_tcp.send(socket, "NOT HTTP AT ALL\r\n\r\n")
    assert {:ok, "HTTP/1.1 400" <> _} = :gen_tcp.recv(socket, 0, 5_000)
    :gen_tcp.close(socket)
    assert {200, _, _} = http(:get, node.url <> "/metrics")
    assert :pong = GenServer.call({:xla, node.name}, :ping)
  end

  test "the endpoint listens on the address it is given, and only with the flag" do
    with_flag = start_metrics_node()

    assert listening(with_flag.os_pid) ==
             Enum.sort([{:any, with_flag.dist_port}, {{127, 0, 0, 1}, with_flag.metrics_port}])

    without = Harness.start_node()
    assert listening(without.os_pid) == [{:any, without.dist_port}]
    assert Harness.log_matching(without, "metrics") == []

    # An address that cannot be bound stops start-up, saying why.
    taken = "127.0.0.1:#{with_flag.metrics_port}"

    error =
      assert_raise RuntimeError, fn ->
        Harness.start_node(args: ["--metrics-addr", taken], timeout: 10_000)
      end

    assert error.message =~ "exited with status 1"
    assert error.message =~ "cannot listen for metrics on #{taken}"
  end

  # The TCP ports an OS process listens on, with their address (`:any` for 0.0.0.0 or ::).
  defp listening(os_pid) do
    inodes =
      for fd <- File.ls!("/proc/#{os_pid}/fd"),
          {:ok, link} <- [File.read_link("/proc/#{os_pid}/fd/#{fd}")],
          [_, inode] <- [Regex.run(~r/^socket:\[(\d+)\]$/, link)],
          into: MapSet.new(),
          do: inode

    for table <- ["/proc/net/tcp", "/proc/net/tcp6"],
        File.exists?(table),
        line <- table |> File.read!() |> String.split("\n", trim: true) |> tl(),
        [_sl, local, _remote, state | rest] = String.split(line),
        state == "0A",
        Enum.at(rest, 5) in inodes do
      [address, port] = String.split(local, ":")
      {address(address), String.to_integer(port, 16)}
    end
    |> Enum.sort()
  end

  defp address(hex) when hex in ["00000000", "00000000000000000000000000000000"], do: :any

  defp address(<<_::binary-size(8)>> = hex) do
    <<a, b, c, d>> = <<String.to_integer(hex, 16)::little-32>>
    {a, b, c, d}
  end

  defp address(hex), do: {:ipv6, hex}

  ## :telemetry

  if reason = TelemetryLibrary.unavailable() do
    IO.puts("XlaNode.MetricsTest: the :telemetry test is skipped: #{reason}")
  end

  @tag skip: TelemetryLibrary.unavailable()
  test "the client's :telemetry spans for the same sequence" do
    :ok = TelemetryLibrary.start()
    node = start_metrics_node()
    # telemetry's own test handler: each event as a message {event, ref, measurements, metadata}.
    ref = :telemetry_test.attach_event_handlers(self(), XlaNode.Telemetry.events())
    on_exit(fn -> :telemetry.detach(ref) end)
    %{exe: exe, cb_exe: cb_exe, server: server} = sequence(node)
    # Other tests' calls to their own nodes reach the handler too.
    received = for {_, _, %{node: n}} = event <- collect(ref, []), n == node.name, do: event
    by_event = Enum.group_by(received, &elem(&1, 0))
    count = fn event -> length(Map.get(by_event, event, [])) end

    # Four compiles, 35 runs (the refused and the timed-out ones included), 29 callbacks run by
    # the callback server (not the one whose server was dead, nor the queued one that never
    # started), one of which raised.
    assert count.([:xla_node, :compile, :start]) == 4
    assert count.([:xla_node, :compile, :stop]) == 4
    assert count.([:xla_node, :run, :start]) == 35
    assert count.([:xla_node, :run, :stop]) == 35
    assert count.([:xla_node, :callback, :start]) == 29
    assert count.([:xla_node, :callback, :stop]) == 28
    assert count.([:xla_node, :callback, :exception]) == 1
    assert count.([:xla_node, :compile, :exception]) == 0
    assert count.([:xla_node, :run, :exception]) == 0

    for {[_, _, :start], m, meta} <- received do
      assert is_integer(m.monotonic_time) and is_integer(m.system_time)
      assert is_reference(meta.telemetry_span_context)
    end

    for {[_, _, kind], m, _} <- received, kind in [:stop, :exception] do
      assert is_integer(m.duration) and m.duration >= 0 and is_integer(m.monotonic_time)
    end

    # Every :stop pairs with a :start of the same span, whose metadata it extends.
    starts =
      for {[_, op, :start], _, meta} <- received,
          into: %{},
          do: {meta.telemetry_span_context, {op, meta}}

    for {[_, op, kind], _, meta} <- received, kind != :start do
      assert {^op, start} = Map.fetch!(starts, meta.telemetry_span_context)
      assert Map.take(meta, Map.keys(start)) == start
    end

    # compile: node, server, and the executable or the error.
    compile_stops = for {[_, :compile, :stop], _, meta} <- received, do: meta
    assert Enum.all?(compile_stops, &(&1.node == node.name and &1.server == {:xla, node.name}))
    assert Enum.count(compile_stops, &is_reference(&1.exe)) == 3

    assert [%XlaNode.Error{kind: :compile_error}] =
             for(%{error: e} <- compile_stops, e != nil, do: e)

    # run: node, server, exe, and the error of each run that failed.
    run_stops = for {[_, :run, :stop], _, meta} <- received, do: meta
    assert Enum.all?(run_stops, &(&1.node == node.name and &1.exe in [exe, cb_exe]))
    assert Enum.count(run_stops, &(&1.exe == exe)) == 4

    assert Enum.frequencies(for %{error: %XlaNode.Error{kind: kind}} <- run_stops, do: kind) ==
             %{argument_error: 1, runtime_error: 4, timeout: 1}

    # callback: the node that called back, the server, the id; an error answered, an exception
    # raised; durations in native units.
    callback_events =
      for {[_, :callback, kind], m, meta} <- received, kind != :start, do: {kind, m, meta}

    assert Enum.all?(callback_events, fn {_, _, meta} ->
             meta.node == node.name and meta.callback_server == server and
               meta.callback_id == :metrics
           end)

    assert [{:bad_value, "two is not welcome"}] =
             for({:stop, _, %{error: e}} <- callback_events, e != nil, do: e)

    assert [
             %{
               kind: :error,
               reason: %ArgumentError{message: "five is right out"},
               stacktrace: [_ | _]
             }
           ] = for({:exception, _, meta} <- callback_events, do: meta)

    slowest = callback_events |> Enum.map(fn {_, m, _} -> m.duration end) |> Enum.max()
    assert System.convert_time_unit(slowest, :native, :millisecond) >= 600
  end

  # Every event received so far (the sequence is over: none is still coming).
  defp collect(ref, acc) do
    receive do
      {event, ^ref, measurements, metadata} ->
        collect(ref, [{event, measurements, metadata} | acc])
    after
      0 -> Enum.reverse(acc)
    end
  end
end
