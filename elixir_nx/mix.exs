defmodule XlaNodeNx.MixProject do
  use Mix.Project

  # `defn` on xla_node: an Nx compiler (`XlaNode.Compiler`) that lowers expressions to StableHLO
  # with the client's `XlaNode.MLIR`, compiles and runs them on a compute node, and serves
  # `runtime_call`s and hooks on the caller's node.
  #
  # Nx is an ordinary dependency. To build against a local checkout instead (machines without
  # Hex), point NX_PATH at its `nx` folder, and COMPLEX_PATH and TELEMETRY_PATH at its
  # dependencies.
  def project do
    [
      app: :xla_node_nx,
      version: "0.1.0",
      elixir: "~> 1.17",
      start_permanent: Mix.env() == :prod,
      elixirc_paths: if(Mix.env() == :test, do: ["lib", "test/support"], else: ["lib"]),
      deps: deps()
    ]
  end

  def application do
    [extra_applications: [:logger], mod: {XlaNode.Compiler.Application, []}]
  end

  defp deps do
    [{:xla_node_client, path: "../elixir_client"} | nx_deps()]
  end

  defp nx_deps do
    case System.get_env("NX_PATH") do
      nil ->
        [{:nx, "~> 0.13"}]

      nx ->
        [{:nx, path: nx, override: true}] ++
          local("COMPLEX_PATH", :complex) ++ local("TELEMETRY_PATH", :telemetry)
    end
  end

  defp local(var, app) do
    case System.get_env(var) do
      nil -> []
      path -> [{app, path: path, override: true}]
    end
  end
end
