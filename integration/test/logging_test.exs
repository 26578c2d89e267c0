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

    node_args = ["--sname", sname, "--cookie", to_string(Harness.cookie())] ++ Harness.node_args()

    command = "exec " <> Enum.map_join([Harness.bin_path() | node_args], " ", &shell_quote/1)

    port =
      Port.open({:spawn_executable, script}, [
        :binary,
        :exit_status,
        args: ["-qec", command, "/dev/null"]
      ])

    # Told to stop only once it is up (a node stopped while it starts may take longer than its
    # shutdown grace to get there), it exits 0 and unregisters.
    {started, nil} = read_port(port, "XLA ready", 60_000)
    {_, 0} = System.cmd("pkill", ["-TERM", "-f", "--", "--sname #{sname} "])
    {rest, status} = read_port(port, nil, 30_000)

    output = started <> rest
    assert status == 0, "exit status #{status}; output:\n#{output}"
    assert output =~ "node up (hidden)"
    assert output =~ "\e["
    refute Harness.epmd_registered?(sname)
  end

  # What `port` writes until `text` appears in it ({output, nil}) or it exits ({output,
  # status}); fails after `timeout` ms.
  defp read_port(port, text, timeout, acc \\ "") do
    receive do
      {^port, {:data, data}} ->
        acc = acc <> data
        if text && acc =~ text, do: {acc, nil}, else: read_port(port, text, timeout, acc)

      {^port, {:exit_status, status}} ->
        {acc, status}
    after
      timeout -> flunk("the node wrote no #{inspect(text)} within #{timeout} ms:\n#{acc}")
    end
  end

  defp shell_quote(arg), do: "'" <> String.replace(arg, "'", ~S('\'')) <> "'"
end
