defmodule XlaNode.XlaCallsTest do
  @moduledoc "The `:xla` server: ping, info, and exact round trips of every external term type."
  use ExUnit.Case, async: true

  alias XlaNode.Harness

  setup_all do
    Harness.start_shared_node()
  end

  defp echo(node, term, timeout \\ 10_000), do: GenServer.call({:xla, node.name}, {:echo, term}, timeout)

  defp assert_echo(node, term) do
    back = echo(node, term)
    assert back === term, "echo changed #{inspect(term, limit: 20)} into #{inspect(back, limit: 20)}"
    # Also compare the encodings: catches differences `===` cannot see.
    assert :erlang.term_to_binary(back) == :erlang.term_to_binary(term)
  end

  test ":ping", %{node: node} do
    assert GenServer.call({:xla, node.name}, :ping) == :pong
    assert :gen_server.call({:xla, node.name}, :ping) == :pong
  end

  test ":info", %{node: node} do
    assert {:ok, info} = GenServer.call({:xla, node.name}, :info)
    assert %{node: name, version: version, uptime_ms: up, peers: peers, processes: n} = info
    assert name == node.name
    assert is_binary(version) and version != ""
    assert is_integer(up) and up >= 0
    assert node() in peers
    assert is_integer(n) and n >= 1
  end

  test "unknown requests get an error reply, the server lives on", %{node: node} do
    assert {:error, _} = GenServer.call({:xla, node.name}, {:no_such_request, 1, 2})
    assert GenServer.call({:xla, node.name}, :ping) == :pong
  end

  test "atoms", %{node: node} do
    for a <- [
          :a,
          true,
          false,
          nil,
          :"",
          :"with space",
          :ünïcödé,
          :"日本語",
          :"emoji_😀",
          String.to_atom(String.duplicate("a", 255)),
          String.to_atom(String.duplicate("é", 255))
        ],
        do: assert_echo(node, a)
  end

  test "integers and bignums", %{node: node} do
    for i <- [
          0,
          1,
          255,
          256,
          -1,
          -256,
          2_147_483_647,
          -2_147_483_648,
          2_147_483_648,
          -2_147_483_649,
          Bitwise.bsl(1, 63) - 1,
          Bitwise.bsl(1, 64),
          -Bitwise.bsl(1, 64),
          Bitwise.bsl(1, 2040),
          Bitwise.bsl(1, 2048) + 12_345,
          -(Bitwise.bsl(1, 100_000) + 1),
          Integer.pow(7, 20_000)
        ],
        do: assert_echo(node, i)
  end

  test "floats (bit-exact)", %{node: node} do
    for f <- [0.0, 1.5, -2.25, 3.141592653589793, 1.0e308, -1.0e-308, 5.0e-324, 1.7976931348623157e308] do
      assert_echo(node, f)
    end

    # -0.0 === 0.0 in OTP 25, so compare the bits.
    back = echo(node, -0.0)
    assert is_float(back)
    assert <<back::float>> == <<-0.0::float>>
  end

  test "binaries and bitstrings", %{node: node} do
    big = :crypto.strong_rand_bytes(100_000)
    <<_::binary-size(10), sub::binary-size(1000), _::binary>> = big

    for b <- [
          <<>>,
          "hello",
          "ünïcödé",
          :binary.list_to_bin(Enum.to_list(0..255)),
          big,
          sub,
          <<1::1>>,
          <<5::3>>,
          <<255, 7::5>>,
          <<1, 2, 3, 0::7>>,
          <<big::binary, 3::2>>
        ],
        do: assert_echo(node, b)
  end

  test "lists: empty, charlists, improper, nested", %{node: node} do
    for l <- [
          [],
          ~c"hello",
          Enum.to_list(0..255),
          List.duplicate(?a, 70_000),
          [1, 2 | 3],
          [1 | :a],
          [[], [[]], [[[]]]],
          [:a, "b", 3, 4.0, {5}, [6]],
          [256, 1000, -1]
        ],
        do: assert_echo(node, l)
  end

  test "tuples: empty, small, large, nested", %{node: node} do
    for t <- [
          {},
          {1},
          {:a, "b", [3]},
          List.to_tuple(Enum.to_list(1..300)),
          {{{{{{{{{{:deep}}}}}}}}}}
        ],
        do: assert_echo(node, t)
  end

  test "maps: empty, small, more than 32 keys, nested, odd keys", %{node: node} do
    big = Map.new(1..100, &{&1, "v#{&1}"})
    huge = Map.new(1..5000, &{{:k, &1}, &1})

    for m <- [
          %{},
          %{a: 1},
          Map.new(1..32, &{&1, &1}),
          Map.new(1..33, &{&1, &1}),
          big,
          huge,
          %{nested: %{deeper: %{deepest: [1, 2, %{}]}}, other: big},
          %{{1, 2} => [3], "str" => :atom, 1.5 => nil, [] => %{}, %{k: 1} => <<1::3>>},
          %URI{host: "example.com"}
        ],
        do: assert_echo(node, m)
  end

  test "pids: local, of the node itself and of a third node", %{node: node} do
    assert_echo(node, self())
    assert_echo(node, spawn(fn -> :ok end))
    assert_echo(node, :c.pid(0, 0, 0))

    worker = Harness.spawn_echo(node)
    assert_echo(node, worker)

    peer = Harness.start_peer()
    peer_pid = Harness.peer_call(peer, :erlang, :whereis, [:init])
    assert node(peer_pid) == peer.node
    assert_echo(node, peer_pid)
    assert_echo(node, {self(), peer_pid, worker})
  end

  test "references: plain, alias and monitor references, of other nodes", %{node: node} do
    ref = make_ref()
    alias_ref = :erlang.alias()
    mon = Process.monitor(self())
    assert_echo(node, ref)
    assert_echo(node, alias_ref)
    assert_echo(node, mon)
    Process.demonitor(mon)
    :erlang.unalias(alias_ref)

    peer = Harness.start_peer()
    peer_ref = Harness.peer_call(peer, :erlang, :make_ref, [])
    assert node(peer_ref) == peer.node
    assert_echo(node, peer_ref)
  end

  test "ports", %{node: node} do
    port = Port.open({:spawn, "cat"}, [])
    assert_echo(node, port)
    assert_echo(node, hd(Port.list()))
    Port.close(port)

    peer = Harness.start_peer()
    peer_port = Harness.peer_call(peer, :erlang, :hd, [Harness.peer_call(peer, :erlang, :ports, [])])
    assert is_port(peer_port)
    assert_echo(node, peer_port)
  end

  test "funs: anonymous (with and without environment) and external", %{node: node} do
    x = 42
    y = "captured"

    for f <- [
          fn -> :ok end,
          fn a -> a + x end,
          fn a, b -> {a, b, x, y, self()} end,
          &String.upcase/1,
          &:lists.reverse/1,
          &Enum.map/2,
          &XlaNode.Harness.unique_name/0
        ] do
      assert_echo(node, f)
    end

    # The anonymous fun still works after the round trip.
    f = echo(node, fn a -> a * x end)
    assert f.(2) == 84
  end

  test "a mixed, nested term", %{node: node} do
    term = %{
      pids: [self(), :c.pid(0, 1, 0)],
      refs: {make_ref(), make_ref()},
      data: [1, 2.5, "three", :four, <<5::5>>, [6 | 7], %{8 => {9}}],
      big: Bitwise.bsl(1, 300),
      fun: &Kernel.+/2
    }

    assert_echo(node, term)
  end

  test "deeply nested (but within the node's limit) terms", %{node: node} do
    nested_list = Enum.reduce(1..500, [], fn i, acc -> [i, acc] end)
    nested_tuple = Enum.reduce(1..500, :leaf, fn _, acc -> {acc} end)
    nested_map = Enum.reduce(1..300, %{}, fn i, acc -> %{i => acc} end)
    assert_echo(node, nested_list)
    assert_echo(node, nested_tuple)
    assert_echo(node, nested_map)
  end

  @tag :slow
  @tag timeout: 120_000
  test "a list of 1,000,000 integers", %{node: node} do
    list = Enum.to_list(1..1_000_000)
    assert echo(node, list, 60_000) === list
    mixed = Enum.map(1..1_000_000, &(&1 * 1_000_003))
    assert echo(node, mixed, 60_000) === mixed
  end

  @tag :slow
  @tag timeout: 180_000
  test "a 64 MiB binary; :info answers during and after the transfer", %{node: node} do
    bin = :crypto.strong_rand_bytes(64 * 1024 * 1024)
    task = Task.async(fn -> echo(node, bin, 120_000) end)

    # While it travels: small calls from other processes keep working.
    infos =
      for _ <- 1..5 do
        Process.sleep(20)
        GenServer.call({:xla, node.name}, :info, 60_000)
      end

    assert Enum.all?(infos, &match?({:ok, %{}}, &1))
    back = Task.await(task, 120_000)
    assert byte_size(back) == byte_size(bin)
    assert back == bin
    assert {:ok, %{node: _}} = GenServer.call({:xla, node.name}, :info)
  end

  @tag timeout: 120_000
  test "replies arrive in the order they were sent, large and small interleaved", %{node: node} do
    # One sender (:xla), one receiver: Erlang guarantees the order. Large replies go out in
    # fragments through the writer while small ones may be written directly by the sender; the
    # mix must not reorder them.
    requests =
      for i <- 1..100 do
        payload =
          case rem(i, 5) do
            0 -> :binary.copy(<<rem(i, 256)>>, 4_000_000 + i)
            1 -> {:small, i}
            2 -> :binary.copy(<<rem(i, 256)>>, 70_000)
            _ -> i
          end

        ref = make_ref()
        send({:xla, node.name}, {:"$gen_call", {self(), ref}, {:echo, payload}})
        {ref, payload}
      end

    replies =
      for _ <- requests do
        receive do
          {ref, reply} when is_reference(ref) -> {ref, reply}
        after
          60_000 -> flunk("a reply is missing")
        end
      end

    assert Enum.map(replies, &elem(&1, 0)) == Enum.map(requests, &elem(&1, 0))
    assert replies == requests
  end
end
