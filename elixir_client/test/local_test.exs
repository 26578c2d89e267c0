defmodule XlaNode.LocalTest do
  @moduledoc """
  `XlaNode.Local`, the launchers and a pool's on-demand options where no node is started: every
  bad option is an `ArgumentError` naming it, the node's flags as the options write them, and
  what a VM that is not distributed gets (this suite's VM is not). Nodes started for real:
  ../integration/test/local_test.exs, pool_launcher_test.exs, ssh_launcher_test.exs.
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Error, Options, Pool}
  alias XlaNode.Launcher.{Flags, SSH}

  @add_one """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %r = stablehlo.add %x, %one : tensor<4xf32>
    return %r : tensor<4xf32>
  }
  """

  # {option, a value of the wrong kind}: the node's flags, shared by every launcher.
  @bad_flags [
    visible_devices: [],
    visible_devices: [-1],
    memory_fraction: 1.5,
    memory_fraction: 0,
    preallocate: "no",
    max_device_bytes: "8T",
    max_device_bytes: 0,
    max_message_bytes: "lots",
    max_executables: 0,
    pjrt_options: [cpu_device_count: :two],
    pjrt_options: "cpu_device_count=2",
    callback_timeout: -1,
    queue_timeout: 1.5,
    callback_spin_us: :fast,
    busy_wait_us: -5,
    kernels: [{"t", "/lib.so"}],
    kernels: ["no-symbol"],
    kernel_dirs: "/dir",
    kernel_version_shim: "all",
    metrics_addr: 9464,
    net_ticktime: 0,
    inet_dist_listen_min: 70_000,
    inet_dist_listen_max: -1,
    inet_dist_use_interface: "not an address",
    proto_dist: :tls,
    ssl_dist_optfile: "",
    log: :info,
    callback_trace: 1,
    env: [{"XLA", 1}],
    args: "--flag"
  ]

  describe "XlaNode.Local's options" do
    test "an unknown option raises, naming it and listing the valid ones" do
      error = assert_raise ArgumentError, fn -> XlaNode.Local.start_link(plugn: :cpu) end
      assert error.message =~ "XlaNode.Local.start_link/1: unknown option :plugn"
      assert error.message =~ "did you mean :plugin?"
      assert error.message =~ ":memory_fraction"
    end

    test "each option of the wrong kind raises, naming it" do
      own = [
        name: :xla@host,
        name: "xla",
        bin: 42,
        plugin: :tpu,
        plugin: "",
        distribution: :maybe,
        start_timeout: 0,
        stop_timeout: -1
      ]

      for {key, value} <- own ++ @bad_flags do
        error = assert_raise ArgumentError, fn -> XlaNode.Local.start_link([{key, value}]) end

        assert error.message =~ "option #{inspect(key)} must be", inspect({key, value})
      end
    end

    test "a child spec per name, with time for the node's graceful stop" do
      assert %{id: {XlaNode.Local, :xla}, start: {XlaNode.Local, :start_link, [[name: :xla]]}} =
               XlaNode.Local.child_spec(name: :xla)

      assert %{shutdown: 12_000} = XlaNode.Local.child_spec(name: :xla)
      assert %{shutdown: 32_000} = XlaNode.Local.child_spec(stop_timeout: 30_000)
    end

    @tag :not_distributed
    test "a VM that is not distributed gets an error saying how to start it" do
      if Node.alive?() do
        IO.puts("skipped: this VM is distributed")
      else
        assert {:error, %Error{kind: :launch_error, message: message}} =
                 XlaNode.Local.start_link(name: :xla_not_distributed)

        assert message =~ "not a distributed node"
        assert message =~ "--sname"
        assert message =~ "distribution: :start"
        refute Process.whereis(:xla_not_distributed)
      end
    end

    test "a name no XlaNode.Local runs under is an unknown server" do
      assert_raise Error, ~r/no XlaNode.Local named :xla_nowhere/, fn ->
        XlaNode.Local.node(:xla_nowhere)
      end

      assert {:error, %Error{kind: :noproc, message: message}} = XlaNode.ping(:xla_nowhere)
      assert message =~ "nor an XlaNode.Local"
    end
  end

  describe "the node's flags" do
    test "each option is its flag, in the flag's unit" do
      opts = [
        visible_devices: [0, 2],
        memory_fraction: 0.5,
        preallocate: false,
        max_device_bytes: "8G",
        max_message_bytes: 1_048_576,
        max_executables: 32,
        callback_timeout: 5,
        queue_timeout: 0,
        callback_spin_us: 0,
        busy_wait_us: 100,
        metrics_addr: "127.0.0.1:0",
        net_ticktime: 10,
        inet_dist_listen_min: 9100,
        inet_dist_listen_max: 9105,
        inet_dist_use_interface: {127, 0, 0, 1},
        proto_dist: :inet_tls,
        ssl_dist_optfile: "/etc/ssl_dist.conf",
        pjrt_options: [cpu_device_count: 2, flag: true, ratio: 0.5, ids: [1], name: "3"],
        kernels: [{"my_kernel", "/k/lib.so", "Handler"}, "other=/k/o.so:Other"],
        kernel_dirs: ["/k"],
        kernel_version_shim: ["my_kernel"],
        args: ["--extra"]
      ]

      opts = Options.validate!(opts, "test", Flags.spec())

      assert Flags.args(opts) == [
               "--visible-devices",
               "0,2",
               "--memory-fraction",
               "0.5",
               "--preallocate",
               "false",
               "--max-device-bytes",
               "8G",
               "--max-message-bytes",
               "1048576",
               "--max-executables",
               "32",
               "--callback-timeout",
               "5",
               "--queue-timeout",
               "0",
               "--callback-spin-us",
               "0",
               "--busy-wait-us",
               "100",
               "--metrics-addr",
               "127.0.0.1:0",
               "--net-ticktime",
               "10",
               "--inet-dist-listen-min",
               "9100",
               "--inet-dist-listen-max",
               "9105",
               "--inet-dist-use-interface",
               "127.0.0.1",
               "--proto-dist",
               "inet_tls",
               "--ssl-dist-optfile",
               "/etc/ssl_dist.conf",
               "--pjrt-option",
               "cpu_device_count:int=2",
               "--pjrt-option",
               "flag:bool=true",
               "--pjrt-option",
               "ratio:float=0.5",
               "--pjrt-option",
               "ids:ints=1",
               "--pjrt-option",
               "name:string=3",
               "--kernel",
               "my_kernel=/k/lib.so:Handler",
               "--kernel",
               "other=/k/o.so:Other",
               "--kernel-dir",
               "/k",
               "--kernel-version-shim=my_kernel",
               "--extra"
             ]

      assert Flags.args(kernel_version_shim: true) == ["--kernel-version-shim"]

      assert Flags.env(log: "warn", callback_trace: true, env: %{"A" => "1", "B" => false}) ==
               [
                 {"XLA_NODE_LOG", "warn"},
                 {"XLA_NODE_CALLBACK_TRACE", "1"},
                 {"A", "1"},
                 {"B", false}
               ]
    end
  end

  describe "the launchers' options" do
    test "XlaNode.Launcher.Local takes XlaNode.Local's, but the name" do
      assert XlaNode.Launcher.Local.validate_options(plugin: :cpu) == [plugin: :cpu]

      error =
        assert_raise ArgumentError, fn -> XlaNode.Launcher.Local.validate_options(name: :x) end

      assert error.message =~ "XlaNode.Launcher.Local: unknown option :name"

      for {key, value} <- @bad_flags do
        error =
          assert_raise ArgumentError, fn ->
            XlaNode.Launcher.Local.validate_options([{key, value}])
          end

        assert error.message =~ "option #{inspect(key)} must be"
      end
    end

    test "XlaNode.Launcher.SSH needs a host and a binary, and checks every option" do
      assert_raise ArgumentError, ~r/needs :host/, fn -> SSH.validate_options(bin: "/b") end
      assert_raise ArgumentError, ~r/needs :bin/, fn -> SSH.validate_options(host: "h") end

      good = [host: "gpu1", bin: "/opt/xla_node"]
      assert SSH.validate_options(good) == good

      own = [
        host: :gpu1,
        bin: "",
        user: 0,
        port: 0,
        port: 70_000,
        key: "/no/such/key",
        known_hosts: "/no/such/file",
        ssh_options: "-v",
        connect_timeout: 0,
        node_host: nil,
        plugin: :tpu,
        start_timeout: 0
      ]

      for {key, value} <- own ++ @bad_flags do
        error = assert_raise ArgumentError, fn -> SSH.validate_options([{key, value} | good]) end

        assert error.message =~ "option #{inspect(key)} must be", inspect({key, value})
      end

      error = assert_raise ArgumentError, fn -> SSH.validate_options([{:hots, "h"} | good]) end
      assert error.message =~ "unknown option :hots (did you mean :host?)"
    end
  end

  describe "a pool's on-demand options" do
    test "each bad one raises, naming it" do
      launcher = {XlaNode.Launcher.Local, []}

      cases = [
        {[launcher: XlaNode.Launcher.Local], ~r/option :launcher must be \{module, options\}/},
        {[launcher: {NotALauncher, []}], ~r/:launcher: NotALauncher is not an XlaNode.Launcher/},
        {[launcher: {XlaNode.Launcher.Local, [memory_fraction: 3]}],
         ~r/option :memory_fraction must be/},
        {[launcher: launcher, min: -1], ~r/option :min must be/},
        {[launcher: launcher, max: 0], ~r/option :max must be/},
        {[launcher: launcher, min: 3, max: 2], ~r/option :min \(3\) is more than :max \(2\)/},
        {[launcher: launcher, idle_shutdown_after: 0], ~r/option :idle_shutdown_after must be/},
        {[launcher: launcher, max_concurrency: 0], ~r/option :max_concurrency must be/},
        {[launcher: launcher, launch_backoff: {5, 1}], ~r/option :launch_backoff must be/},
        {[nodes: [], min: 1], ~r/option :min applies to a pool that starts its nodes/},
        {[nodes: [], idle_shutdown_after: 10], ~r/option :idle_shutdown_after applies/}
      ]

      for {opts, message} <- cases do
        assert_raise ArgumentError, message, fn -> Pool.start_link(opts) end
      end
    end

    test "defaults: max is min or 1" do
      pool = start_supervised!({Pool, launcher: {XlaNode.Launcher.Local, []}, min: 0})

      assert %{
               nodes: [],
               launcher: %{
                 module: XlaNode.Launcher.Local,
                 min: 0,
                 max: 1,
                 idle_shutdown_after: 30_000,
                 max_concurrency: 1,
                 started: 0
               }
             } = Pool.status(pool)
    end

    @tag :not_distributed
    @tag :capture_log
    test "a call that finds no node up and cannot start one gets the launch's error" do
      if Node.alive?() do
        IO.puts("skipped: this VM is distributed")
      else
        pool =
          start_supervised!(
            {Pool, launcher: {XlaNode.Launcher.Local, []}, launch_backoff: {60_000, 60_000}}
          )

        assert {:error, %Error{kind: :launch_error, message: message}} =
                 XlaNode.compile(pool, @add_one)

        assert message =~ "starting one failed (1 in a row"
        assert message =~ "not a distributed node"
        # Within the backoff, the next call gets the same error at once, starting nothing.
        assert {:error, %Error{kind: :launch_error}} = XlaNode.ping(pool)

        assert %{launcher: %{failed: 1, started: 0, launching: 0, last_error: last}} =
                 Pool.status(pool)

        assert last =~ "not a distributed node"
      end
    end
  end
end
