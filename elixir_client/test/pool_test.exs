defmodule XlaNode.PoolTest do
  @moduledoc """
  `XlaNode.Pool` where no compute node is needed: options, bad input, the effects read from a
  module, the callback relay. Runs against real nodes are in ../integration/test/pool_test.exs.
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Error, Pool}
  alias XlaNode.MLIR, as: M
  alias XlaNode.Pool.{Effects, Executable, Relay}

  doctest XlaNode.Pool.Effects
  doctest XlaNode.Pool

  @add_one """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %r = stablehlo.add %x, %one : tensor<4xf32>
    return %r : tensor<4xf32>
  }
  """

  defp f32x4, do: XlaNode.Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32})

  defp start_pool!(opts) do
    start_supervised!({Pool, opts})
  end

  describe "starting" do
    test "unknown options raise, listing the valid ones" do
      error = assert_raise ArgumentError, fn -> Pool.start_link(nodes: [], max_attemps: 2) end

      assert error.message =~ "[:max_attemps]"
      assert error.message =~ ":max_attempts"
      assert error.message =~ ":reconnect_backoff"
    end

    test "bad option values raise" do
      assert_raise ArgumentError, ~r/needs nodes/, fn -> Pool.start_link([]) end
      assert_raise ArgumentError, ~r/node name/, fn -> Pool.start_link(nodes: [:no_host]) end
      assert_raise ArgumentError, ~r/node name/, fn -> Pool.start_link(nodes: ["xla@host"]) end

      assert_raise ArgumentError, ~r/max_attempts/, fn ->
        Pool.start_link(nodes: [], max_attempts: 0)
      end

      assert_raise ArgumentError, ~r/:name/, fn -> Pool.start_link(nodes: [], name: :a@b) end

      assert_raise ArgumentError, ~r/reconnect_backoff/, fn ->
        Pool.start_link(nodes: [], reconnect_backoff: {10, 1})
      end
    end

    test "child_spec/1 takes its id from the name" do
      assert %{id: MyPool, start: {Pool, :start_link, [[name: MyPool, nodes: []]]}} =
               Pool.child_spec(name: MyPool, nodes: [])
    end

    test "a pool is known by its name and its pid while it runs" do
      name = :"pool_#{System.unique_integer([:positive])}"
      pid = start_pool!(name: name, nodes: [])
      assert %{pool: ^name, nodes: []} = Pool.status(name)
      assert %{pool: ^name} = Pool.status(pid)
      assert Pool.pool?(name) and Pool.pool?(pid)
      refute Pool.pool?(:xla@host) or Pool.pool?(self()) or Pool.pool?(NoSuchPool)
      assert Pool.nodes(name) == []
      :ok = Pool.add_node(name, :xla_a@nowhere)
      assert Pool.nodes(name) == [:xla_a@nowhere]
      :ok = Pool.remove_node(name, :xla_a@nowhere)
      assert Pool.nodes(name) == []

      :ok = stop_supervised(name)
      assert_raise Error, ~r/no pool named/, fn -> Pool.status(name) end

      assert {:error, %Error{kind: :noproc}} = XlaNode.compile(name, @add_one)
    end
  end

  describe "bad input" do
    test "an unknown pool is an error, not a call to a node" do
      assert {:error, %Error{kind: :noproc, message: message}} =
               XlaNode.compile(NoSuchPool, @add_one)

      assert message =~ "NoSuchPool"
      assert {:error, %Error{kind: :noproc}} = XlaNode.run(NoSuchPool, make_ref(), [f32x4()])
      assert_raise Error, ~r/NoSuchPool/, fn -> Pool.status(NoSuchPool) end
      assert_raise Error, fn -> XlaNode.run!(NoSuchPool, make_ref(), []) end
    end

    test "an empty pool answers :no_nodes" do
      pool = start_pool!(nodes: [])

      assert {:error, %Error{kind: :no_nodes, reason: :no_nodes}} =
               XlaNode.compile(pool, @add_one)

      assert {:error, %Error{reason: :no_nodes}} = XlaNode.to_device(pool, f32x4())
      assert {:error, %Error{reason: :no_nodes}} = XlaNode.info(pool)
      assert {:error, %Error{reason: :no_nodes}} = XlaNode.ping(pool)
    end

    test "no node up: the error names every node and where it stands" do
      # This test VM is not distributed: the pool cannot connect.
      nodes = [:xla_a@nowhere, :xla_b@nowhere]
      pool = start_pool!(nodes: nodes)

      assert {:error, %Error{kind: :nodedown, reason: {:nodes_down, ^nodes}, message: message}} =
               XlaNode.compile(pool, @add_one)

      assert message =~ "xla_a@nowhere ("
      assert message =~ "xla_b@nowhere ("

      assert %{nodes: [%{node: :xla_a@nowhere, status: status}, _]} = Pool.status(pool)
      assert status in [:connecting, :down]
    end

    test "an executable from another pool, from a node, or no executable at all" do
      pool = start_pool!(nodes: [])
      other = %Executable{pool: OtherPool, pool_ref: make_ref(), id: 1, effects: :pure}

      assert {:error, %Error{kind: :argument_error, message: message}} =
               XlaNode.run(pool, other, [f32x4()])

      assert message =~ "OtherPool"
      assert {:error, %Error{kind: :argument_error}} = XlaNode.free(pool, other)

      assert {:error, %Error{kind: :argument_error, message: message}} =
               XlaNode.run(pool, make_ref(), [f32x4()])

      assert message =~ "compiled through the pool"

      assert {:error, %Error{kind: :argument_error}} = XlaNode.run(pool, :exe, [f32x4()])
    end

    test "a pool's executable given to a node is refused before anything is sent" do
      handle = %Executable{pool: SomePool, pool_ref: make_ref(), id: 3, effects: :pure}

      assert {:error, %Error{kind: :argument_error, message: message}} =
               XlaNode.run(:xla@nowhere, handle, [f32x4()])

      assert message =~ "SomePool"
      assert {:error, %Error{kind: :argument_error}} = XlaNode.free(:xla@nowhere, handle)
    end

    test "unknown run options raise, listing the valid ones" do
      pool = start_pool!(nodes: [])
      handle = %Executable{pool: pool, pool_ref: make_ref(), id: 1, effects: :pure}

      error = assert_raise ArgumentError, fn -> XlaNode.run(pool, handle, [], retries: 2) end
      assert error.message =~ ":retries"

      # Those of a pool only with a pool.
      assert_raise ArgumentError, ~r/unknown option :retry/, fn ->
        XlaNode.run(:xla@nowhere, make_ref(), [], retry: false)
      end

      assert error.message =~ ":max_attempts"
    end

    test "a buffer of a node outside the pool" do
      pool = start_pool!(nodes: [:xla_a@nowhere])

      assert {:error, %Error{kind: :argument_error, message: message}} =
               XlaNode.read(pool, make_ref())

      assert message =~ "not a node of the pool"
    end

    test "requests a pool does not serve" do
      pool = start_pool!(nodes: [])
      assert {:error, %Error{kind: :argument_error}} = XlaNode.load_kernel(pool, "t", "l.so", "S")
    end
  end

  describe "effects" do
    test "pure programs, runtime calls, io calls, streams and marked custom calls" do
      assert Effects.of(@add_one) == :pure

      program = fn body ->
        M.module(fn -> M.function("main", [{{:u, 8}, [8]}, {{:f, 32}, [4]}], body) end)
      end

      assert Effects.of(program.(fn [cb, x] -> M.runtime_call(cb, :double, [x], [x.type]) end)) ==
               :callbacks

      assert {:side_effects, "io_call" <> _} =
               Effects.of(program.(fn [cb, x] -> M.io_call(cb, :log, [x]) end))

      assert {:side_effects, "custom call @exla_beam_outfeed"} =
               Effects.of(program.(fn [cb, x] -> [M.outfeed(cb, [x]), x] end))

      assert {:side_effects, "custom call @exla_beam_infeed"} =
               Effects.of(program.(fn [cb, _x] -> M.infeed(cb, [{{:f, 32}, [4]}]) end))

      assert {:side_effects, "custom call @my_log (has_side_effect = true)"} =
               Effects.of(
                 program.(fn [_cb, x] ->
                   M.custom_call("my_log", [x], [x.type], has_side_effect: true)
                 end)
               )

      assert Effects.of(program.(fn [_cb, x] -> M.custom_call("my_softplus", [x], [x.type]) end)) ==
               :pure
    end

    test "the pretty form, over several lines" do
      text = """
      %0 = stablehlo.custom_call @exla_runtime_callback(%cb, %x) {
        api_version = 4 : i32,
        has_side_effect = true,
        backend_config = {callback_id = array<i64: 1>, num_aliased_data_outputs = 1 : ui64}
      } : (tensor<8xui8>, tensor<4xf32>) -> tensor<4xf32>
      %1 = stablehlo.custom_call @other(%0) : (tensor<4xf32>) -> tensor<4xf32>
      """

      assert {:side_effects, "io_call" <> _} = Effects.of(text)
      assert {:side_effects, "stablehlo.outfeed"} = Effects.of("stablehlo.outfeed")
    end

    test "bytecode naming a callback target counts as side effects" do
      assert Effects.of(<<"ML", 0xEF, "R", 0, "nothing here">>) == :pure

      assert {:side_effects, _} = Effects.of(<<"ML", 0xEF, "R", 0, "exla_runtime_callback">>)
    end
  end

  describe "relay" do
    test "forwards callback requests and says whether one fired" do
      relay = Relay.start(self())
      refute Relay.close(relay)

      relay = Relay.start(self())
      send(relay, {:exla_runtime_call, :id, [], {self(), :tag}})
      assert_receive {:exla_runtime_call, :id, [], {_, :tag}}
      assert Relay.close(relay)
      refute Process.alive?(relay)
    end

    test "requests that arrive after the close are dropped" do
      relay = Relay.start(self())
      refute Relay.close(relay)
      send(relay, {:exla_runtime_call, :late, [], {self(), :tag}})
      refute_receive {:exla_runtime_call, :late, _, _}, 50
    end

    test "a callback server that goes down ends the relay with a reason naming it" do
      {:ok, target} = Agent.start(fn -> nil end)
      relay = Relay.start(target)
      ref = Process.monitor(relay)
      Agent.stop(target)
      # :noproc when the server was gone before the relay could watch it.
      assert_receive {:DOWN, ^ref, :process, ^relay, {:callback_server_down, ^target, reason}}
      assert reason in [:normal, :noproc]
    end

    test "it ends with its caller" do
      test = self()

      caller =
        spawn(fn ->
          send(test, {:relay, Relay.start(test)})
          receive do: (:stop -> :ok)
        end)

      assert_receive {:relay, relay}
      ref = Process.monitor(relay)
      send(caller, :stop)
      assert_receive {:DOWN, ^ref, :process, ^relay, :normal}
    end
  end
end
