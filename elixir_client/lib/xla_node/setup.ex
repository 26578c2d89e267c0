defmodule XlaNode.Setup do
  @moduledoc false
  # Where things are on this machine, as the repository's scripts put them: the release binary
  # `scripts/setup.sh` builds (beside this client, in the same checkout), the PJRT plugins it
  # installs under `$XDG_DATA_HOME/xla_node` (`~/.local/share/xla_node`), and the script itself
  # (`mix xla_node.setup` runs it). Paths of scripts/gpu_env.sh, which this follows.

  # This file is <repo>/elixir_client/lib/xla_node/setup.ex, also when the client is a path
  # dependency of another project (Mix compiles it where it is).
  @repo_root Path.expand("../../..", __DIR__)

  @doc "The checkout this client belongs to."
  def repo_root, do: @repo_root

  @doc "The script that sets a machine up (`scripts/setup.sh`), or nil outside a checkout."
  def setup_script do
    path = Path.join(@repo_root, "scripts/setup.sh")
    if File.regular?(path), do: path
  end

  @doc "Where `scripts/setup.sh` builds the node binary."
  def built_bin, do: Path.join(@repo_root, "target/release/xla_node")

  @doc """
  The node binary and where that choice came from: the `bin` given (an option, or the
  application's config), else `$XLA_NODE_BIN`, else `built_bin/0`.
  """
  def bin(given) do
    cond do
      given -> {Path.expand(given), "the :bin option"}
      env = System.get_env("XLA_NODE_BIN") -> {Path.expand(env), "XLA_NODE_BIN"}
      true -> {built_bin(), "where scripts/setup.sh builds it"}
    end
  end

  @doc "`$XDG_DATA_HOME/xla_node` (default `~/.local/share/xla_node`)."
  def data_dir do
    base = System.get_env("XDG_DATA_HOME") || Path.join(System.user_home!(), ".local/share")
    Path.join(base, "xla_node")
  end

  @doc "The CUDA PJRT plugin `scripts/setup.sh --gpu` installs."
  def cuda_plugin, do: Path.join(data_dir(), "cuda/jax_plugins/xla_cuda13/xla_cuda_plugin.so")

  @doc "ptxas and libdevice installed with it, for `XLA_FLAGS=--xla_gpu_cuda_data_dir=...`."
  def cuda_data_dir, do: Path.join(data_dir(), "cuda/nvidia/cu13")
end
