defmodule XlaNode.Launcher.Port do
  @moduledoc """
  A compute node run by a command that this VM starts and holds through a port: the process
  behind `XlaNode.Local` and `XlaNode.Launcher.SSH`, and the building block of a launcher of
  your own whose command starts the node elsewhere while carrying its standard input
  (`kubectl run -i`, a cloud provider's CLI; see `XlaNode.Launcher`).

  The command runs `xla_node` with `--cookie-from-stdin --exit-on-stdin-close` (and the node
  name given here as `:node`). This process writes this VM's cookie on the node's standard input
  once the node asks for it (a line it writes on standard error before it reads the cookie), so
  that the cookie is in no command line, and holds that input open: the node stops when it
  closes, which happens when this process stops and when this VM ends, however it ends
  (`kill -9` included: the kernel closes the pipe). Through `ssh` the same holds: the remote
  node's input closes with the connection. A command that exits before the node asks (a refused
  argument, `ssh` failing to connect) is never written to, so that its exit status and its
  last lines reach the error.

  `start_link/1` returns once the node answers `:ping` (this VM connects to it), or the error
  that kept it from doing so: the command exited (with the last lines it wrote), or did not
  serve within `:start_timeout`. Every line the command writes (the node's log, on stderr; the
  command's own complaints) goes to `Logger`, at the level the node gave it (or XLA's own log, its
  severity letter; `:warning` for any other line), with `xla_node: node` in its metadata. Once started, a node that
  exits stops this process with `{:xla_node_exited, status}`, so that a supervisor restarts it
  (under a new node name) as any child; stopping this process stops the node: SIGTERM, the
  node's graceful stop (at most 3 s), then SIGKILL after `:stop_timeout`, and returns once the
  command has exited and the node has left this VM's cluster.

  The spec:

    * `:command` - the executable (an absolute path) and `:args`, its arguments
    * `:node` - the node name the command starts the node as (required)
    * `:env` - `[{name, value | false}]` for the command (`false` unsets a variable)
    * `:label` - how logs and errors name it (default: the node name)
    * `:start_timeout` - milliseconds to wait for `:ping` (default 60_000)
    * `:stop_timeout` - milliseconds a graceful stop may take before SIGKILL (default 10_000)
    * `:owner` - a pid: when it exits, the node is stopped (what a pool's nodes use)
    * `:name` - registers this process under that atom
    * `:explain` - `fn status, lines -> message end`: what the command exiting with `status`
      before the node served means (`XlaNode.Launcher.SSH` tells an ssh failure from the
      node's own)
  """

  use GenServer

  require Logger

  alias XlaNode.Error

  # What the node writes on standard error, under --cookie-from-stdin, before it reads the
  # cookie (`COOKIE_PROMPT` in the node's src/shutdown.rs).
  @cookie_prompt "xla_node: waiting for the cookie on standard input"
  @log_line ~r/\A\d{4}-\d\d-\d\dT\S+\s+(TRACE|DEBUG|INFO|WARN|ERROR)\s+(.*)\z/s
  # XLA's own C++ log (absl): severity letter, date, time, thread, file:line] message.
  @absl_line ~r/\A([IWEF])\d{4} [0-9:.]+\s+\d+ (\S+\] .*)\z/s
  @kept_lines 20

  @doc "Starts the command, linked to the caller; returns once the node answers `:ping`."
  @spec start_link(map() | keyword()) :: GenServer.on_start()
  def start_link(spec), do: start_with(&GenServer.start_link/3, spec)

  @doc "As `start_link/1`, without a link (see the `:owner` of the spec)."
  @spec start(map() | keyword()) :: GenServer.on_start()
  def start(spec), do: start_with(&GenServer.start/3, spec)

  defp start_with(start, spec) do
    spec = Map.new(spec)
    gen_opts = if spec[:name], do: [name: spec[:name]], else: []
    # The start waits for the node itself (:start_timeout), then the spawn and the stop of a
    # node that did not come up.
    start.(__MODULE__, spec, [timeout: :infinity] ++ gen_opts)
  end

  @doc "The node's name."
  @spec node(GenServer.server()) :: node()
  def node(server), do: GenServer.call(server, :node)

  @doc "The OS pid of the command (the node itself where the command is the node binary)."
  @spec os_pid(GenServer.server()) :: non_neg_integer()
  def os_pid(server), do: GenServer.call(server, :os_pid)

  @doc "Stops the node and this process; returns once the node is gone (at once if it was)."
  @spec stop(GenServer.server(), timeout()) :: :ok
  def stop(server, timeout \\ :infinity) do
    GenServer.stop(server, :normal, timeout)
  catch
    # It had stopped, or stopped meanwhile for a reason of its own: the node is gone either way.
    :exit, {reason, {GenServer, :stop, _}} when reason != :timeout -> :ok
  end

  @doc false
  # `{pid, node}` of the started node registered as `name`, or nil: how `XlaNode` finds the node
  # an `XlaNode.Local` name stands for without asking its process.
  def lookup(name) when is_atom(name) do
    case :persistent_term.get({__MODULE__, name}, nil) do
      {pid, _node} = found -> if Process.alive?(pid), do: found
      nil -> nil
    end
  end

  ## GenServer

  @impl true
  def init(spec) do
    # To stop the node when the supervisor (or whoever linked to this process) stops it.
    Process.flag(:trap_exit, true)
    if owner = spec[:owner], do: Process.monitor(owner)

    state = %{
      node: Map.fetch!(spec, :node),
      label: spec[:label] || to_string(spec.node),
      name: spec[:name],
      owner: spec[:owner],
      explain: spec[:explain],
      stop_timeout: Map.get(spec, :stop_timeout, 10_000),
      port: nil,
      os_pid: nil,
      cookie_sent: false,
      partial: "",
      lines: :queue.new()
    }

    with {:ok, state} <- open(state, spec),
         {:ok, state} <- await_ready(state, deadline(Map.get(spec, :start_timeout, 60_000))) do
      if state.name, do: :persistent_term.put({__MODULE__, state.name}, {self(), state.node})
      {:ok, state}
    else
      {:error, error, state} ->
        stop_command(state)
        {:stop, error}
    end
  end

  defp open(state, spec) do
    env = for {k, v} <- Map.get(spec, :env, []), do: {to_charlist(k), v && to_charlist(v)}

    port =
      Port.open({:spawn_executable, spec.command}, [
        :binary,
        :exit_status,
        :use_stdio,
        :stderr_to_stdout,
        {:line, 16_384},
        args: Map.get(spec, :args, []),
        env: env
      ])

    # nil: the command exited already, and its exit status is on its way.
    os_pid =
      case Port.info(port, :os_pid) do
        {:os_pid, os_pid} -> os_pid
        nil -> nil
      end

    {:ok, %{state | port: port, os_pid: os_pid}}
  catch
    :error, reason ->
      {:error,
       launch_error(state, "cannot run #{spec.command}: #{inspect(reason)}", {:spawn, reason}),
       state}
  end

  # Until the node answers :ping, the command exits, the owner goes, or the deadline passes
  # (checked each time round: a command that keeps writing must not hold the start up). What
  # the command wrote and its exit are taken before the node is asked again: a command that
  # exited at once is an answer without a round of connection attempts (which a busy
  # net_kernel makes slow).
  defp await_ready(state, deadline) do
    case next_event(state, 0) do
      {:continue, state} ->
        await_ready(state, deadline)

      {:done, result} ->
        result

      :none ->
        cond do
          serving?(state.node) ->
            {:ok, state}

          past?(deadline) ->
            message =
              "did not answer :ping in time (start_timeout)#{never_asked(state)}" <>
                last_lines(state)

            {:error, launch_error(state, message, :timeout), state}

          true ->
            case next_event(state, wait_time(deadline)) do
              {:continue, state} -> await_ready(state, deadline)
              {:done, result} -> result
              :none -> await_ready(state, deadline)
            end
        end
    end
  end

  # The command's next line or exit, the owner's exit or a stop, within `timeout` ms.
  defp next_event(state, timeout) do
    port = state.port

    receive do
      {^port, {:data, data}} ->
        {:continue, output(state, data)}

      {^port, {:exit_status, status}} ->
        state = flush_output(%{state | port: nil})
        {:done, {:error, exited_error(state, status), state}}

      # The command closed its input once the node had asked for the cookie, before it was
      # written (an Erlang port closed by `epipe` reports no exit status).
      {:EXIT, ^port, reason} ->
        state = flush_output(%{state | port: nil})
        message = "closed its standard input (#{inspect(reason)}) before it answered :ping"

        {:done,
         {:error, launch_error(state, message <> last_lines(state), {:exit, reason}), state}}

      {:DOWN, _, :process, owner, reason} when owner == state.owner ->
        message = "its owner exited (#{inspect(reason)})"
        {:done, {:error, launch_error(state, message, :owner_down), state}}

      {:EXIT, from, reason} when from != port ->
        {:done, {:error, launch_error(state, "stopped while starting", {:exit, reason}), state}}
    after
      timeout -> :none
    end
  end

  defp serving?(node) do
    Node.connect(node) == true and
      try do
        GenServer.call({:xla, node}, :ping, 5_000) == :pong
      catch
        :exit, _ -> false
      end
  end

  @impl true
  def handle_call(:node, _from, state), do: {:reply, state.node, state}
  def handle_call(:os_pid, _from, state), do: {:reply, state.os_pid, state}

  @impl true
  def handle_info({port, {:data, data}}, %{port: port} = state),
    do: {:noreply, output(state, data)}

  def handle_info({port, {:exit_status, status}}, %{port: port} = state) do
    state = flush_output(%{state | port: nil})
    Logger.error("#{state.label} exited with status #{status}", xla_node: state.node)
    {:stop, {:xla_node_exited, status}, state}
  end

  def handle_info({:DOWN, _, :process, owner, _reason}, %{owner: owner} = state),
    do: {:stop, :shutdown, state}

  # The port closed without an exit status (a write to a command that closed its input).
  def handle_info({:EXIT, port, reason}, %{port: port} = state) do
    state = flush_output(%{state | port: nil})
    Logger.error("#{state.label} closed its port (#{inspect(reason)})", xla_node: state.node)
    {:stop, {:xla_node_exited, reason}, state}
  end

  # The port's own exit signal (its exit status came first), and those of processes this one
  # linked to while starting.
  def handle_info({:EXIT, _from, _reason}, state), do: {:noreply, state}
  def handle_info(_message, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, state) do
    if state.name && :persistent_term.get({__MODULE__, state.name}, nil) == {self(), state.node},
      do: :persistent_term.erase({__MODULE__, state.name})

    stop_command(state)
  end

  ## Stopping

  # SIGTERM, then SIGKILL after the stop timeout; returns once the command has exited and the
  # node has left the cluster (or the timeout passed).
  defp stop_command(%{port: nil}), do: :ok

  defp stop_command(state) do
    connected = state.node in Node.list([:visible, :hidden])
    if connected, do: Node.monitor(state.node, true)
    deadline = deadline(state.stop_timeout)
    signal(state.os_pid, "TERM")

    state =
      case await_exit(state, deadline) do
        {:ok, state} ->
          state

        {:timeout, state} ->
          Logger.warning("#{state.label} did not stop within #{state.stop_timeout} ms: killed",
            xla_node: state.node
          )

          signal(state.os_pid, "KILL")
          {_, state} = await_exit(state, deadline(2_000))
          state
      end

    if connected, do: await_nodedown(state.node, deadline)
    :ok
  end

  defp await_exit(state, deadline) do
    port = state.port

    receive do
      {^port, {:data, data}} -> await_exit(output(state, data), deadline)
      {^port, {:exit_status, _status}} -> {:ok, flush_output(%{state | port: nil})}
    after
      wait_time(deadline, :infinity) -> {:timeout, state}
    end
  end

  defp await_nodedown(node, deadline) do
    receive do
      {:nodedown, ^node} -> :ok
    after
      wait_time(deadline, :infinity) ->
        if node in Node.list([:visible, :hidden]), do: Node.disconnect(node)
        :ok
    end
  end

  # No OS pid: the command had exited when this process looked.
  defp signal(nil, _signal), do: :ok

  defp signal(os_pid, signal),
    do: System.cmd("kill", ["-#{signal}", "#{os_pid}"], stderr_to_stdout: true)

  ## Output: line by line to Logger

  defp output(state, {:noeol, part}), do: %{state | partial: state.partial <> part}

  defp output(state, {:eol, line}) do
    case state.partial <> line do
      # Through a terminal (`ssh -t`, `kubectl -t`) the line ends in "\r\n".
      prompt when prompt in [@cookie_prompt, @cookie_prompt <> "\r"] ->
        send_cookie(%{state | partial: ""})

      line ->
        kept_line(state, line)
    end
  end

  defp kept_line(state, line) do
    log(state, line)
    lines = :queue.in(line, state.lines)
    lines = if :queue.len(lines) > @kept_lines, do: :queue.drop(lines), else: lines
    %{state | partial: "", lines: lines}
  end

  # Once, when the node asks: this VM's cookie on its standard input. A port that closed
  # meanwhile reports its exit next.
  defp send_cookie(%{cookie_sent: true} = state), do: state

  defp send_cookie(state) do
    try do
      Port.command(state.port, [Atom.to_string(Node.get_cookie()), ?\n])
    rescue
      ArgumentError -> :ok
    end

    %{state | cookie_sent: true}
  end

  # A line cut off by the exit.
  defp flush_output(%{partial: ""} = state), do: state
  defp flush_output(state), do: output(state, {:eol, ""})

  defp log(state, line) do
    {level, text} =
      cond do
        match = Regex.run(@log_line, line, capture: :all_but_first) ->
          [level, text] = match
          {level(level), text}

        match = Regex.run(@absl_line, line, capture: :all_but_first) ->
          [severity, text] = match
          {absl_level(severity), text}

        # absl's note that it logs to stderr until initialised: true of every start.
        String.starts_with?(line, "WARNING: All log messages before absl::InitializeLog()") ->
          {:debug, line}

        true ->
          {:warning, line}
      end

    Logger.log(level, fn -> "#{state.node}: #{text}" end, xla_node: state.node)
  end

  defp level("ERROR"), do: :error
  defp level("WARN"), do: :warning
  defp level("INFO"), do: :info
  defp level(_debug_or_trace), do: :debug

  defp absl_level("I"), do: :info
  defp absl_level("W"), do: :warning
  defp absl_level(_error_or_fatal), do: :error

  defp last_lines(state) do
    case :queue.to_list(state.lines) do
      [] -> ""
      lines -> "; its last lines:\n" <> Enum.join(lines, "\n")
    end
  end

  ## Errors

  # A node that never asked for the cookie is no xla_node, or one older than this client (which
  # read it without asking).
  defp never_asked(%{cookie_sent: true}), do: ""

  defp never_asked(_state),
    do:
      "; it never asked for the cookie on its standard input, as xla_node does " <>
        "(an xla_node older than this client does not: build it from the same version)"

  defp exited_error(state, status) do
    lines = :queue.to_list(state.lines)

    explained = if state.explain, do: state.explain.(status, lines), else: nil

    message =
      explained ||
        "exited with status #{status} before it answered :ping#{last_lines(state)}"

    launch_error(state, message, {:exit_status, status})
  end

  defp launch_error(state, message, reason),
    do: %Error{
      kind: :launch_error,
      message: "#{state.label}: #{message}",
      reason: reason,
      node: state.node
    }

  defp deadline(:infinity), do: :infinity
  defp deadline(ms), do: System.monotonic_time(:millisecond) + ms

  defp past?(:infinity), do: false
  defp past?(deadline), do: System.monotonic_time(:millisecond) >= deadline

  # How long to wait for a message before polling the node again (or the whole rest).
  defp wait_time(deadline, poll \\ 100)
  defp wait_time(:infinity, poll), do: poll

  defp wait_time(deadline, poll),
    do: min(poll, max(deadline - System.monotonic_time(:millisecond), 0))
end
