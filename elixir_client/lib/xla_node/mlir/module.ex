defmodule XlaNode.MLIR.Module do
  @moduledoc false
  # A module being built (what `XlaNode.MLIR.module/1` does): the functions defined while its
  # builder runs, in an ETS table owned by the building process, written in the order they
  # were defined once the builder returns.

  alias XlaNode.MLIR.Builders

  @enforce_keys [:functions]
  defstruct [:functions]

  @typedoc "`functions`: the ETS table of `{name, order, text}`."
  @type t :: %__MODULE__{functions: :ets.tid()}

  @doc "Runs `fun`, which defines the module's functions; returns the module's text."
  def build(fun) do
    module = %__MODULE__{functions: :ets.new(__MODULE__, [:set, :private])}

    try do
      Builders.open_module!(module)

      try do
        fun.()

        unless defined?(module, "main"),
          do: raise(ArgumentError, "the module has no \"main\" function")

        module.functions
        |> :ets.tab2list()
        |> Enum.sort_by(fn {_name, order, _text} -> order end)
        |> Enum.map_join("\n", fn {_name, _order, text} -> text end)
      after
        Builders.close_module()
      end
    after
      :ets.delete(module.functions)
    end
  end

  @doc "Whether `module` has a function `name`."
  def defined?(%__MODULE__{functions: functions}, name), do: :ets.member(functions, name)

  @doc "Adds the function `name`, of MLIR `text`, after those defined before."
  def add(%__MODULE__{functions: functions}, name, text) do
    :ets.insert(functions, {name, :ets.info(functions, :size), text})
    :ok
  end
end
