defmodule XlaNodeClient.MixProject do
  use Mix.Project

  # Elixir client for `xla_node`. No dependencies: it only uses Erlang distribution.
  def project do
    [
      app: :xla_node_client,
      version: "0.1.0",
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      deps: [],
      name: "xla_node_client",
      docs: docs()
    ]
  end

  # HexDocs-style documentation, built by `mix docs` with the ExDoc of Debian 13's elixir-ex-doc
  # package (scripts/docs.sh runs it, in a Debian 13 userland; this project depends on nothing).
  defp docs do
    [
      main: "readme",
      extras: [
        "README.md": [filename: "readme", title: "The Elixir client"],
        "../README.md": [filename: "xla_node", title: "xla_node"],
        "../docs/callbacks.md": [title: "Host callbacks: the protocol"],
        "../docs/kernels.md": [title: "Native kernels"],
        "../docs/threading.md": [title: "The threading model"],
        "../docs/performance.md": [title: "Performance"],
        "../elixir_nx/README.md": [filename: "elixir_nx", title: "Nx on the node (elixir_nx)"]
      ],
      groups_for_extras: [Guides: ~r{docs/}],
      groups_for_modules: [
        Client: [XlaNode, XlaNode.Tensor, XlaNode.Error, XlaNode.Transfer, XlaNode.Telemetry],
        Callbacks: [XlaNode.CallbackServer],
        Pools: [XlaNode.Pool, XlaNode.Pool.Executable, XlaNode.Pool.Effects],
        Programs: [XlaNode.MLIR, XlaNode.MLIR.Value, XlaNode.MLIR.Func, XlaNode.MLIR.CPUFaults]
      ]
    ]
  end

  def application do
    [extra_applications: [:logger], mod: {XlaNode.Application, []}]
  end
end
