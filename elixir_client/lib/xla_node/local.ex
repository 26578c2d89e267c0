defmodule XlaNode.Local do
  @moduledoc """
  A compute node that this application starts, supervises and stops: the `xla_node` binary as
  an OS process of this VM, on this host, with this VM's cookie and a name of its own.

      children = [
        {XlaNode.Local, name: :xla}
      ]

      {:ok, _supervisor} = Supervisor.start_link(children, strategy: :one_for_one)

      mlir = "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
        %y = stablehlo.add %x, %x : tensor<2xf32>
        return %y : tensor<2xf32>
      }"

      exe = XlaNode.compile!(:xla, mlir)
      [y] = XlaNode.run!(:xla, exe, [XlaNode.Tensor.from_list([1.0, 2.0], {:f, 32})])
      XlaNode.Tensor.to_list(y)
      #=> [2.0, 4.0]
      XlaNode.Local.node(:xla)  # :"xla_48213_1@myhost", say

  The child starts the binary, waits until the node answers `:ping`, and is then started: the
  children after it can use the node. Every `XlaNode` function takes the name where it takes a
  node (`XlaNode.compile!(:xla, mlir)`), and so do `XlaNode.Compiler`'s and `XlaNode.Backend`'s
  `node:` options, in one line of config:

      # config/config.exs
      config :nx, default_backend: {XlaNode.Backend, node: :xla}
      config :nx, default_defn_options: [compiler: XlaNode.Compiler, node: :xla]

  ## Lifetime

  The node exits with this VM, however the VM ends (`System.stop/0`, a crash, `kill -9`): it
  watches its standard input, the pipe this VM's port holds, and stops when it closes (the
  node's `--exit-on-stdin-close`). Stopping the child (its supervisor shutting down,
  `Supervisor.terminate_child/2`) stops the node gracefully (SIGTERM) and returns once it is
  gone. A node that exits or crashes ends the child with `{:xla_node_exited, status}`: its
  supervisor restarts it as any child, under a new node name (the name `:xla` follows it).
  Buffers and executables of the node are gone with it, as with any node that restarts.

  The node's log (its stderr and stdout) goes to `Logger`, line by line, at the level the node
  gave each line, prefixed with the node's name and with `xla_node: node` in the metadata.

  ## Distribution

  A node is reached over Erlang distribution, so this VM must be a distributed node: started
  with a name (`iex --sname app -S mix`, `elixir --sname app -S mix run`, a release, whose
  distribution is on by default). The node gets a name on this VM's host, short or long as this
  VM's is, this VM's cookie (passed on its standard input, never in a command line), this VM's
  `net_ticktime`, and, where this VM runs TLS distribution (`-proto_dist inet_tls` with
  `-ssl_dist_optfile`), the same carrier and option file. In a VM that is not distributed,
  `start_link/1` returns an error saying how to start it, unless `distribution: :start`, which
  starts distribution here as Livebook does (`epmd -daemon`, then a short name).

  ## Options

    * `:name` - registers the child under this atom (without `"@"`): `XlaNode` functions,
      `XlaNode.Compiler` and `XlaNode.Backend` then take the name for the node
    * `:plugin` - `:cpu` (the CPU plugin), `:gpu` (the CUDA plugin that `mix xla_node.setup --gpu`
      installs; `XLA_FLAGS` then points XLA at the ptxas and libdevice installed with it), or
      the path of a PJRT plugin. Default: the node's own default (`$XLA_NODE_PJRT_PLUGIN`, else
      the CPU plugin)
    * `:bin` - the `xla_node` binary. Default: the `:bin` of the application's config (below),
      else `$XLA_NODE_BIN`, else where `mix xla_node.setup` (`scripts/setup.sh`) builds it
    * `:distribution` - `:require` (default) or `:start` (see above)
    * `:start_timeout` - milliseconds to wait for the node to answer `:ping` (default 60_000)
    * `:stop_timeout` - milliseconds a graceful stop may take before the node is killed
      (default 10_000)
    * every flag of the node, named as the flag with `_` for `-`, in the flag's own unit (see
      the README's "Command line"): `visible_devices: [0, 2]`, `memory_fraction: 0.5`,
      `preallocate: false`, `max_device_bytes: "8G"` (or bytes), `max_message_bytes`,
      `max_executables`, `pjrt_options: [cpu_device_count: 2]`, `callback_timeout` (s),
      `queue_timeout` (s), `callback_spin_us`, `busy_wait_us`, `kernels: [{target, path,
      symbol}]`, `kernel_dirs: [dir]`, `kernel_version_shim: true | [target]`,
      `metrics_addr: "127.0.0.1:9464"`, `net_ticktime` (s), `inet_dist_listen_min`,
      `inet_dist_listen_max`, `inet_dist_use_interface`, `proto_dist: :inet_tcp | :inet_tls`,
      `ssl_dist_optfile`
    * `:log` - the node's log filter (`XLA_NODE_LOG`: `"warn"`, `"info"`, `"xla_node=debug"`)
    * `:callback_trace` - `XLA_NODE_CALLBACK_TRACE` (times each step of every callback)
    * `:env` - more environment variables for the node, `%{"NAME" => "value" | false}`
    * `:args` - more arguments for the node, after those above

  Defaults for every `XlaNode.Local` (and `XlaNode.Launcher.Local`) come from the application's
  config, under the options given to the child:

      # config/config.exs
      config :xla_node_client, XlaNode.Local, bin: "/opt/xla_node/bin/xla_node", log: "warn"

  An unknown option, or a value of the wrong kind, raises an `ArgumentError` that names it. A
  binary or plugin that is not there, a VM that is not distributed, a node that exits or does
  not answer in time: `start_link/1` returns `{:error, %XlaNode.Error{kind: :launch_error}}`
  saying what happened, with the node's last lines where it wrote any.
  """

  alias XlaNode.{Error, Options, Setup}
  alias XlaNode.Launcher.{Flags, Port}

  @own_options [
    name: :pool_name,
    bin: :string,
    plugin: {:check, ":cpu, :gpu or the path of a PJRT plugin (a string)", &__MODULE__.plugin?/1},
    distribution: {:in, [:require, :start]},
    start_timeout: :positive_timeout,
    stop_timeout: :positive_timeout
  ]

  @doc false
  def plugin?(plugin), do: plugin in [:cpu, :gpu] or (is_binary(plugin) and plugin != "")

  @typedoc "A local node: the name given as `:name`, or the child's pid."
  @type t :: atom() | pid()

  @doc """
  Starts the node, linked to the caller, and returns once it answers `:ping`.

      {:ok, pid} = XlaNode.Local.start_link(name: :xla, plugin: :cpu)
  """
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts \\ []) do
    opts = validate!(opts, "XlaNode.Local.start_link/1")

    with {:ok, spec} <- port_spec(opts, %{name: opts[:name], owner: nil}) do
      Port.start_link(spec)
    end
  end

  @doc """
  A child spec: `{XlaNode.Local, name: :xla}`. Its id is `{XlaNode.Local, name}`, so that a
  supervisor may hold several; its shutdown leaves the node time for its graceful stop.
  """
  @spec child_spec(keyword()) :: Supervisor.child_spec()
  def child_spec(opts) do
    %{
      id: {__MODULE__, Keyword.get(opts, :name)},
      start: {__MODULE__, :start_link, [opts]},
      shutdown: stop_timeout(opts) + 2_000
    }
  end

  defp stop_timeout(opts) do
    case Keyword.get(opts, :stop_timeout, 10_000) do
      ms when is_integer(ms) and ms > 0 -> ms
      _ -> 10_000
    end
  end

  @doc """
  The node's name. Raises `XlaNode.Error` (kind `:noproc`) when no node of that name runs (it
  is not started, or is restarting).

      {:ok, _} = XlaNode.Local.start_link(name: :xla)
      XlaNode.Local.node(:xla)  # :"xla_48213_1@myhost", say
  """
  @spec node(t()) :: node()
  def node(local) when is_pid(local), do: Port.node(local)

  def node(name) when is_atom(name) do
    case Port.lookup(name) do
      {_pid, node} -> node
      nil -> raise not_running(name)
    end
  end

  @doc "The OS pid of the node."
  @spec os_pid(t()) :: non_neg_integer()
  def os_pid(local), do: Port.os_pid(local)

  @doc """
  Stops the node (gracefully: SIGTERM, then SIGKILL after `:stop_timeout`) and the process that
  holds it; returns once the node is gone. Under a supervisor, stop it through the supervisor
  (`Supervisor.terminate_child/2`): this one is restarted like any child that stops.
  """
  @spec stop(t(), timeout()) :: :ok
  def stop(local, timeout \\ :infinity), do: Port.stop(local, timeout)

  @doc """
  The node `server` stands for where it is the name of an `XlaNode.Local` with a node up;
  any other server as it is. How `XlaNode.Compiler` and `XlaNode.Backend` turn `node: :xla` into
  the node of the moment (a tensor made on it then names that node, and is known to be gone
  once the child has restarted).

      {:ok, _} = XlaNode.Local.start_link(name: :xla)
      XlaNode.Local.resolve(:xla) == XlaNode.Local.node(:xla)
      #=> true
      XlaNode.Local.resolve(:"xla@gpu1")
      #=> :"xla@gpu1"
  """
  @spec resolve(term()) :: term()
  def resolve(name) when is_atom(name) and name != nil, do: whereis_node(name) || name
  def resolve(server), do: server

  @doc false
  # The node a name given to XlaNode functions stands for, or nil when no XlaNode.Local of that
  # name has a node up.
  def whereis_node(name) when is_atom(name) do
    case Port.lookup(name) do
      {_pid, node} -> node
      nil -> nil
    end
  end

  @doc false
  def not_running(name),
    do:
      Error.noproc(
        "no XlaNode.Local named #{inspect(name)} has a node running (not started, or restarting)"
      )

  ## Options

  @doc false
  # The options with the application's config under them, checked.
  def validate!(opts, function, without \\ []) do
    config = Application.get_env(:xla_node_client, __MODULE__, [])
    spec = Keyword.drop(@own_options, without) ++ Flags.spec()

    Options.validate!(
      config,
      "config :xla_node_client, XlaNode.Local",
      @own_options ++ Flags.spec()
    )

    opts = Options.validate!(opts, function, spec)
    Keyword.merge(config, opts)
  end

  @doc false
  # The spec of `XlaNode.Launcher.Port` that runs the node on this host: `context` has the
  # registered `:name` (or nil), the `:owner` (or nil) and optionally a `:base` for the node
  # name. `{:error, %XlaNode.Error{}}` for what keeps it from starting: no distribution, no
  # binary, no plugin.
  def port_spec(opts, context) do
    with :ok <- ensure_distribution(Keyword.get(opts, :distribution, :require)),
         {:ok, bin} <- binary(opts[:bin]),
         {:ok, plugin_args, plugin_env} <- plugin(opts[:plugin]),
         {:ok, dist_args} <- distribution_args(opts) do
      node = node_name(context[:base] || context[:name] || "xla")
      name_flag = if longnames?(), do: "--name", else: "--sname"

      {:ok,
       %{
         command: bin,
         args:
           [name_flag, Atom.to_string(node), "--cookie-from-stdin", "--exit-on-stdin-close"] ++
             plugin_args ++ dist_args ++ Flags.args(opts),
         env: [{"XLA_NODE_COOKIE", false}] ++ plugin_env ++ Flags.env(opts),
         node: node,
         label: "xla_node #{node}",
         name: context[:name],
         owner: context[:owner],
         start_timeout: Keyword.get(opts, :start_timeout, 60_000),
         stop_timeout: stop_timeout(opts)
       }}
    end
  end

  # A name of its own on this host: the given base (sanitised for a node name), this VM's OS
  # pid, a counter.
  defp node_name(base) do
    base =
      base
      |> to_string()
      |> String.replace_prefix("Elixir.", "")
      |> String.replace(~r/[^A-Za-z0-9_-]/, "_")

    host = node() |> Atom.to_string() |> String.split("@") |> List.last()
    :"#{base}_#{System.pid()}_#{System.unique_integer([:positive])}@#{host}"
  end

  defp longnames?, do: :net_kernel.longnames() == true

  defp ensure_distribution(mode) do
    cond do
      Node.alive?() -> :ok
      mode == :start -> start_distribution()
      true -> {:error, launch_error(not_distributed_message(), :not_distributed)}
    end
  end

  defp not_distributed_message do
    "XlaNode.Local reaches its node over Erlang distribution, and this VM is not a " <>
      "distributed node: start it with a name (iex --sname app -S mix, elixir --sname app " <>
      "-S mix run, or a release, distributed by default), or pass distribution: :start to " <>
      "start distribution from here"
  end

  # As Livebook does: epmd, then a short name of this VM's own.
  defp start_distribution do
    epmd = System.find_executable("epmd") || Path.join(:code.root_dir(), "bin/epmd")
    System.cmd(epmd, ["-daemon"], stderr_to_stdout: true)

    app =
      case :application.get_application() do
        {:ok, app} -> app
        :undefined -> :elixir
      end

    case Node.start(:"#{app}_#{System.pid()}", :shortnames) do
      {:ok, _} ->
        :ok

      {:error, {:already_started, _}} ->
        :ok

      {:error, reason} ->
        {:error,
         launch_error(
           "distribution: :start could not make this VM a distributed node (" <>
             "#{inspect(reason)}); start it with --sname instead",
           {:distribution, reason}
         )}
    end
  catch
    :error, reason ->
      {:error, launch_error("cannot run epmd: #{inspect(reason)}", {:distribution, reason})}
  end

  defp binary(given) do
    {path, source} = Setup.bin(given)

    cond do
      not File.regular?(path) ->
        {:error,
         launch_error(
           "no xla_node binary at #{path} (#{source}): build it with `mix xla_node.setup`, " <>
             "or give its path (the :bin option, config :xla_node_client, XlaNode.Local, " <>
             "bin: path, or XLA_NODE_BIN)",
           {:no_binary, path}
         )}

      not executable?(path) ->
        {:error, launch_error("#{path} (#{source}) is not executable", {:no_binary, path})}

      true ->
        {:ok, path}
    end
  end

  defp executable?(path) do
    case File.stat(path) do
      {:ok, %File.Stat{mode: mode}} -> Bitwise.band(mode, 0o111) != 0
      _ -> false
    end
  end

  # {:ok, args, env}
  defp plugin(nil), do: {:ok, [], []}
  defp plugin(:cpu), do: {:ok, [], [{"XLA_NODE_PJRT_PLUGIN", false}]}

  defp plugin(:gpu) do
    path = Setup.cuda_plugin()

    if File.regular?(path) do
      {:ok, ["--pjrt-plugin", path], cuda_flags()}
    else
      {:error,
       launch_error(
         "plugin: :gpu, but the CUDA plugin is not installed at #{path}: install it with " <>
           "`mix xla_node.setup --gpu` (on a machine with an NVIDIA GPU and its driver)",
         {:no_plugin, path}
       )}
    end
  end

  defp plugin(path) do
    path = Path.expand(path)

    if File.regular?(path),
      do: {:ok, ["--pjrt-plugin", path], []},
      else: {:error, launch_error("plugin: no PJRT plugin at #{path}", {:no_plugin, path})}
  end

  # As scripts/start.sh --gpu: XLA finds ptxas and libdevice installed with the plugin, unless
  # XLA_FLAGS names a directory already.
  defp cuda_flags do
    flags = System.get_env("XLA_FLAGS", "")

    if flags =~ "--xla_gpu_cuda_data_dir=" do
      []
    else
      dir = "--xla_gpu_cuda_data_dir=#{Setup.cuda_data_dir()}"
      [{"XLA_FLAGS", String.trim("#{flags} #{dir}")}]
    end
  end

  @doc false
  # This VM's net_ticktime, and its TLS carrier and option file, unless the options say.
  def distribution_args(opts) do
    ticktime =
      if Keyword.has_key?(opts, :net_ticktime) do
        []
      else
        case :net_kernel.get_net_ticktime() do
          seconds when is_integer(seconds) -> ["--net-ticktime", "#{seconds}"]
          {:ongoing_change_to, seconds} -> ["--net-ticktime", "#{seconds}"]
          _ -> []
        end
      end

    vm_tls = :init.get_argument(:proto_dist) == {:ok, [[~c"inet_tls"]]}

    cond do
      Keyword.has_key?(opts, :proto_dist) or not vm_tls ->
        {:ok, ticktime}

      Keyword.has_key?(opts, :ssl_dist_optfile) ->
        {:ok, ticktime ++ ["--proto-dist", "inet_tls"]}

      true ->
        case :init.get_argument(:ssl_dist_optfile) do
          {:ok, [[file] | _]} ->
            {:ok, ticktime ++ ["--proto-dist", "inet_tls", "--ssl-dist-optfile", to_string(file)]}

          _ ->
            {:error,
             launch_error(
               "this VM runs TLS distribution without -ssl_dist_optfile: give the node its " <>
                 "options with ssl_dist_optfile: path (and proto_dist: :inet_tls)",
               :tls_options
             )}
        end
    end
  end

  defp launch_error(message, reason),
    do: %Error{kind: :launch_error, message: message, reason: reason}
end
