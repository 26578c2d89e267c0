defmodule Mix.Tasks.XlaNode.Setup do
  @shortdoc "Sets this machine up to run xla_node (plugin, release build) and prints the binary"

  @moduledoc """
  Sets this machine up to run compute nodes, as `mix tailwind.install` does for its binary:
  runs the repository's `scripts/setup.sh` (Erlang, Elixir and g++ from apt where missing, the
  PJRT CPU plugin, a release build of `xla_node`), then prints the path of the binary, which
  `XlaNode.Local` finds there by itself.

      $ mix xla_node.setup
      /home/me/xla_node/target/release/xla_node

      $ mix xla_node.setup --gpu

  `--gpu` also installs the CUDA PJRT plugin and the NVIDIA libraries it loads (several GB;
  only on a machine with an NVIDIA driver), for `XlaNode.Local`'s `plugin: :gpu`.

  Idempotent and quiet: each step is skipped when its result is there, nothing is printed but
  the path (and a line before the first build, which takes minutes), and the script's output is
  shown only when it fails. The client must be used from its checkout (a path dependency), where
  the script and the Rust sources are.
  """

  use Mix.Task

  @impl true
  def run(args) do
    {opts, rest} = OptionParser.parse!(args, strict: [gpu: :boolean])

    if rest != [] do
      Mix.raise("mix xla_node.setup takes no arguments but --gpu, got: #{Enum.join(rest, " ")}")
    end

    script =
      XlaNode.Setup.setup_script() ||
        Mix.raise(
          "mix xla_node.setup: no scripts/setup.sh in #{XlaNode.Setup.repo_root()}: use the " <>
            "client from a checkout of the xla_node repository (a path dependency)"
        )

    bin = XlaNode.Setup.built_bin()

    unless File.exists?(bin) do
      Mix.shell().info("xla_node.setup: building xla_node the first time (a few minutes)")
    end

    script_args = if opts[:gpu], do: ["--gpu"], else: []

    case System.cmd("bash", [script | script_args], stderr_to_stdout: true) do
      {_output, 0} ->
        Mix.shell().info(bin)

      {output, status} ->
        Mix.shell().error(output)
        Mix.raise("mix xla_node.setup: scripts/setup.sh failed (exit status #{status})")
    end
  end
end
