defmodule XlaNode.BackendLifetimeTest do
  @moduledoc """
  `XlaNode.Backend` tensors live while a process holds them, as EXLA's do: Nx's own idioms,
  with `Nx.global_default_backend({XlaNode.Backend, node: node})` as a new user would set it.
  A Task's result read by its caller long after the Task exited, a GenServer wrapping a model
  called 10,000 times, `Task.async_stream`, an `Agent`, an ETS table, a message not yet
  received, a process on a second BEAM node, `Nx.Serving` with `keep_on_device: true`, an
  eager loop without `scope/1`; and bad tokens.

  Holders are real processes (`XlaNode.NxTest.Holder` keeps what it holds in its loop's
  state). A dropped tensor counts until its holder's garbage is collected, as a dropped EXLA
  tensor does: the tests collect it and ask `XlaNode.Keeper` for a sweep, rather than wait.
  What the node holds is counted by its `:info` `buffers`.
  """
  # Not async: it counts the node's buffers, and sets the global default backend.
  use ExUnit.Case, async: false

  @moduletag timeout: 600_000

  alias XlaNode.NxTest.{Holder, Node}

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  # How many dropped tensors a busy process may hold between its collections, and the keeper
  # between its sweeps: a process collects its garbage once its heap, or the binaries it
  # references (tokens count there, a hundred bytes each), fill; a few thousand tensors at
  # most, whatever the number made.
  @garbage_bound 10_000

  defp buffers do
    {:ok, %{buffers: buffers}} = XlaNode.info(xla())
    buffers
  end

  # A sweep returns once the node has taken its releases.
  defp sweep, do: XlaNode.Keeper.sweep()

  defp collect(pids) do
    Enum.each(pids, &:erlang.garbage_collect/1)
    sweep()
  end

  # The same on the peer's node, with its keeper.
  defp collect(peer, pids) do
    Enum.each(pids, &:erpc.call(peer.node, :erlang, :garbage_collect, [&1]))
    :erpc.call(peer.node, XlaNode.Keeper, :sweep, [])
  end

  setup do
    previous = Application.get_env(:nx, :default_backend)
    Nx.global_default_backend({XlaNode.Backend, node: xla()})
    on_exit(fn -> Application.put_env(:nx, :default_backend, previous) end)
    # What earlier tests dropped goes before this one counts: the garbage of every process
    # here, a sweep, and the node's releases for peers stopped since (it frees what they held
    # as their nodedown reaches it), until its count stays put.
    Enum.each(Process.list(), &:erlang.garbage_collect/1)
    sweep()
    settle(buffers())
    :ok
  end

  # Until three reads 100 ms apart agree with `count` (5 s at most).
  defp settle(count, agreed \\ 0, left \\ 50)
  defp settle(_count, 3, _left), do: :ok
  defp settle(_count, _agreed, 0), do: :ok

  defp settle(count, agreed, left) do
    Process.sleep(100)

    case buffers() do
      ^count -> settle(count, agreed + 1, left - 1)
      other -> settle(other, 0, left - 1)
    end
  end

  test "a Task's result is read by its caller at any time while it holds it, and freed once dropped" do
    n0 = buffers()
    caller = Holder.start()

    # The issue's example, in a caller that keeps what it gets.
    [sum] =
      Holder.await(caller, fn ->
        t = Task.async(fn -> Nx.iota({1000}, type: :f32) |> Nx.multiply(2) end) |> Task.await()
        [t]
      end)

    assert sum == 999_000.0
    collect([caller])
    assert buffers() == n0 + 1

    # Seconds later, many sweeps later.
    Process.sleep(2_000)
    sweep()
    assert Holder.sums(caller) == [999_000.0]

    Holder.drop(caller)
    sweep()
    assert buffers() == n0
  end

  defmodule Model do
    @moduledoc "The issue's model server: its weights in its state, a product per call."
    use GenServer

    def init(_), do: {:ok, Nx.iota({256, 256}, type: :f32) |> Nx.divide(65_536)}
    def handle_call({:predict, x}, _from, w), do: {:reply, Nx.dot(x, w), w}
  end

  test "10,000 GenServer.calls whose results the caller reads and drops leave the node's buffers where they were" do
    {:ok, model} = GenServer.start(Model, nil)
    n0 = buffers()
    caller = Holder.start()
    test = self()

    Holder.await(caller, fn ->
      peak =
        Enum.reduce(1..10_000, 0, fn i, peak ->
          x = Nx.broadcast(Nx.tensor(i * 1.0), {1, 256})
          y = GenServer.call(model, {:predict, x})
          # Read, and dropped.
          [[_ | _]] = Nx.to_list(y)
          if rem(i, 1_000) == 0, do: max(peak, buffers()), else: peak
        end)

      send(test, {:peak, peak})
      []
    end)

    assert_received {:peak, peak}
    collect([caller, model])
    # The weights, and nothing per call.
    assert buffers() <= n0 + 2, "#{buffers()} buffers after, #{n0} before"
    # While it ran, 30,000 were made, and some garbage at most was held.
    assert peak - n0 < @garbage_bound, "#{peak - n0} buffers more at the most"
    GenServer.stop(model)
  end

  test "Task.async_stream over 1,000 batches: every result usable while held, freed once dropped" do
    n0 = buffers()
    caller = Holder.start()

    sums =
      Holder.await(caller, fn ->
        1..1_000
        |> Task.async_stream(fn i -> Nx.multiply(Nx.iota({4}, type: :f32), i) end,
          max_concurrency: 4
        )
        |> Enum.map(fn {:ok, t} -> t end)
      end)

    assert sums == Enum.map(1..1_000, &(6.0 * &1))
    collect([caller])
    assert buffers() == n0 + 1_000
    assert Holder.sums(caller) == sums
    Holder.drop(caller)
    sweep()
    assert buffers() == n0
  end

  test "an Agent holds params while the process that made them has exited" do
    n0 = buffers()

    agent =
      Task.async(fn ->
        params = %{w: Nx.iota({4, 4}, type: :f32), b: Nx.iota({4}, type: :f32) |> Nx.add(1)}
        {:ok, agent} = Agent.start(fn -> params end)
        agent
      end)
      |> Task.await()

    sweep()
    assert buffers() == n0 + 2
    assert Agent.get(agent, &Nx.to_number(Nx.sum(&1.w))) == 120.0
    assert Agent.get(agent, &Nx.to_flat_list(&1.b)) == [1.0, 2.0, 3.0, 4.0]
    Agent.stop(agent)
    sweep()
    assert buffers() == n0
  end

  test "a tensor in an ETS table, and in a message not yet received" do
    n0 = buffers()
    table = :ets.new(:lifetime, [:public])
    test = self()

    receiver =
      Task.async(fn ->
        :ets.insert(table, {:t, Nx.iota({3}, type: :f32)})

        receiver =
          spawn(fn ->
            receive do
              :read ->
                receive do
                  {:tensor, t} -> send(test, {:read, Nx.to_flat_list(t)})
                end
            end
          end)

        send(receiver, {:tensor, Nx.iota({2}, type: :f32) |> Nx.add(10)})
        receiver
      end)
      |> Task.await()

    sweep()
    assert buffers() == n0 + 2
    [{:t, t}] = :ets.lookup(table, :t)
    assert Nx.to_flat_list(t) == [0.0, 1.0, 2.0]
    send(receiver, :read)
    assert_receive {:read, [10.0, 11.0]}
    :ets.delete(table)
    sweep()
    # `t`, read back from the table, is this process's now.
    assert buffers() == n0 + 1
    assert Nx.to_flat_list(t) == [0.0, 1.0, 2.0]
  end

  test "a tensor sent to a process on a second BEAM node is usable there while held, and freed once no node holds it" do
    peer = Node.start_peer!()
    on_exit(fn -> Node.stop_peer(peer) end)
    n0 = buffers()
    remote = :erpc.call(peer.node, Holder, :start, [])
    local = Holder.start()

    # Made here, in a Task; the remote holder uses it at once (its node's client takes it
    # over then), and nothing here holds it after.
    [] =
      Holder.await(local, fn ->
        t = Task.async(fn -> Nx.iota({10}, type: :f32) end) |> Task.await()
        [45.0] = Holder.hold(remote, [t])
        []
      end)

    collect([local])
    collect(peer, [remote])
    assert buffers() == n0 + 1
    assert Holder.sums(remote) == [45.0]

    Holder.drop(remote)
    collect(peer, [remote])
    assert buffers() == n0

    # The other way: made there, given to a holder here, which uses it (this node's keeper
    # takes it over), and dropped there.
    remote_backend = {XlaNode.Backend, node: xla()}
    assert Holder.apply(remote, Nx, :iota, [{5}, [type: :f32, backend: remote_backend]]) == [10.0]
    assert Holder.give(remote, local) == [10.0]
    collect(peer, [remote])
    collect([local])
    assert buffers() == n0 + 1
    assert Holder.sums(local) == [10.0]
    Holder.drop(local)
    sweep()
    assert buffers() == n0

    # A node that goes down releases what it held.
    [] =
      Holder.await(local, fn ->
        [45.0] = Holder.hold(remote, [Nx.iota({10}, type: :f32)])
        []
      end)

    collect([local])
    collect(peer, [remote])
    assert buffers() == n0 + 1
    :peer.stop(peer.pid)
    assert Enum.any?(1..100, fn _ -> buffers() == n0 or (Process.sleep(50) && false) end)
  end

  test "a container handed over to a process on a second BEAM node lives there before its first use, and goes with that process if never used" do
    peer = Node.start_peer!()
    on_exit(fn -> Node.stop_peer(peer) end)
    n0 = buffers()
    # They keep what they are sent without using it until asked for its sums.
    remote = :erpc.call(peer.node, Holder, :start, [])
    idle = :erpc.call(peer.node, Holder, :start, [])
    local = Holder.start()
    handed = fn -> :erpc.call(peer.node, XlaNode.Keeper, :stats, []).handed end

    # Made here in a Task, handed over, sent, and dropped here at once.
    [] =
      Holder.await(local, fn ->
        params = Task.async(fn -> [Nx.iota({10}, type: :f32), Nx.iota({4}, type: :f32)] end)
        params = Task.await(params)
        send(remote, {:params, XlaNode.Backend.hand_over(params, remote)})
        []
      end)

    assert handed.() == 2
    collect([local])
    collect(peer, [remote])
    assert buffers() == n0 + 2

    # Used there: taken over by its node's client, and the hand-over ends.
    assert Holder.sums(remote) == [45.0, 6.0]
    assert handed.() == 0
    collect(peer, [remote])
    assert buffers() == n0 + 2
    assert Holder.sums(remote) == [45.0, 6.0]
    Holder.drop(remote)
    collect(peer, [remote])
    assert buffers() == n0

    # Never used there: it goes when the process it was handed to exits.
    [] =
      Holder.await(local, fn ->
        :ok = Holder.keep(idle, XlaNode.Backend.hand_over([Nx.iota({3}, type: :f32)], idle))
        []
      end)

    collect([local])
    collect(peer, [idle])
    assert buffers() == n0 + 1
    :erpc.call(peer.node, Process, :exit, [idle, :kill])
    assert Enum.any?(1..100, fn _ -> buffers() == n0 or (Process.sleep(50) && false) end)

    # Handed to a process of this node: nothing to do, the tensor comes back as it was.
    t = Nx.iota({2}, type: :f32)
    assert XlaNode.Backend.hand_over(t, local) == t
  end

  test "Nx.Serving with keep_on_device: true: the results stay on the node while the caller holds them" do
    n0 = buffers()

    serving =
      Nx.Serving.jit(&Nx.multiply(&1, 3),
        compiler: XlaNode.Compiler,
        node: xla(),
        keep_on_device: true
      )
      |> Nx.Serving.batch_size(2)

    start_supervised!({Nx.Serving, serving: serving, name: __MODULE__.Serving, batch_timeout: 10})
    caller = Holder.start()

    [sum] =
      Holder.await(caller, fn ->
        result =
          Nx.Serving.batched_run(__MODULE__.Serving, Nx.Batch.stack([Nx.tensor([1.0, 2.0])]))

        %XlaNode.Backend{} = result.data
        [result]
      end)

    assert sum == 9.0
    # The batch's task exited long ago.
    Process.sleep(200)
    collect([caller])
    assert Holder.sums(caller) == [9.0]
    stop_supervised!(__MODULE__.Serving)
    collect([caller])
    assert Holder.sums(caller) == [9.0]
    Holder.drop(caller)
    sweep()
    assert buffers() == n0
  end

  defmodule Loop do
    @moduledoc "A long-lived process running eager steps on request, with no scope."
    use GenServer

    def init(node) do
      Nx.default_backend({XlaNode.Backend, node: node})
      {:ok, Nx.broadcast(Nx.tensor(0.0), {16})}
    end

    def handle_call({:run, steps}, _from, acc) do
      acc =
        Enum.reduce(1..steps, acc, fn i, acc -> acc |> Nx.add(rem(i, 500)) |> Nx.multiply(0.5) end)

      {:reply, :ok, acc}
    end

    def handle_call(:read, _from, acc), do: {:reply, Nx.to_flat_list(acc), acc}
  end

  @steps 100_000

  test "#{@steps} eager steps in a long-lived process, without scope/1: the node's buffers stay bounded" do
    {:ok, loop} = GenServer.start(Loop, xla())
    n0 = buffers()

    peak =
      Enum.reduce(1..div(@steps, 1_000), 0, fn _, peak ->
        :ok = GenServer.call(loop, {:run, 1_000}, 120_000)
        max(peak, buffers())
      end)

    [value | _] = GenServer.call(loop, :read)
    expected = Enum.reduce(1..@steps, 0.0, fn i, acc -> (acc + rem(i, 500)) * 0.5 end)
    assert_in_delta value, expected, 1.0e-3

    assert peak - n0 < @garbage_bound,
           "#{peak - n0} buffers more at the most over #{@steps} steps (#{2 * @steps} made)"

    collect([loop])
    assert buffers() <= n0 + 1
    GenServer.stop(loop)
    sweep()
    assert buffers() == n0 - 1
  end

  describe "bad tokens" do
    test "a forged token is refused, a stale one says the tensor is gone; nothing else is freed" do
      mine = Nx.iota({3}, type: :f32)
      t = Nx.iota({3}, type: :f32)

      forged = put_in(t.data.token, "forged")
      error = assert_raise ArgumentError, fn -> Nx.sum(forged) end
      assert error.message =~ "not a token of XlaNode.Keeper"

      # Well-formed, of no keeper, for a buffer freed meanwhile.
      stale = put_in(t.data.token, <<1::64, 2::64, 0::size(49)-unit(8)>>)
      Nx.backend_deallocate(t)
      error = assert_raise XlaNode.Error, fn -> Nx.sum(stale) end
      assert error.kind == :gone

      sweep()
      assert Nx.to_flat_list(mine) == [0.0, 1.0, 2.0]
    end

    test "a tensor whose node restarted is gone; the new node's tensors are untouched" do
      name = "xla_nx_restart_#{System.pid()}"
      first = Node.start!(name)
      backend = {XlaNode.Backend, node: first.name}
      caller = Holder.start()
      Holder.await(caller, fn -> [Nx.iota({4}, type: :f32, backend: backend)] end)
      Node.stop(first)
      Process.sleep(200)
      second = Node.start!(name)
      on_exit(fn -> Node.stop(second) end)

      kept = Nx.iota({2}, type: :f32, backend: backend)
      assert {:error, %XlaNode.Error{kind: :gone}} = Holder.sums(caller)
      # Dropped: its release goes to the new node, which skips it.
      Holder.drop(caller)
      sweep()
      assert Nx.to_flat_list(kept) == [0.0, 1.0]
    end
  end
end
