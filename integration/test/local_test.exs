defmodule XlaNode.LocalTest do
  @moduledoc """
  `XlaNode.Local`: a compute node started, supervised and stopped by this VM, reached by its
  child's name; its log in Logger; gone with its supervisor, with its VM however that ends, and
  restarted by its supervisor when it crashes. Real binary, real epmd, real peer VMs. (A Mix
  application started from scratch that does the same: local_app_test.exs.)
  """
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog

  alias XlaNode.{Error, Harness, LogLines, PeerHelpers, Tensor}

  @add_one """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %r = stablehlo.add %x, %one : tensor<4xf32>
    return %r : tensor<4xf32>
  }
  """

  defp unique_name, do: :"local_#{System.unique_integer([:positive])}"

  # The suite's plugin and arguments (a GPU run gives them through the environment).
  defp node_opts(opts), do: [args: Harness.extra_args()] ++ opts

  defp add_one!(server) do
    exe = XlaNode.compile!(server, @add_one)
    [y] = XlaNode.run!(server, exe, [Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32})])
    Tensor.to_list(y)
  end

  defp wait_gone(os_pid),
    do: Harness.eventually(fn -> not Harness.os_process_alive?(os_pid) end, 15_000)

  test "a child starts a node that serves under the child's name, and stops with it" do
    name = unique_name()
    lines = LogLines.attach(self())
    on_exit(fn -> LogLines.detach(lines) end)

    capture_log([level: :info], fn ->
      start_supervised!({XlaNode.Local, node_opts(name: name)})
    end)

    node = XlaNode.Local.node(name)
    os_pid = XlaNode.Local.os_pid(name)
    [sname, host] = node |> Atom.to_string() |> String.split("@")
    assert host == Harness.host()
    assert sname =~ ~r/\A#{name}_#{System.pid()}_\d+\z/
    assert node in Node.list(:hidden)
    assert Harness.epmd_registered?(sname)
    assert Harness.os_process_alive?(os_pid)

    # Its log, line by line, named, at the level it was written: the node's output comes through
    # its port, by another way than its answer to :ping, so the line is waited for.
    ready = "#{node}: xla_node::server: XLA ready"

    assert_receive {:logged, :info, line}
                   when binary_part(line, 0, byte_size(ready)) == ready,
                   10_000

    # The name, a node name and the raw server all reach it.
    assert XlaNode.ping(name) == :pong
    assert GenServer.call({:xla, node}, :ping) == :pong
    assert add_one!(name) == [2.0, 3.0, 4.0, 5.0]
    assert {:ok, %{node: ^node}} = XlaNode.info(name)
    assert XlaNode.server(name) == {:xla, node}

    # The cookie went on its standard input: no command line holds it.
    {:ok, cmdline} = File.read("/proc/#{os_pid}/cmdline")
    refute cmdline =~ Atom.to_string(Node.get_cookie())
    assert cmdline =~ "--cookie-from-stdin"

    log = capture_log([level: :info], fn -> :ok = stop_supervised({XlaNode.Local, name}) end)
    # Stopped and gone when the supervisor returns: the graceful stop, out of epmd.
    refute Harness.os_process_alive?(os_pid)
    refute node in Node.list(:hidden)
    refute Harness.epmd_registered?(sname)
    assert log =~ "#{node}: xla_node: SIGTERM: shutting down"
    assert {:error, %Error{kind: :noproc}} = XlaNode.compile(name, @add_one)
    assert_raise Error, ~r/no XlaNode.Local named/, fn -> XlaNode.Local.node(name) end
  end

  test "a node that crashes is restarted by its supervisor, and the name follows it" do
    name = unique_name()
    start_supervised!({XlaNode.Local, node_opts(name: name, log: "warn")})
    first = XlaNode.Local.node(name)
    first_pid = XlaNode.Local.os_pid(name)
    assert add_one!(name) == [2.0, 3.0, 4.0, 5.0]

    log =
      capture_log(fn ->
        System.cmd("kill", ["-KILL", "#{first_pid}"])

        assert Harness.eventually(
                 fn ->
                   case XlaNode.Local.whereis_node(name) do
                     nil -> false
                     node -> node != first
                   end
                 end,
                 30_000
               )
      end)

    assert log =~ "#{first} exited with status"
    second = XlaNode.Local.node(name)
    assert second != first
    refute first in Node.list(:hidden)
    assert add_one!(name) == [2.0, 3.0, 4.0, 5.0]
    assert XlaNode.Local.os_pid(name) != first_pid
  end

  test "the node ends with the VM that started it: halted, or killed with kill -9" do
    for ending <- [:halt, :kill] do
      peer = Harness.start_peer()

      {node, node_pid, vm_pid} =
        Harness.peer_call(peer, PeerHelpers, :start_local, [node_opts(name: :xla, log: "warn")])

      assert vm_pid == peer.os_pid
      assert Harness.os_process_alive?(node_pid)
      assert Harness.xla_node_processes(node) == [node_pid]

      case ending do
        :halt -> :erpc.cast(peer.node, :erlang, :halt, [0])
        :kill -> System.cmd("kill", ["-KILL", "#{peer.os_pid}"])
      end

      assert wait_gone(node_pid), "#{ending}: #{node} (OS pid #{node_pid}) outlived its VM"
      assert Harness.xla_node_processes(node) == []

      assert Harness.eventually(fn -> not Harness.epmd_registered?(node) end, 5_000),
             "#{ending}: #{node} left epmd"
    end
  end

  test "the node's flags are options, in the flag's units" do
    name = unique_name()

    start_supervised!(
      {XlaNode.Local,
       node_opts(
         name: name,
         max_executables: 7,
         max_device_bytes: "1G",
         max_message_bytes: "64M",
         log: "warn"
       )}
    )

    assert {:ok, info} = XlaNode.info(name)
    assert info.max_device_bytes == 1_073_741_824
    assert info.max_message_bytes == 67_108_864
    assert info.platform == Harness.platform()
    os_pid = XlaNode.Local.os_pid(name)
    {:ok, cmdline} = File.read("/proc/#{os_pid}/cmdline")
    assert cmdline =~ "--max-executables\u00007\u0000"
  end

  @tag :cpu_only
  test "plugin options reach the plugin" do
    name = unique_name()

    start_supervised!(
      {XlaNode.Local, name: name, plugin: :cpu, pjrt_options: [cpu_device_count: 2], log: "warn"}
    )

    assert {:ok, %{devices: ["cpu:0", "cpu:1"]}} = XlaNode.info(name)
  end

  describe "what keeps a node from starting is an error saying so" do
    # A start that fails in the node's process exits it, as any GenServer's init that stops.
    setup do
      Process.flag(:trap_exit, true)
      :ok
    end

    test "no binary, no plugin, a node that exits at once" do
      assert {:error, %Error{kind: :launch_error, message: message}} =
               XlaNode.Local.start_link(bin: "/no/such/xla_node")

      assert message =~ "no xla_node binary at /no/such/xla_node (the :bin option)"
      assert message =~ "mix xla_node.setup"

      assert {:error, %Error{kind: :launch_error, message: message}} =
               XlaNode.Local.start_link(plugin: "/no/such/plugin.so")

      assert message =~ "plugin: no PJRT plugin at /no/such/plugin.so"

      log =
        capture_log(fn ->
          assert {:error, %Error{kind: :launch_error, message: message, node: node}} =
                   XlaNode.Local.start_link(args: ["--no-such-flag"])

          assert message =~ "exited with status 2 before it answered :ping"
          assert message =~ "unexpected argument '--no-such-flag'"
          refute node in Node.list(:hidden)
        end)

      assert log =~ "unexpected argument"
    end

    test "starts that fail at once, many together, each say why" do
      # A node refusing its arguments exits at once; the cookie written on its input must not
      # meet a closed pipe, which would cost the error its exit status and lines.
      log =
        capture_log(fn ->
          1..24
          |> Task.async_stream(
            fn _ ->
              Process.flag(:trap_exit, true)
              XlaNode.Local.start_link(args: ["--no-such-flag"])
            end,
            max_concurrency: 24,
            timeout: 60_000
          )
          |> Enum.each(fn {:ok, result} ->
            assert {:error, %Error{kind: :launch_error, message: message}} = result
            assert message =~ "exited with status 2 before it answered :ping"
            assert message =~ "unexpected argument '--no-such-flag'"
          end)
        end)

      assert log =~ "unexpected argument"
    end

    test "a command that exits before the node asks for the cookie keeps its status and lines" do
      # Nothing is written to a command that did not ask: a write into the pipe of one that
      # exited would close the port with `epipe` and no exit status (1 in 15 of these, before).
      {:ok, host} = :inet.gethostname()

      for round <- 1..4 do
        1..24
        |> Task.async_stream(
          fn i ->
            Process.flag(:trap_exit, true)

            XlaNode.Launcher.Port.start_link(%{
              command: "/bin/sh",
              args: ["-c", "echo refused; exit 3"],
              node: :"never_#{round}_#{i}@#{host}"
            })
          end,
          max_concurrency: 24,
          timeout: 60_000
        )
        |> Enum.each(fn {:ok, result} ->
          assert {:error, %Error{kind: :launch_error, message: message}} = result

          assert message =~
                   "exited with status 3 before it answered :ping; its last lines:\nrefused"
        end)
      end
    end

    test "the cookie goes on the command's standard input once the node asks, never before" do
      {:ok, host} = :inet.gethostname()
      prompt = "xla_node: waiting for the cookie on standard input"

      # A command that reads its input first, and one that asks (on standard error, as the
      # node does), then reads.
      early = ~s|line=$(timeout 1 head -n 1); echo "before asking: [$line]"; exit 4|
      asked = ~s|echo "#{prompt}" >&2; read line; echo "once asked: [$line]"; exit 5|

      for {script, status, said} <- [
            {early, 4, "before asking: []"},
            {asked, 5, "once asked: [#{Node.get_cookie()}]"}
          ] do
        assert {:error, %Error{message: message}} =
                 XlaNode.Launcher.Port.start(%{
                   command: "/bin/sh",
                   args: ["-c", script],
                   node: :"never_#{System.unique_integer([:positive])}@#{host}"
                 })

        assert message =~ "exited with status #{status} before it answered :ping"
        assert message =~ said
        refute message =~ prompt
      end
    end

    test "plugin: :gpu without the CUDA plugin installed" do
      if File.exists?(XlaNode.Setup.cuda_plugin()) do
        IO.puts("skipped: the CUDA plugin is installed here")
      else
        assert {:error, %Error{kind: :launch_error, message: message}} =
                 XlaNode.Local.start_link(plugin: :gpu)

        assert message =~ "mix xla_node.setup --gpu"
      end
    end

    test "a start that takes longer than start_timeout" do
      # A binary that never serves (a shell that sleeps): the start gives up and stops it.
      dir = Path.join(System.tmp_dir!(), "xla_local_#{System.unique_integer([:positive])}")
      File.mkdir_p!(dir)
      on_exit(fn -> File.rm_rf!(dir) end)
      bin = Path.join(dir, "xla_node")
      File.write!(bin, "#!/bin/sh\necho starting\nexec sleep 60\n")
      File.chmod!(bin, 0o755)

      log =
        capture_log(fn ->
          assert {:error, %Error{kind: :launch_error, reason: :timeout, message: message}} =
                   XlaNode.Local.start_link(bin: bin, start_timeout: 500)

          assert message =~ "did not answer :ping in time (start_timeout)"
          # A shell never asks for the cookie, as an xla_node older than the client would not.
          assert message =~ "it never asked for the cookie on its standard input"
          assert message =~ "its last lines:\nstarting"
        end)

      assert log =~ "starting"
    end
  end
end
