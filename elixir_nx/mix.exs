defmodule XlaNodeNx.LocalPackages do
  @moduledoc false
  # Nx's own mix.exs names its dependencies as Hex packages (`{:complex, "~> 0.7"}`). Without
  # Hex, Mix cannot even read such an entry ("Could not find an SCM for dependency :complex"),
  # so an unedited Nx checkout cannot be a path dependency. Where Hex is not installed, this SCM
  # answers for those entries: a package with a local checkout (COMPLEX_PATH, TELEMETRY_PATH)
  # resolves to it, and the project's own path dependency on the same checkout overrides Nx's
  # version requirement; any other (Nx's docs-only tools) stays unavailable, which is harmless
  # outside the environment that names it.
  @behaviour Mix.SCM

  @variables %{complex: "COMPLEX_PATH", telemetry: "TELEMETRY_PATH"}

  @doc "The local checkouts given in the environment, as `{app, path}`."
  def checkouts do
    for {app, var} <- @variables, path = System.get_env(var), do: {app, path}
  end

  @doc "Makes Mix ask this SCM about Hex entries, unless Hex itself is installed."
  def register do
    unless Code.ensure_loaded?(Hex), do: Mix.SCM.append(__MODULE__)
  end

  @impl true
  def fetchable?, do: false

  @impl true
  def format(opts) do
    opts[:local_path] ||
      "Hex package, and Hex is not installed: set #{opts[:local_variable]} to a local checkout"
  end

  @impl true
  def format_lock(_opts), do: nil

  @impl true
  def accepts_options(app, opts) do
    variable = Map.get(@variables, app, "#{app |> Atom.to_string() |> String.upcase()}_PATH")

    case System.get_env(variable) do
      nil -> Keyword.put(opts, :local_variable, variable)
      path -> Keyword.merge(opts, local_path: path, dest: Path.expand(path))
    end
  end

  @impl true
  def checked_out?(opts), do: opts[:local_path] != nil and File.dir?(opts[:dest])

  @impl true
  def checkout(opts), do: Mix.raise(format(opts))

  @impl true
  def update(opts), do: Mix.raise(format(opts))

  @impl true
  def lock_status(_opts), do: :ok

  @impl true
  def equal?(opts1, opts2), do: opts1[:dest] == opts2[:dest]

  @impl true
  def managers(_opts), do: []
end

defmodule XlaNodeNx.MixProject do
  use Mix.Project

  # `defn` on xla_node: an Nx compiler (`XlaNode.Compiler`) that lowers expressions to StableHLO
  # with the client's `XlaNode.MLIR`, compiles and runs them on a compute node, and serves
  # `runtime_call`s and hooks on the caller's node.
  #
  # Nx is an ordinary dependency. To build against a local checkout instead (machines without
  # Hex), point NX_PATH at its `nx` folder, and COMPLEX_PATH and TELEMETRY_PATH at local
  # checkouts of its dependencies (see the README).
  def project do
    [
      app: :xla_node_nx,
      version: "0.1.0",
      elixir: "~> 1.17",
      start_permanent: Mix.env() == :prod,
      elixirc_paths: elixirc_paths(Mix.env()),
      deps: deps(),
      name: "xla_node_nx",
      docs: docs()
    ]
  end

  # The tests also run the documentation's examples, with the integration suite's reader of them
  # (an outside directory must be given as an absolute path).
  defp elixirc_paths(:test),
    do: ["lib", "test/support", Path.expand("../integration/test/support/doc_examples", __DIR__)]

  defp elixirc_paths(_), do: ["lib"]

  # HexDocs-style documentation, built by `mix docs` with the ExDoc of Debian 13's elixir-ex-doc
  # package (scripts/docs.sh runs it where Nx is present); the client's modules link to its
  # documentation, built beside this one.
  defp docs do
    [
      main: "readme",
      extras: [
        "README.md": [filename: "readme", title: "Nx on the node"],
        "../docs/callbacks.md": [title: "Host callbacks: the protocol"],
        "../docs/kernels.md": [title: "Native kernels"],
        "../docs/threading.md": [title: "The threading model"],
        "../docs/performance.md": [title: "Performance"],
        "../elixir_client/README.md": [filename: "client", title: "The Elixir client"]
      ],
      groups_for_extras: [Guides: ~r{docs/}],
      deps: [xla_node_client: "../../elixir_client/doc"]
    ]
  end

  # Mix (Elixir >= 1.15) prunes from the code path the OTP applications a project does not
  # declare: the tests' random data comes from :crypto.
  def application do
    [extra_applications: extra_applications(Mix.env()), mod: {XlaNode.Compiler.Application, []}]
  end

  defp extra_applications(:test), do: [:logger, :crypto]
  defp extra_applications(_), do: [:logger]

  defp deps do
    [{:xla_node_client, path: "../elixir_client"} | nx_deps()]
  end

  defp nx_deps do
    case System.get_env("NX_PATH") do
      nil ->
        [{:nx, "~> 0.13"}]

      nx ->
        XlaNodeNx.LocalPackages.register()

        [{:nx, path: nx, override: true}] ++
          Enum.flat_map(XlaNodeNx.LocalPackages.checkouts(), fn {app, path} ->
            [{app, path: path, override: true}]
          end)
    end
  end
end
