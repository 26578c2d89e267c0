defmodule XlaNode.Options do
  @moduledoc false
  # Checks the keyword options of the library's public functions, in one place. A misspelt
  # option (`keep_on_devise: true`) would otherwise be silently ignored, and a value of the wrong
  # kind would fail far from the call, on the node or deep inside the MLIR builder. Both are
  # mistakes in the calling code, so both raise an ArgumentError that names the function, the
  # option, and what it accepts, as `Keyword.validate!/2` does for unknown keys.

  @typedoc """
  What an option accepts: one of the kinds below, `{:in, values}` (one of `values`), or
  `{:check, description, fun}` (a value for which `fun` returns true; `description` completes
  "must be ..." in the error).
  """
  @type kind ::
          :boolean
          | :boolean_or_indices
          | :timeout
          | :positive_timeout
          | :process
          | :pid
          | :name
          | :outfeed
          | :list
          | :map
          | :non_neg_integer
          | :pos_integer
          | :integers
          | :integer_lists
          | :integer_pairs
          | :dimension_layout
          | :attributes
          | :node
          | :node_names
          | :pool_name
          | :backoff
          | :string
          | :any
          | {:in, [term()]}
          | {:check, String.t(), (term() -> boolean())}

  @doc """
  Returns `opts` when it is a keyword list whose keys are all in `spec` (`[key: kind]`) and whose
  values are of their key's kind; raises `ArgumentError` otherwise. `function` names the caller
  in the message, e.g. `"XlaNode.run/4"`; `note`, if given, ends the message about an unknown
  option (where such options may come from). `XlaNode.Compiler` checks its options here too.
  """
  @spec validate!(keyword(), String.t(), [{atom(), kind()}], String.t() | nil) :: keyword()
  def validate!(opts, function, spec, note \\ nil) do
    unless is_list(opts) and Enum.all?(opts, &match?({key, _} when is_atom(key), &1)) do
      raise ArgumentError, "#{function}: options must be a keyword list, got: #{inspect(opts)}"
    end

    for {key, value} <- opts do
      case List.keyfind(spec, key, 0) do
        {^key, kind} ->
          unless valid?(kind, value) do
            raise ArgumentError,
                  "#{function}: option #{inspect(key)} must be #{describe(kind)}, " <>
                    "got: #{inspect(value)}"
          end

        nil ->
          raise ArgumentError,
                unknown_message(function, key, Keyword.keys(spec)) <> if(note, do: note, else: "")
      end
    end

    opts
  end

  defp unknown_message(function, key, known) do
    suggestion =
      known
      |> Enum.max_by(&String.jaro_distance(to_string(&1), to_string(key)), fn -> nil end)
      |> then(fn best ->
        if best && String.jaro_distance(to_string(best), to_string(key)) >= 0.8,
          do: " (did you mean #{inspect(best)}?)",
          else: ""
      end)

    valid =
      if known == [], do: "none", else: known |> Enum.sort() |> Enum.map_join(", ", &inspect/1)

    "#{function}: unknown option #{inspect(key)}#{suggestion}; valid options: #{valid}"
  end

  defp valid?(:boolean, value), do: is_boolean(value)

  defp valid?(:boolean_or_indices, value),
    do:
      is_boolean(value) or
        (is_list(value) and Enum.all?(value, &(is_integer(&1) and &1 >= 0)) and
           length(Enum.uniq(value)) == length(value))

  defp valid?(:timeout, value), do: value == :infinity or (is_integer(value) and value >= 0)

  defp valid?(:positive_timeout, value),
    do: value == :infinity or (is_integer(value) and value > 0)

  defp valid?(:process, value), do: is_pid(value) or name_at_node?(value) or plain_atom?(value)
  defp valid?(:pid, value), do: is_pid(value)

  defp valid?(:outfeed, value),
    do: value == nil or valid?(:process, value) or is_function(value, 1)

  defp valid?(:list, value), do: is_list(value)
  defp valid?(:map, value), do: is_map(value)
  defp valid?(:non_neg_integer, value), do: is_integer(value) and value >= 0
  defp valid?(:pos_integer, value), do: is_integer(value) and value > 0
  defp valid?(:integers, value), do: is_list(value) and Enum.all?(value, &is_integer/1)
  defp valid?({:in, values}, value), do: value in values
  defp valid?(:node, value), do: is_pid(value) or plain_atom?(value)
  defp valid?(:node_names, value), do: is_list(value) and Enum.all?(value, &node_name?/1)

  defp valid?(:pool_name, value),
    do: is_atom(value) and not String.contains?(Atom.to_string(value), "@")

  defp valid?(:backoff, value),
    do:
      match?(
        {first, max}
        when is_integer(first) and is_integer(max) and 0 <= first and first <= max and max > 0,
        value
      )

  defp valid?(:any, _value), do: true
  defp valid?(:string, value), do: is_binary(value) and value != ""
  defp valid?({:check, _description, fun}, value), do: fun.(value) == true

  defp valid?(:name, value) do
    case value do
      {:global, _} -> true
      {:via, module, _} -> is_atom(module)
      _ -> plain_atom?(value)
    end
  end

  defp valid?(:integer_lists, value),
    do: match?({a, b} when is_list(a) and is_list(b), value) and integer_lists?(value)

  defp valid?(:integer_pairs, value),
    do:
      is_list(value) and
        Enum.all?(value, &match?({a, b} when is_integer(a) and is_integer(b), &1))

  defp valid?(:dimension_layout, value) do
    match?({a, b, dims} when is_integer(a) and is_integer(b) and is_list(dims), value) and
      valid?(:integers, elem(value, 2))
  end

  defp valid?(:attributes, value) do
    is_list(value) and
      Enum.all?(value, &match?({k, v} when (is_atom(k) or is_binary(k)) and is_binary(v), &1))
  end

  defp integer_lists?({a, b}), do: valid?(:integers, a) and valid?(:integers, b)

  defp plain_atom?(value), do: is_atom(value) and value not in [nil, true, false]

  @doc "Whether `value` is a node name: an atom with an `@`, such as `:\"xla@host\"`."
  @spec node_name?(term()) :: boolean()
  def node_name?(value), do: plain_atom?(value) and String.contains?(Atom.to_string(value), "@")
  defp name_at_node?(value), do: match?({name, node} when is_atom(name) and is_atom(node), value)

  defp describe(:boolean), do: "a boolean"

  defp describe(:boolean_or_indices),
    do: "a boolean or a list of distinct non-negative integers (result indices)"

  defp describe(:timeout), do: "a non-negative integer (milliseconds) or :infinity"
  defp describe(:positive_timeout), do: "a positive integer (milliseconds) or :infinity"
  defp describe(:process), do: "a pid, a registered name (an atom) or {name, node}"
  defp describe(:pid), do: "a pid"
  defp describe(:name), do: "an atom, {:global, term} or {:via, module, term}"

  defp describe(:outfeed),
    do: "a pid, a registered name (an atom), {name, node}, a function of one argument or nil"

  defp describe(:list), do: "a list"
  defp describe(:map), do: "a map"
  defp describe(:non_neg_integer), do: "a non-negative integer"
  defp describe(:pos_integer), do: "a positive integer"
  defp describe(:integers), do: "a list of integers"
  defp describe(:integer_lists), do: "{lhs_dims, rhs_dims}, two lists of integers"
  defp describe(:integer_pairs), do: "a list of {integer, integer}"
  defp describe(:dimension_layout), do: "{dimension, dimension, [dimension]}, integers"
  defp describe(:attributes), do: "a list of {name, attribute text}"
  defp describe(:node), do: "a node name (an atom) or an XlaNode.Pool (its name or pid)"
  defp describe(:node_names), do: ~s(a list of node names such as :"xla@host")

  defp describe(:pool_name),
    do: "nil or an atom without \"@\" (it must not read as a node name)"

  defp describe(:backoff), do: "{first_ms, max_ms} with 0 <= first_ms <= max_ms and max_ms > 0"
  defp describe(:string), do: "a non-empty string"
  defp describe({:check, description, _fun}), do: description
  defp describe({:in, values}), do: "one of " <> Enum.map_join(values, ", ", &inspect/1)
end
