defmodule XlaNode.LoggingTest do
  @moduledoc """
  The node's log on stderr: plain text wherever stderr is not a terminal (a pipe to a
  supervisor, a file), coloured on a terminal.
  """
  use ExUnit.Case, async: true

  alias XlaNode.Harness

  test "written to a pipe, log lines carry no terminal colour codes" do
    node = Harness.start_node()
    # A peer connecting and leaving logs nodeup and nodedown, with their fields.
    peer = Harness.start_peer()
    assert Harness.peer_call(peer, :net_adm, :ping, [node.name]) == :pong
    assert {:ok, _} = Harness.wait_for_log(node, ["nodeup", to_string(peer.node)])

    log = Harness.log(node)
    assert log =~ "node up (hidden) node=#{node.name}"
    refute log =~ "\e", "colour codes in the log:\n#{inspect(log)}"
  end

  @tag :tmp_dir
  test "written to a file (2>file), log lines carry no terminal colour codes", %{tmp_dir: dir} do
    path = Path.join(dir, "xla_node.log")
    node = Harness.start_node(stderr_file: path)
    assert GenServer.call({:xla, node.name}, :ping) == :pong
    assert Harness.stop_node(node) == 0

    log = File.read!(path)
    assert log =~ "node up (hidden) node=#{node.name}"
    assert log =~ "SIGTERM: shutting down"
    refute log =~ "\e", "colour codes in the log:\n#{inspect(log)}"
  end

  test "on a terminal, log lines are coloured" do
    # `script` runs the node on a pseudo-terminal and copies what it writes there.
    script = System.find_executable("script") || flunk("`script` (util-linux) is not installed")
    sname = Harness.unique_name()

    node_args =
      ["--sname", sname, "--cookie", to_string(Harness.cookie())] ++
        if(plugin = Harness.plugin_path(), do: ["--pjrt-plugin", plugin], else: [])

    # The node is told to stop (SIGTERM) after 3 s; it exits 0 and unregisters.
    stop_after_3s = ["timeout", "--preserve-status", "-s", "TERM", "3"]

    command =
      Enum.map_join(stop_after_3s ++ [Harness.bin_path() | node_args], " ", &shell_quote/1)

    {output, 0} = System.cmd(script, ["-qec", command, "/dev/null"])

    assert output =~ "node up (hidden)"
    assert output =~ "\e["
    refute Harness.epmd_registered?(sname)
  end

  defp shell_quote(arg), do: "'" <> String.replace(arg, "'", ~S('\'')) <> "'"
end
