defmodule XlaNode.MLIR.Type do
  @moduledoc false
  # The builder's tensor types, `{element_type, dims}` as `XlaNode.Tensor` spells element types:
  # their MLIR text, their family, and the check that a type given by a caller is one.

  alias XlaNode.Tensor

  @doc "The MLIR text of a type, e.g. `tensor<2x3xf32>`."
  def text({type, dims}) do
    "tensor<" <> Enum.map_join(dims, "", &"#{&1}x") <> element_text(type) <> ">"
  end

  @doc "The MLIR text of several types, comma-separated."
  def texts(types), do: Enum.map_join(types, ", ", &text/1)

  @doc "The MLIR text of an element type, e.g. `f32`, `ui4`, `i1` for pred."
  def element_text({:f, 8}), do: "f8E5M2"
  def element_text({:f8_e4m3fn, 8}), do: "f8E4M3FN"
  def element_text({:f, bits}), do: "f#{bits}"
  def element_text({:bf, 16}), do: "bf16"
  def element_text({:s, bits}), do: "i#{bits}"
  def element_text({:u, bits}), do: "ui#{bits}"
  def element_text({:pred, 8}), do: "i1"
  def element_text({:c, 64}), do: "complex<f32>"
  def element_text({:c, 128}), do: "complex<f64>"

  @doc "The family of an element type: `:float`, `:complex`, `:signed`, `:unsigned` or `:pred`."
  def category({:f, _}), do: :float
  def category({:f8_e4m3fn, _}), do: :float
  def category({:bf, _}), do: :float
  def category({:c, _}), do: :complex
  def category({:s, _}), do: :signed
  def category({:u, _}), do: :unsigned
  def category({:pred, _}), do: :pred

  @doc """
  A caller's `{type, dims}`, its element type normalized; raises `ArgumentError` naming `op`
  when it is not one.
  """
  def check!(op, {type, dims} = given) when is_list(dims) do
    type =
      try do
        Tensor.normalize_type(type)
      rescue
        e in ArgumentError ->
          reraise ArgumentError, "#{op}: #{Exception.message(e)}", __STACKTRACE__
      end

    unless Enum.all?(dims, &(is_integer(&1) and &1 >= 0)) do
      raise ArgumentError, "#{op}: dims must be non-negative integers, got #{inspect(given)}"
    end

    {type, dims}
  end

  def check!(op, other),
    do: raise(ArgumentError, "#{op}: expected a type {type, dims}, got #{inspect(other)}")
end
