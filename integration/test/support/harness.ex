defmodule XlaNode.Harness do
  @moduledoc """
  Starts and stops `xla_node` OS processes and extra BEAM peer nodes for integration tests.

  Everything is real: the node binary, epmd, TCP, and OTP `:peer` nodes.

  ## xla_node processes

      node = Harness.start_node(net_ticktime: 4)   # %{name: :"xla_t12@host", os_pid: 4242, ...}
      GenServer.call({:xla, node.name}, :ping)
      Harness.log(node)                            # everything it wrote to stderr so far
      Harness.wait_for_log(node, "nodeup")         # poll until a line matches
      0 = Harness.stop_node(node)                  # SIGTERM, returns the exit status

  Each node's port is owned by a small GenServer (`XlaNode.Harness.NodeProc`) that collects
  stderr. `start_node/1` registers an `on_exit` callback that kills the OS process when called
  from a test process (pass `cleanup: false` to manage it yourself); `kill_all/0` (run after the
  suite by test_helper) kills any node still running.

  ## peers

      peer = Harness.start_peer()                  # %{pid: ..., node: :"p12@host", os_pid: ...}
      Harness.peer_call(peer, :erlang, :node, [])

  Peers get the runner's whole code path (`-pa`), so Elixir and every module compiled from
  `lib/` and `test/support/` (e.g. `XlaNode.PeerHelpers`) can run there. Modules defined in
  test files (`*.exs`) exist only in the runner's memory: put code that must run on a peer in
  `test/support/`.
  """

  alias XlaNode.Harness.NodeProc

  @default_cookie :xla_test
  @registry XlaNode.Harness.Registry

  ## Configuration

  @doc "The cookie the runner and (by default) every started node and peer use."
  def cookie, do: @default_cookie

  @doc "Path of the node binary: `$XLA_NODE_BIN`, else `../target/release/xla_node`."
  def bin_path do
    case System.get_env("XLA_NODE_BIN") do
      nil -> Path.expand("../target/release/xla_node", project_dir())
      path -> Path.expand(path)
    end
  end

  @doc """
  The PJRT plugin to pass with `--pjrt-plugin`: `$XLA_NODE_PJRT_PLUGIN`, else the default
  install location, resolved against the runner's HOME (tests that change HOME still find it).
  `nil` when neither exists (the node then uses its own default).
  """
  def plugin_path do
    case System.get_env("XLA_NODE_PJRT_PLUGIN") do
      nil ->
        base =
          System.get_env("XDG_DATA_HOME") ||
            Path.join(System.user_home() || "/nonexistent", ".local/share")

        path = Path.join(base, "xla_node/pjrt/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
        if File.regular?(path), do: path

      path ->
        path
    end
  end

  @doc """
  Extra node arguments from `$XLA_NODE_EXTRA_ARGS` (split as a shell would, quotes honoured),
  given to every node the tests start, after the harness's own: how the suite runs on another
  platform's terms (`scripts/gpu_check.sh` passes, e.g., `--preallocate false` on a GPU).
  """
  def extra_args do
    case System.get_env("XLA_NODE_EXTRA_ARGS") do
      nil -> []
      args -> OptionParser.split(args)
    end
  end

  @doc """
  The arguments every node of the suite gets besides its name and cookie: `--pjrt-plugin` with
  `plugin_path/0` (when there is one), then `extra_args/0`. For tests that start the binary
  themselves rather than through `start_node/1`.
  """
  def node_args do
    if(plugin = plugin_path(), do: ["--pjrt-plugin", plugin], else: []) ++ extra_args()
  end

  @doc """
  The platform the suite runs on (`"cpu"`, `"cuda"`, ...), as test_helper found it with
  `probe_platform/0`.
  """
  def platform, do: Application.fetch_env!(:xla_node_integration, :platform)

  @doc """
  Finds the platform the suite runs on: `"cpu"` unless `$XLA_NODE_PJRT_PLUGIN` or
  `$XLA_NODE_EXTRA_ARGS` is set, else what a node started on those terms reports in `:info`.
  test_helper excludes the tests tagged `:cpu_only` when it is not `"cpu"`.
  """
  def probe_platform do
    if System.get_env("XLA_NODE_PJRT_PLUGIN") || System.get_env("XLA_NODE_EXTRA_ARGS") do
      node = start_node(cleanup: false)

      try do
        {:ok, %{platform: platform}} = xla_call(node, :info)
        platform
      after
        stop_node(node, "KILL")
      end
    else
      "cpu"
    end
  end

  defp project_dir, do: Path.expand("../..", __DIR__)

  @doc "Where `scripts/kernels.sh` installs JAX (for PYTHONPATH)."
  def jax_path do
    base =
      System.get_env("XDG_DATA_HOME") ||
        Path.join(System.user_home() || "/nonexistent", ".local/share")

    Path.join(base, "xla_node/jax")
  end

  @doc """
  Runs `scripts/kernels.sh` (JAX 0.8.1 and the test kernel libraries under `target/kernels`),
  one test module at a time: it is idempotent, but two runs at once would build the same files.
  """
  def ensure_kernels! do
    if Application.get_env(:xla_node_integration, :platform, "cpu") != "cpu" and
         Enum.all?(["02", "03"], &File.exists?(kernel_library(&1))) do
      # Off the CPU the suite only loads the libraries (its tests against JAX, the counterpart
      # kernels.sh installs, run on the CPU alone): built already, nothing is fetched.
      :ok
    else
      run_kernels_script!()
    end
  end

  defp run_kernels_script! do
    script = Path.join(project_dir(), "../scripts/kernels.sh")

    {out, status} =
      :global.trans(
        {:xla_node_kernels, self()},
        fn -> System.cmd("bash", [script], stderr_to_stdout: true) end,
        [node()]
      )

    if status != 0, do: raise("scripts/kernels.sh failed:\n#{out}")
    :ok
  end

  @doc """
  The test kernel library `scripts/kernels.sh` builds against the headers of FFI `version`
  (`"02"` or `"03"`).
  """
  def kernel_library(version),
    do: Path.expand("../target/kernels/libxn_test_kernels_ffi#{version}.so", project_dir())

  @doc """
  A fresh node/peer name (no host part), unique on this machine: the test VM's OS pid keeps two
  suites running at once from registering the same name with epmd.
  """
  def unique_name(prefix \\ "xla_t"),
    do: "#{prefix}#{System.pid()}_#{System.unique_integer([:positive])}"

  @doc "The short host name, as both `erl -sname` and `xla_node --sname` complete names."
  def host do
    case Atom.to_string(node()) do
      "nonode@nohost" ->
        {:ok, h} = :inet.gethostname()
        h |> List.to_string() |> String.split(".") |> hd()

      full ->
        full |> String.split("@") |> List.last()
    end
  end

  @doc """
  Makes the runner a distributed node (short names) if it is not one already, after making sure
  epmd runs, and sets its cookie to `cookie/0`.
  """
  def ensure_distribution! do
    System.cmd("epmd", ["-daemon"])

    unless Node.alive?() do
      {:ok, _} = Node.start(:"itest_runner_#{System.pid()}", :shortnames)
    end

    Node.set_cookie(cookie())
    start_registry()
    :ok
  end

  ## xla_node processes

  @doc """
  Starts the node binary and waits until it is registered in epmd.

  Options:
    * `:sname` - short name without host (default: a unique `xla_tN`)
    * `:name` - long name, e.g. `"xla_t1@127.0.0.1"` (passed as `--name`, replaces `:sname`)
    * `:cookie` - string/atom (default `cookie/0`); `false` passes no `--cookie` and unsets
      `XLA_NODE_COOKIE`, so the node reads `$HOME/.erlang.cookie`
    * `:home` - HOME for the process
    * `:net_ticktime` - seconds
    * `:listen_port` - fixed distribution port (`--inet-dist-listen-min/max`)
    * `:pjrt_plugin` - plugin path (default `plugin_path/0`; `false` passes none)
    * `:args` - extra command-line arguments, after `extra_args/0` (which every node gets)
    * `:env` - extra environment, `[{"VAR", "value" | false}]` (`false` unsets)
    * `:stderr_file` - write the node's stderr (its log) to this file, as a shell's `2>file`
      does, instead of collecting it (`log/1` then holds only its stdout)
    * `:timeout` - how long to wait for the epmd registration and for `:xla` (default 30 s)
    * `:wait_ready` - after epmd, wait until `:xla` answers `:ping` through a throwaway raw
      connection (default true; its nodeup/nodedown lines name `ready_probeN@host`)
    * `:cleanup` - register an on_exit kill in the calling test (default true)

  Returns `%{name: node_atom, sname: "xla_tN", os_pid: integer, port: erlang_port,
  owner: pid, dist_port: tcp_port, cookie: atom | nil}`.
  """
  def start_node(opts \\ []) do
    bin = bin_path()

    unless File.regular?(bin) do
      raise "xla_node binary not found at #{bin} (build it with `cargo build --release` " <>
              "or set XLA_NODE_BIN)"
    end

    {name_args, alive_name, full_name} =
      case opts[:name] do
        nil ->
          sname = opts[:sname] || unique_name()
          {["--sname", sname], sname, :"#{sname}@#{host()}"}

        long ->
          [alive, _] = String.split(long, "@", parts: 2)
          {["--name", long], alive, String.to_atom(long)}
      end

    cookie =
      case Keyword.get(opts, :cookie, cookie()) do
        false -> nil
        c -> to_string(c)
      end

    plugin =
      case Keyword.get(opts, :pjrt_plugin, :default) do
        :default -> plugin_path()
        false -> nil
        p -> p
      end

    args =
      name_args ++
        if(cookie, do: ["--cookie", cookie], else: []) ++
        if(opts[:net_ticktime], do: ["--net-ticktime", "#{opts[:net_ticktime]}"], else: []) ++
        if(opts[:listen_port],
          do: [
            "--inet-dist-listen-min",
            "#{opts[:listen_port]}",
            "--inet-dist-listen-max",
            "#{opts[:listen_port]}"
          ],
          else: []
        ) ++
        if(plugin, do: ["--pjrt-plugin", plugin], else: []) ++
        extra_args() ++
        Keyword.get(opts, :args, [])

    env =
      [{"XLA_NODE_COOKIE", false}] ++
        if(opts[:home], do: [{"HOME", opts[:home]}], else: []) ++
        Keyword.get(opts, :env, [])

    env =
      for {k, v} <- env,
          do: {String.to_charlist(k), if(v, do: String.to_charlist(v), else: false)}

    # A node of the same name that just stopped may still be in epmd for a moment.
    eventually(fn -> not epmd_registered?(alive_name) end, 2_000)

    {:ok, owner} = GenServer.start(NodeProc, {bin, args, env, opts[:stderr_file]})
    os_pid = GenServer.call(owner, :os_pid)
    port = GenServer.call(owner, :port)
    register_os_pid(os_pid)

    node = %{
      name: full_name,
      sname: alive_name,
      os_pid: os_pid,
      port: port,
      owner: owner,
      dist_port: nil,
      cookie: cookie && String.to_atom(cookie)
    }

    if Keyword.get(opts, :cleanup, true), do: register_cleanup(fn -> cleanup_node(node) end)

    timeout = Keyword.get(opts, :timeout, 30_000)

    with {:ok, dist_port} <- wait_epmd(node, timeout),
         node = %{node | dist_port: dist_port},
         :ok <-
           if(Keyword.get(opts, :wait_ready, true),
             do: wait_ready(node, opts, timeout),
             else: :ok
           ) do
      node
    else
      {:error, why} ->
        log = log(node)
        cleanup_node(node)
        raise "xla_node #{full_name} did not come up: #{why}\n--- log ---\n#{log}"
    end
  end

  # The node registers in epmd slightly before its `:xla` server runs. Probe with a throwaway raw
  # distribution connection (not the runner's own, which would tie the runner to the node, e.g.
  # with a different net_ticktime) until `:xla` answers `:pong`.
  defp wait_ready(node, opts, timeout) do
    cookie =
      node.cookie ||
        File.read!(Path.join(opts[:home] || System.user_home!(), ".erlang.cookie"))
        |> String.trim()

    probe = fn ->
      name = "#{unique_name("ready_probe")}@#{host()}"

      case XlaNode.Harness.RawDist.connect(node, cookie: cookie, name: name) do
        {:ok, conn} ->
          reply = XlaNode.Harness.RawDist.gen_call(conn, :xla, :ping, 2_000)
          XlaNode.Harness.RawDist.close(conn)
          reply == {:ok, :pong}

        _ ->
          false
      end
    end

    if eventually(probe, timeout, 100), do: :ok, else: {:error, ":xla never answered :ping"}
  end

  defp wait_epmd(node, timeout) do
    deadline = System.monotonic_time(:millisecond) + timeout
    wait_epmd_loop(node, String.to_charlist(node.sname), deadline)
  end

  defp wait_epmd_loop(node, name, deadline) do
    registered =
      case :erl_epmd.names() do
        {:ok, names} -> List.keyfind(names, name, 0)
        _ -> nil
      end

    cond do
      registered != nil ->
        {:ok, elem(registered, 1)}

      exit_status(node) != nil ->
        {:error, "it exited with status #{exit_status(node)}"}

      System.monotonic_time(:millisecond) > deadline ->
        {:error, "timeout"}

      true ->
        Process.sleep(50)
        wait_epmd_loop(node, name, deadline)
    end
  end

  @doc "Whether `name` (a string without host, or a node atom) is registered in local epmd."
  def epmd_registered?(name) do
    name = name |> to_string() |> String.split("@") |> hd() |> String.to_charlist()

    case :erl_epmd.names() do
      {:ok, names} -> List.keymember?(names, name, 0)
      _ -> false
    end
  end

  @doc "Everything the node wrote to stderr (and stdout) so far, exactly as it wrote it."
  def log(%{owner: owner}), do: GenServer.call(owner, :log)

  @doc "The log as a list of lines."
  def log_lines(node), do: node |> log() |> String.split("\n", trim: true)

  @doc "Log lines matching `pattern` (a string to look for, a regex, or a predicate)."
  def log_matching(node, pattern), do: Enum.filter(log_lines(node), &line_matches?(&1, pattern))

  defp line_matches?(line, pattern) when is_binary(pattern), do: String.contains?(line, pattern)
  defp line_matches?(line, %Regex{} = re), do: Regex.match?(re, line)
  defp line_matches?(line, f) when is_function(f, 1), do: f.(line)

  defp line_matches?(line, patterns) when is_list(patterns),
    do: Enum.all?(patterns, &line_matches?(line, &1))

  @doc """
  Polls the log until a line matches `pattern` (see `log_matching/2`; a list means all of its
  patterns on the same line). Returns `{:ok, line}` or `{:error, :timeout}`.
  """
  def wait_for_log(node, pattern, timeout \\ 5_000) do
    deadline = System.monotonic_time(:millisecond) + timeout
    wait_log_loop(node, pattern, deadline)
  end

  defp wait_log_loop(node, pattern, deadline) do
    case log_matching(node, pattern) do
      [line | _] ->
        {:ok, line}

      [] ->
        if System.monotonic_time(:millisecond) > deadline do
          {:error, :timeout}
        else
          Process.sleep(50)
          wait_log_loop(node, pattern, deadline)
        end
    end
  end

  @doc "The OS exit status once the process has exited, else nil."
  def exit_status(%{owner: owner}) do
    if Process.alive?(owner), do: GenServer.call(owner, :exit_status), else: :unknown
  end

  @doc "Whether the node's OS process is still running."
  def os_alive?(node), do: exit_status(node) == nil

  @doc """
  Sends `signal` ("TERM", "INT", "KILL", ...) and waits for the process to exit. Returns its exit
  status (128 + signal number when killed by a signal), or `:timeout` (it is then SIGKILLed).
  """
  def stop_node(node, signal \\ "TERM", timeout \\ 10_000) do
    if os_alive?(node), do: System.cmd("kill", ["-#{signal}", "#{node.os_pid}"])

    case GenServer.call(node.owner, {:await_exit, timeout}, timeout + 1_000) do
      {:ok, status} ->
        unregister_os_pid(node.os_pid)
        status

      :timeout ->
        System.cmd("kill", ["-KILL", "#{node.os_pid}"])
        GenServer.call(node.owner, {:await_exit, 5_000}, 6_000)
        unregister_os_pid(node.os_pid)
        :timeout
    end
  end

  @doc "Sends a signal without waiting (e.g. STOP/CONT)."
  def signal(%{os_pid: os_pid}, signal) do
    {_, 0} = System.cmd("kill", ["-#{signal}", "#{os_pid}"])
    :ok
  end

  defp cleanup_node(node) do
    if Process.alive?(node.owner) do
      if os_alive?(node), do: stop_node(node, "KILL", 5_000)
      GenServer.stop(node.owner)
    else
      System.cmd("kill", ["-KILL", "#{node.os_pid}"], stderr_to_stdout: true)
    end

    unregister_os_pid(node.os_pid)
    :ok
  catch
    _, _ -> :ok
  end

  @doc "Connects the runner to the node and checks `:xla` answers."
  def connect!(node) do
    true = Node.connect(node.name)
    :pong = GenServer.call({:xla, node.name}, :ping)
    :ok
  end

  @doc """
  For a module's `setup_all`: one node for all its tests (started with `opts`, see
  `start_node/1`), connected, killed when they are done. Returns the context `%{node: node}`.
  """
  def start_shared_node(opts \\ []) do
    node = start_node(Keyword.put(opts, :cleanup, false))
    connect!(node)
    ExUnit.Callbacks.on_exit(fn -> stop_node(node, "KILL") end)
    %{node: node}
  end

  @doc "Asks the node for a new process of its own that echoes what it receives; returns its pid."
  def spawn_echo(node) do
    {:ok, pid} = GenServer.call({:xla, node.name}, :spawn_echo)
    true = is_pid(pid) and node(pid) == node.name
    pid
  end

  @doc "`GenServer.call({:xla, node}, request, timeout)`."
  def xla_call(node, request, timeout \\ 5_000),
    do: GenServer.call({:xla, node_name(node)}, request, timeout)

  defp node_name(%{name: n}), do: n
  defp node_name(n) when is_atom(n), do: n

  ## Peers

  @doc """
  Starts a BEAM peer node with OTP's `:peer` (unlinked, so tests that kill a peer do not take the
  test process down; an on_exit stops it). The peer gets `-setcookie`, the runner's code path and
  `args` (charlists or strings).

  Options: `:cookie` (default `cookie/0`), `:connection` (default: Erlang distribution; use
  `:standard_io` for peers the runner must not or cannot connect to: long names, a different
  net_ticktime), `:longnames` + `:host` (e.g. `"127.0.0.1"`), `:cleanup` (default true).

  Returns `%{pid: peer_control_pid, node: node_atom, os_pid: integer, connection: :dist |
  :standard_io}`.
  """
  def start_peer(name \\ nil, args \\ [], opts \\ []) do
    name = name || unique_name("peer")
    cookie = Keyword.get(opts, :cookie, cookie())

    code_path = Enum.flat_map(:code.get_path(), &[~c"-pa", &1])

    spec =
      %{
        name: String.to_charlist(to_string(name)),
        args:
          [~c"-setcookie", String.to_charlist(to_string(cookie))] ++
            Enum.map(args, &to_charlist/1) ++ code_path,
        wait_boot: 30_000
      }
      |> maybe_put(:connection, opts[:connection])
      |> maybe_put(:longnames, opts[:longnames])
      |> maybe_put(:host, opts[:host] && String.to_charlist(opts[:host]))

    {:ok, pid, peer_node} = :peer.start(spec)
    peer = %{pid: pid, node: peer_node, os_pid: nil, connection: opts[:connection] || :dist}
    os_pid = peer_call(peer, :os, :getpid, [], 15_000) |> List.to_integer()
    peer = %{peer | os_pid: os_pid}
    if Keyword.get(opts, :cleanup, true), do: register_cleanup(fn -> stop_peer(peer) end)
    peer
  end

  defp maybe_put(map, _k, nil), do: map
  defp maybe_put(map, k, v), do: Map.put(map, k, v)

  @doc "The peer's OS process id."
  def peer_os_pid(%{os_pid: os_pid}), do: os_pid

  @doc """
  Runs `apply(m, f, a)` on the peer: through `:erpc` over distribution, or through `:peer.call`
  for `connection: :standard_io` peers (OTP's `:peer.call` only works for those).
  """
  def peer_call(peer, m, f, a, timeout \\ 15_000)

  def peer_call(%{connection: :dist, node: node}, m, f, a, timeout),
    do: :erpc.call(node, m, f, a, timeout)

  def peer_call(%{pid: pid}, m, f, a, timeout), do: :peer.call(pid, m, f, a, timeout)

  @doc "Stops a peer; harmless if it is already gone. Kills its OS process if it hangs."
  def stop_peer(%{pid: pid, os_pid: os_pid}) do
    # A stopped (SIGSTOP) peer cannot halt: make sure it is running, then stop it.
    System.cmd("kill", ["-CONT", "#{os_pid}"], stderr_to_stdout: true)

    task =
      Task.async(fn ->
        try do
          :peer.stop(pid)
        catch
          :exit, _ -> :ok
        end
      end)

    case Task.yield(task, 5_000) || Task.shutdown(task, :brutal_kill) do
      nil -> System.cmd("kill", ["-KILL", "#{os_pid}"], stderr_to_stdout: true)
      _ -> :ok
    end

    :ok
  end

  @doc "Sends a signal to the peer's OS process (e.g. \"STOP\", \"CONT\", \"KILL\")."
  def signal_peer(%{os_pid: os_pid}, signal) do
    System.cmd("kill", ["-#{signal}", "#{os_pid}"], stderr_to_stdout: true)
    :ok
  end

  @doc """
  Loads `module` (as compiled on disk) on a peer. Peers already have the runner's code path, so
  this is only needed for modules compiled at runtime from a file; modules defined in `.exs` test
  files have no object code and cannot be shipped.
  """
  def load_module_on(peer, module) do
    case :code.get_object_code(module) do
      {^module, bin, file} ->
        {:module, ^module} = peer_call(peer, :code, :load_binary, [module, file, bin])
        :ok

      :error ->
        raise ArgumentError,
              "no object code for #{inspect(module)}; define it in test/support/ instead"
    end
  end

  ## Process bookkeeping

  @doc false
  def start_registry do
    case Agent.start(fn -> MapSet.new() end, name: @registry) do
      {:ok, _} -> :ok
      {:error, {:already_started, _}} -> :ok
    end
  end

  defp register_os_pid(os_pid) do
    start_registry()
    Agent.update(@registry, &MapSet.put(&1, os_pid))
  end

  defp unregister_os_pid(os_pid) do
    if Process.whereis(@registry), do: Agent.update(@registry, &MapSet.delete(&1, os_pid))
  end

  @doc "SIGKILLs every node process started by the harness that has not been stopped."
  def kill_all do
    if Process.whereis(@registry) do
      for os_pid <- Agent.get(@registry, & &1) do
        System.cmd("kill", ["-KILL", "#{os_pid}"], stderr_to_stdout: true)
      end

      Agent.update(@registry, fn _ -> MapSet.new() end)
    end

    :ok
  end

  defp register_cleanup(fun) do
    ExUnit.Callbacks.on_exit(make_ref(), fun)
  rescue
    # Not called from a test process: the caller cleans up (kill_all/0 runs after the suite).
    _ -> :ok
  end

  ## Small helpers for tests

  @doc "Polls `fun` until it returns a truthy value; returns it or `nil` after `timeout` ms."
  def eventually(fun, timeout \\ 5_000, interval \\ 50) do
    deadline = System.monotonic_time(:millisecond) + timeout
    eventually_loop(fun, deadline, interval)
  end

  defp eventually_loop(fun, deadline, interval) do
    case fun.() do
      result when result not in [nil, false] ->
        result

      _ ->
        if System.monotonic_time(:millisecond) > deadline do
          nil
        else
          Process.sleep(interval)
          eventually_loop(fun, deadline, interval)
        end
    end
  end

  @doc "Runs `fun` and returns `{milliseconds, result}`."
  def timed(fun) do
    t0 = System.monotonic_time(:microsecond)
    result = fun.()
    {(System.monotonic_time(:microsecond) - t0) / 1000, result}
  end
end

defmodule XlaNode.Harness.NodeProc do
  @moduledoc false
  # Owns one xla_node port: collects its output, remembers its exit status.
  use GenServer

  @impl true
  def init({bin, args, env, stderr_file}) do
    port_opts = [:binary, :exit_status, :use_stdio, env: env]

    port =
      case stderr_file do
        nil ->
          Port.open({:spawn_executable, bin}, [:stderr_to_stdout, args: args] ++ port_opts)

        path ->
          # `exec`: the shell becomes the node, so the port's OS pid is the node's.
          redirect = ~S(log="$1"; shift; exec "$0" "$@" 2>"$log")
          sh = System.find_executable("sh")

          Port.open(
            {:spawn_executable, sh},
            [args: ["-c", redirect, bin, path | args]] ++ port_opts
          )
      end

    {:os_pid, os_pid} = Port.info(port, :os_pid)

    {:ok,
     %{port: port, os_pid: os_pid, log: [], status: nil, waiters: [], copy: copy(args, os_pid)}}
  end

  @impl true
  def handle_call(:os_pid, _from, s), do: {:reply, s.os_pid, s}
  def handle_call(:port, _from, s), do: {:reply, s.port, s}

  def handle_call(:log, _from, s),
    do: {:reply, s.log |> Enum.reverse() |> IO.iodata_to_binary(), s}

  def handle_call(:exit_status, _from, s), do: {:reply, s.status, s}

  def handle_call({:await_exit, timeout}, from, s) do
    if s.status != nil do
      {:reply, {:ok, s.status}, s}
    else
      ref = make_ref()
      Process.send_after(self(), {:await_timeout, ref}, timeout)
      {:noreply, %{s | waiters: [{ref, from} | s.waiters]}}
    end
  end

  @impl true
  def handle_info({port, {:data, data}}, %{port: port} = s) do
    if s.copy, do: File.write(s.copy, data, [:append])
    {:noreply, %{s | log: [data | s.log]}}
  end

  def handle_info({port, {:exit_status, status}}, %{port: port} = s) do
    if s.copy, do: File.write(s.copy, "\n[exit status #{status}]\n", [:append])

    for {_, from} <- s.waiters, do: GenServer.reply(from, {:ok, status})
    {:noreply, %{s | status: status, waiters: []}}
  end

  def handle_info({:await_timeout, ref}, s) do
    case List.keytake(s.waiters, ref, 0) do
      {{_, from}, rest} ->
        GenServer.reply(from, :timeout)
        {:noreply, %{s | waiters: rest}}

      nil ->
        {:noreply, s}
    end
  end

  def handle_info(_, s), do: {:noreply, s}

  # XLA_NODE_TEST_LOG_DIR (scripts/gpu_check.sh sets it): every node's output is also written
  # there, one file per node, for a look after the run.
  defp copy(args, os_pid) do
    with dir when is_binary(dir) <- System.get_env("XLA_NODE_TEST_LOG_DIR") do
      File.mkdir_p!(dir)
      name = args |> Enum.drop_while(&(&1 != "--sname")) |> Enum.at(1, "node")
      Path.join(dir, "#{name}_#{os_pid}.log")
    end
  end
end
