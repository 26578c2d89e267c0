defmodule XlaNodeIntegration.MixProject do
  use Mix.Project

  # Multi-node integration tests for the `xla_node` binary: real epmd, real BEAM peer nodes,
  # real TCP. The only dependency is the client library next door, by path (hex.pm is not
  # reachable). See test/test_helper.exs for how to run.
  def project do
    [
      app: :xla_node_integration,
      version: "0.1.0",
      elixir: "~> 1.14",
      elixirc_paths: elixirc_paths(Mix.env()),
      start_permanent: false,
      deps: [{:xla_node_client, path: "../elixir_client"}],
      preferred_cli_env: [test: :test]
    ]
  end

  # Every OTP application the suite uses is declared: since Elixir 1.15 Mix prunes the others
  # from the code path (:inets is the metrics test's HTTP client, whose defaults read
  # :public_key's, an application of :ssl's).
  def application do
    [extra_applications: [:logger, :crypto, :inets, :ssl]]
  end

  defp elixirc_paths(:test), do: ["lib", "test/support"]
  defp elixirc_paths(_), do: ["lib"]
end
