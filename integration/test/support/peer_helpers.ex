defmodule XlaNode.PeerHelpers do
  @moduledoc """
  Code meant to run on peer nodes through `XlaNode.Harness.peer_call/5` (peers share the runner's
  code path, so this module is loaded there on first use). Everything returns plain data: no
  closures of test modules cross nodes.
  """

  @doc "`GenServer.call({:xla, node}, request)` from the peer, results wrapped so exits come back."
  def call(target, request, timeout \\ 5_000) do
    {:ok, GenServer.call(target, request, timeout)}
  catch
    :exit, reason -> {:exit, reason}
  end

  @doc """
  Starts an `XlaNode.Local` with `opts` under a supervisor of its own that outlives the call
  (unlinked); returns `{node, node's OS pid, this VM's OS pid}`.
  """
  def start_local(opts) do
    {:ok, sup} = Supervisor.start_link([{XlaNode.Local, opts}], strategy: :one_for_one)
    Process.unlink(sup)
    [{_, pid, _, _}] = Supervisor.which_children(sup)
    {XlaNode.Local.node(pid), XlaNode.Local.os_pid(pid), System.pid() |> String.to_integer()}
  end

  @doc "Connects to `node` and pings `:xla`."
  def connect_and_ping(node) do
    {Node.connect(node), call({:xla, node}, :ping)}
  end

  @doc """
  Echoes a random binary of `size` bytes through `{:xla, node}` and checks it came back intact.
  Returns `{:ok, ms}` or `{:mismatch, size_back}` / `{:exit, reason}`.
  """
  def echo_big(node, size, timeout \\ 120_000) do
    bin = :crypto.strong_rand_bytes(size)
    t0 = System.monotonic_time(:millisecond)

    case call({:xla, node}, {:echo, bin}, timeout) do
      {:ok, ^bin} -> {:ok, System.monotonic_time(:millisecond) - t0}
      {:ok, other} when is_binary(other) -> {:mismatch, byte_size(other)}
      {:ok, other} -> {:mismatch, other}
      other -> other
    end
  end

  @doc "Makes `n` concurrent `{:echo, {peer_node, i}}` calls; returns how many came back right."
  def concurrent_echoes(node, n) do
    1..n
    |> Task.async_stream(
      fn i -> call({:xla, node}, {:echo, {node(), i, self()}}) == {:ok, {node(), i, self()}} end,
      max_concurrency: 50,
      timeout: 30_000
    )
    |> Enum.count(&(&1 == {:ok, true}))
  end

  @doc """
  Spawns a process on the peer that monitors `target` (a pid or `{name, node}`) and stays alive.
  Returns its pid; the monitor lives as long as the peer does.
  """
  def spawn_monitor_holder(target) do
    parent = self()

    pid =
      spawn(fn ->
        ref = Process.monitor(target)
        send(parent, {:monitoring, self()})

        receive do
          {:DOWN, ^ref, _, _, _} -> Process.sleep(:infinity)
        end
      end)

    receive do
      {:monitoring, ^pid} -> pid
    after
      5_000 -> raise "monitor holder did not start"
    end
  end

  @doc "Spawns a process on the peer that links to `target` and stays alive; returns its pid."
  def spawn_link_holder(target) do
    parent = self()

    pid =
      spawn(fn ->
        Process.link(target)
        send(parent, {:linked, self()})
        Process.sleep(:infinity)
      end)

    receive do
      {:linked, ^pid} -> pid
    after
      5_000 -> raise "link holder did not start"
    end
  end

  @doc """
  Spawns a process on the peer that links to `target`, then exits with `reason`. Returns once
  that process is dead.
  """
  def link_and_exit(target, reason) do
    parent = self()

    {pid, ref} =
      spawn_monitor(fn ->
        Process.link(target)
        # Signals from one process to another arrive in order: LINK before the exit signal.
        send(parent, {:linked, self()})
        receive do: (:go -> exit(reason))
      end)

    receive do
      {:linked, ^pid} -> :ok
    after
      5_000 -> raise "did not link"
    end

    send(pid, :go)

    receive do
      {:DOWN, ^ref, :process, ^pid, why} -> {:ok, why}
    after
      5_000 -> :timeout
    end
  end

  @doc """
  Spawns a process on the peer that subscribes to `:net_kernel.monitor_nodes(true, node_type:
  :all)` and forwards every event to `dest` as `{:peer_saw, event}` (after sending
  `:forwarder_ready`). Returns its pid.
  """
  def spawn_node_forwarder(dest) do
    spawn(fn ->
      :ok = :net_kernel.monitor_nodes(true, node_type: :all)
      send(dest, :forwarder_ready)
      forward_loop(dest)
    end)
  end

  defp forward_loop(dest) do
    receive do
      msg -> send(dest, {:peer_saw, msg})
    end

    forward_loop(dest)
  end

  @doc """
  Evaluates the expressions of an IEx session in order, in one process (so that what the session
  creates, an executable for instance, keeps its owner until the end), each with the bindings of
  those before it. `steps` are `{code, printed}`: `printed` the result the session shows, as
  Elixir code, or nil. Returns `[{code, value, printed_value | :none}]`.
  """
  def eval_session(steps) do
    {results, _binding} =
      Enum.map_reduce(steps, [], fn {code, printed}, binding ->
        {value, binding} = Code.eval_string(code, binding)
        shown = if printed, do: elem(Code.eval_string(printed), 0), else: :none
        {{code, value, shown}, binding}
      end)

    results
  end

  @doc """
  Compiles `mlir` on `node` and runs it with `args` and `opts`, from the calling process (an
  executable lives as long as the process that compiled it, so a compile made through one
  `:peer.call` cannot be run from another). Returns the run's reply, or `{:compile, error}`.
  """
  def compile_and_run(node, mlir, args, opts \\ []) do
    case call({:xla, node}, {:compile, mlir}, 60_000) do
      {:ok, {:ok, exe}} ->
        with {:ok, reply} <- call({:xla, node}, {:run, exe, args, opts}, 30_000), do: reply

      other ->
        {:compile, other}
    end
  end

  @doc """
  Compiles x + 1 on f32[4] (`XlaNode.Load.plus_one_program/0`) on `node`, then keeps `clients`
  processes running it for `ms` milliseconds (`XlaNode.Load.run_clients/4`); returns Load's
  summary.
  """
  def keep_running(node, clients, ms) do
    {:ok, {:ok, exe}} = call({:xla, node}, {:compile, XlaNode.Load.plus_one_program()}, 60_000)
    XlaNode.Load.run_clients(node, clients, ms, [{:tiny, exe}])
  end

  @doc """
  Starts a process (on the peer, or here) that holds `{buffer, token}` pairs as an
  application's process would, in its state, used later: `{:hold, pairs, from}` keeps `pairs`
  and answers `:holds`; `{:await, fun, from}` runs `fun` in a `Task` and awaits it, as
  `Task.async/1` and `Task.await/1` do, keeps the pairs it returns, and answers `{:buffers,
  buffers}` (the references only); `{:use, from}` uses what it holds (`XlaNode.Keeper.hold/2`
  on each pair) and answers `:used`; `{:read, node, from}` reads each buffer it holds from
  `{:xla, node}` and answers `{:read, results}`; `{:drop, from}` drops all, collects its
  garbage and answers `:dropped`. `keep?`: whether it tells its node's `XlaNode.Keeper` it holds
  each pair (`XlaNode.Keeper.hold/2`, what `XlaNode.Backend` does on each use). Returns its pid.
  """
  def spawn_term_holder(keep? \\ true) do
    spawn(fn -> term_holder(keep?, []) end)
  end

  defp term_holder(keep?, held) do
    receive do
      {:hold, pairs, from} ->
        if keep?,
          do: Enum.each(pairs, fn {buffer, token} -> XlaNode.Keeper.hold(token, buffer) end)

        send(from, :holds)
        term_holder(keep?, pairs ++ held)

      {:await, fun, from} ->
        pairs = fun |> Task.async() |> Task.await(60_000)
        send(from, {:buffers, Enum.map(pairs, &elem(&1, 0))})
        term_holder(keep?, pairs ++ held)

      {:use, from} ->
        Enum.each(held, fn {buffer, token} -> XlaNode.Keeper.hold(token, buffer) end)
        send(from, :used)
        term_holder(keep?, held)

      {:read, node, from} ->
        results = for {buffer, _token} <- held, do: call({:xla, node}, {:read, buffer})
        send(from, {:read, results})
        term_holder(keep?, held)

      {:drop, from} ->
        dropped(keep?, from)
    end
  end

  # What it held is no longer an argument here: the collection finds none of it live.
  defp dropped(keep?, from) do
    :erlang.garbage_collect()
    send(from, :dropped)
    term_holder(keep?, [])
  end

  @doc "Starts the client's application on the peer (its `XlaNode.Keeper` among others)."
  def start_client, do: Application.ensure_all_started(:xla_node_client)
end
