defmodule XlaNode.OptionsTest do
  @moduledoc """
  Every public function of the library that takes options: an unknown option raises an
  `ArgumentError` that names it and lists the valid ones, a known option with a value of the
  wrong kind raises one that says what it accepts, and neither sends anything.
  """
  use ExUnit.Case, async: true

  alias XlaNode.CallbackServer
  alias XlaNode.MLIR, as: M

  # The server argument: this process, so that a request sent by mistake would show up in the
  # mailbox (and a GenServer.call to oneself would exit).
  @tensor {<<0::32>>, {{:f, 32}, [1]}}
  @run [
    :callback_server,
    :callback_timeout,
    :device,
    :keep_on_device,
    :owner,
    :priority,
    :queue_timeout,
    :telemetry_metadata,
    :timeout,
    :wait
  ]

  # {name in the message, fun of the options, the valid options}
  defp functions do
    s = self()
    exe = make_ref()

    [
      {"XlaNode.compile/3", &XlaNode.compile(s, "m", &1),
       [:devices, :telemetry_metadata, :timeout]},
      {"XlaNode.compile/3", &XlaNode.compile!(s, "m", &1),
       [:devices, :telemetry_metadata, :timeout]},
      {"XlaNode.run/4", &XlaNode.run(s, exe, [@tensor], &1), @run},
      {"XlaNode.run/4", &XlaNode.run!(s, exe, [@tensor], &1), @run},
      {"XlaNode.to_device/3", &XlaNode.to_device(s, @tensor, &1), [:device, :owner, :timeout]},
      {"XlaNode.to_device/3", &XlaNode.to_device!(s, @tensor, &1), [:device, :owner, :timeout]},
      {"XlaNode.give_away/4", &XlaNode.give_away(s, exe, s, &1), [:timeout]},
      {"XlaNode.share/4", &XlaNode.share(s, [exe], s, &1), [:timeout]},
      {"XlaNode.release/3", &XlaNode.release!(s, exe, &1), [:timeout]},
      {"XlaNode.read/3", &XlaNode.read(s, exe, &1), [:timeout]},
      {"XlaNode.read/3", &XlaNode.read!(s, exe, &1), [:timeout]},
      {"XlaNode.free/3", &XlaNode.free(s, exe, &1), [:timeout]},
      {"XlaNode.free/3", &XlaNode.free!(s, exe, &1), [:timeout]},
      {"XlaNode.ping/2", &XlaNode.ping(s, &1), [:timeout]},
      {"XlaNode.info/2", &XlaNode.info(s, &1), [:timeout]},
      {"XlaNode.load_kernel/5", &XlaNode.load_kernel(s, "t", "k.so", "S", &1),
       [:timeout, :version_shim]},
      {"XlaNode.load_kernel/5", &XlaNode.load_kernel!(s, "t", "k.so", "S", &1),
       [:timeout, :version_shim]},
      {"XlaNode.CallbackServer.start_link/2", &CallbackServer.start_link(%{}, &1),
       [:debug, :hibernate_after, :name, :outfeed, :spawn_opt]},
      {"XlaNode.CallbackServer.start/2", &CallbackServer.start(%{}, &1),
       [:debug, :hibernate_after, :name, :outfeed, :spawn_opt]},
      {"XlaNode.CallbackServer.child_spec/1", &CallbackServer.child_spec({%{}, &1}),
       [:debug, :hibernate_after, :name, :outfeed, :spawn_opt]},
      {"XlaNode.MLIR.function/4", &M.function("main", [], fn [] -> [] end, &1),
       [:arg_attributes, :private]},
      {"XlaNode.MLIR.module/2", &M.module(fn -> :ok end, &1), [:attributes]},
      {"XlaNode.MLIR.dot_general/3", &M.dot_general(nil, nil, &1),
       [:batch, :contracting, :precision]},
      {"XlaNode.MLIR.sort/4", &M.sort(nil, 0, nil, &1), [:stable]},
      {"XlaNode.MLIR.gather/4", &M.gather(nil, nil, [], &1),
       [
         :collapsed_slice_dims,
         :index_vector_dim,
         :indices_are_sorted,
         :offset_dims,
         :operand_batching_dims,
         :start_index_map,
         :start_indices_batching_dims
       ]},
      {"XlaNode.MLIR.scatter/5", &M.scatter(nil, nil, nil, nil, &1),
       [
         :index_vector_dim,
         :indices_are_sorted,
         :input_batching_dims,
         :inserted_window_dims,
         :scatter_dims_to_operand_dims,
         :scatter_indices_batching_dims,
         :unique_indices,
         :update_window_dims
       ]},
      {"XlaNode.MLIR.reduce_window/5", &M.reduce_window(nil, nil, [], nil, &1),
       [:base_dilations, :padding, :strides, :window_dilations]},
      {"XlaNode.MLIR.select_and_scatter/7",
       &M.select_and_scatter(nil, nil, nil, [], nil, nil, &1), [:padding, :strides]},
      {"XlaNode.MLIR.convolution/3", &M.convolution(nil, nil, &1),
       [
         :batch_group_count,
         :feature_group_count,
         :input,
         :kernel,
         :lhs_dilation,
         :output,
         :padding,
         :precision,
         :rhs_dilation,
         :strides
       ]},
      {"XlaNode.MLIR.triangular_solve/3", &M.triangular_solve(nil, nil, &1),
       [:left_side, :lower, :transpose_a, :unit_diagonal]},
      {"XlaNode.MLIR.custom_call/4", &M.custom_call("t", [], [], &1),
       [:backend_config, :has_side_effect, :output_operand_aliases]}
    ]
  end

  test "an unknown option raises ArgumentError naming it and listing the valid ones" do
    for {name, fun, valid} <- functions() do
      error = assert_raise ArgumentError, fn -> fun.(keep_on_devise: true) end

      assert error.message ==
               "#{name}: unknown option :keep_on_devise" <>
                 if(:keep_on_device in valid, do: " (did you mean :keep_on_device?)", else: "") <>
                 "; valid options: #{Enum.map_join(valid, ", ", &inspect/1)}"
    end

    refute_received _
  end

  test "options that are not a keyword list raise ArgumentError" do
    for {name, fun, _valid} <- functions(),
        opts <- [[:timeout], [{"timeout", 1}], %{timeout: 1}] do
      error = assert_raise ArgumentError, fn -> fun.(opts) end
      assert error.message =~ "#{name}: options must be a keyword list, got: "
    end
  end

  test "a known option with a value of the wrong kind raises ArgumentError saying what it takes" do
    s = self()
    exe = make_ref()

    for {call, message} <- [
          {fn -> XlaNode.compile(s, "m", timeout: -1) end,
           "XlaNode.compile/3: option :timeout must be a non-negative integer (milliseconds) or :infinity, got: -1"},
          {fn -> XlaNode.run(s, exe, [], keep_on_device: :yes) end,
           "XlaNode.run/4: option :keep_on_device must be a boolean or a list of distinct non-negative integers (result indices), got: :yes"},
          {fn -> XlaNode.run(s, exe, [], keep_on_device: [0, 2, 0]) end,
           "XlaNode.run/4: option :keep_on_device must be a boolean or a list of distinct non-negative integers (result indices), got: [0, 2, 0]"},
          {fn -> XlaNode.run(s, exe, [], wait: 1) end,
           "XlaNode.run/4: option :wait must be a boolean, got: 1"},
          {fn -> XlaNode.run(s, exe, [], callback_server: "cb") end,
           "XlaNode.run/4: option :callback_server must be a pid, a registered name (an atom) or {name, node}, got: \"cb\""},
          {fn -> XlaNode.run(s, exe, [], callback_server: nil) end,
           "option :callback_server must be a pid"},
          {fn -> XlaNode.run(s, exe, [], callback_timeout: 0) end,
           "XlaNode.run/4: option :callback_timeout must be a positive integer (milliseconds) or :infinity, got: 0"},
          {fn -> XlaNode.run(s, exe, [], queue_timeout: :soon) end,
           "option :queue_timeout must be a non-negative integer (milliseconds) or :infinity, got: :soon"},
          {fn -> XlaNode.run(s, exe, [], priority: :urgent) end,
           "XlaNode.run/4: option :priority must be one of :high, :normal, :low, got: :urgent"},
          {fn -> XlaNode.run!(s, exe, [], timeout: 1.5) end, "option :timeout must be"},
          {fn -> XlaNode.run(s, exe, [], telemetry_metadata: [key: 1]) end,
           "XlaNode.run/4: option :telemetry_metadata must be a map, got: [key: 1]"},
          {fn -> XlaNode.compile(s, "m", telemetry_metadata: nil) end,
           "XlaNode.compile/3: option :telemetry_metadata must be a map, got: nil"},
          {fn -> XlaNode.to_device(s, @tensor, timeout: nil) end,
           "XlaNode.to_device/3: option :timeout"},
          {fn -> XlaNode.to_device(s, @tensor, owner: :me) end,
           "XlaNode.to_device/3: option :owner must be a pid, got: :me"},
          {fn -> XlaNode.run(s, exe, [], owner: {:keeper, node()}) end,
           "XlaNode.run/4: option :owner must be a pid, got: "},
          {fn -> XlaNode.give_away(s, [exe, :buffer], s) end,
           "XlaNode.give_away/4 takes the references of a node's executables and buffers, got: :buffer"},
          {fn -> XlaNode.read(s, exe, timeout: "1") end, "XlaNode.read/3: option :timeout"},
          {fn -> XlaNode.free(s, exe, timeout: -5) end, "XlaNode.free/3: option :timeout"},
          {fn -> XlaNode.ping(s, timeout: :never) end, "XlaNode.ping/2: option :timeout"},
          {fn -> XlaNode.info(s, timeout: :never) end, "XlaNode.info/2: option :timeout"},
          {fn -> XlaNode.load_kernel(s, "t", "k.so", "S", version_shim: 1) end,
           "XlaNode.load_kernel/5: option :version_shim must be a boolean, got: 1"},
          {fn -> CallbackServer.start_link(%{}, name: "cb") end,
           "XlaNode.CallbackServer.start_link/2: option :name must be an atom, {:global, term} or {:via, module, term}, got: \"cb\""},
          {fn -> CallbackServer.start(%{}, outfeed: fn -> :ok end) end,
           "XlaNode.CallbackServer.start/2: option :outfeed must be a pid, a registered name (an atom), {name, node}, a function of one argument or nil"},
          {fn -> CallbackServer.child_spec({%{}, hibernate_after: :later}) end,
           "XlaNode.CallbackServer.child_spec/1: option :hibernate_after must be"},
          {fn -> M.dot_general(nil, nil, precision: :max) end,
           "XlaNode.MLIR.dot_general/3: option :precision must be one of :default, :high, :highest, got: :max"},
          {fn -> M.dot_general(nil, nil, contracting: {1, 0}) end,
           "option :contracting must be {lhs_dims, rhs_dims}, two lists of integers"},
          {fn -> M.sort(nil, 0, nil, stable: 1) end,
           "XlaNode.MLIR.sort/4: option :stable must be a boolean"},
          {fn -> M.gather(nil, nil, [], index_vector_dim: -1) end,
           "option :index_vector_dim must be a non-negative integer"},
          {fn -> M.reduce_window(nil, nil, [], nil, padding: [1, 1]) end,
           "option :padding must be a list of {integer, integer}"},
          {fn -> M.convolution(nil, nil, feature_group_count: 0) end,
           "option :feature_group_count must be a positive integer"},
          {fn -> M.convolution(nil, nil, input: {0, 1}) end,
           "option :input must be {dimension, dimension, [dimension]}, integers"},
          {fn -> M.triangular_solve(nil, nil, transpose_a: true) end,
           "option :transpose_a must be one of :no_transpose, :transpose, :adjoint"},
          {fn -> M.custom_call("t", [], [], backend_config: [n: 2]) end,
           "option :backend_config must be a list of {name, attribute text}, got: [n: 2]"},
          {fn -> M.custom_call("t", [], [], output_operand_aliases: [0]) end,
           "option :output_operand_aliases must be a list of {integer, integer}"}
        ] do
      error = assert_raise ArgumentError, call
      assert error.message =~ message
    end

    refute_received _
  end

  test "valid options are taken" do
    name = :"options_test_#{System.unique_integer([:positive])}"

    assert {:ok, pid} =
             CallbackServer.start_link(%{},
               name: {:global, name},
               outfeed: {name, node()},
               debug: [],
               spawn_opt: [],
               hibernate_after: 1_000
             )

    assert :global.whereis_name(name) == pid
    assert {:ok, _} = CallbackServer.start(%{}, outfeed: nil)

    text =
      M.module(fn ->
        M.function("main", [{{:f, 32}, [2, 2]}], fn [x] ->
          M.dot_general(x, x, contracting: {[1], [0]}, batch: {[], []}, precision: :highest)
        end)
      end)

    assert text =~ "precision HIGHEST"
  end
end
