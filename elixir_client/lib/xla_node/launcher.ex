defmodule XlaNode.Launcher do
  @moduledoc ~S"""
  Starts compute nodes somewhere and stops them: what an `XlaNode.Pool` given `launcher:` grows
  and shrinks with.

      {XlaNode.Pool,
       name: MyApp.XLA,
       launcher: {XlaNode.Launcher.Local, log: "warn"},
       min: 0,
       max: 3,
       idle_shutdown_after: 30_000}

  Two come with the client: `XlaNode.Launcher.Local` (a node on this host, as
  `XlaNode.Local`), and `XlaNode.Launcher.SSH` (a node on another host, started over `ssh`).

  ## The contract

  `c:start_node/2` starts one node and returns once it answers `:ping` (`GenServer.call({:xla,
  node}, :ping)`), with its name and a *handle*: a pid that lives exactly as long as the node
  does, so that the pool learns of a node that dies by the handle's exit. The node must stop
  when `owner` (the pool's process) exits, however it exits, so that a pool never leaves a node
  behind; and `c:stop_node/1` stops it and returns once it is gone. `c:validate_options/1`
  checks the options when the pool starts, so that a wrong one is an `ArgumentError` naming it
  there, not a launch failure later.

  The pool calls `start_node/2` in a process of its own (a launch never holds the pool up) and
  retries a launch that fails after a backoff, reporting each failure (`Logger`, telemetry,
  `XlaNode.Pool.status/1`).

  ## A launcher of your own

  `XlaNode.Launcher.Port` does the hard part for any launcher whose command carries the node's
  standard input: it writes the cookie there when the node asks, holds it open (the node stops
  when it closes), logs the command's output, waits for `:ping`, and stops it. A Kubernetes
  launcher, for instance, can run each node as a pod attached by `kubectl run -i` (not built
  here):

      defmodule MyApp.KubernetesLauncher do
        @behaviour XlaNode.Launcher

        @impl true
        def validate_options(opts),
          do: Keyword.validate!(opts, [:image, namespace: "default", gpus: 1])

        @impl true
        def start_node(opts, %{owner: owner, name: base}) do
          # A pod of its own, named in DNS by a headless service `xla-nodes` (long names:
          # this VM runs with --name too).
          pod = String.downcase(String.replace("#{base}-#{System.unique_integer([:positive])}", "_", "-"))
          node = :"xla@#{pod}.xla-nodes.#{opts[:namespace]}.svc.cluster.local"

          spec = %{
            command: System.find_executable("kubectl"),
            args:
              ["run", pod, "-i", "--rm", "--restart=Never", "--quiet",
               "--namespace", opts[:namespace], "--image", opts[:image],
               "--overrides", overrides(pod, opts), "--",
               "xla_node", "--name", Atom.to_string(node),
               "--cookie-from-stdin", "--exit-on-stdin-close"],
            node: node,
            owner: owner,
            start_timeout: 300_000
          }

          with {:ok, pid} <- XlaNode.Launcher.Port.start(spec), do: {:ok, node, pid}
        end

        @impl true
        def stop_node(pid), do: XlaNode.Launcher.Port.stop(pid)

        # The pod's hostname and subdomain (its DNS name) and its GPUs, as kubectl's JSON.
        defp overrides(pod, opts) do
          ~s({"spec": {"hostname": "#{pod}", "subdomain": "xla-nodes", "containers": ) <>
            ~s([{"name": "#{pod}", "resources": {"limits": {"nvidia.com/gpu": #{opts[:gpus]}}}}]}})
        end
      end

  `kubectl run -i --rm` attaches the pod's standard input and deletes the pod once its command
  exits, so a pod, like a local node, goes with the VM that started it. A cloud launcher
  (instances from an API, as FLAME's backends start machines) would instead boot a machine
  whose start-up runs the node with its cookie from a secret, return once it answers `:ping`,
  and make the handle a process that monitors the node (`Node.monitor/2`) and deletes the
  machine when the node or the owner goes: a machine without a pipe back to this VM needs that
  watcher, and a machine-side idle limit, to be sure never to outlive it.
  """

  @typedoc "The pid that lives exactly as long as the node (see the contract above)."
  @type handle :: pid()

  @typedoc """
  What the pool tells a launch: `owner`, the process whose exit must stop the node; `name`, a
  string to base the node's name on (the pool's name, sanitised).
  """
  @type context :: %{owner: pid(), name: String.t()}

  @doc "Checks `opts` and returns them (with defaults); raises `ArgumentError` naming a bad one."
  @callback validate_options(opts :: keyword()) :: keyword()

  @doc """
  Starts a node, returning once it answers `:ping`: `{:ok, node, handle}`, or `{:error,
  exception}` saying what kept it from starting (an `XlaNode.Error` of kind `:launch_error`).
  """
  @callback start_node(opts :: keyword(), context()) ::
              {:ok, node(), handle()} | {:error, Exception.t()}

  @doc "Stops the node; returns once it is gone."
  @callback stop_node(handle()) :: :ok
end
