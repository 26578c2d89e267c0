defmodule XlaNode.MLIR.Function do
  @moduledoc false
  # A function being built (what `XlaNode.MLIR.function/4` does). Its values carry it, as
  # EXLA's values carry their function, and an op on them writes into it: the function holds
  # its ops' lines in its module's ETS table (functions do not nest), keyed by the number each
  # op was named by (`%n`), and the counter that numbers them. Numbers follow the calls that made
  # the ops, so when a region's body returns, the ops written since it opened are its block's
  # (XlaNode.MLIR.Region takes them out into its op's line), and when the function's body
  # returns, those left are its own, in order.

  alias XlaNode.MLIR.{Attribute, Builders, Func, Module, Type, Value}

  @enforce_keys [:name, :lines, :state, :owner]
  defstruct [:name, :lines, :state, :owner]

  @typedoc """
  `lines`: the ETS table of its module where it writes `{number, line}`; `state`: atomics of the next number and whether
  the body runs (1) or returned (0); `owner`: the building process.
  """
  @type t :: %__MODULE__{
          name: String.t(),
          lines: :ets.tid(),
          state: :atomics.atomics_ref(),
          owner: pid()
        }

  @next 1
  @open 2

  @doc """
  Builds the function `name` of the module the calling process builds: `body` receives values
  of `arg_types` and returns a value or a list of values. Returns its `XlaNode.MLIR.Func`.
  `opts`, checked by `XlaNode.MLIR.function/4`: `private` (whether it is written private) and
  `arg_attributes` (nil or `[{name, attribute text}]` for each argument).
  """
  def build(name, arg_types, body, opts) do
    module =
      case Builders.where() do
        {module, nil} ->
          module

        {_module, _function} ->
          raise ArgumentError, "function/4 cannot be called inside another function"

        nil ->
          raise ArgumentError, "function/4 must be called inside XlaNode.MLIR.module/1"
      end

    if Module.defined?(module, name),
      do: raise(ArgumentError, "function #{inspect(name)} is defined twice")

    arg_types = Enum.map(arg_types, &Type.check!("function #{name}", &1))
    arg_attributes = arg_attributes!(name, opts, length(arg_types))

    function = %__MODULE__{
      name: name,
      lines: module.table,
      state: :atomics.new(2, signed: false),
      owner: self()
    }

    args =
      for {t, i} <- Enum.with_index(arg_types),
          do: %Value{name: "%arg#{i}", type: t, function: function}

    :atomics.put(function.state, @open, 1)
    Builders.put_function(function)

    try do
      results = body.(args) |> List.wrap() |> Enum.map(&value!("return", &1))
      result_types = Enum.map(results, & &1.type)

      text =
        [
          "func.func #{if opts[:private], do: "private ", else: ""}@#{name}(",
          Enum.zip_with(args, arg_attributes, &argument_text/2) |> Enum.join(", "),
          ") -> (",
          Type.texts(result_types),
          ") {\n",
          take_from(function, 0),
          "  \"func.return\"(#{names(results)}) : (#{Type.texts(result_types)}) -> ()\n}\n"
        ]
        |> IO.iodata_to_binary()

      Module.add(module, name, text)
      %Func{name: name, arg_types: arg_types, result_types: result_types}
    after
      :atomics.put(function.state, @open, 0)
      Builders.put_function(nil)
      # What a body that raised wrote.
      take_from(function, 0)
    end
  end

  defp arg_attributes!(name, opts, count) do
    case Keyword.fetch(opts, :arg_attributes) do
      :error ->
        List.duplicate(nil, count)

      {:ok, attributes} when length(attributes) == count ->
        Enum.each(attributes, fn entry ->
          unless entry == nil or attributes?(entry) do
            raise ArgumentError,
                  "function #{name}: each of :arg_attributes must be nil or a list of " <>
                    "{name, attribute text}, got: #{inspect(entry)}"
          end
        end)

        attributes

      {:ok, attributes} ->
        raise ArgumentError,
              "function #{name}: :arg_attributes has #{length(attributes)} entries for " <>
                "#{count} arguments"
    end
  end

  defp attributes?(entry),
    do:
      is_list(entry) and Enum.all?(entry, &match?({k, v} when is_binary(k) and is_binary(v), &1))

  defp argument_text(arg, attributes) when attributes in [nil, []],
    do: "#{arg.name}: #{Type.text(arg.type)}"

  defp argument_text(arg, attributes),
    do: "#{arg.name}: #{Type.text(arg.type)} {#{Attribute.named(attributes)}}"

  @doc """
  `value` if it is a value of the function whose body runs in the calling process; raises
  `ArgumentError` otherwise (naming `op` if it is not a value at all).
  """
  def value!(_op, %Value{function: %__MODULE__{owner: owner, state: state}} = value)
      when owner == self() do
    if :atomics.get(state, @open) == 1, do: value, else: misplaced!(value)
  end

  def value!(_op, %Value{} = value), do: misplaced!(value)

  def value!(op, other),
    do: raise(ArgumentError, "#{op}: expected a value, got #{inspect(other)}")

  # A value used where its function is not being built: in another function, or in none.
  defp misplaced!(value) do
    if Builders.function(),
      do: raise(ArgumentError, "#{value.name} belongs to another function"),
      else: raise(ArgumentError, "not inside XlaNode.MLIR.function/3")
  end

  @doc """
  The function an op of `operands` writes into: theirs (they were checked with `value!/2`),
  or for an op without operands the one whose body runs.
  """
  def of([%Value{function: function} | _]), do: function
  def of([]), do: current!()

  @doc "The function whose body runs in the calling process; raises `ArgumentError` if none."
  def current! do
    Builders.function() || raise ArgumentError, "not inside XlaNode.MLIR.function/3"
  end

  @doc "A fresh number for a value of `function` (`%n`)."
  def next_number(%__MODULE__{state: state}), do: :atomics.add_get(state, @next, 1) - 1

  @doc "The number `next_number/1` gives next."
  def peek_number(%__MODULE__{state: state}), do: :atomics.get(state, @next)

  @doc "Writes the line of the op numbered `number`."
  def write(%__MODULE__{lines: lines}, number, line) do
    :ets.insert(lines, {number, line})
    :ok
  end

  @doc "Takes out the lines of the ops numbered from `first` on, in order."
  def take_from(%__MODULE__{lines: lines}, first), do: take(lines, :ets.next(lines, first - 1))

  # Lines are keyed by integers, which sort before the module's other keys.
  defp take(lines, number) when is_integer(number) do
    [{_, line}] = :ets.take(lines, number)
    [line | take(lines, :ets.next(lines, number))]
  end

  defp take(_lines, _end), do: []

  @doc """
  Forgets the ops numbered from `first` on and gives their numbers again: what a region whose
  body raised leaves.
  """
  def discard_from(%__MODULE__{state: state} = function, first) do
    take_from(function, first)
    :atomics.put(state, @next, first)
    :ok
  end

  @doc "The names of values, comma-separated."
  def names(values), do: Enum.map_join(values, ", ", & &1.name)
end
