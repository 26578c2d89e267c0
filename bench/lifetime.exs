# What the lifetime of a tensor costs (XlaNode.Keeper: a buffer lives while a process holds its
# token), against the cost of an eager operation, measured in the same run (bench/run.sh
# lifetime):
#
#   * an eager operation's request: a run of a cached program taking a buffer and keeping its
#     result on the node (what an XlaNode.Backend eager operation sends), caller-held, the
#     baseline; and the same run with owner: the keeper, its result tracked and its argument
#     handed to XlaNode.Keeper.hold/2, as XlaNode.Backend does now; interleaved in rounds;
#   * the calling process's part alone, per tensor: track/1 (a token and a message to the keeper)
#     and hold/2 of a token made here (no lookup) and of a copy that came back from another node
#     (one lookup in the keeper's table);
#   * the keeper's part, per tensor: its message, learning its id (a probe per 64 tokens), and
#     the sweeps the tokens' arrival brings;
#   * a sweep, with 1,000, 10,000 and 100,000 live tokens, per live token; and the keeper's
#     memory per live token;
#   * a hand-over of buffers to a process of another node (a peer VM running the client).
#
# Runs in the client's Mix project:
#   cd elixir_client && elixir --sname NAME --cookie COOKIE -S mix run ../bench/lifetime.exs XLA_NODE_SNAME

[xla_name] = System.argv()
host = node() |> Atom.to_string() |> String.split("@") |> List.last()
xla = :"#{xla_name}@#{host}"
true = Node.connect(xla)
Code.require_file("timing.exs", __DIR__)

defmodule Bench.Lifetime do
  alias XlaNode.Keeper

  defdelegate median(samples), to: Bench.Timing

  def us(x), do: :erlang.float_to_binary(x / 1, decimals: 2) <> " us"
  def pct(a, b), do: :erlang.float_to_binary(100 * a / b, decimals: 1) <> "%"

  # Microseconds per call of `fun` over `n` calls, the median of `rounds` such batches.
  def per_call(fun, n, rounds \\ 7) do
    for(_ <- 1..rounds, do: Bench.Timing.time(fn -> for _ <- 1..n, do: fun.() end) / n)
    |> median()
  end

  # Tokens for `n` references standing for buffers (references of this node: the keeper asks
  # no node about them, and releases them, once dropped, to an :xla this node has not got).
  def tokens(n) do
    buffers = for _ <- 1..n, do: make_ref()
    {buffers, Keeper.track(buffers)}
  end

  def keeper_memory, do: elem(Process.info(Keeper.owner(), :memory), 1)

  @doc """
  Microseconds of CPU the VM's schedulers spent running Erlang code and collecting garbage
  while `fun` ran, by microstate accounting (its `emulator` and `gc` states: `other` holds
  their spinning when idle); and `fun`'s result.
  """
  def cpu_us(fun) do
    :erlang.system_flag(:microstate_accounting, :reset)
    :erlang.system_flag(:microstate_accounting, true)
    result = fun.()
    :erlang.system_flag(:microstate_accounting, false)
    threads = :erlang.statistics(:microstate_accounting)

    work =
      for %{type: type, counters: counters} <- threads,
          type in [:scheduler, :dirty_cpu_scheduler],
          {state, ticks} <- counters,
          state in [:emulator, :gc],
          reduce: 0,
          do: (acc -> acc + ticks)

    {work * 1_000_000 / :erlang.convert_time_unit(1, :second, :perf_counter), result}
  end
end

alias Bench.Lifetime, as: B
alias XlaNode.Keeper

IO.puts(
  "## lifetime (XlaNode.Keeper), #{:erlang.system_info(:otp_release)} / #{System.version()}"
)

# The baseline: x + 1 on a buffer, its result kept on the node, held by this process.
mlir = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %r = stablehlo.add %x, %one : tensor<4xf32>
  return %r : tensor<4xf32>
}
"""

exe = XlaNode.compile!(xla, mlir)
x = XlaNode.to_device!(xla, {<<0::128>>, {{:f, 32}, [4]}}, owner: Keeper.owner())
[x_token] = Keeper.track([x])
owner = Keeper.owner()

plain = fn -> {:ok, [_y]} = XlaNode.run(xla, exe, [x], keep_on_device: true) end

kept = fn ->
  Keeper.hold(x_token, x)
  {:ok, [y]} = XlaNode.run(xla, exe, [x], keep_on_device: true, owner: owner)
  Keeper.track([y])
end

# The baseline's results stay this process's until it exits (no frees among the timings); the
# kept ones go with the keeper's sweeps, as they would. Rounds alternate which goes first.
for _ <- 1..200, do: {plain.(), kept.()}

rounds =
  for round <- 1..40 do
    order =
      if rem(round, 2) == 0, do: [plain: plain, kept: kept], else: [kept: kept, plain: plain]

    for {name, fun} <- order, into: %{}, do: {name, B.per_call(fun, 50, 1)}
  end

{m_plain, m_kept} =
  {B.median(Enum.map(rounds, & &1.plain)), B.median(Enum.map(rounds, & &1.kept))}

IO.puts("eager request, caller-held (baseline): #{B.us(m_plain)} median")

IO.puts(
  "eager request, kept while held: #{B.us(m_kept)} median " <>
    "(#{B.pct(m_kept - m_plain, m_plain)} over the baseline; rounds interleaved)"
)

:erlang.garbage_collect()
Keeper.sweep()

# The calling process's part alone: a tensor made (track/1), and used (hold/2) here, or after
# it came back from another node (a copy, looked up in the keeper's table).
buffer = make_ref()
track = B.per_call(fn -> Keeper.track([buffer]) end, 2_000)
hold = B.per_call(fn -> Keeper.hold(x_token, x) end, 20_000)
# As a copy arrives: part of a larger binary (the message's).
copy = binary_part(x_token <> <<0>>, 0, byte_size(x_token))
hold_copy = B.per_call(fn -> Keeper.hold(copy, x) end, 20_000)
:erlang.garbage_collect()
Keeper.sweep()

IO.puts(
  "per tensor, in the calling process: track #{B.us(track)}, hold #{B.us(hold)} " <>
    "(#{B.us(hold_copy)} for a copy that came back from another node): " <>
    "#{B.pct(track + hold, m_plain)} of the baseline request"
)

# The keeper's part: its messages, learning the ids and the sweeps they bring, for 10,000
# tokens tracked while it was suspended, timed from its resumption to its answer to a sweep
# after them, less a sweep alone.
n = 10_000
keeper = Keeper.owner()
before = Keeper.stats()
:sys.suspend(keeper)
{buffers, tokens} = B.tokens(n)

{busy_cpu, _} =
  B.cpu_us(fn ->
    :sys.resume(keeper)
    Keeper.sweep()
  end)

after_busy = Keeper.stats()
{sweep_cpu, _} = B.cpu_us(fn -> Keeper.sweep() end)
after_sweep = Keeper.stats()
keeper_cpu = (busy_cpu - sweep_cpu) / n

in_sweeps =
  (after_busy.sweep_us - before.sweep_us - (after_sweep.sweep_us - after_busy.sweep_us)) / n

keeper_part = max(keeper_cpu, in_sweeps)

IO.puts(
  "per tensor, in the keeper: #{B.us(keeper_cpu)} of CPU (its message, its id learnt, the " <>
    "sweeps its arrival brings), #{B.us(in_sweeps)} of the keeper's time in sweeps; " <>
    "#{B.pct(keeper_part, m_plain)} of the baseline request, the larger"
)

_ = {buffers, tokens}
:erlang.garbage_collect()
Keeper.sweep()

sweeps =
  for live <- [1_000, 10_000, 100_000] do
    held = B.tokens(live)
    Keeper.sweep()
    memory = B.keeper_memory()
    times = for _ <- 1..7, do: elem(B.cpu_us(fn -> Keeper.sweep() end), 0)
    sweep = B.median(times)
    per_live = sweep / live
    # A sweep comes once as many tokens were tracked as the last one left (at least 1,024), or
    # on a timer at least 50 of its own durations apart.
    per_made = sweep / max(1024, live)

    IO.puts(
      "sweep of #{live} live tokens: #{B.us(sweep)} (#{B.us(per_live)} a live token; " <>
        "#{B.us(per_made)} a tensor made, at most; the keeper's memory " <>
        "#{div(memory, live)} bytes a live token)"
    )

    _ = held
    :erlang.garbage_collect()
    Keeper.sweep()
    {live, per_made}
  end

total = track + hold + keeper_part + elem(List.keyfind(sweeps, 10_000, 0), 1)

IO.puts(
  "per tensor made and used once, with 10,000 live: #{B.us(total)}, " <>
    "#{B.pct(total, m_plain)} of the baseline request (target: under 5%)"
)

# A hand-over to a process of another node (XlaNode.Keeper.hand_over/3, what
# XlaNode.Backend.hand_over/2 calls): a peer VM running the client, and a process there that
# keeps what it is handed; each call hands buffers not handed before (so that the peer's keeper
# takes its holds on them), of 1 and of 16 buffers, timed one by one, its median against the
# baseline request.
{:ok, peer, peer_node} =
  :peer.start(%{
    name: :"bench_lifetime_peer_#{System.pid()}",
    args:
      [~c"-setcookie", Atom.to_charlist(Node.get_cookie())] ++
        Enum.flat_map(:code.get_path(), &[~c"-pa", &1]),
    wait_boot: 30_000
  })

{:ok, _} = :erpc.call(peer_node, Application, :ensure_all_started, [:xla_node_client])
receiver = Node.spawn(peer_node, Process, :sleep, [:infinity])

for count <- [1, 16] do
  calls = 200

  batches =
    for _ <- 1..calls do
      buffers =
        for _ <- 1..count,
            do: XlaNode.to_device!(xla, {<<0::128>>, {{:f, 32}, [4]}}, owner: Keeper.owner())

      Enum.zip(Keeper.track(buffers), buffers)
    end

  times =
    for pairs <- batches do
      Bench.Timing.time(fn -> :ok = Keeper.hand_over(pairs, receiver) end)
    end

  m = B.median(times)

  IO.puts(
    "hand_over of #{count} buffer(s) to a process of another node: #{B.us(m)} median " <>
      "(#{:erlang.float_to_binary(m / m_plain, decimals: 2)}x the baseline request)"
  )
end

Process.exit(receiver, :kill)
:peer.stop(peer)
