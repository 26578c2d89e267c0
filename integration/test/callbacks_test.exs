defmodule XlaNode.CallbacksTest do
  @moduledoc """
  Host callbacks through the `:xla` server, as a user runs them: a module in EXLA's exact form,
  run from one BEAM node, calling back into processes on other BEAM nodes, with every failure
  ending the run with a clear error instead of a hang.
  """
  use ExUnit.Case, async: true

  alias XlaNode.Harness
  alias XlaNode.CallbacksTest.Servers

  # Callback servers, shipped to the peer node (a third node: the xla node dials it itself).
  @servers """
  defmodule XlaNode.CallbacksTest.Servers do
    def add_one(register \\\\ nil) do
      pid = spawn(fn -> add_one_loop() end)
      if register, do: Process.register(pid, register)
      pid
    end

    defp add_one_loop do
      receive do
        {:exla_runtime_call, id, [{bin, {{:f, 32}, dims}}], {pid, ref}} ->
          out = for <<v::float-32-little <- bin>>, into: <<>>, do: <<v + 1.0::float-32-little>>
          # Noted before the reply: the test asks for it as soon as its run returns.
          send_seen(id, dims)
          send(pid, {ref, {:ok, [out]}})
      end

      add_one_loop()
    end

    defp send_seen(id, dims), do: :persistent_term.put({:seen, id}, dims)
    def seen(id), do: :persistent_term.get({:seen, id}, nil)

    def replying(reply) do
      spawn(fn ->
        receive do
          {:exla_runtime_call, _id, _args, {pid, ref}} -> send(pid, {ref, reply})
        end
      end)
    end

    def dying_on_call(reason) do
      spawn(fn ->
        receive do
          {:exla_runtime_call, _id, _args, _tag} -> exit(reason)
        end
      end)
    end

    def silent, do: spawn(fn -> Process.sleep(:infinity) end)

    # Tells `observer` when the request arrived, then answers with the argument after `ms`.
    def slow_echo(observer, ms) do
      spawn(fn ->
        receive do
          {:exla_runtime_call, _id, [{bin, _}], {pid, ref}} ->
            send(observer, :slow_request_seen)
            Process.sleep(ms)
            send(pid, {ref, {:ok, [bin]}})
        end
      end)
    end
  end
  """

  setup_all do
    node = Harness.start_node(cleanup: false)
    Harness.connect!(node)
    peer = Harness.start_peer(nil, [], cleanup: false)
    [{Servers, servers_binary}] = Code.compile_string(@servers)
    {:module, _} = Harness.peer_call(peer, :code, :load_binary, [Servers, ~c"servers.ex", servers_binary])

    on_exit(fn ->
      Harness.stop_peer(peer)
      Harness.stop_node(node, "KILL")
    end)

    %{node: node, peer: peer, servers_binary: servers_binary}
  end

  # A module in EXLA's exact form: the callback server's u8[8] is parameter 0.
  defp exla_module(id, shape \\ "tensor<4xf32>") do
    idbin = :erlang.term_to_binary(id)
    padded = idbin <> :binary.copy(<<0>>, rem(8 - rem(byte_size(idbin), 8), 8))
    words = for <<w::signed-native-64 <- padded>>, do: w

    """
    func.func @main(%cb: tensor<8xui8>, %x: #{shape}) -> #{shape} {
      %r = stablehlo.custom_call @exla_runtime_callback(%cb, %x) {api_version = 4 : i32, has_side_effect = true, backend_config = {callback_id = array<i64: #{Enum.join(words, ", ")}>, callback_id_size = #{byte_size(idbin)} : ui64, num_aliased_data_outputs = 0 : ui64}} : (tensor<8xui8>, #{shape}) -> #{shape}
      return %r : #{shape}
    }
    """
  end

  defp f32(list), do: {for(v <- list, into: <<>>, do: <<v::float-32-little>>), {{:f, 32}, [length(list)]}}
  defp to_f32(bin), do: for(<<v::float-32-little <- bin>>, do: v)
  defp call(node, request, timeout \\ 30_000), do: GenServer.call({:xla, node.name}, request, timeout)
  defp on_peer(peer, fun, args), do: Harness.peer_call(peer, Servers, fun, args)

  defp compile!(node, mlir) do
    {:ok, exe} = call(node, {:compile, mlir})
    exe
  end

  test "a callback reaches a process on a third node, by pid and by {name, node}", %{node: node, peer: peer} do
    exe = compile!(node, exla_module({:add_one, 1}))
    server = on_peer(peer, :add_one, [:cb_add_one])

    assert {:ok, [{bin, {{:f, 32}, [4]}}]} = call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])], [callback_server: server]})
    assert to_f32(bin) == [2.0, 3.0, 4.0, 5.0]
    assert on_peer(peer, :seen, [{:add_one, 1}]) == [4]

    assert {:ok, [{bin, _}]} = call(node, {:run, exe, [f32([0.0, 0.0, 0.0, 0.0])], [callback_server: {:cb_add_one, peer.node}]})
    assert to_f32(bin) == [1.0, 1.0, 1.0, 1.0]
    assert node.name in Harness.peer_call(peer, Node, :list, [:hidden])
  end

  test "a callback server on the node that asked for the run, by registered name", %{node: node} do
    exe = compile!(node, exla_module(:local_name))
    name = :"cb_local_#{System.unique_integer([:positive])}"

    pid =
      spawn(fn ->
        receive do
          {:exla_runtime_call, :local_name, [{bin, {{:f, 32}, [4]}}], {pid, ref}} -> send(pid, {ref, {:ok, [bin]}})
        end
      end)

    Process.register(pid, name)
    assert {:ok, [{bin, _}]} = call(node, {:run, exe, [f32([5.0, 6.0, 7.0, 8.0])], [callback_server: name]})
    assert to_f32(bin) == [5.0, 6.0, 7.0, 8.0]
  end

  test "wrong reply size and error replies fail the run with clear errors", %{node: node, peer: peer} do
    exe = compile!(node, exla_module(:checked))

    server = on_peer(peer, :replying, [{:ok, [<<1, 2, 3>>]}])
    assert {:error, {:runtime_error, m}} = call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])], [callback_server: server]})
    assert m =~ ":checked" and m =~ "16" and m =~ "3"

    server = on_peer(peer, :replying, [{:error, {:argument_error, "shape mismatch"}}])
    assert {:error, {:runtime_error, m}} = call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])], [callback_server: server]})
    assert m =~ "elixir callback returned argument_error: shape mismatch"

    assert call(node, :ping) == :pong
  end

  test "a callback server that dies mid-wait fails the run at once, naming it", %{node: node, peer: peer} do
    exe = compile!(node, exla_module(:dies))
    server = on_peer(peer, :dying_on_call, [:boom])
    {us, reply} = :timer.tc(fn -> call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])], [callback_server: server, callback_timeout: 20_000]}) end)
    assert {:error, {:runtime_error, m}} = reply
    assert m =~ "boom" and m =~ Atom.to_string(peer.node)
    assert us < 10_000_000, "the run waited for the timeout instead of noticing the exit"

    unregistered = {:nobody_here, peer.node}
    assert {:error, {:runtime_error, m}} = call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])], [callback_server: unregistered, callback_timeout: 20_000]})
    assert m =~ "noproc"
  end

  test "a registered name is watched afresh after its process dies and the name is taken again", %{node: node, peer: peer} do
    exe = compile!(node, exla_module(:again))
    name = :"cb_again_#{System.unique_integer([:positive])}"
    target = {name, peer.node}
    run = fn -> call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])], [callback_server: target, callback_timeout: 20_000]}) end

    first = on_peer(peer, :add_one, [name])
    assert {:ok, [{bin, _}]} = run.()
    assert to_f32(bin) == [2.0, 3.0, 4.0, 5.0]

    # The node keeps its monitor of the name between runs; the process dies meanwhile.
    ref = Process.monitor(first)
    Process.exit(first, :kill)
    assert_receive {:DOWN, ^ref, :process, _, :killed}, 5_000
    {us, reply} = :timer.tc(run)
    assert {:error, {:runtime_error, m}} = reply
    assert m =~ Atom.to_string(name) and m =~ Atom.to_string(peer.node)
    assert us < 10_000_000, "the run waited for the timeout instead of noticing"

    # A new process under the same name serves the next run.
    _second = on_peer(peer, :add_one, [name])
    assert {:ok, [{bin, _}]} = run.()
    assert to_f32(bin) == [2.0, 3.0, 4.0, 5.0]
  end

  test "a requester that dies abandons its run at once, also after earlier runs of it", %{peer: peer} do
    # A node of its own, so that its callback counters are this test's alone.
    node = Harness.start_node()
    Harness.connect!(node)
    exe = compile!(node, exla_module(:requester))
    adder = on_peer(peer, :add_one, [])
    silent = on_peer(peer, :silent, [])
    test = self()

    requester =
      spawn(fn ->
        # A first run leaves the node watching this requester.
        {:ok, _} = call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])], [callback_server: adder]})
        send(test, :first_run_done)
        call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])], [callback_server: silent, callback_timeout: 60_000]}, 120_000)
      end)

    assert_receive :first_run_done, 10_000
    pending = fn -> {:ok, %{callbacks: %{pending: p}}} = call(node, :info); p end
    assert wait_until(fn -> pending.() == 1 end), "the second run's callback never started waiting"

    Process.exit(requester, :kill)
    assert wait_until(fn -> pending.() == 0 end), "the dead requester's callback still waits"
    assert {:ok, %{callbacks: %{open_runs: 0, errors: 1}}} = call(node, :info)
  end

  # Polls `fun` for up to 5 s.
  defp wait_until(fun, tries \\ 100) do
    cond do
      fun.() -> true
      tries == 0 -> false
      true -> Process.sleep(50) && wait_until(fun, tries - 1)
    end
  end

  test "a silent callback server times out", %{node: node, peer: peer} do
    exe = compile!(node, exla_module(:silent))
    server = on_peer(peer, :silent, [])
    assert {:error, {:runtime_error, m}} = call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])], [callback_server: server, callback_timeout: 300]})
    assert m =~ "timed out"
    assert call(node, :ping) == :pong
  end

  test "a callback server whose node goes down fails the run at once", %{node: node, servers_binary: servers_binary} do
    exe = compile!(node, exla_module(:node_down))
    other = Harness.start_peer()
    {:module, _} = Harness.peer_call(other, :code, :load_binary, [Servers, ~c"servers.ex", servers_binary])
    server = Harness.peer_call(other, Servers, :silent, [])
    task = Task.async(fn -> call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])], [callback_server: server, callback_timeout: 30_000]}, 60_000) end)
    Process.sleep(500)
    Harness.signal_peer(other, "KILL")
    assert {:error, {:runtime_error, m}} = Task.await(task, 20_000)
    assert m =~ "noconnection" or m =~ "down"
  end

  test "without a callback server the run fails with a clear error", %{node: node} do
    exe = compile!(node, exla_module(:nobody))
    assert {:error, {:runtime_error, m}} = call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])]})
    assert m =~ "callback_server"
  end

  test "with --callback-spin-us 0 waiting runs sleep at once and callbacks still answer", %{peer: peer} do
    node = Harness.start_node(args: ["--callback-spin-us", "0"])
    Harness.connect!(node)
    exe = compile!(node, exla_module(:no_spin))
    server = on_peer(peer, :add_one, [])

    for i <- 1..50 do
      assert {:ok, [{bin, _}]} = call(node, {:run, exe, [f32([i * 1.0, 0.0, 0.0, 0.0])], [callback_server: server]})
      assert to_f32(bin) == [i + 1.0, 1.0, 1.0, 1.0]
    end
  end

  test "a run of a quick program waiting on a slow callback leaves the node serving everyone else", %{node: node, peer: peer} do
    exe = compile!(node, exla_module(:warm_then_slow))
    quick = on_peer(peer, :add_one, [])
    one = fn i -> {:ok, [{bin, _}]} = call(node, {:run, exe, [f32([i * 1.0, 0.0, 0.0, 0.0])], [callback_server: quick]}); to_f32(bin) end
    # Many quick runs first: the node learns the program is brief and starts its runs on a
    # network worker, handing the worker over only while a callback waits.
    for i <- 1..50, do: assert one.(i) == [i + 1.0, 1.0, 1.0, 1.0]

    slow = on_peer(peer, :slow_echo, [self(), 2_000])
    task = Task.async(fn -> call(node, {:run, exe, [f32([7.0, 7.0, 7.0, 7.0])], [callback_server: slow]}) end)
    assert_receive :slow_request_seen, 5_000

    for i <- 1..20 do
      assert call(node, :ping) == :pong
      assert one.(i) == [i + 1.0, 1.0, 1.0, 1.0]
    end

    assert Task.yield(task, 0) == nil, "the slow run should still be waiting for its callback"
    assert {:ok, [{bin, _}]} = Task.await(task, 10_000)
    assert to_f32(bin) == [7.0, 7.0, 7.0, 7.0]
  end

  test ":info counts the time callbacks waited for their replies", %{node: node, peer: peer} do
    exe = compile!(node, exla_module(:timed))
    {:ok, %{callbacks: before}} = call(node, :info)

    slow = on_peer(peer, :slow_echo, [self(), 300])
    assert {:ok, [_]} = call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])], [callback_server: slow]})

    {:ok, %{callbacks: now}} = call(node, :info)
    assert now.replies - before.replies == 1
    waited_ms = (now.reply_wait_us - before.reply_wait_us) / 1000
    assert waited_ms >= 300 and waited_ms < 5_000, "waited #{waited_ms} ms for a reply sent after 300 ms"
  end

  test "many concurrent runs with callbacks to two nodes are all correct", %{node: node, peer: peer} do
    exe = compile!(node, exla_module(:many))
    remote = on_peer(peer, :add_one, [])

    local =
      spawn_link(fn ->
        loop = fn loop ->
          receive do
            {:exla_runtime_call, :many, [{bin, _}], {pid, ref}} ->
              out = for <<v::float-32-little <- bin>>, into: <<>>, do: <<v + 1.0::float-32-little>>
              send(pid, {ref, {:ok, [out]}})
          end

          loop.(loop)
        end

        loop.(loop)
      end)

    1..200
    |> Task.async_stream(
      fn i ->
        server = if rem(i, 2) == 0, do: remote, else: local
        {:ok, [{bin, _}]} = call(node, {:run, exe, [f32([i * 1.0, 0.0, 0.0, 0.0])], [callback_server: server]})
        {i, to_f32(bin)}
      end,
      max_concurrency: 16,
      timeout: 60_000
    )
    |> Enum.each(fn {:ok, {i, out}} -> assert out == [i + 1.0, 1.0, 1.0, 1.0] end)
  end
end
