defmodule XlaNode.MLIR.Module do
  @moduledoc false
  # A module being built (what `XlaNode.MLIR.module/1` does): the functions defined while its
  # builder runs, in an ETS table owned by the building process, written in the order they
  # were defined once the builder returns. The same table holds the lines of the function
  # being built (XlaNode.MLIR.Function), under integer keys.

  alias XlaNode.MLIR.{Attribute, Builders}

  @enforce_keys [:table]
  defstruct [:table]

  @typedoc "`table`: the ETS table of `{{:function, name}, order, text}` and of lines."
  @type t :: %__MODULE__{table: :ets.tid()}

  # The least heap of a building process, in words: the builder's state is off the heap, which
  # then stays small and is collected often; the process's own setting is back afterwards.
  @min_heap_size 32_768

  @doc """
  Runs `fun`, which defines the module's functions; returns the module's text, with
  `attributes` (`[{name, attribute text}]`).
  """
  def build(fun, attributes) do
    module = %__MODULE__{table: :ets.new(__MODULE__, [:ordered_set, :private])}
    heap = Process.flag(:min_heap_size, @min_heap_size)

    try do
      Builders.open_module!(module)

      try do
        fun.()

        unless defined?(module, "main"),
          do: raise(ArgumentError, "the module has no \"main\" function")

        body =
          module.table
          |> :ets.select([{{{:function, :_}, :"$1", :"$2"}, [], [{{:"$1", :"$2"}}]}])
          |> Enum.sort()
          |> Enum.map_join("\n", fn {_order, text} -> text end)

        # Without attributes the text stays as it was, so that programs keep their cache keys.
        case attributes do
          [] -> body
          attributes -> "module attributes {#{Attribute.named(attributes)}} {\n" <> body <> "}\n"
        end
      after
        Builders.close_module()
      end
    after
      :ets.delete(module.table)
      Process.flag(:min_heap_size, heap)
    end
  end

  @doc "Whether `module` has a function `name`."
  def defined?(%__MODULE__{table: table}, name), do: :ets.member(table, {:function, name})

  @doc "Adds the function `name`, of MLIR `text`, after those defined before."
  def add(%__MODULE__{table: table}, name, text) do
    # The function's lines are taken out by now: the table holds the functions alone.
    :ets.insert(table, {{:function, name}, :ets.info(table, :size), text})
    :ok
  end
end
