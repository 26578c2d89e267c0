defmodule XlaNode.NxPriorityTest do
  @moduledoc """
  `priority:` through `XlaNode.Compiler` and `XlaNode.Backend`: with every place this node's
  runs that call back may take held (raw runs this test answers one at a time), jitted
  functions whose `Nx.runtime_call` makes their runs call back queue on the node, and the
  `:high` ones go before the `:low` ones. A node of its own: holding its places would stall the
  other tests.
  """
  use ExUnit.Case, async: false

  import Nx.Defn

  # Places the node gives the runs that call back of one client node with runs in flight: 24,
  # less the 2 it leaves to nodes with none.
  @calling_back_places 22

  setup_all do
    node = XlaNode.NxTest.Node.start!("xla_nx_priority_#{System.pid()}")
    on_exit(fn -> XlaNode.NxTest.Node.stop(node) end)
    %{node: node.name}
  end

  defn tagged(x, tag) do
    Nx.runtime_call(x, {x, tag}, [], &report/2)
  end

  # Runs on this node, in the compiler's callback server, when the run calls back: tells the
  # test which run it is.
  def report({x, tag}, _opts) do
    send(:priority_test, {:called, Nx.to_number(tag)})
    x
  end

  defp holding_program do
    XlaNode.MLIR.module(fn ->
      XlaNode.MLIR.function("main", [{{:u, 8}, [8]}, {{:f, 32}, [4]}], fn [cb, x] ->
        XlaNode.MLIR.runtime_call(cb, :hold, [x], [{{:f, 32}, [4]}])
      end)
    end)
  end

  defp queued(node) do
    {:ok, %{tenants: tenants}} = XlaNode.info(node)
    get_in(tenants, [node(), :runs_queued]) || 0
  end

  test "with the node saturated, :high jitted runs overtake :low ones", %{node: node} do
    Process.register(self(), :priority_test)
    exe = XlaNode.compile!(node, holding_program())
    x = XlaNode.Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32})

    holders =
      for _ <- 1..@calling_back_places do
        Task.async(fn -> XlaNode.run(node, exe, [x], callback_server: :priority_test) end)
      end

    held =
      for _ <- 1..@calling_back_places do
        assert_receive {:exla_runtime_call, _id, [{bin, _}], from}, 10_000
        {from, bin}
      end

    jit = fn priority ->
      Nx.Defn.jit(&tagged/2, compiler: XlaNode.Compiler, node: node, priority: priority)
    end

    t = Nx.tensor([1.0, 2.0])

    runs =
      for {priority, tags} <- [low: 1..3, high: 11..13], tag <- tags do
        run = Task.async(fn -> jit.(priority).(t, tag) end)
        # One after another, so that each priority's runs queue in order.
        assert Enum.any?(1..500, fn _ ->
                 queued(node) >= tag_count(tag) || (Process.sleep(10) && false)
               end)

        run
      end

    # One place frees: the queued runs go through it one after another, in priority order.
    [{{pid, ref}, bin} | rest] = held
    send(pid, {ref, {:ok, [bin]}})

    order =
      for _ <- 1..6 do
        assert_receive {:called, tag}, 10_000
        tag
      end

    assert order == [11, 12, 13, 1, 2, 3]

    for {{pid, ref}, bin} <- rest, do: send(pid, {ref, {:ok, [bin]}})
    for task <- holders, do: assert({:ok, [_]} = Task.await(task, 10_000))
    for run <- runs, do: assert(Nx.to_flat_list(Task.await(run, 10_000)) == [1.0, 2.0])
  end

  test "the backend's eager operations run at the priority of its options", %{node: node} do
    t = Nx.tensor([1.0, 2.0], backend: {XlaNode.Backend, node: node})

    previous = Nx.default_backend({XlaNode.Backend, node: node, priority: :low})

    try do
      assert Nx.to_flat_list(Nx.multiply(t, t)) == [1.0, 4.0]
      # The option reaches each run the backend sends: a value the node does not take is
      # refused there, naming the option.
      Nx.default_backend({XlaNode.Backend, node: node, priority: :urgent})

      assert_raise ArgumentError, ~r/option :priority must be one of :high, :normal, :low/, fn ->
        Nx.multiply(t, t)
      end
    after
      Nx.default_backend(previous)
    end
  end

  # How many runs are queued once the run tagged `tag` is.
  defp tag_count(tag) when tag < 10, do: tag
  defp tag_count(tag), do: 3 + tag - 10
end
