defmodule XlaNode.Compiler.Options do
  @moduledoc """
  The options `XlaNode.Compiler` takes, checked before anything is compiled: a misspelt option
  (`keep_on_devise: true`) raises instead of being silently ignored.

  Besides its own, the compiler accepts (and ignores) the options Nx itself passes through to
  a compiler: `Nx.Defn.jit/2`'s and `Nx.Defn.compile/3`'s `:hooks` (used) and `:on_conflict`,
  the `:compiler` that `Nx.Serving` leaves in the options of a partitioned serving, and the
  `:batch_keys` it adds to the options it gives the function that jits.
  """

  @own [
    node: :node,
    device_id: :non_neg_integer,
    callbacks: {:in, [:inside, :split]},
    callback_timeout: :positive_timeout,
    queue_timeout: :timeout,
    hooks: :map,
    keep_on_device: :boolean,
    timeout: :timeout
  ]
  @from_nx [batch_keys: :any, compiler: :any, on_conflict: :any]

  @note " (besides its own, the compiler takes Nx's " <>
          Enum.map_join(Keyword.keys(@from_nx), ", ", &inspect/1) <>
          "; options set with Nx.Defn.default_options/1 or :default_defn_options reach the " <>
          "compiler too)"

  @doc "The options the compiler accepts."
  def valid, do: Keyword.keys(@own ++ @from_nx)

  @doc "Returns `opts`, or raises `ArgumentError` naming an unknown option or a bad value."
  def validate!(opts),
    do: XlaNode.Options.validate!(opts, "XlaNode.Compiler", @own ++ @from_nx, @note)
end
