defprotocol XlaNode.Compiler.CustomCall do
  @moduledoc """
  Lowers an `Nx.block/4` to a native kernel on the node instead of its default expression.

  A library that ships a kernel for a block (an XLA FFI handler, loaded on the node with
  `--kernel` or `XlaNode.load_kernel/5`, see [Native kernels](kernels.md)) implements this
  protocol for its block struct. For every block in a `defn`, `XlaNode.Compiler` calls
  `call(block, out, args, target)`:

    * `block` - the struct given to `Nx.block/4`;
    * `out` - the block's output template (a tensor template, or a tuple or map of them);
    * `args` - the templates of its tensor arguments, in order;
    * `target` - `%{node: node, platform: platform}`, the compute node and its platform as the
      node names it (`"cpu"`, `"cuda"`, ...), so that an implementation can keep a host-only
      kernel off other platforms.

  It returns `:skip`, and the block runs as the compiler would lower it otherwise (one
  StableHLO op for the blocks StableHLO expresses, the default expression for the rest), or
  `{:ok, %XlaNode.Compiler.CustomCall.Spec{}}`: a `stablehlo.custom_call` to the spec's target
  with the block's tensor arguments as operands and its outputs, flattened, as results. Blocks
  whose struct has no implementation are skipped.

  ## Example

  A block for `y = x * n + sin(x)`, served by a kernel registered on the node as
  `"my_add_scaled"`, on CPU nodes only:

      defmodule MyLib.AddScaled do
        defstruct n: 1.0

        def add_scaled(x, n) do
          Nx.block(%__MODULE__{n: n}, [x], x, fn %{n: n}, x -> Nx.add(Nx.multiply(x, n), Nx.sin(x)) end)
        end
      end

      defimpl XlaNode.Compiler.CustomCall, for: MyLib.AddScaled do
        def call(%{n: n}, %{type: {:f, 32}}, [_x], %{platform: "cpu"}) do
          {:ok, %XlaNode.Compiler.CustomCall.Spec{target: "my_add_scaled", attributes: [n: n]}}
        end

        def call(_block, _out, _args, _target), do: :skip
      end

  Any other compiler runs the default expression, so the block works everywhere. (This example
  is the one the tests of elixir_nx define, in `test/support/add_scaled.ex`, and run against the
  node's test kernel library.)
  """

  @fallback_to_any true

  @doc """
  Returns `:skip` or `{:ok, %XlaNode.Compiler.CustomCall.Spec{}}` for a block. A struct without
  an implementation of its own (here a map) is skipped:

      iex> out = Nx.template({3}, :f32)
      iex> XlaNode.Compiler.CustomCall.call(%{n: 2.0}, out, [out], %{node: :"xla@host", platform: "cpu"})
      :skip
  """
  def call(block, out, args, target)
end

defimpl XlaNode.Compiler.CustomCall, for: Any do
  def call(_block, _out, _args, _target), do: :skip
end

defmodule XlaNode.Compiler.CustomCall.Spec do
  @moduledoc """
  The custom call a block becomes (see `XlaNode.Compiler.CustomCall`).

    * `:target` - the FFI target name the kernel is registered under on the node (required)
    * `:attributes` - the handler's attributes, `[{name, value}]`, each value as
      `XlaNode.MLIR.attribute/1` takes it (a float is an `f32`, an integer an `i64`,
      `{type, number}` any other scalar type, a string, a boolean, a list of numbers an array)
    * `:operand_types` - element types to convert the operands to first, one per operand
      (`nil`: as they are)
    * `:has_side_effect` - keep the call even when its results are unused (default `false`)

      iex> %XlaNode.Compiler.CustomCall.Spec{target: "my_add_scaled", attributes: [{"n", 2.5}]}
      %XlaNode.Compiler.CustomCall.Spec{target: "my_add_scaled", attributes: [{"n", 2.5}], operand_types: nil, has_side_effect: false}
  """

  @enforce_keys [:target]
  defstruct [:target, attributes: [], operand_types: nil, has_side_effect: false]
end
