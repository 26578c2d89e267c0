defmodule XlaNode.SSHLauncherTest do
  @moduledoc """
  `XlaNode.Launcher.SSH` against a real OpenSSH server on loopback (`scripts/sshd.sh`, started
  by `Harness.ensure_sshd!/0`): a node started over ssh, used by a pool, gone when its
  connection or its pool goes; a wrong host, key, host key or path is a clear error, and a
  pool keeps serving on the nodes it has.
  """
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog

  alias XlaNode.{Error, Harness, Pool, Tensor}
  alias XlaNode.Launcher.{Port, SSH}

  @add_one """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %r = stablehlo.add %x, %one : tensor<4xf32>
    return %r : tensor<4xf32>
  }
  """

  setup_all do
    %{sshd: Harness.ensure_sshd!()}
  end

  # The binary and plugin "on the remote host" are this machine's own (sshd is on loopback).
  defp ssh_opts(sshd, more \\ []) do
    plugin = if path = Harness.plugin_path(), do: [plugin: path], else: []

    Keyword.merge(
      [
        host: sshd.host,
        port: sshd.port,
        user: sshd.user,
        key: sshd.key,
        known_hosts: sshd.known_hosts,
        bin: Harness.bin_path(),
        args: Harness.extra_args(),
        log: "warn"
      ] ++ plugin,
      more
    )
  end

  defp context, do: %{owner: self(), name: "ssh_t#{System.unique_integer([:positive])}"}

  defp x, do: Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32})

  defp wait_for(fun, timeout \\ 30_000), do: Harness.eventually(fun, timeout, 50)

  test "a node started over ssh serves, and goes with its connection", %{sshd: sshd} do
    opts = SSH.validate_options(ssh_opts(sshd))
    assert {:ok, node, handle} = SSH.start_node(opts, context())
    assert node |> Atom.to_string() |> String.ends_with?("@localhost")
    assert XlaNode.ping(node) == :pong
    exe = XlaNode.compile!(node, @add_one)
    assert Tensor.to_list(hd(XlaNode.run!(node, exe, [x()]))) == [2.0, 3.0, 4.0, 5.0]

    # The node runs under sshd, not under this VM; the cookie is in no command line.
    [node_pid] = Harness.xla_node_processes(node)
    ssh_pid = Port.os_pid(handle)
    cookie = Atom.to_string(Node.get_cookie())

    for pid <- [node_pid, ssh_pid] do
      {:ok, cmdline} = File.read("/proc/#{pid}/cmdline")
      refute cmdline =~ cookie
    end

    {:ok, ssh_cmdline} = File.read("/proc/#{ssh_pid}/cmdline")
    assert ssh_cmdline =~ "--exit-on-stdin-close"
    refute parent_of(node_pid) == String.to_integer(System.pid())

    # The connection ends (ssh killed with -9): the remote node stops, and its handle with it.
    ref = Process.monitor(handle)
    System.cmd("kill", ["-KILL", "#{ssh_pid}"])
    assert_receive {:DOWN, ^ref, :process, ^handle, {:xla_node_exited, _}}, 10_000
    assert wait_for(fn -> not Harness.os_process_alive?(node_pid) end, 15_000)
    assert wait_for(fn -> node not in Node.list(:hidden) end, 15_000)
  end

  test "a pool grows through ssh and stops its remote nodes with it", %{sshd: sshd} do
    name = :"ssh_pool_#{System.unique_integer([:positive])}"

    start_supervised!(
      {Pool,
       name: name, launcher: {SSH, ssh_opts(sshd)}, min: 1, max: 2, idle_shutdown_after: 60_000}
    )

    assert wait_for(fn -> match?([%{status: :up}], Pool.status(name).nodes) end)
    [%{node: node, launched: %{reason: :min}}] = Pool.status(name).nodes
    exe = XlaNode.compile!(name, @add_one)

    for _ <- 1..10,
        do: assert(Tensor.to_list(hd(XlaNode.run!(name, exe, [x()]))) == [2.0, 3.0, 4.0, 5.0])

    assert [%{node: ^node, runs: 10}] = Pool.status(name).nodes
    [node_pid] = Harness.xla_node_processes(node)

    :ok = stop_supervised(name)
    refute node in Node.list(:hidden)
    assert wait_for(fn -> not Harness.os_process_alive?(node_pid) end, 15_000)
  end

  describe "a wrong host, key, host key or path" do
    setup %{sshd: sshd} do
      empty = Path.join(System.tmp_dir!(), "known_hosts_#{System.unique_integer([:positive])}")
      File.write!(empty, "")
      on_exit(fn -> File.rm(empty) end)
      %{empty_known_hosts: empty, sshd: sshd}
    end

    test "is an error that says which", %{sshd: sshd, empty_known_hosts: empty} do
      not_executable = empty <> ".data"
      File.write!(not_executable, "data")
      File.chmod!(not_executable, 0o644)
      on_exit(fn -> File.rm(not_executable) end)

      cases = [
        {[key: sshd.other_key], "ssh to #{sshd.user}@localhost:#{sshd.port} failed:",
         "Permission denied (publickey)"},
        {[port: closed_port()], "failed:", "Connection refused"},
        {[host: "no-such-host.invalid", node_host: "nowhere"], "failed:",
         "Could not resolve hostname no-such-host.invalid"},
        {[known_hosts: empty], "failed:", "Host key verification failed"},
        {[bin: "/no/such/xla_node"], "bin: /no/such/xla_node was not found on", "No such file"},
        {[bin: not_executable], "bin: #{not_executable} cannot be executed on",
         "Permission denied"},
        {[args: ["--no-such-flag"]], "the node exited with status 2", "--no-such-flag"}
      ]

      capture_log(fn ->
        for {bad, what, detail} <- cases do
          opts = SSH.validate_options(ssh_opts(sshd, bad))

          assert {:error, %Error{kind: :launch_error, message: message}} =
                   SSH.start_node(opts, context())

          assert message =~ what, "#{inspect(bad)}: #{message}"
          assert message =~ detail, "#{inspect(bad)}: #{message}"
        end
      end)
    end

    test "leaves a pool serving on the nodes it has", %{sshd: sshd} do
      fixed = Harness.start_node()
      name = :"ssh_pool_#{System.unique_integer([:positive])}"

      log =
        capture_log(fn ->
          start_supervised!(
            {Pool,
             name: name,
             nodes: [fixed.name],
             launcher: {SSH, ssh_opts(sshd, key: sshd.other_key)},
             min: 1,
             max: 2,
             launch_backoff: {200, 1_000}}
          )

          assert wait_for(fn -> Pool.status(name).launcher.failed >= 2 end)
          exe = XlaNode.compile!(name, @add_one)

          for _ <- 1..5,
              do:
                assert(Tensor.to_list(hd(XlaNode.run!(name, exe, [x()]))) == [2.0, 3.0, 4.0, 5.0])
        end)

      status = Pool.status(name)
      assert [%{node: node, runs: 5}] = status.nodes
      assert node == fixed.name
      assert status.launcher.started == 0
      assert status.launcher.last_error =~ "Permission denied (publickey)"
      assert log =~ "a node failed to start"
    end
  end

  defp closed_port do
    {:ok, socket} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(socket)
    :gen_tcp.close(socket)
    port
  end

  defp parent_of(os_pid) do
    {:ok, stat} = File.read("/proc/#{os_pid}/stat")
    [_, rest] = String.split(stat, ") ", parts: 2)
    rest |> String.split(" ") |> Enum.at(1) |> String.to_integer()
  end
end
