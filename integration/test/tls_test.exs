defmodule XlaNode.TlsTest do
  @moduledoc """
  TLS distribution (`--proto-dist inet_tls --ssl-dist-optfile FILE`) against BEAM nodes started
  with `-proto_dist inet_tls -ssl_dist_optfile FILE`, all reading the same option file: one CA,
  node certificates, peers verified both ways. The BEAM nodes check xla_node's certificate
  against the CA and its host name; xla_node checks theirs.

  The test runner itself speaks plain TCP, so it reaches the TLS peers through their standard
  I/O (`:peer` with `connection: :standard_io`) and never connects to them or to the node.
  """
  use ExUnit.Case, async: false

  alias XlaNode.{Certs, Harness, Load, PeerHelpers}

  setup_all do
    dir = Certs.tmp_dir("xla_tls")
    ca = Certs.ca(dir, "ca")
    good = Certs.optfile(dir, "dist.conf", Certs.node_cert(dir, "node", ca, Harness.host()), ca)
    # A certificate from another CA, on a node that itself trusts the cluster's CA.
    other_ca = Certs.ca(dir, "other_ca")
    other = Certs.node_cert(dir, "other", other_ca, Harness.host())
    rogue = Certs.optfile(dir, "rogue.conf", other, ca)

    node = Harness.start_node(args: Certs.node_args(good), wait_ready: false, cleanup: false)
    a = tls_peer(good)
    b = tls_peer(good)

    # The node is ready once a TLS peer gets :pong from :xla.
    assert Harness.eventually(
             fn ->
               Harness.peer_call(a, PeerHelpers, :connect_and_ping, [node.name]) ==
                 {true, {:ok, :pong}}
             end,
             30_000,
             200
           )

    on_exit(fn ->
      Enum.each([a, b], &Harness.stop_peer/1)
      Harness.stop_node(node, "KILL")
      File.rm_rf!(dir)
    end)

    %{node: node, a: a, b: b, dir: dir, good: good, rogue: rogue, other: other, ca: ca}
  end

  # The peers' ssl application reports each refused handshake at notice level on their standard
  # output, which is the test's: the node's log is what the tests check.
  defp tls_peer(optfile, opts \\ []) do
    args = Certs.erl_args(optfile) ++ ["-kernel", "logger_level", "warning"]
    Harness.start_peer(nil, args, [connection: :standard_io] ++ opts)
  end

  defp on(peer, m, f, a, timeout \\ 30_000), do: Harness.peer_call(peer, m, f, a, timeout)

  defp xla(peer, node, request),
    do: on(peer, PeerHelpers, :call, [{:xla, node.name}, request, 20_000])

  # Runs x + 1 from `peer` for `ms` milliseconds: Load's summary (ok, failed, failures).
  defp keep_running(peer, node, ms) do
    Task.async(fn ->
      on(peer, PeerHelpers, :keep_running, [node.name, 2, ms], ms + 60_000)
    end)
  end

  test "BEAM nodes over inet_tls connect, ping, compile and run", %{node: node, a: a, b: b} do
    assert on(b, PeerHelpers, :connect_and_ping, [node.name]) == {true, {:ok, :pong}}

    for p <- [a, b] do
      assert node.name in on(p, Node, :list, [:hidden])
      {bin, _} = x = Load.f32(1, 4)
      expected = Load.plus_one(bin)

      assert {:ok, [{^expected, {{:f, 32}, [4]}}]} =
               on(p, PeerHelpers, :compile_and_run, [node.name, Load.plus_one_program(), [x]])
    end

    {:ok, %{peers: peers}} = xla(a, node, :info) |> elem(1)
    assert a.node in peers and b.node in peers
  end

  test "a callback to a third TLS node: the node dials it over TLS", %{
    node: node,
    a: a,
    good: good
  } do
    third = tls_peer(good)
    server = on(third, Load, :callback_server, [0])
    {bin, _} = x = Load.f32(10, 4)
    expected = Load.plus_one(bin)
    program = Load.callback_program(:tls_third)

    assert {:ok, [{^expected, _}]} =
             on(a, PeerHelpers, :compile_and_run, [
               node.name,
               program,
               [x],
               [callback_server: server]
             ])

    # The node opened that connection itself: the third node never connected to it.
    assert node.name in on(third, Node, :list, [:hidden])
    assert {:ok, _} = Harness.wait_for_log(node, ["nodeup", Atom.to_string(third.node)])
    Harness.stop_peer(third)
  end

  test "a plain-TCP peer is refused with one log line; TLS peers are served throughout", %{
    node: node,
    a: a
  } do
    runs = keep_running(a, node, 3_000)
    before = length(Harness.log_matching(node, "does not speak TLS"))
    # The runner speaks plain-TCP distribution.
    refute Node.connect(node.name)
    assert {:ok, line} = Harness.wait_for_log(node, "does not speak TLS")
    assert line =~ "127.0.0.1" or line =~ "addr="
    assert length(Harness.log_matching(node, "does not speak TLS")) == before + 1
    summary = Task.await(runs, 90_000)
    assert summary.failed == 0 and summary.ok > 0
    assert {:ok, :pong} = xla(a, node, :ping)
  end

  test "a peer whose certificate comes from another CA is refused, both ways", %{
    node: node,
    a: a,
    b: b,
    rogue: rogue
  } do
    runs = keep_running(a, node, 4_000)
    rogue_peer = tls_peer(rogue)

    # It connects to the node: the node refuses its client certificate.
    assert {false, {:exit, _}} = on(rogue_peer, PeerHelpers, :connect_and_ping, [node.name])
    assert {:ok, line} = Harness.wait_for_log(node, ["connection refused", "not trusted"])
    assert line =~ "addr="

    # The node dials it (a callback server there): the node refuses its server certificate, and
    # the run fails with a clear error instead of waiting.
    server = on(rogue_peer, Load, :callback_server, [0])
    program = Load.callback_program(:rogue)
    opts = [callback_server: server, callback_timeout: 10_000]

    assert {:error, {:runtime_error, message}} =
             on(b, PeerHelpers, :compile_and_run, [node.name, program, [Load.f32(1, 4)], opts])

    assert message =~ "noconnection" or message =~ "down" or message =~ "connect"

    assert {:ok, line} =
             Harness.wait_for_log(node, ["cannot connect", Atom.to_string(rogue_peer.node)])

    assert line =~ "not trusted"

    summary = Task.await(runs, 90_000)
    assert summary.failed == 0 and summary.ok > 0
    refute rogue_peer.node in (xla(a, node, :info) |> elem(1) |> elem(1)).peers
    Harness.stop_peer(rogue_peer)
  end

  test "XlaNode.Local in a VM on TLS distribution starts its node on TLS, with the VM's file", %{
    good: good
  } do
    peer = tls_peer(good)
    opts = [name: :xla, log: "warn", args: Harness.extra_args()]
    {node, os_pid, _vm} = on(peer, PeerHelpers, :start_local, [opts])
    assert on(peer, XlaNode, :ping, [:xla]) == :pong
    assert node in on(peer, Node, :list, [:hidden])
    {:ok, cmdline} = File.read("/proc/#{os_pid}/cmdline")
    assert cmdline =~ "--proto-dist\0inet_tls\0--ssl-dist-optfile\0#{good}\0"

    Harness.stop_peer(peer)

    assert Harness.eventually(fn -> not Harness.os_process_alive?(os_pid) end, 15_000),
           "the node outlived its TLS VM"
  end

  describe "start-up refused with one clear message" do
    defp start_fails(args) do
      name = Harness.unique_name("xla_tls_bad")

      System.cmd(
        Harness.bin_path(),
        ["--sname", name, "--cookie", "x"] ++ Harness.node_args() ++ args,
        stderr_to_stdout: true
      )
    end

    test "a missing option file", %{dir: dir} do
      missing = Path.join(dir, "missing.conf")
      assert {out, 1} = start_fails(Certs.node_args(missing))
      assert out =~ missing and out =~ "No such file"
    end

    test "a certificate file that does not exist", %{dir: dir, ca: ca} do
      conf = Certs.optfile(dir, "gone.conf", %{cert: Path.join(dir, "gone.pem"), key: ca.key}, ca)
      assert {out, 1} = start_fails(Certs.node_args(conf))
      assert out =~ "certfile #{Path.join(dir, "gone.pem")}" and out =~ "No such file"
    end

    test "a key that does not match its certificate", %{dir: dir, ca: ca, other: other} do
      node_cert = %{cert: Path.join(dir, "node.pem"), key: other.key}
      conf = Certs.optfile(dir, "mismatch.conf", node_cert, ca)
      assert {out, 1} = start_fails(Certs.node_args(conf))
      assert out =~ "does not match" and out =~ other.key
    end

    test "inet_tls without an option file, and an option file without inet_tls", %{good: good} do
      assert {out, 1} = start_fails(["--proto-dist", "inet_tls"])
      assert out =~ "--ssl-dist-optfile"
      assert {out, 1} = start_fails(["--ssl-dist-optfile", good])
      assert out =~ "--proto-dist inet_tls"
    end
  end
end
