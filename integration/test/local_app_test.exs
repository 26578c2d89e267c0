defmodule XlaNode.LocalAppTest do
  @moduledoc """
  A new Mix application, written from scratch into a temporary directory, with the client as a
  path dependency and one child, `{XlaNode.Local, name: :xla, distribution: :start}`: `mix run`
  compiles and runs a program on the node its supervision tree started, and `kill -9` of the
  application's VM leaves no `xla_node` process behind; `mix xla_node.setup` there prints the
  binary's path. Real `mix`, real VMs, real binary.
  """
  use ExUnit.Case, async: true

  alias XlaNode.Harness

  @moduletag :slow

  @client Path.expand("../../elixir_client", __DIR__)

  setup_all do
    dir =
      Path.join(
        System.tmp_dir!(),
        "xla_app_#{System.pid()}_#{System.unique_integer([:positive])}"
      )

    File.mkdir_p!(Path.join(dir, "lib"))
    on_exit(fn -> File.rm_rf!(dir) end)

    File.write!(Path.join(dir, "mix.exs"), """
    defmodule XlaApp.MixProject do
      use Mix.Project

      def project do
        [app: :xla_app, version: "0.1.0", deps: [{:xla_node_client, path: #{inspect(@client)}}]]
      end

      def application do
        [extra_applications: [:logger], mod: {XlaApp.Application, []}]
      end
    end
    """)

    File.write!(Path.join(dir, "lib/application.ex"), """
    defmodule XlaApp.Application do
      use Application

      @impl true
      def start(_type, _args) do
        children = [{XlaNode.Local, name: :xla, distribution: :start, log: "warn"}]
        Supervisor.start_link(children, strategy: :one_for_one, name: XlaApp.Supervisor)
      end
    end
    """)

    File.write!(Path.join(dir, "run.exs"), ~S'''
    mlir = """
    func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %one = stablehlo.constant dense<1.0> : tensor<4xf32>
      %y = stablehlo.add %x, %one : tensor<4xf32>
      return %y : tensor<4xf32>
    }
    """

    exe = XlaNode.compile!(:xla, mlir)
    [y] = XlaNode.run!(:xla, exe, [XlaNode.Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32})])
    IO.puts("RESULT #{inspect(XlaNode.Tensor.to_list(y))} on #{XlaNode.Local.node(:xla)}")
    ''')

    File.write!(Path.join(dir, "hold.exs"), ~S"""
    :pong = XlaNode.ping(:xla)
    IO.puts("READY #{System.pid()} #{XlaNode.Local.os_pid(:xla)} #{XlaNode.Local.node(:xla)}")
    """)

    %{dir: dir}
  end

  # The application runs where a user's would: its own Mix environment, not the suite's, the
  # binary found where `mix xla_node.setup` builds it, as in a fresh clone (unless the suite
  # runs another one), and the default plugin (a GPU run's plugin, taken whole, is not for a
  # node of its own beside the suite's).
  defp env do
    bin = if File.exists?(XlaNode.Setup.built_bin()), do: [{"XLA_NODE_BIN", nil}], else: []
    [{"MIX_ENV", "dev"}, {"XLA_NODE_PJRT_PLUGIN", nil}] ++ bin
  end

  test "mix run: the child starts the node, the script compiles and runs on it", %{dir: dir} do
    {out, status} =
      System.cmd("mix", ["run", "run.exs"], cd: dir, env: env(), stderr_to_stdout: true)

    assert status == 0, out
    assert [_, node] = Regex.run(~r/RESULT \[2\.0, 3\.0, 4\.0, 5\.0\] on (\S+)/, out), out
    # The VM stopped at the script's end, and its node with it.
    assert Harness.eventually(fn -> Harness.xla_node_processes(node) == [] end, 15_000)
    assert Harness.eventually(fn -> not Harness.epmd_registered?(node) end, 5_000)
  end

  test "mix xla_node.setup, from the application, prints the binary's path and nothing else",
       %{dir: dir} do
    # scripts/test.sh ran scripts/setup.sh already: this run finds everything in place.
    {out, status} =
      System.cmd("mix", ["xla_node.setup"], cd: dir, env: env(), stderr_to_stdout: true)

    assert status == 0, out
    # Compiling the application the first time may print its own lines first.
    assert out |> String.split("\n", trim: true) |> List.last() == XlaNode.Setup.built_bin()
    assert File.regular?(XlaNode.Setup.built_bin())

    {again, 0} =
      System.cmd("mix", ["xla_node.setup"], cd: dir, env: env(), stderr_to_stdout: true)

    assert again == XlaNode.Setup.built_bin() <> "\n"
  end

  test "kill -9 of the application's VM leaves no xla_node behind", %{dir: dir} do
    port =
      Port.open({:spawn_executable, System.find_executable("mix")}, [
        :binary,
        :exit_status,
        :stderr_to_stdout,
        {:line, 4096},
        args: ["run", "--no-halt", "hold.exs"],
        cd: dir,
        env: for({k, v} <- env(), do: {to_charlist(k), if(v, do: to_charlist(v), else: false)})
      ])

    {vm_pid, node_pid, node} = await_ready(port, [])
    assert Harness.os_process_alive?(node_pid)
    assert Harness.xla_node_processes(node) == [node_pid]

    System.cmd("kill", ["-KILL", "#{vm_pid}"])
    assert_receive {^port, {:exit_status, _}}, 15_000

    assert Harness.eventually(fn -> not Harness.os_process_alive?(node_pid) end, 15_000),
           "#{node} (OS pid #{node_pid}) outlived the VM killed with -9"

    assert Harness.xla_node_processes(node) == []
    assert Harness.eventually(fn -> not Harness.epmd_registered?(node) end, 5_000)
  end

  defp await_ready(port, lines) do
    receive do
      {^port, {:data, {:eol, "READY " <> rest}}} ->
        [vm, node_pid, node] = String.split(rest)
        {String.to_integer(vm), String.to_integer(node_pid), node}

      {^port, {:data, {_, line}}} ->
        await_ready(port, [line | lines])

      {^port, {:exit_status, status}} ->
        flunk("mix run exited with #{status}:\n" <> Enum.join(Enum.reverse(lines), "\n"))
    after
      300_000 -> flunk("mix run did not get ready:\n" <> Enum.join(Enum.reverse(lines), "\n"))
    end
  end
end
