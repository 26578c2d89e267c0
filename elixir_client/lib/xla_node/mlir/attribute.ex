defmodule XlaNode.MLIR.Attribute do
  @moduledoc false
  # The MLIR text of attributes: the FFI attributes of a custom call's backend_config (what
  # `XlaNode.MLIR.attribute/1` documents), the integer arrays and padding of StableHLO ops, and
  # named attributes (a module's, an argument's).

  alias XlaNode.MLIR.Type

  @doc "An `array<i64: ...>` attribute."
  def i64_array([]), do: "array<i64>"
  def i64_array(list), do: "array<i64: #{Enum.join(list, ", ")}>"

  @doc "Named attributes, `[{name, attribute text}]`, as a dictionary's entries: `a = 1, b = 2`."
  def named(attributes),
    do: Enum.map_join(attributes, ", ", fn {name, value} -> "#{name} = #{value}" end)

  @doc "A padding attribute, `[{low, high}]` per dimension, as a `tensor<Nx2xi64>`."
  def padding(padding) do
    rows = Enum.map_join(padding, ", ", fn {lo, hi} -> "[#{lo}, #{hi}]" end)
    "dense<[#{rows}]> : tensor<#{length(padding)}x2xi64>"
  end

  @doc "The text of one FFI attribute from an Elixir value: see `XlaNode.MLIR.attribute/1`."
  def text(value) when is_boolean(value), do: to_string(value)
  def text(value) when is_float(value), do: text({{:f, 32}, value})
  def text(value) when is_integer(value), do: text({{:s, 64}, value})
  def text({:mlir, text}) when is_binary(text), do: text

  def text(value) when is_binary(value) do
    escaped =
      for <<byte <- value>>, into: "" do
        if byte in 0x20..0x7E and byte not in [?", ?\\],
          do: <<byte>>,
          else: "\\" <> Base.encode16(<<byte>>)
      end

    ~s("#{escaped}")
  end

  def text([n | _] = list) when is_integer(n), do: text({{:s, 64}, list})

  def text({type, list}) when is_list(list) do
    elem = attribute_type!(type)

    "array<#{Type.element_text(elem)}: " <>
      Enum.map_join(list, ", ", &number_text(&1, elem)) <> ">"
  end

  def text({type, number}) when is_number(number) do
    elem = attribute_type!(type)
    "#{number_text(number, elem)} : #{Type.element_text(elem)}"
  end

  def text(other) do
    raise ArgumentError,
          "attribute: expected a number, {type, number}, {type, [numbers]}, a string, a boolean " <>
            "or {:mlir, text}, got #{inspect(other)}"
  end

  defp attribute_type!(type) do
    case Type.check!("attribute", {type, []}) do
      {{kind, _} = elem, []} when kind in [:s, :u, :f] ->
        elem

      _ ->
        raise ArgumentError, "attribute: expected an integer or float type, got #{inspect(type)}"
    end
  end

  defp number_text(n, {:f, _}), do: :erlang.float_to_binary(n / 1, [:short])

  defp number_text(n, {kind, _}) when is_integer(n) and kind in [:s, :u],
    do: Integer.to_string(n)

  defp number_text(n, elem),
    do: raise(ArgumentError, "attribute: #{inspect(n)} is not a #{Type.element_text(elem)} value")
end
