defmodule XlaNode.PlatformTest do
  @moduledoc """
  The node on a platform it has no host-callback handler for, and the plugin's create options.

  The other platform is a real PJRT plugin: `integration/kernels/renamed_platform_plugin.c`
  (built by `scripts/kernels.sh`) is the CPU plugin under the platform name `xn_renamed`. The
  node starts on it with `host_callbacks: false` and one log line saying why, computes as on any
  platform (through the paths it takes off the CPU: results read back through PJRT), and
  refuses a program that calls back with a compile error saying to split it. The create options
  are checked against the CPU plugin's own (`cpu_device_count`), and the errors a bad value or
  a value the plugin refuses gives.
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, Tensor}

  # The other platform wraps the CPU plugin, and the options are the CPU plugin's.
  @moduletag :cpu_only

  @root Path.expand("../..", __DIR__)
  @renamed Path.join(@root, "target/kernels/libxn_renamed_platform_plugin.so")

  @add_one """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %y = stablehlo.add %x, %one : tensor<4xf32>
    return %y : tensor<4xf32>
  }
  """

  @calls_back """
  func.func @main(%h: tensor<8xui8>, %x: tensor<4xf32>) -> tensor<4xf32> {
    %y = stablehlo.custom_call @exla_runtime_callback(%h, %x) {api_version = 4 : i32, has_side_effect = true, backend_config = {callback_id = array<i64: 0>, callback_id_size = 1 : ui64, num_aliased_data_outputs = 0 : ui64}} : (tensor<8xui8>, tensor<4xf32>) -> tensor<4xf32>
    return %y : tensor<4xf32>
  }
  """

  setup_all do
    Harness.ensure_kernels!()
  end

  defp call(node, request), do: GenServer.call({:xla, node.name}, request, 30_000)

  defp f32(list), do: Tensor.from_list(list, {:f, 32})

  # Starts a node binary that is expected to stop during start-up; returns its exit status and
  # its output.
  defp start_failing(args) do
    name = Harness.unique_name("xla_pfail")

    {out, status} =
      System.cmd(
        "timeout",
        ["30", Harness.bin_path(), "--sname", name, "--cookie", "#{Harness.cookie()}"] ++ args,
        stderr_to_stdout: true,
        env: [{"XLA_NODE_LOG", "warn"}]
      )

    {status, out}
  end

  describe "a platform without host-callback handlers" do
    setup do
      log = Path.join(System.tmp_dir!(), "#{Harness.unique_name("renamed")}.log")
      on_exit(fn -> File.rm(log) end)

      node =
        Harness.start_node(
          pjrt_plugin: @renamed,
          env: [{"XLA_NODE_WRAPPED_PJRT_PLUGIN", Harness.plugin_path()}],
          stderr_file: log
        )

      %{node: node, log: log}
    end

    test "the node starts, says why callbacks are off once, and reports it in :info", %{node: node, log: log} do
      assert {:ok, info} = call(node, :info)
      assert %{platform: "xn_renamed", host_callbacks: false, devices: [_ | _] = devices} = info
      assert length(info.device_info) == length(devices)

      lines = log |> File.read!() |> String.split("\n") |> Enum.filter(&(&1 =~ "host callbacks off"))
      assert [line] = lines
      assert line =~ ~s(the node has no host-callback handler for platform "xn_renamed")
    end

    test "programs compile and run, results come back and stay on the device", %{node: node} do
      assert {:ok, exe} = call(node, {:compile, @add_one})
      assert {:ok, [y]} = call(node, {:run, exe, [f32([1, 2, 3, 4])]})
      assert Tensor.to_list(y) == [2.0, 3.0, 4.0, 5.0]

      assert {:ok, [ref]} = call(node, {:run, exe, [f32([1, 2, 3, 4])], [keep_on_device: true]})
      assert {:ok, [again]} = call(node, {:run, exe, [ref]})
      assert Tensor.to_list(again) == [3.0, 4.0, 5.0, 6.0]
      assert {:ok, read} = call(node, {:read, ref})
      assert Tensor.to_list(read) == [2.0, 3.0, 4.0, 5.0]
    end

    test "a program that calls back is a compile error that says to split it", %{node: node} do
      assert {:error, {:compile_error, message}} = call(node, {:compile, @calls_back})
      assert message =~ "No FFI handler registered for exla_runtime_callback"
      assert message =~ "This node runs no host callbacks"
      assert message =~ "split the program at its callbacks"
      assert :pong = call(node, :ping)
    end
  end

  describe "create options" do
    test "a plugin option of the CPU plugin takes effect (--pjrt-option)" do
      node = Harness.start_node(args: ["--pjrt-option", "cpu_device_count=2"])
      assert {:ok, %{devices: ["cpu:0", "cpu:1"], device_info: [d0, d1]}} = call(node, :info)
      assert %{id: 0, kind: "cpu", bytes_in_use: nil, bytes_limit: nil} = d0
      assert %{id: 1, kind: "cpu"} = d1
    end

    test "the CPU plugin reports no device memory: :info says nil, /metrics leaves it out" do
      node = Harness.start_node()
      assert {:ok, %{device_info: [_ | _] = devices}} = call(node, :info)
      assert Enum.all?(devices, &(&1.bytes_in_use == nil and &1.peak_bytes_in_use == nil))
    end

    test "a value of the wrong type stops start-up naming the option" do
      {status, out} = start_failing(["--pjrt-option", "cpu_device_count:string=two"])
      assert status != 0
      assert out =~ ~s(PJRT_Client_Create with options cpu_device_count="two")
    end

    test "malformed options stop start-up before anything else, saying what is wrong" do
      for {args, expected} <- [
            {["--pjrt-option", "cpu_device_count"], "is not KEY=VALUE"},
            {["--pjrt-option", "n:uint=1"], ~s(unknown type "uint")},
            {["--memory-fraction", "1.5"], "is not a fraction in (0, 1]"},
            {["--visible-devices", "0,x"], "is not a list of device ids"},
            {["--preallocate", "maybe"], "invalid value 'maybe'"},
            {["--preallocate", "false", "--pjrt-option", "preallocate=true"], "the plugin option preallocate is given twice"}
          ] do
        {status, out} = start_failing(args)
        assert status != 0, "#{inspect(args)} started"
        assert out =~ expected, "#{inspect(args)}: #{out}"
      end
    end
  end
end
