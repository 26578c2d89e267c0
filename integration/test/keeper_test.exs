defmodule XlaNode.KeeperTest do
  @moduledoc """
  `XlaNode.Keeper`: buffers that live while any process holds their token, the lifetime of an
  EXLA tensor, with the raw API (`XlaNode.Backend` keeps every Nx tensor this way; elixir_nx's
  tests cover the Nx idioms). Holders are real processes: a Task's caller, an Agent, a message
  not yet received, an ETS table, a process on a second BEAM node running the client. What the
  node holds is counted by its `:info` `buffers`, on a node of this module's own.

  A holder's dropped tokens count until its garbage is collected, as a dropped EXLA tensor
  does: the tests collect it (`:erlang.garbage_collect/1`) and ask the keeper for a sweep
  (`XlaNode.Keeper.sweep/0`), rather than wait for either.
  """
  use ExUnit.Case, async: false

  alias XlaNode.{Harness, Keeper, PeerHelpers, Tensor}

  setup_all do
    Harness.start_shared_node()
  end

  # What an earlier test dropped is released before this one counts.
  setup do
    sweep()
    :ok
  end

  defp buffers(node) do
    {:ok, %{buffers: buffers}} = XlaNode.info(node.name)
    buffers
  end

  # A release is a cast to the node: it is seen a moment later.
  defp buffers_come_to?(node, n), do: Harness.eventually(fn -> buffers(node) == n end) != nil

  # A buffer held by the keeper, and its token.
  defp kept(node, values) do
    {:ok, buffer} =
      XlaNode.to_device(node.name, Tensor.from_list(values, {:f, 32}), owner: Keeper.owner())

    [token] = Keeper.track([buffer])
    {buffer, token}
  end

  defp read(node, buffer) do
    case XlaNode.read(node.name, buffer) do
      {:ok, tensor} -> {:ok, Tensor.to_list(tensor)}
      {:error, error} -> {:error, error.kind}
    end
  end

  defp hold(holder, pairs) do
    send(holder, {:hold, pairs, self()})
    assert_receive :holds, 5_000
  end

  # `holder` runs `fun` in a Task, awaits it and holds the pairs it returns; this process gets
  # their buffer references only (a token this process held would count until its stack frame
  # is gone).
  defp made_in(holder, fun) do
    send(holder, {:await, fun, self()})
    assert_receive {:buffers, buffers}, 30_000
    buffers
  end

  defp drop(holder) do
    send(holder, {:drop, self()})
    assert_receive :dropped, 5_000
  end

  # A buffer made in a Task of `local`, sent to `to` (handed over to it first when
  # `hand_over?`), then dropped by `local`: only `to` holds its token afterwards.
  defp sent_and_dropped(node, local, to, values, hand_over?) do
    test = self()

    [buffer] =
      made_in(local, fn ->
        {buffer, token} = pair = kept(node, values)
        if hand_over?, do: :ok = Keeper.hand_over([{token, buffer}], to)
        send(to, {:hold, [pair], test})
        [pair]
      end)

    assert_receive :holds, 5_000
    drop(local)
    sweep()
    buffer
  end

  # Sweeps until the keeper has learnt every token and read their counts twice over.
  defp sweep do
    Keeper.sweep()
    Keeper.sweep()
  end

  test "a buffer made in a Task lives while its caller holds the token, seconds later included, and goes after",
       %{node: node} do
    n0 = buffers(node)
    caller = PeerHelpers.spawn_term_holder(false)
    [buffer] = made_in(caller, fn -> [kept(node, [1.0, 2.0])] end)
    assert buffers(node) == n0 + 1

    # The Task exited; timed sweeps come and go.
    sweep()
    Process.sleep(1_500)
    assert read(node, buffer) == {:ok, [1.0, 2.0]}

    drop(caller)
    sweep()
    assert buffers_come_to?(node, n0)
    assert read(node, buffer) == {:error, :argument_error}
  end

  test "a process that makes many and exits frees them; those another holds stay",
       %{node: node} do
    n0 = buffers(node)
    other = PeerHelpers.spawn_term_holder(false)
    maker = PeerHelpers.spawn_term_holder(false)

    made_in(maker, fn ->
      pairs = for i <- 1..200, do: kept(node, [i * 1.0])
      hold(other, Enum.take(pairs, 5))
      []
    end)

    sweep()
    assert buffers_come_to?(node, n0 + 5)
    send(other, {:read, node.name, self()})
    assert_receive {:read, results}, 5_000
    assert length(results) == 5 and Enum.all?(results, &match?({:ok, {:ok, _}}, &1))
    drop(other)
    sweep()
    assert buffers_come_to?(node, n0)
  end

  test "a message not yet received, an Agent and an ETS table hold their tokens",
       %{node: node} do
    n0 = buffers(node)
    table = :ets.new(:keeper_test, [:public])
    test = self()

    # Only the message, the Agent and the table hold them once the Task has exited.
    {receiver, agent, [a, b, c]} =
      Task.async(fn ->
        [pa, pb, pc] = for v <- [1.0, 2.0, 3.0], do: kept(node, [v])

        receiver =
          spawn(fn ->
            receive do: (:read -> receive(do: ({:pair, _} -> send(test, :received))))
          end)

        send(receiver, {:pair, pa})
        {:ok, agent} = Agent.start(fn -> pb end)
        :ets.insert(table, {:pair, pc})
        {receiver, agent, Enum.map([pa, pb, pc], &elem(&1, 0))}
      end)
      |> Task.await()

    sweep()
    assert buffers(node) == n0 + 3
    assert Enum.map([a, b, c], &read(node, &1)) == [{:ok, [1.0]}, {:ok, [2.0]}, {:ok, [3.0]}]

    send(receiver, :read)
    assert_receive :received
    Agent.stop(agent)
    :ets.delete(table)
    sweep()
    assert buffers_come_to?(node, n0)
  end

  test "a process on another BEAM node that holds the token keeps the buffer; that node going down releases it",
       %{node: node} do
    peer = Harness.start_peer()
    {:ok, _} = Harness.peer_call(peer, PeerHelpers, :start_client, [])
    n0 = buffers(node)
    local = PeerHelpers.spawn_term_holder(false)
    remote = Harness.peer_call(peer, PeerHelpers, :spawn_term_holder, [true])
    test = self()

    # Made here, sent to the remote holder (which tells its node's keeper it holds it), and
    # dropped here.
    buffer = sent_and_dropped(node, local, remote, [4.0], false)
    Process.sleep(100)
    assert buffers(node) == n0 + 1
    assert read(node, buffer) == {:ok, [4.0]}
    send(remote, {:read, node.name, self()})
    assert_receive {:read, [{:ok, {:ok, {<<4.0::float-32-little>>, _}}}]}, 5_000

    # Dropped there too, and swept there: it goes.
    drop(remote)
    Harness.peer_call(peer, Keeper, :sweep, [])
    Harness.peer_call(peer, Keeper, :sweep, [])
    assert buffers_come_to?(node, n0)
    assert read(node, buffer) == {:error, :argument_error}

    # A node that goes down releases what its keeper held.
    [] =
      made_in(local, fn ->
        pair = kept(node, [5.0])
        send(remote, {:hold, [pair], test})
        send(test, {:made, elem(pair, 0)})
        []
      end)

    assert_receive {:made, buffer}
    assert_receive :holds, 5_000
    sweep()
    Process.sleep(100)
    assert read(node, buffer) == {:ok, [5.0]}
    Harness.signal_peer(peer, "KILL")
    assert buffers_come_to?(node, n0)
  end

  test "a buffer handed over to a process on another BEAM node lives there before its first use, and goes with that process if never used",
       %{node: node} do
    peer = Harness.start_peer()
    {:ok, _} = Harness.peer_call(peer, PeerHelpers, :start_client, [])
    n0 = buffers(node)
    local = PeerHelpers.spawn_term_holder(false)
    # They keep what they are sent without using it until told to.
    remote = Harness.peer_call(peer, PeerHelpers, :spawn_term_holder, [false])
    idle = Harness.peer_call(peer, PeerHelpers, :spawn_term_holder, [false])
    handed = fn -> Harness.peer_call(peer, Keeper, :stats, []).handed end

    # Without a hand-over, a buffer sent there and dropped here goes before its first use there.
    control = sent_and_dropped(node, local, remote, [1.0], false)
    assert buffers_come_to?(node, n0)
    assert read(node, control) == {:error, :argument_error}
    send(remote, {:drop, self()})
    assert_receive :dropped, 5_000

    # Handed over first: held there until used, whatever this node does.
    buffer = sent_and_dropped(node, local, remote, [4.0], true)
    assert handed.() == 1
    Process.sleep(100)
    assert buffers(node) == n0 + 1
    assert read(node, buffer) == {:ok, [4.0]}

    # Its first use there takes it over: the hand-over's hold ends, the token's holds it.
    send(remote, {:use, self()})
    assert_receive :used, 5_000
    assert handed.() == 0
    Harness.peer_call(peer, Keeper, :sweep, [])
    Process.sleep(100)
    assert buffers(node) == n0 + 1
    send(remote, {:read, node.name, self()})
    assert_receive {:read, [{:ok, {:ok, {<<4.0::float-32-little>>, _}}}]}, 5_000

    send(remote, {:drop, self()})
    assert_receive :dropped, 5_000
    Harness.peer_call(peer, Keeper, :sweep, [])
    Harness.peer_call(peer, Keeper, :sweep, [])
    assert buffers_come_to?(node, n0)

    # Handed to a process that never uses it: it goes when that process exits.
    buffer = sent_and_dropped(node, local, idle, [5.0], true)
    Process.sleep(100)
    assert read(node, buffer) == {:ok, [5.0]}
    Harness.peer_call(peer, Process, :exit, [idle, :kill])
    assert buffers_come_to?(node, n0)
    assert handed.() == 0

    # To a process of this node: nothing to do. To a node without the client: refused.
    {buffer, token} = kept(node, [6.0])
    assert :ok = Keeper.hand_over([{token, buffer}], local)
    # (Quietly: its application controller would log the stop.)
    :ok = Harness.peer_call(peer, :logger, :set_primary_config, [:level, :warning])
    :ok = Harness.peer_call(peer, Application, :stop, [:xla_node_client])

    assert {:error, %XlaNode.Error{kind: :noproc, message: message}} =
             Keeper.hand_over([{token, buffer}], remote)

    assert message =~ "start the :xla_node_client application there"
    assert read(node, buffer) == {:ok, [6.0]}

    assert_raise ArgumentError, ~r/takes {token, buffer} pairs/, fn ->
      Keeper.hand_over([{"not a token", buffer}], remote)
    end
  end

  test "a forged or stale token is refused or costs nothing else; a keeper that restarts frees what it held",
       %{node: node} do
    n0 = buffers(node)
    holder = PeerHelpers.spawn_term_holder(false)
    [buffer] = made_in(holder, fn -> [kept(node, [6.0])] end)

    assert_raise ArgumentError, ~r/not a token of XlaNode.Keeper/, fn ->
      Keeper.hold("forged", buffer)
    end

    # A token of the right form that no keeper made, for a buffer this keeper holds: taken
    # over, and when it goes (this process drops it), the real token keeps the buffer.
    Task.async(fn -> Keeper.hold(<<0::64, 1::64, 0::size(49)-unit(8)>>, buffer) end)
    |> Task.await()

    sweep()
    assert buffers(node) == n0 + 1
    assert read(node, buffer) == {:ok, [6.0]}

    # The keeper goes down: the node frees what it held, and its tokens are stale.
    token =
      Task.async(fn -> kept(node, [8.0]) end)
      |> Task.await()
      |> tap(fn {stale, _} -> assert read(node, stale) == {:ok, [8.0]} end)

    keeper = Keeper.owner()
    ref = Process.monitor(keeper)
    Process.exit(keeper, :kill)
    assert_receive {:DOWN, ^ref, :process, _, :killed}
    assert buffers_come_to?(node, n0)
    Harness.eventually(fn -> Keeper.owner() not in [nil, keeper] end)

    # A stale token is taken over by the new keeper, whose share the node skips: the buffer is
    # gone, and reading it says so.
    {stale, stale_token} = token
    :ok = Keeper.hold(stale_token, stale)
    assert read(node, stale) == {:error, :argument_error}

    # The new keeper keeps what is made from now on.
    [fresh] = made_in(holder, fn -> [kept(node, [7.0])] end)
    sweep()
    assert read(node, fresh) == {:ok, [7.0]}
    drop(holder)
    sweep()
    assert buffers_come_to?(node, n0)
  end

  test "the keeper's figures" do
    stats = Keeper.stats()

    assert %{live: _, tracked: _, released: _, sweeps: _, last_sweep_us: _, interval_ms: _} =
             stats

    assert %{released: _, live: _} = Keeper.sweep()
  end
end
