defmodule XlaNode.RegistrationTest do
  @moduledoc "Names, cookies, ports and shutdown, as seen through epmd and BEAM nodes."
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, PeerHelpers}

  test "an --sname node appears in epmd under its name" do
    node = Harness.start_node()
    assert {:ok, names} = :erl_epmd.names()
    assert {String.to_charlist(node.sname), node.dist_port} in names
    assert node.name == :"#{node.sname}@#{Harness.host()}"
  end

  test "--name (long names) works from a long-name BEAM node" do
    sname = Harness.unique_name()
    long = "#{sname}@127.0.0.1"
    node = Harness.start_node(name: long)
    assert Harness.epmd_registered?(sname)

    # A short-name runner cannot talk to long-name nodes: do it all from a long-name peer.
    peer =
      Harness.start_peer(Harness.unique_name("lpeer"), [],
        longnames: true,
        host: "127.0.0.1",
        connection: :standard_io
      )

    assert Atom.to_string(peer.node) =~ "@127.0.0.1"
    assert Harness.peer_call(peer, :net_adm, :ping, [node.name]) == :pong
    assert Harness.peer_call(peer, PeerHelpers, :call, [{:xla, node.name}, :ping]) == {:ok, :pong}

    name = node.name

    assert {:ok, {:ok, %{node: ^name, peers: peers}}} =
             Harness.peer_call(peer, PeerHelpers, :call, [{:xla, node.name}, :info])

    assert peer.node in peers
    assert node.name in Harness.peer_call(peer, :erlang, :nodes, [:hidden])
  end

  test "--cookie is respected" do
    node = Harness.start_node(cookie: "some_other_cookie")
    Node.set_cookie(node.name, :some_other_cookie)
    assert Node.connect(node.name) == true
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end

  @tag :tmp_dir
  test "without --cookie it reads $HOME/.erlang.cookie", %{tmp_dir: home} do
    cookie_file = Path.join(home, ".erlang.cookie")
    File.write!(cookie_file, "HOMECOOKIEXYZ")
    File.chmod!(cookie_file, 0o400)

    node = Harness.start_node(cookie: false, home: home)

    # A peer whose cookie is the file's connects; one with the runner's cookie does not.
    good = Harness.start_peer(nil, [], cookie: :HOMECOOKIEXYZ, connection: :standard_io)
    assert Harness.peer_call(good, :net_adm, :ping, [node.name]) == :pong

    bad = Harness.start_peer(nil, [], connection: :standard_io)
    assert Harness.peer_call(bad, :net_adm, :ping, [node.name]) == :pang

    assert File.read!(cookie_file) == "HOMECOOKIEXYZ"
  end

  @tag :tmp_dir
  test "without --cookie and without a cookie file it creates one, as erl does", %{tmp_dir: home} do
    node = Harness.start_node(cookie: false, home: home)
    cookie_file = Path.join(home, ".erlang.cookie")
    assert {:ok, cookie} = File.read(cookie_file)
    assert cookie =~ ~r/^[A-Z]{20}$/
    assert {:ok, %File.Stat{mode: mode}} = File.stat(cookie_file)
    assert Bitwise.band(mode, 0o777) == 0o400

    Node.set_cookie(node.name, String.to_atom(cookie))
    assert Node.connect(node.name) == true
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end

  test "a fixed port via --inet-dist-listen-min/max shows in epmd" do
    port = free_port()
    node = Harness.start_node(listen_port: port)
    assert node.dist_port == port

    assert {:port, ^port, _version} =
             :erl_epmd.port_please(String.to_charlist(node.sname), ~c"127.0.0.1")

    Harness.connect!(node)
  end

  for signal <- ["TERM", "INT"] do
    test "SIG#{signal}: exit status 0, gone from epmd, connected nodes see nodedown" do
      node = Harness.start_node()
      Harness.connect!(node)
      :ok = :net_kernel.monitor_nodes(true, node_type: :all)
      name = node.name

      assert Harness.stop_node(node, unquote(signal)) == 0
      assert_receive {:nodedown, ^name, _info}, 2_000
      refute Harness.epmd_registered?(node.sname)
      refute name in Node.list(:hidden)
      :ok = :net_kernel.monitor_nodes(false, node_type: :all)
    end
  end

  test "SIGTERM: a connected peer node gets nodedown promptly" do
    node = Harness.start_node()
    peer = Harness.start_peer()
    name = node.name
    me = self()

    # A process on the peer subscribes to node events and forwards them to the test.
    _ = Harness.peer_call(peer, PeerHelpers, :spawn_node_forwarder, [me])
    assert_receive :forwarder_ready, 5_000
    assert {true, {:ok, :pong}} = Harness.peer_call(peer, PeerHelpers, :connect_and_ping, [name])
    assert_receive {:peer_saw, {:nodeup, ^name, _}}, 5_000

    assert Harness.stop_node(node) == 0
    assert_receive {:peer_saw, {:nodedown, ^name, _}}, 2_000
  end

  defp free_port do
    {:ok, s} = :gen_tcp.listen(0, [])
    {:ok, port} = :inet.port(s)
    :gen_tcp.close(s)
    port
  end
end
