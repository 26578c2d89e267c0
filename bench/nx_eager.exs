# The eager part of the Nx benchmark (bench/run.sh nx): operations on XlaNode.Backend tensors,
# each one a request to the node, against a BEAM node's GenServer.call in the same run.
#
#   * the first call of an operation, its compile included (fresh shapes each time);
#   * a cached operation, interleaved with a GenServer.call to a BEAM node (:peer) and with the
#     node's own :ping, in rounds, so that machine noise hits all alike;
#   * 100,000 eager operations in one long-lived process, in scopes of 1,000: their time and
#     the node's buffer count before and after; and the same without scopes, what the process
#     drops going with its garbage (XlaNode.Keeper): the most buffers beyond those before.
#
# Runs inside the elixir_nx Mix project, which needs Nx (NX_PATH) and Elixir >= 1.17:
#   cd elixir_nx && elixir --sname NAME --cookie COOKIE -S mix run ../bench/nx_eager.exs XLA_NODE_SNAME

[xla_name] = System.argv()
host = node() |> Atom.to_string() |> String.split("@") |> List.last()
xla = :"#{xla_name}@#{host}"
true = Node.connect(xla)

[{mod, bin}] =
  Code.compile_string("""
  defmodule Bench.NxEager.Baseline do
    use GenServer
    def init(_), do: {:ok, nil}
    def handle_call(:ping, _from, s), do: {:reply, :pong, s}
  end
  """)

{:ok, _peer, base} =
  :peer.start_link(%{
    name: :"bench_nx_base_#{System.os_time()}",
    args: [~c"-setcookie", Atom.to_charlist(Node.get_cookie()), ~c"-pa" | :code.get_path()]
  })

{:module, _} = :erpc.call(base, :code, :load_binary, [mod, ~c"bench_nx_baseline.beam", bin])
{:ok, _} = :erpc.call(base, GenServer, :start, [Bench.NxEager.Baseline, nil, [name: :baseline]])

Code.require_file("timing.exs", __DIR__)

defmodule Bench.NxEager do
  defdelegate median(samples), to: Bench.Timing
  defdelegate time_us(fun), to: Bench.Timing, as: :time
  defdelegate interleave(funs, rounds, n), to: Bench.Timing

  def us(x), do: :erlang.float_to_binary(x / 1, decimals: 1) <> " us"
  def ms(x), do: :erlang.float_to_binary(x / 1000, decimals: 2) <> " ms"
  def ratio(a, b), do: :erlang.float_to_binary(a / b, decimals: 2)

  def buffers(xla) do
    {:ok, %{buffers: buffers}} = XlaNode.info(xla)
    buffers
  end
end

alias Bench.NxEager, as: B

Nx.default_backend({XlaNode.Backend, node: xla})
beam_call = fn -> :pong = GenServer.call({:baseline, base}, :ping) end
xla_ping = fn -> :pong = XlaNode.ping(xla) end

# First calls: Nx.exp on a fresh shape each time; the tensor is made (and its iota compiled)
# before the timing.
first_calls =
  for k <- 1..9 do
    t = Nx.iota({1000 + k}, type: :f32)
    B.time_us(fn -> Nx.exp(t) end)
  end

# Cached: Nx.add of two f32[4] tensors on the node, and of one and a number.
a = Nx.iota({4}, type: :f32)
b = Nx.add(a, 1.0)

add = fn -> Nx.add(a, b) end
add_number = fn -> Nx.add(a, 2.0) end

# The results are freed when the scope ends, outside the timings.
s =
  XlaNode.Backend.scope(fn ->
    for _ <- 1..500, do: {add.(), add_number.(), beam_call.(), xla_ping.()}

    B.interleave(
      [add: add, add_number: add_number, beam: beam_call, xla_ping: xla_ping],
      10,
      500
    )
  end)

[add_us, add_number_us, beam_us, ping_us] =
  Enum.map([:add, :add_number, :beam, :xla_ping], &B.median(s[&1]))

# 100,000 eager operations, 1,000 per scope, in this long-lived process.
x = Nx.broadcast(0.0, {16})
before = B.buffers(xla)

{ops_us, x} =
  :timer.tc(fn ->
    Enum.reduce(1..100, x, fn _, x ->
      next =
        XlaNode.Backend.scope(fn ->
          Enum.reduce(1..500, x, fn i, acc -> acc |> Nx.add(i) |> Nx.multiply(0.5) end)
        end)

      Nx.backend_deallocate(x)
      next
    end)
  end)

after_ops = B.buffers(xla)
Nx.backend_deallocate(x)

# The same without scopes or frees: what this process drops goes with its garbage (XlaNode.Keeper).
# The node's buffers, counted every 1,000 operations: the most beyond those before.
XlaNode.Keeper.sweep()
before_free = B.buffers(xla)

{free_us, {x, peak}} =
  :timer.tc(fn ->
    Enum.reduce(1..100, {Nx.broadcast(0.0, {16}), 0}, fn _, {x, peak} ->
      x = Enum.reduce(1..500, x, fn i, acc -> acc |> Nx.add(i) |> Nx.multiply(0.5) end)
      {x, max(peak, B.buffers(xla))}
    end)
  end)

:erlang.garbage_collect()
XlaNode.Keeper.sweep()
after_free = B.buffers(xla)
_ = x

IO.puts("""

## Nx eager operations on XlaNode.Backend (each a request to the node)
  first call of an operation (Nx.exp on a fresh f32[1000+k], compile included; median of 9): #{B.ms(B.median(first_calls))}
  cached, interleaved in 10 rounds of 500; medians:
    Nx.add(a, b), both f32[4] on the node: #{B.us(add_us)}
    Nx.add(a, 2.0), the scalar sent along: #{B.us(add_number_us)}
    GenServer.call to a BEAM node (:peer), :ping: #{B.us(beam_us)}
    the node's own :ping: #{B.us(ping_us)}
    ratio Nx.add / BEAM GenServer.call: #{B.ratio(add_us, beam_us)}; Nx.add / the node's :ping: #{B.ratio(add_us, ping_us)}
  100,000 eager operations (Nx.add, Nx.multiply) in one process, in 100 scopes of 1,000: #{:erlang.float_to_binary(ops_us / 1_000_000, decimals: 1)} s (#{B.us(ops_us / 100_000)} per operation); node buffers before #{before}, after #{after_ops}
  the same without scopes, what the process drops going with its garbage: #{:erlang.float_to_binary(free_us / 1_000_000, decimals: 1)} s (#{B.us(free_us / 100_000)} per operation); node buffers before #{before_free}, #{peak - before_free} more at the most, after (its garbage collected, a sweep) #{after_free}\
""")
