defmodule XlaNode.Launcher.Local do
  @moduledoc """
  A launcher (`XlaNode.Launcher`) that starts each node on this host, as `XlaNode.Local` does:
  an OS process of this VM, with this VM's cookie, that stops when the pool (or this VM)
  does.

      XlaNode.Pool.start_link(
        name: MyPool,
        launcher: {XlaNode.Launcher.Local, plugin: :cpu, log: "warn"},
        min: 0,
        max: 2,
        idle_shutdown_after: 3_000
      )

  Its options are those of `XlaNode.Local` but `:name` (the pool names its nodes after itself):
  `:plugin`, `:bin`, `:distribution`, `:start_timeout`, `:stop_timeout`, every node flag,
  `:log`, `:env`, `:args`, with the defaults of `config :xla_node_client, XlaNode.Local`. On one
  host, nodes share its cores (and GPUs): give each a share with the node's flags, e.g.
  `pjrt_options: [cpu_device_count: 2]` or `visible_devices:`/`memory_fraction:` on a GPU.
  """

  @behaviour XlaNode.Launcher

  alias XlaNode.Launcher.Port

  @impl true
  def validate_options(opts),
    do: XlaNode.Local.validate!(opts, "XlaNode.Launcher.Local", [:name])

  @impl true
  def start_node(opts, %{owner: owner, name: base}) do
    with {:ok, spec} <- XlaNode.Local.port_spec(opts, %{base: base, owner: owner}),
         {:ok, pid} <- Port.start(spec) do
      {:ok, spec.node, pid}
    end
  end

  @impl true
  def stop_node(pid), do: Port.stop(pid)
end
