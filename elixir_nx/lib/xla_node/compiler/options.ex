defmodule XlaNode.Compiler.Options do
  @moduledoc false

  # The options `XlaNode.Compiler` takes, checked before anything is compiled: a value of the
  # wrong kind (`keep_on_device: :yes`, `timeout: :never`) raises `ArgumentError` naming the
  # option.
  #
  # Options the compiler does not know are accepted and ignored, as `Nx.Defn.Evaluator` and
  # `EXLA` do: `Nx.Defn.jit/2` hands a compiler every option it is given, and libraries forward
  # their own through it (`Axon.build(model, mode: :train)` passes `:mode`, and others
  # `:global_layer_options` or `:print_values`), as does Nx itself (`:hooks`, `:on_conflict`,
  # `Nx.Serving`'s `:batch_keys` and the `:compiler` it leaves in a partitioned serving's
  # options). So a misspelt option of the compiler's own (`keep_on_devise: true`) is ignored too.

  @own [
    node: :node,
    device_id: :non_neg_integer,
    callbacks: {:in, [:inside, :split]},
    callback_timeout: :positive_timeout,
    queue_timeout: :timeout,
    priority: {:in, [:high, :normal, :low]},
    hooks: :map,
    keep_on_device: :boolean,
    timeout: :timeout,
    debug: :boolean,
    wait: :boolean
  ]

  @doc "The compiler's own options, whose values are checked."
  def own, do: Keyword.keys(@own)

  @doc """
  Returns `opts`, or raises `ArgumentError` when it is not a keyword list or one of the
  compiler's own options has a value it does not take. Other options pass unchecked.
  """
  def validate!(opts) do
    foreign =
      for {key, _value} when is_atom(key) <- List.wrap(opts),
          not Keyword.has_key?(@own, key),
          uniq: true,
          do: {key, :any}

    XlaNode.Options.validate!(opts, "XlaNode.Compiler", @own ++ foreign)
  end
end
