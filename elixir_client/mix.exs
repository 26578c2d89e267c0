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
      docs: [main: "XlaNode"]
    ]
  end

  def application do
    [extra_applications: [:logger], mod: {XlaNode.Application, []}]
  end
end
