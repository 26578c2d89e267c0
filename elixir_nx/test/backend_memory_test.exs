defmodule XlaNode.BackendMemoryTest do
  # Not async: it counts the node's buffers and compiles, which other tests would add to.
  use ExUnit.Case, async: false

  alias XlaNode.Backend

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  defp info do
    {:ok, info} = XlaNode.info(xla())
    info
  end

  defp buffers, do: info().buffers

  # The tests count `before` with their first tensor on the node, and use it last: a tensor the
  # test no longer uses may be collected, and freed by the keeper, while it counts.
  defp still_held(t), do: assert(%Backend{} = t.data)

  # Whether the node's buffer count comes to `expected` within 5 s: another process's
  # `Nx.backend_deallocate/1` leaves with its next request, or a millisecond later.
  defp buffers_come_to?(expected),
    do: Enum.any?(1..100, fn _ -> buffers() == expected or (Process.sleep(50) && false) end)

  # Compile requests: the node counts those it compiled and those its own cache of program
  # texts answered (a program another test compiled already).
  defp compiles do
    %{compiles: compiles, cache_hits: hits} = info()
    compiles + hits
  end

  setup do
    Nx.default_backend({Backend, node: xla()})
    # What earlier tests dropped goes now, not while this one counts.
    XlaNode.Keeper.sweep()
    :ok
  end

  describe "scope/1" do
    test "frees what was made inside, except what it returns" do
      t = Nx.iota({4}, type: :f32)
      before = buffers()

      {y, %{z: z}} =
        Backend.scope(fn ->
          x = Nx.add(t, 1)
          y = Nx.multiply(x, 2)
          {y, %{z: Nx.exp(y), count: 3}}
        end)

      assert buffers() == before + 2
      assert Nx.to_flat_list(y) == [2.0, 4.0, 6.0, 8.0]
      assert Nx.to_number(Nx.sum(z)) > 0
      # The tensor made before the scope is untouched.
      assert Nx.to_flat_list(t) == [0.0, 1.0, 2.0, 3.0]
    end

    test "nests: what an inner scope returns belongs to the outer one" do
      t = Nx.iota({4}, type: :f32)
      before = buffers()

      sum =
        Backend.scope(fn ->
          inner = Backend.scope(fn -> t |> Nx.add(1) |> Nx.multiply(3) end)
          assert buffers() == before + 1
          Nx.sum(inner)
        end)

      assert buffers() == before + 1
      assert Nx.to_number(sum) == 30.0
      still_held(t)
    end

    test "frees everything when the function raises, and re-raises" do
      t = Nx.iota({4}, type: :f32)
      before = buffers()

      assert_raise RuntimeError, "boom", fn ->
        Backend.scope(fn ->
          Nx.add(t, 1)
          Nx.exp(t)
          raise "boom"
        end)
      end

      assert buffers() == before
      assert catch_throw(Backend.scope(fn -> throw(Nx.add(t, 1)) end))
      assert buffers() == before
      still_held(t)
    end

    test "covers the results of functions jitted with XlaNode.Compiler" do
      # 128 bytes a result: above what a run returns inline, so they stay on the node.
      t = Nx.iota({32}, type: :f32)
      f = Nx.Defn.jit(&{Nx.sin(&1), Nx.cos(&1)}, compiler: XlaNode.Compiler, node: xla())
      before = buffers()
      s = Backend.scope(fn -> elem(f.(t), 0) end)
      assert %Backend{} = s.data
      assert buffers() == before + 1
      still_held(t)
    end

    test "a tensor freed inside with Nx.backend_deallocate/1 is skipped" do
      t = Nx.iota({4}, type: :f32)
      before = buffers()

      Backend.scope(fn ->
        x = Nx.add(t, 1)
        assert Nx.backend_deallocate(x) == :ok
        :done
      end)

      assert buffers() == before
      still_held(t)
    end
  end

  defmodule Worker do
    @moduledoc "A long-lived process running eager operations on request, as a service would."
    use GenServer

    def start_link(node), do: GenServer.start_link(__MODULE__, node)

    @impl true
    def init(node) do
      Nx.default_backend({XlaNode.Backend, node: node})
      {:ok, Nx.broadcast(Nx.tensor(0.0), {16})}
    end

    # `ops` eager operations in a scope; the state is the one tensor the scope keeps.
    @impl true
    def handle_call({:run, ops}, _from, acc) do
      next =
        XlaNode.Backend.scope(fn ->
          Enum.reduce(1..div(ops, 2), acc, fn i, acc ->
            acc |> Nx.add(i) |> Nx.multiply(0.5)
          end)
        end)

      Nx.backend_deallocate(acc)
      {:reply, :ok, next}
    end

    def handle_call(:read, _from, acc), do: {:reply, Nx.to_flat_list(acc), acc}
  end

  # 20-70 s on a shared 2-core machine, as loaded (bench/run.sh nx times the same loop).
  @ops 100_000

  @tag timeout: 300_000
  test "#{@ops} eager operations in one long-lived process, in scopes, leave the node's buffers where they were" do
    {:ok, worker} = Worker.start_link(xla())
    before = buffers()

    for _ <- 1..div(@ops, 1_000) do
      :ok = GenServer.call(worker, {:run, 1_000}, 60_000)
      assert buffers_come_to?(before), "#{buffers()} buffers, #{before} before"
    end

    [value | _] = GenServer.call(worker, :read)
    # acc -> (acc + i) / 2 over i = 1..500, repeated: it settles just under 500.
    assert_in_delta value, 499.0, 0.01
    assert buffers_come_to?(before), "#{buffers()} buffers, #{before} before"
    GenServer.stop(worker)
  end

  test "an operation is compiled once per node, types and shapes" do
    t = Nx.iota({5}, type: :f32)
    {t6, t64} = {Nx.iota({6}, type: :f32), Nx.iota({5}, type: :f64)}
    Nx.exp(t)
    c0 = compiles()

    for _ <- 1..20, do: Nx.exp(t)
    # Names label results only.
    Nx.exp(Nx.rename(t, [:x]))
    assert compiles() == c0

    Nx.exp(t6)
    Nx.exp(t64)
    assert compiles() == c0 + 2

    # Reading elements one by one (t[i] is a slice and a squeeze): one slice program, whatever
    # the place.
    assert Enum.map(0..4, &Nx.to_number(t[&1])) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert compiles() == c0 + 4
  end
end
