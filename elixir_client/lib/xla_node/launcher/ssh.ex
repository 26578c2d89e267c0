defmodule XlaNode.Launcher.SSH do
  @moduledoc """
  A launcher (`XlaNode.Launcher`) that starts each node on another host over `ssh`: the way a
  pool grows past this machine. With a host `gpu1.internal` that this machine logs in to:

  ```text
  XlaNode.Pool.start_link(
    name: MyPool,
    launcher:
      {XlaNode.Launcher.SSH,
       host: "gpu1.internal",
       user: "xla",
       key: "/etc/myapp/xla_ed25519",
       bin: "/opt/xla_node/target/release/xla_node",
       plugin: :gpu},
    min: 1,
    max: 4
  )
  ```

  Each node runs as `ssh ... HOST exec BIN --sname NAME@HOST --cookie-from-stdin
  --exit-on-stdin-close ...`, held by this VM through a port (`XlaNode.Launcher.Port`): this VM's
  cookie goes down the connection on the node's standard input (it is in no command line, here
  or there), and the node stops when the connection closes, so it ends with this VM or the pool
  however they end. The node gets a name on the remote host, short or long as this VM's own
  name, and this VM connects to it by that name, as to any node of its cluster: the remote
  host's name must resolve here, and its epmd (the node starts one if none runs) and the node's
  port (`inet_dist_listen_min`/`max` to fix it) must be reachable from here.

  The remote host needs the node binary and its plugin (`scripts/setup.sh` in a checkout
  there, or copied); `ssh` here (OpenSSH) logs in without a password or prompt (`BatchMode`):
  with `key:`, or the keys of ssh's own configuration.

  ## Options

    * `:host` - the host to start nodes on (required)
    * `:bin` - the path of `xla_node` on that host (required)
    * `:user` - the user to log in as (default: ssh's, from its configuration or this user)
    * `:port` - sshd's port (default: ssh's, usually 22)
    * `:key` - a private key file to log in with (ssh `-i`, and only that key)
    * `:known_hosts` - a known-hosts file to check the host's key against (default: ssh's);
      an unknown or changed host key is an error, never accepted silently
    * `:ssh_options` - more arguments for `ssh`, e.g. `["-o", "ProxyJump=bastion"]`
    * `:ssh` - the `ssh` executable (default: the one on `PATH`)
    * `:connect_timeout` - milliseconds for ssh to connect (default 10_000)
    * `:node_host` - the host part of the nodes' names, as this VM reaches the host (default:
      `:host`, its first label with short names; an IP address needs long names or this option)
    * `:plugin` - `:cpu`, `:gpu` (the CUDA plugin where `scripts/setup.sh --gpu` installs it
      on that host, under its user's `~/.local/share/xla_node`), or a path there
    * `:start_timeout` (default 120_000), `:stop_timeout` (default 10_000) - milliseconds, as
      for `XlaNode.Local`
    * every flag of the node, and `:log`, `:callback_trace`, `:env`, `:args`, as for
      `XlaNode.Local` (paths in them are paths on the remote host)

  ## Errors

  A launch that fails returns `{:error, %XlaNode.Error{kind: :launch_error}}` saying what
  happened: ssh could not connect or log in (its own message: connection refused, permission
  denied, host key verification failed, no such host), the binary is not there or not
  executable on the host, or the node exited (its last lines) or did not answer in time. A pool
  reports it and tries again after a backoff, serving meanwhile on the nodes it has.
  """

  @behaviour XlaNode.Launcher

  alias XlaNode.{Error, Options}
  alias XlaNode.Launcher.{Flags, Port}

  @own_options [
    host: :string,
    bin: :string,
    user: :string,
    port: {:check, "an integer in 1..65535", &__MODULE__.port?/1},
    key: {:check, "the path of an existing private key file", &__MODULE__.file?/1},
    known_hosts: {:check, "the path of an existing known-hosts file", &__MODULE__.file?/1},
    ssh_options: {:check, "a list of strings", &Flags.strings?/1},
    ssh: :string,
    connect_timeout: :pos_integer,
    node_host: :string,
    plugin: {:check, ":cpu, :gpu or a path (a string)", &XlaNode.Local.plugin?/1},
    start_timeout: :positive_timeout,
    stop_timeout: :positive_timeout
  ]

  @doc false
  def port?(n), do: is_integer(n) and n in 1..65_535

  @doc false
  def file?(path), do: is_binary(path) and File.regular?(path)

  @impl true
  def validate_options(opts) do
    opts = Options.validate!(opts, "XlaNode.Launcher.SSH", @own_options ++ Flags.spec())

    for required <- [:host, :bin], not Keyword.has_key?(opts, required) do
      raise ArgumentError,
            "XlaNode.Launcher.SSH needs #{inspect(required)}: the host to start nodes on " <>
              "(host:) and the path of xla_node there (bin:)"
    end

    opts
  end

  @impl true
  def start_node(opts, %{owner: owner, name: base}) do
    with {:ok, ssh} <- ssh_executable(opts),
         {:ok, node} <- node_name(opts, base),
         {:ok, dist_args} <- XlaNode.Local.distribution_args(opts) do
      name_flag = if longnames?(), do: "--name", else: "--sname"

      node_args =
        [name_flag, Atom.to_string(node), "--cookie-from-stdin", "--exit-on-stdin-close"] ++
          plugin_args(opts[:plugin]) ++ dist_args ++ Flags.args(opts)

      env = plugin_env(opts[:plugin]) ++ Flags.env(opts)
      target = target(opts)

      spec = %{
        command: ssh,
        args: ssh_args(opts) ++ ["--", opts[:host], remote_command(opts[:bin], node_args, env)],
        env: [],
        node: node,
        label: "xla_node #{node} (over ssh to #{target})",
        owner: owner,
        start_timeout: Keyword.get(opts, :start_timeout, 120_000),
        stop_timeout: Keyword.get(opts, :stop_timeout, 10_000),
        explain: &explain(&1, &2, target, opts[:bin])
      }

      with {:ok, pid} <- Port.start(spec), do: {:ok, node, pid}
    end
  end

  @impl true
  def stop_node(pid), do: Port.stop(pid)

  ## The command

  defp ssh_executable(opts) do
    case opts[:ssh] || System.find_executable("ssh") do
      nil ->
        {:error, launch_error("no ssh executable on PATH (give its path as ssh:)", :no_ssh)}

      path ->
        if File.regular?(path),
          do: {:ok, path},
          else: {:error, launch_error("ssh: no executable at #{path}", :no_ssh)}
    end
  end

  defp ssh_args(opts) do
    seconds = div(Keyword.get(opts, :connect_timeout, 10_000) + 999, 1_000)

    # -T: no terminal, a pipe for the node's input (its end is the node's signal to stop).
    ["-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=#{seconds}"] ++
      if(opts[:port], do: ["-p", "#{opts[:port]}"], else: []) ++
      if(opts[:user], do: ["-l", opts[:user]], else: []) ++
      if(opts[:key], do: ["-i", Path.expand(opts[:key]), "-o", "IdentitiesOnly=yes"], else: []) ++
      if(opts[:known_hosts],
        do: ["-o", "UserKnownHostsFile=#{Path.expand(opts[:known_hosts])}"],
        else: []
      ) ++
      Keyword.get(opts, :ssh_options, [])
  end

  # One line for the remote user's shell: `exec env ... BIN ARGS`, each word quoted but the
  # plugin paths under the remote home, which the shell expands there.
  defp remote_command(bin, args, env) do
    settings =
      Enum.flat_map(env, fn
        {name, false} -> ["-u", quote_word(name)]
        {name, {:remote_home, prefix, path}} -> [~s(#{name}="#{prefix}$HOME/#{path}")]
        {name, value} -> [quote_word("#{name}=#{value}")]
      end)

    words =
      Enum.map(args, fn
        {:remote_home, prefix, path} -> ~s("#{prefix}$HOME/#{path}")
        arg -> quote_word(arg)
      end)

    Enum.join(["exec", "env"] ++ settings ++ [quote_word(bin) | words], " ")
  end

  defp quote_word(word), do: "'" <> String.replace(word, "'", ~S('\'')) <> "'"

  # The plugins as scripts/setup.sh installs them on the remote host, under its user's home.
  @cuda_dir ".local/share/xla_node/cuda"

  defp plugin_args(nil), do: []
  defp plugin_args(:cpu), do: []

  defp plugin_args(:gpu),
    do: [
      "--pjrt-plugin",
      {:remote_home, "", "#{@cuda_dir}/jax_plugins/xla_cuda13/xla_cuda_plugin.so"}
    ]

  defp plugin_args(path), do: ["--pjrt-plugin", path]

  defp plugin_env(:cpu), do: [{"XLA_NODE_PJRT_PLUGIN", false}]

  defp plugin_env(:gpu),
    do: [{"XLA_FLAGS", {:remote_home, "--xla_gpu_cuda_data_dir=", "#{@cuda_dir}/nvidia/cu13"}}]

  defp plugin_env(_), do: []

  defp target(opts) do
    user = if opts[:user], do: "#{opts[:user]}@", else: ""
    port = if opts[:port], do: ":#{opts[:port]}", else: ""
    "#{user}#{opts[:host]}#{port}"
  end

  ## The node's name

  defp longnames?, do: :net_kernel.longnames() == true

  defp node_name(opts, base) do
    with {:ok, host} <- node_host(opts) do
      base = String.replace(base, ~r/[^A-Za-z0-9_-]/, "_")
      {:ok, :"#{base}_#{System.pid()}_#{System.unique_integer([:positive])}@#{host}"}
    end
  end

  defp node_host(opts) do
    host = opts[:node_host] || opts[:host]
    ip? = match?({:ok, _}, :inet.parse_address(String.to_charlist(host)))

    cond do
      not Node.alive?() ->
        {:error,
         launch_error(
           "this VM is not a distributed node: start it with a name (--sname or --name)",
           :not_distributed
         )}

      longnames?() or opts[:node_host] ->
        {:ok, host}

      ip? ->
        {:error,
         launch_error(
           "host: #{host} is an IP address, which cannot be the host of a short node name: " <>
             "give node_host: (the host's name as this VM resolves it), or run this VM with " <>
             "long names",
           :node_host
         )}

      true ->
        {:ok, host |> String.split(".") |> hd()}
    end
  end

  ## Errors

  # What the command's exit status before the node served says: 255 is ssh's own failure, 126
  # and 127 the remote shell's (cannot execute, not found), anything else the node's.
  defp explain(255, lines, target, _bin),
    do: "ssh to #{target} failed: #{ssh_lines(lines)}"

  defp explain(127, lines, target, bin),
    do: "bin: #{bin} was not found on #{target} (#{ssh_lines(lines)})"

  defp explain(126, lines, target, bin),
    do: "bin: #{bin} cannot be executed on #{target} (#{ssh_lines(lines)})"

  defp explain(status, lines, target, _bin),
    do:
      "the node exited with status #{status} on #{target} before it answered :ping; " <>
        "its last lines:\n" <> Enum.join(lines, "\n")

  defp ssh_lines([]), do: "no message"
  defp ssh_lines(lines), do: lines |> Enum.map(&String.trim/1) |> Enum.join("; ")

  defp launch_error(message, reason),
    do: %Error{kind: :launch_error, message: "XlaNode.Launcher.SSH: #{message}", reason: reason}
end
