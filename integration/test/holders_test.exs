defmodule XlaNode.HoldersTest do
  @moduledoc """
  Who holds a buffer or an executable on the node, with the raw requests: `owner:` on
  `:to_device`, `:upload` and `:run`, `{:share, refs, pid}`, `{:give_away, refs, pid}`,
  `{:release, refs}` and `{:release, refs, pid}` as calls and casts, and the client's
  `XlaNode.give_away/4`, `share/4` and `release/3`. A resource lives while any holder does:
  the processes here are real (local ones, and those of a second BEAM node), and what the node
  holds is counted by its `:info` `buffers`, on a node of this module's own.
  """
  use ExUnit.Case, async: false

  alias XlaNode.{Harness, Load, Tensor}

  setup_all do
    Harness.start_shared_node()
  end

  defp call(node, request), do: GenServer.call({:xla, node.name}, request, 30_000)

  defp info(node) do
    {:ok, info} = call(node, :info)
    info
  end

  defp buffers(node), do: info(node).buffers

  # The node's buffer count comes to `n` (a cast, or a holder's exit, is seen a little later).
  defp buffers_come_to?(node, n), do: Harness.eventually(fn -> buffers(node) == n end) != nil

  defp f32(list), do: Tensor.from_list(list, {:f, 32})

  # A process that holds on until told to stop, then exits.
  defp holder do
    spawn(fn ->
      receive do
        :stop -> :ok
      end
    end)
  end

  defp stop(pid) do
    ref = Process.monitor(pid)
    send(pid, :stop)
    assert_receive {:DOWN, ^ref, :process, ^pid, _}
  end

  # Runs `fun` in a process that exits once it has returned, and returns what it returned.
  defp in_process(fun), do: fun |> Task.async() |> Task.await(30_000)

  defp read!(node, buffer) do
    assert {:ok, {data, _}} = call(node, {:read, buffer})
    for <<v::float-32-little <- data>>, do: v
  end

  test "owner: on :to_device, :upload and :run names the process that holds what they make",
       %{node: node} do
    n0 = buffers(node)
    owner = holder()
    {:ok, exe} = call(node, {:compile, Load.plus_one_program()})

    # Made by processes that exit at once: the owner holds them.
    {placed, uploaded, [kept]} =
      in_process(fn ->
        {:ok, placed} = call(node, {:to_device, f32([1.0, 2.0]), [owner: owner]})
        {:ok, upload} = call(node, {:upload, {{:f, 32}, [2]}, [device: 1, owner: owner]})
        GenServer.cast({:xla, node.name}, {:upload, upload, <<3.0::float-32-little>>})
        :ok = call(node, {:upload, upload, <<4.0::float-32-little>>})
        {:ok, uploaded} = call(node, {:upload_done, upload})

        {:ok, kept} =
          call(node, {:run, exe, [f32([1, 2, 3, 4])], [keep_on_device: true, owner: owner]})

        {placed, uploaded, kept}
      end)

    assert buffers(node) == n0 + 3
    assert read!(node, placed) == [1.0, 2.0]
    assert read!(node, uploaded) == [3.0, 4.0]
    assert {:ok, %{device: 1}} = call(node, {:describe, uploaded})
    assert read!(node, kept) == [2.0, 3.0, 4.0, 5.0]

    stop(owner)
    assert buffers_come_to?(node, n0)

    assert {:error, {:argument_error, "unknown or freed reference" <> _}} =
             call(node, {:read, kept})
  end

  test "an owner that is already dead frees at once what is made for it", %{node: node} do
    n0 = buffers(node)
    dead = holder()
    stop(dead)
    {:ok, buffer} = call(node, {:to_device, f32([1.0]), [owner: dead]})
    assert buffers_come_to?(node, n0)
    assert {:error, {:argument_error, _}} = call(node, {:read, buffer})
  end

  test "bad owner: values are argument errors that name the option", %{node: node} do
    {:ok, exe} = call(node, {:compile, Load.plus_one_program()})

    for request <- [
          {:to_device, f32([1.0]), [owner: :keeper]},
          {:upload, {{:f, 32}, [1]}, [owner: "me"]},
          {:run, exe, [f32([1, 2, 3, 4])], [keep_on_device: true, owner: {:keeper, node()}]}
        ] do
      assert {:error, {:argument_error, message}} = call(node, request)
      assert message =~ "owner must be a pid, got"
    end
  end

  test "give_away hands the caller's hold over, as :ets.give_away/3 hands a table", %{node: node} do
    n0 = buffers(node)
    heir = holder()

    [a, b] =
      in_process(fn ->
        {:ok, a} = call(node, {:to_device, f32([1.0])})
        {:ok, b} = call(node, {:to_device, f32([2.0])})
        assert call(node, {:give_away, a, heir}) == :ok
        assert call(node, {:give_away, [b], heir}) == :ok
        # Given away: the caller holds them no more.
        assert {:error, {:argument_error, message}} = call(node, {:give_away, a, heir})
        assert message =~ ~r/^#Ref<.*> is not held by <.*>: only a holder can give it away$/
        [a, b]
      end)

    # The maker exited; the heir's holds keep them.
    assert buffers(node) == n0 + 2
    assert read!(node, a) == [1.0] and read!(node, b) == [2.0]
    stop(heir)
    assert buffers_come_to?(node, n0)
  end

  test "a give_away that cannot hand over every reference hands over none", %{node: node} do
    n0 = buffers(node)
    heir = holder()
    {:ok, mine} = call(node, {:to_device, f32([1.0])})
    theirs = in_process(fn -> elem(call(node, {:to_device, f32([2.0]), [owner: heir]}), 1) end)
    freed = in_process(fn -> elem(call(node, {:to_device, f32([3.0])}), 1) end)
    assert buffers_come_to?(node, n0 + 2)

    assert {:error, {:argument_error, message}} = call(node, {:give_away, [mine, theirs], heir})

    assert message =~ ~r/^#Ref<.*> is not held by <.*>: only a holder can give it away$/

    assert {:error, {:argument_error, message}} = call(node, {:give_away, [mine, freed], heir})
    assert message =~ ~r/^unknown or freed reference #Ref<.*>$/

    # Nothing moved: this process still holds its own, the heir its own.
    stop(heir)
    assert buffers_come_to?(node, n0 + 1)
    assert read!(node, mine) == [1.0]
    assert call(node, {:free, mine}) == :ok
  end

  test "share adds holds; the buffer goes with the last; release ends one", %{node: node} do
    n0 = buffers(node)
    {h1, h2} = {holder(), holder()}
    {:ok, buffer} = call(node, {:to_device, f32([5.0])})
    assert call(node, {:share, buffer, h1}) == :ok
    assert call(node, {:share, [buffer], h2}) == :ok
    # Holds are counted: h2 holds it twice now.
    assert call(node, {:share, buffer, h2}) == :ok

    assert call(node, {:release, buffer}) == :ok
    assert {:error, {:argument_error, message}} = call(node, {:release, buffer})
    assert message =~ ~r/is not held by <.*>: only a holder can release it$/
    stop(h1)
    assert read!(node, buffer) == [5.0]
    assert buffers(node) == n0 + 1

    # Releases naming their holder, as casts (the keeper of a client node sends these): the
    # first leaves h2 one hold, the second none.
    GenServer.cast({:xla, node.name}, {:release, [buffer], h2})
    assert read!(node, buffer) == [5.0]
    GenServer.cast({:xla, node.name}, {:release, buffer, h2})
    assert buffers_come_to?(node, n0)
    Process.exit(h2, :kill)
  end

  test "a holder's exit ends all its holds, however many", %{node: node} do
    n0 = buffers(node)
    h = holder()
    {:ok, buffer} = call(node, {:to_device, f32([5.0]), [owner: h]})
    :ok = call(node, {:share, [buffer, buffer], h})
    stop(h)
    assert buffers_come_to?(node, n0)
  end

  test "free frees whoever holds", %{node: node} do
    n0 = buffers(node)
    h = holder()
    {:ok, buffer} = call(node, {:to_device, f32([5.0])})
    :ok = call(node, {:share, buffer, h})
    assert call(node, {:free, buffer}) == :ok
    assert buffers(node) == n0

    assert {:error, {:argument_error, "unknown or freed reference" <> _}} =
             call(node, {:read, buffer})

    stop(h)
  end

  test "casts skip what they cannot change and cost nothing else", %{node: node} do
    n0 = buffers(node)
    h = holder()
    {:ok, mine} = call(node, {:to_device, f32([1.0])})
    {:ok, other} = call(node, {:to_device, f32([2.0])})
    :ok = call(node, {:free, other})
    forged = make_ref()

    # A stale (freed) and a forged reference among real ones.
    GenServer.cast({:xla, node.name}, {:share, [other, forged, mine], h})
    # A release for a process that holds nothing, and a release without a holder, which a cast
    # cannot name: both change nothing.
    GenServer.cast({:xla, node.name}, {:release, [mine, forged], holder()})
    GenServer.cast({:xla, node.name}, {:release, [mine]})
    GenServer.cast({:xla, node.name}, {:give_away, [mine], h})
    assert call(node, :ping) == :pong

    # The share went through: both hold it.
    assert call(node, {:release, mine}) == :ok
    assert buffers(node) == n0 + 1
    stop(h)
    assert buffers_come_to?(node, n0)
  end

  test "malformed requests are argument errors that change nothing", %{node: node} do
    {:ok, buffer} = call(node, {:to_device, f32([1.0])})
    h = holder()

    for {request, expected} <- [
          {{:share, :buffer, h}, "unknown or freed reference 'buffer'"},
          {{:share, [buffer, 7], h}, "unknown or freed reference 7"},
          {{:give_away, buffer, :heir}, "give_away: the holder must be a pid, got 'heir'"},
          {{:share, buffer, "pid"}, "share: the holder must be a pid"},
          {{:release, buffer, {:keeper, node()}}, "release: the holder must be a pid"}
        ] do
      assert {:error, {:argument_error, message}} = call(node, request)
      assert message =~ expected
    end

    {:ok, upload} = call(node, {:upload, {{:f, 32}, [1]}})
    assert {:error, {:argument_error, message}} = call(node, {:share, upload, h})
    assert message =~ "is an upload not yet done"
    assert read!(node, buffer) == [1.0]
    stop(h)
  end

  test "a holder on another BEAM node keeps a buffer; that node going down releases it",
       %{node: node} do
    n0 = buffers(node)
    peer = Harness.start_peer()
    remote = Node.spawn(peer.node, :timer, :sleep, [:infinity])
    charged = fn client -> get_in(info(node), [:tenants, client, :device_bytes]) || 0 end
    here = charged.(node())
    {:ok, buffer} = call(node, {:to_device, f32([7.0])})
    assert call(node, {:share, buffer, remote}) == :ok
    # Its bytes count against the quota of the node that made it while that node holds it...
    assert {charged.(node()), charged.(peer.node)} == {here + 4, 0}
    assert call(node, {:release, buffer}) == :ok
    assert read!(node, buffer) == [7.0]
    # ... and then against the node that holds it.
    assert {charged.(node()), charged.(peer.node)} == {here, 4}

    # The peer's own process reads it, as any process that knows the reference may.
    assert {:ok, {<<7.0::float-32-little>>, _}} =
             Harness.peer_call(peer, GenServer, :call, [{:xla, node.name}, {:read, buffer}])

    Harness.signal_peer(peer, "KILL")
    assert buffers_come_to?(node, n0)
  end

  describe "the client" do
    test "give_away/4, share/4 and release/3, and their bang variants", %{node: node} do
      n0 = buffers(node)
      heir = holder()
      {:ok, a} = XlaNode.to_device(node.name, f32([1.0]))
      {:ok, b} = XlaNode.to_device(node.name, f32([2.0]), owner: heir)

      assert XlaNode.give_away(node.name, a, heir) == :ok

      assert {:error, %XlaNode.Error{kind: :argument_error}} =
               XlaNode.give_away(node.name, a, heir)

      assert XlaNode.share!(node.name, [a, b], self()) == :ok
      assert XlaNode.release!(node.name, [a, b]) == :ok

      assert_raise XlaNode.Error, ~r/not held by/, fn -> XlaNode.release!(node.name, a) end

      assert_raise XlaNode.Error, ~r/unknown or freed/, fn ->
        XlaNode.give_away!(node.name, make_ref(), heir)
      end

      assert buffers(node) == n0 + 2
      stop(heir)
      assert buffers_come_to?(node, n0)
    end

    test "through a pool, each reference goes to its node", %{node: node} do
      other = Harness.start_node()
      Harness.connect!(other)
      pool = :"holders_pool_#{System.unique_integer([:positive])}"
      start_supervised!({XlaNode.Pool, name: pool, nodes: [node.name, other.name]})

      Harness.eventually(fn ->
        Enum.all?(XlaNode.Pool.status(pool).nodes, &(&1.status == :up))
      end)

      heir = holder()
      {:ok, here} = XlaNode.to_device(node.name, f32([1.0]))
      {:ok, there} = XlaNode.to_device(other.name, f32([2.0]))
      assert XlaNode.give_away(pool, [here, there], heir) == :ok
      assert XlaNode.share(pool, [here, there], self()) == :ok
      assert XlaNode.release(pool, [there, here]) == :ok
      assert {:error, %XlaNode.Error{kind: :argument_error}} = XlaNode.release(pool, here)

      n_other = buffers(other)
      stop(heir)
      assert buffers_come_to?(other, n_other - 1)
    end
  end
end
