defmodule XlaNode.Compiler.Options do
  @moduledoc """
  The options `XlaNode.Compiler` takes, checked before anything is compiled: a misspelt option
  (`keep_on_devise: true`) raises instead of being silently ignored.

  Besides its own, the compiler accepts (and ignores) the options Nx itself passes through to
  a compiler: `Nx.Defn.jit/2`'s and `Nx.Defn.compile/3`'s `:hooks` (used) and `:on_conflict`,
  the `:compiler` that `Nx.Serving` leaves in the options of a partitioned serving, and the
  `:batch_keys` it adds to the options it gives the function that jits.
  """

  @own [:node, :callbacks, :callback_timeout, :queue_timeout, :hooks, :keep_on_device, :timeout]
  @from_nx [:batch_keys, :compiler, :on_conflict]

  @doc "The options the compiler accepts."
  def valid, do: @own ++ @from_nx

  @doc "Returns `opts`, or raises `ArgumentError` naming an unknown option or a bad value."
  def validate!(opts) when is_list(opts) do
    Enum.each(opts, fn
      {key, value} when key in @own -> check!(key, value)
      {key, _value} when key in @from_nx -> :ok
      other -> unknown!(other)
    end)

    opts
  end

  defp unknown!(option) do
    what =
      case option do
        {key, _} when is_atom(key) -> "unknown option #{inspect(key)}"
        other -> "options must be a keyword list, got #{inspect(other)} in it"
      end

    raise ArgumentError,
          "XlaNode.Compiler: #{what}. The valid options are " <>
            Enum.map_join(@own, ", ", &inspect/1) <>
            ", and Nx's own " <>
            Enum.map_join(@from_nx, ", ", &inspect/1) <>
            " (options set with Nx.Defn.default_options/1 or :default_defn_options reach " <>
            "the compiler too)"
  end

  defp check!(:node, node) when is_atom(node) and node != nil, do: :ok
  defp check!(:node, pool) when is_pid(pool), do: :ok
  defp check!(:callbacks, mode) when mode in [:inside, :split], do: :ok
  defp check!(key, :infinity) when key in [:callback_timeout, :queue_timeout, :timeout], do: :ok
  defp check!(:callback_timeout, ms) when is_integer(ms) and ms > 0, do: :ok
  defp check!(:queue_timeout, ms) when is_integer(ms) and ms >= 0, do: :ok
  defp check!(:hooks, hooks) when is_map(hooks), do: :ok
  defp check!(:keep_on_device, keep) when is_boolean(keep), do: :ok
  defp check!(:timeout, ms) when is_integer(ms) and ms >= 0, do: :ok

  defp check!(key, value) do
    raise ArgumentError,
          "XlaNode.Compiler: #{inspect(key)} must be #{expected(key)}, got #{inspect(value)}"
  end

  defp expected(:node), do: "a node name (an atom) or an XlaNode.Pool (its name or pid)"
  defp expected(:callbacks), do: ":inside or :split"
  defp expected(:callback_timeout), do: "a positive integer (milliseconds) or :infinity"
  defp expected(:queue_timeout), do: "a non-negative integer (milliseconds) or :infinity"
  defp expected(:hooks), do: "a map of hook names to functions"
  defp expected(:keep_on_device), do: "a boolean"
  defp expected(:timeout), do: "a non-negative integer (milliseconds) or :infinity"
end
