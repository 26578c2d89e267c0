defmodule XlaNode.MLIR do
  @moduledoc """
  Builds StableHLO programs from Elixir: each op takes typed values and returns a typed value,
  checking the types in Elixir, and `module/2` returns the module's text, ready for
  `XlaNode.compile/3`.

  Types are the client's `{type, dims}` (see `XlaNode.Tensor`): `{{:f, 32}, [2, 3]}` is
  `tensor<2x3xf32>`, `{{:u, 4}, [8]}` is `tensor<8xui4>`, `{{:f, 8}, []}` (E5M2) is
  `tensor<f8E5M2>` and `{{:f8_e4m3fn, 8}, []}` is `tensor<f8E4M3FN>`. A mismatch raises `ArgumentError` naming the op, the operands' types and
  what was expected, before anything reaches a node. Ops that take options (a keyword list,
  documented with each) check them the same way: an unknown option, or a value of the wrong kind,
  raises `ArgumentError` naming it and listing the valid ones. The same program always gives the
  same text, so the node's compile cache hits.

  ## Example

      iex> alias XlaNode.MLIR, as: M
      iex> text =
      ...>   M.module(fn ->
      ...>     M.function("main", [{{:f, 32}, [4]}], fn [x] ->
      ...>       one = M.constant(1.0, {{:f, 32}, [4]})
      ...>       M.add(x, one)
      ...>     end)
      ...>   end)
      iex> text =~ ~s|"stablehlo.add"(%arg0, %0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>|
      true
      iex> M.add(M.constant(1, {{:s, 32}, []}), M.constant(1.0, {{:f, 32}, []}))
      ** (ArgumentError) not inside XlaNode.MLIR.function/3

  Inside a function body, ops emit operations into the function; the body returns a value, or a
  list of values for several results.

  Values (`XlaNode.MLIR.Value`) carry their function, as EXLA's values do, and an op writes its
  operation into the function of its operands: the builder is split as EXLA's is, into the
  module, its functions, values, regions and operations (with the text of their types and
  attributes), and the ops into families, which this module documents and delegates to. The
  process keeps no builder state of its own beyond which module and function it is building,
  for the ops that have no operand to say so (constants, iota).

  ## Ops

    * elementwise, unary: `abs/1`, `negate/1`, `sign/1`, `exponential/1`,
      `exponential_minus_one/1`, `log/1`, `log_plus_one/1`, `logistic/1`, `sqrt/1`, `rsqrt/1`,
      `cbrt/1`, `sine/1`, `cosine/1`, `tan/1`, `tanh/1`, `floor/1`, `ceil/1`,
      `round_nearest_even/1`, `round_nearest_afz/1`, `bitwise_not/1`, `population_count/1`,
      `count_leading_zeros/1`, `is_finite/1`, `real/1`, `imag/1`, and from CHLO `erf/1`,
      `erfc/1`, `erf_inv/1`, `lgamma/1`, `digamma/1`, `asin/1`, `acos/1`, `atan/1`, `sinh/1`,
      `cosh/1`, `asinh/1`, `acosh/1`, `atanh/1`, `is_inf/1`, `is_pos_inf/1`, `is_neg_inf/1`
    * elementwise, binary: `add/2`, `subtract/2`, `multiply/2`, `divide/2`, `remainder/2`,
      `power/2`, `maximum/2`, `minimum/2`, `atan2/2`, `complex/2`, `bitwise_and/2`,
      `bitwise_or/2`, `bitwise_xor/2`, `shift_left/2`, `shift_right_arithmetic/2`,
      `shift_right_logical/2`; `compare/4`, `select/3`, `clamp/3`
    * types and values: `constant/2`, `constant_binary/2`, `iota/2`, `convert/2`,
      `bitcast_convert/2`
    * shapes: `broadcast_in_dim/3`, `reshape/2`, `transpose/2`, `reverse/2`, `slice/4`,
      `dynamic_slice/3`, `dynamic_update_slice/3`, `concatenate/2`, `pad/5`, `gather/4`,
      `scatter/5`
    * contractions and windows: `dot_general/3`, `convolution/3`, `reduce/4`,
      `reduce_window/5`, `select_and_scatter/7`, `sort/4`, `top_k/2`, `fft/3`,
      `triangular_solve/3`
    * control flow: `while_loop/3`, `if_then_else/3`, `case_of/2`, `call/2`
    * others: `optimization_barrier/1`, `rng_bit_generator/3`
    * calls out of the program: `runtime_call/4`, `io_call/3`, `outfeed/2`, `infeed/2`,
      `stream_target/1`, `custom_call/4`

  ## Regions

  Ops with regions (`reduce/4`, `reduce_window/5`, `scatter/5`, `select_and_scatter/7`,
  `sort/4`, `while_loop/3`, `if_then_else/3`, `case_of/2`) take Elixir functions that receive
  the region's arguments as values and return its results.

  ## Callbacks

  `runtime_call/4` emits EXLA's `exla_runtime_callback` custom call: the function's first
  parameter must be the `{{:u, 8}, [8]}` callback handle, which the node supplies when the run
  has a `callback_server:` (see `XlaNode.run/4`), and the callback id may be any term.
  `io_call/3` is the side-effect form; `outfeed/2` and `infeed/2` stream values to and from a
  process; `custom_call/4` calls any registered FFI target (a native kernel).

  ## Types XLA's CPU backend does not take everywhere

  StableHLO allows every op on the 2- and 4-bit integers and the 8-bit floats that it allows on
  their wider kin, but XLA's CPU backend does not compute them all. These raise here, before a
  node refuses the program (or XLA fails on it): `concatenate/2` and `sort/4` of 2-bit integers
  (XLA aborts compiling the one and computes the other wrongly), `dot_general/3` and
  `convolution/3` of 2-bit integers, and `top_k/2` of 2- and 4-bit integers (XLA has no kernel for
  them). Convert to `{:s, 8}`/`{:u, 8}` first.

  Not caught here, because they depend on what XLA makes of the program: a `transpose/2` of 2- or
  4-bit integers that XLA turns into a copy (in a function with several results, or one it adds
  around a gather or scatter) makes XLA's compiler throw, which the node turns into a
  `:compile_error` ("XLA's compiler failed: it threw a C++ exception ..."); a `convert/2` of the
  result of arithmetic on them to a wider type skips the wrap; and `population_count/1` and
  `count_leading_zeros/1` of them count the bits of the sign-extended byte. Transpose them as
  8-bit integers, and convert behind an `optimization_barrier/1`, as `XlaNode.Compiler` does.
  """

  import Kernel, except: [abs: 1, floor: 1, ceil: 1]

  import XlaNode.MLIR.Ops.Common,
    only: [emit: 4, one_or_list: 1, options!: 3, types_text: 1, value!: 2]

  alias XlaNode.MLIR.{Attribute, Func, Function, Module, Type}
  alias XlaNode.MLIR.Ops.{Calls, Control, Elementwise, Linear, Shape, Window}
  alias XlaNode.Tensor

  @typedoc "A tensor type: `{type, dims}`."
  @type type :: {Tensor.type(), [non_neg_integer()]}

  ## Module and functions

  @doc """
  Builds a module: `fun` defines its functions with `function/4`; one must be `"main"`.
  Returns the module's text.

  Options: `attributes: [{name, attribute text}]`, the module's attributes, such as what an
  SPMD program over several devices carries (`XlaNode.compile/3`'s `devices:`):

      iex> alias XlaNode.MLIR, as: M
      iex> text =
      ...>   M.module(fn -> M.function("main", [{{:f, 32}, [4]}], fn [x] -> x end) end,
      ...>     attributes: [{"mhlo.num_partitions", "2 : i32"}, {"mhlo.num_replicas", "1 : i32"}]
      ...>   )
      iex> text =~ "module attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {"
      true
  """
  def module(fun, opts \\ []) when is_function(fun, 0) do
    opts = options!(opts, "module/2", attributes: :attributes)
    Module.build(fun, Keyword.get(opts, :attributes, []))
  end

  @doc """
  Defines a function of the module. `arg_types` are `{type, dims}`; `body` receives the
  arguments as a list of values and returns a value or a list of values. Returns a
  `%XlaNode.MLIR.Func{}` for `call/2`. Options:

    * `:private` - `true` by default for every function but `"main"`
    * `:arg_attributes` - one entry per argument: `nil`, or the argument's attributes as
      `[{name, attribute text}]`, such as the sharding of an SPMD program's parameter

  An SPMD program's parameters, one split in two, the other whole on each device:

      iex> alias XlaNode.MLIR, as: M
      iex> text =
      ...>   M.module(fn ->
      ...>     M.function("main", [{{:f, 32}, [4]}, {{:f, 32}, []}], fn [x, _] -> x end,
      ...>       arg_attributes: [[{"mhlo.sharding", ~s("{devices=[2]0,1}")}], nil]
      ...>     )
      ...>   end)
      iex> text =~ ~s|(%arg0: tensor<4xf32> {mhlo.sharding = "{devices=[2]0,1}"}, %arg1: tensor<f32>)|
      true
  """
  def function(name, arg_types, body, opts \\ []) when is_binary(name) and is_function(body, 1) do
    opts = options!(opts, "function/4", private: :boolean, arg_attributes: :list)
    Function.build(name, arg_types, body, Keyword.put_new(opts, :private, name != "main"))
  end

  @doc ~S'''
  Calls a function of the module (`func.call`); returns its result, or a list of results.

      iex> alias XlaNode.MLIR, as: M
      iex> text =
      ...>   M.module(fn ->
      ...>     double = M.function("double", [{{:f, 32}, [3]}], fn [x] -> M.add(x, x) end)
      ...>     M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.call(double, [x]) end)
      ...>   end)
      iex> text =~ ~s|func.func private @double(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {|
      true
      iex> text =~ ~s|%0 = "func.call"(%arg0) {callee = @double} : (tensor<3xf32>) -> tensor<3xf32>|
      true
  '''
  def call(%Func{} = f, args) do
    args = Enum.map(args, &value!("call @#{f.name}", &1))
    given = Enum.map(args, & &1.type)

    if given != f.arg_types do
      raise ArgumentError,
            "call @#{f.name}: expected arguments #{types_text(f.arg_types)}, got #{types_text(given)}"
    end

    results = emit("func.call", args, f.result_types, ["callee = @#{f.name}"])
    one_or_list(results)
  end

  ## Types

  @doc """
  The MLIR text of a type.

      iex> XlaNode.MLIR.type_text({{:bf, 16}, [2, 3]})
      "tensor<2x3xbf16>"
      iex> XlaNode.MLIR.type_text({{:pred, 8}, []})
      "tensor<i1>"
      iex> XlaNode.MLIR.type_text({{:s, 4}, [8]})
      "tensor<8xi4>"
      iex> XlaNode.MLIR.type_text({{:f8_e4m3fn, 8}, [2]})
      "tensor<2xf8E4M3FN>"
  """
  def type_text(type), do: Type.text(type)

  @doc """
  The family of an element type: `:float`, `:complex`, `:signed`, `:unsigned` or `:pred`.

      iex> XlaNode.MLIR.category({:bf, 16})
      :float
  """
  def category(element_type), do: Type.category(element_type)

  ## Constants, iota and elementwise ops

  @doc ~S'''
  `stablehlo.iota`: values counting along `dimension`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [], fn [] -> M.iota({{:s, 32}, [2, 3]}, 1) end)
      ...> end)
      """
      func.func @main() -> (tensor<2x3xi32>) {
        %0 = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<2x3xi32>
        "func.return"(%0) : (tensor<2x3xi32>) -> ()
      }
      """
  '''
  defdelegate iota(type, dimension), to: Elementwise

  @doc ~S'''
  A constant of type `{type, dims}`: a single value (repeated, a splat) or a flat list of
  `product(dims)` values, as `XlaNode.Tensor.from_list/3` accepts them (`:nan`, `:infinity`,
  `:neg_infinity` included).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [], fn [] -> M.constant([1.0, 2.0, :infinity], {{:f, 32}, [3]}) end)
      ...> end)
      """
      func.func @main() -> (tensor<3xf32>) {
        %0 = "stablehlo.constant"() {value = dense<"0x0000803F000000400000807F"> : tensor<3xf32>} : () -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate constant(value, type), to: Elementwise

  @doc ~S'''
  A constant from the raw row-major little-endian bytes of a tensor of `type`, as a tensor's
  binary holds them (see `XlaNode.Tensor`: a `pred` constant takes one byte, 0 or 1, per element;
  2- and 4-bit elements are packed in a bitstring).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [], fn [] -> M.constant_binary(<<1, 2, 3>>, {{:u, 8}, [3]}) end)
      ...> end)
      """
      func.func @main() -> (tensor<3xui8>) {
        %0 = "stablehlo.constant"() {value = dense<"0x010203"> : tensor<3xui8>} : () -> tensor<3xui8>
        "func.return"(%0) : (tensor<3xui8>) -> ()
      }
      """
  '''
  defdelegate constant_binary(binary, type), to: Elementwise

  @doc ~S'''
  `stablehlo.exponential` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.exponential(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.exponential"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate exponential(x), to: Elementwise

  @doc ~S'''
  `stablehlo.exponential_minus_one` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.exponential_minus_one(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.exponential_minus_one"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate exponential_minus_one(x), to: Elementwise

  @doc ~S'''
  `stablehlo.log` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.log(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.log"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate log(x), to: Elementwise

  @doc ~S'''
  `stablehlo.log_plus_one` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.log_plus_one(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.log_plus_one"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate log_plus_one(x), to: Elementwise

  @doc ~S'''
  `stablehlo.logistic` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.logistic(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.logistic"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate logistic(x), to: Elementwise

  @doc ~S'''
  `stablehlo.sqrt` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.sqrt(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.sqrt"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate sqrt(x), to: Elementwise

  @doc ~S'''
  `stablehlo.rsqrt` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.rsqrt(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.rsqrt"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate rsqrt(x), to: Elementwise

  @doc ~S'''
  `stablehlo.cbrt` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.cbrt(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.cbrt"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate cbrt(x), to: Elementwise

  @doc ~S'''
  `stablehlo.sine` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.sine(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.sine"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate sine(x), to: Elementwise

  @doc ~S'''
  `stablehlo.cosine` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.cosine(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.cosine"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate cosine(x), to: Elementwise

  @doc ~S'''
  `stablehlo.tan` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.tan(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.tan"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate tan(x), to: Elementwise

  @doc ~S'''
  `stablehlo.tanh` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.tanh(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.tanh"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate tanh(x), to: Elementwise

  @doc ~S'''
  `stablehlo.floor` (float).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.floor(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.floor"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate floor(x), to: Elementwise

  @doc ~S'''
  `stablehlo.ceil` (float).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.ceil(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.ceil"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate ceil(x), to: Elementwise

  @doc ~S'''
  `stablehlo.round_nearest_even` (float).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.round_nearest_even(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.round_nearest_even"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate round_nearest_even(x), to: Elementwise

  @doc ~S'''
  `stablehlo.round_nearest_afz` (float).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.round_nearest_afz(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.round_nearest_afz"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate round_nearest_afz(x), to: Elementwise

  @doc ~S'''
  `chlo.erf` (float).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.erf(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.erf"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate erf(x), to: Elementwise

  @doc ~S'''
  `chlo.erfc` (float).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.erfc(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.erfc"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate erfc(x), to: Elementwise

  @doc ~S'''
  `chlo.erf_inv` (float).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.erf_inv(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.erf_inv"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate erf_inv(x), to: Elementwise

  @doc ~S'''
  `chlo.lgamma` (float).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.lgamma(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.lgamma"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate lgamma(x), to: Elementwise

  @doc ~S'''
  `chlo.digamma` (float).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.digamma(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.digamma"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate digamma(x), to: Elementwise

  @doc ~S'''
  `chlo.asin` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.asin(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.asin"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate asin(x), to: Elementwise

  @doc ~S'''
  `chlo.acos` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.acos(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.acos"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate acos(x), to: Elementwise

  @doc ~S'''
  `chlo.atan` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.atan(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.atan"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate atan(x), to: Elementwise

  @doc ~S'''
  `chlo.sinh` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.sinh(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.sinh"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate sinh(x), to: Elementwise

  @doc ~S'''
  `chlo.cosh` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.cosh(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.cosh"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate cosh(x), to: Elementwise

  @doc ~S'''
  `chlo.asinh` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.asinh(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.asinh"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate asinh(x), to: Elementwise

  @doc ~S'''
  `chlo.acosh` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.acosh(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.acosh"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate acosh(x), to: Elementwise

  @doc ~S'''
  `chlo.atanh` (float or complex).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.atanh(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "chlo.atanh"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate atanh(x), to: Elementwise

  @doc ~S'''
  `stablehlo.complex`: a complex tensor from real and imaginary parts (f32 or f64).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [re, im] -> M.complex(re, im) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xcomplex<f32>>) {
        %0 = "stablehlo.complex"(%arg0, %arg1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xcomplex<f32>>
        "func.return"(%0) : (tensor<3xcomplex<f32>>) -> ()
      }
      """
  '''
  defdelegate complex(re, im), to: Elementwise

  @doc ~S'''
  `stablehlo.negate`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.negate(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.negate"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate negate(x), to: Elementwise

  @doc ~S'''
  `stablehlo.sign`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.sign(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.sign"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate sign(x), to: Elementwise

  @doc ~S'''
  `stablehlo.abs`: for complex operands, the result is the real magnitude.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:c, 64}, [3]}], fn [z] -> M.abs(z) end) end)
      """
      func.func @main(%arg0: tensor<3xcomplex<f32>>) -> (tensor<3xf32>) {
        %0 = "stablehlo.abs"(%arg0) : (tensor<3xcomplex<f32>>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate abs(x), to: Elementwise

  @doc ~S'''
  `stablehlo.real`: the real part of a complex tensor (floats pass through).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:c, 64}, [3]}], fn [z] -> M.real(z) end) end)
      """
      func.func @main(%arg0: tensor<3xcomplex<f32>>) -> (tensor<3xf32>) {
        %0 = "stablehlo.real"(%arg0) : (tensor<3xcomplex<f32>>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate real(x), to: Elementwise

  @doc ~S'''
  `stablehlo.not` (integer or pred).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 32}, [3]}], fn [x] -> M.bitwise_not(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xi32>) -> (tensor<3xi32>) {
        %0 = "stablehlo.not"(%arg0) : (tensor<3xi32>) -> tensor<3xi32>
        "func.return"(%0) : (tensor<3xi32>) -> ()
      }
      """
  '''
  defdelegate bitwise_not(x), to: Elementwise

  @doc ~S'''
  `stablehlo.popcnt`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 32}, [3]}], fn [x] -> M.population_count(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xi32>) -> (tensor<3xi32>) {
        %0 = "stablehlo.popcnt"(%arg0) : (tensor<3xi32>) -> tensor<3xi32>
        "func.return"(%0) : (tensor<3xi32>) -> ()
      }
      """
  '''
  defdelegate population_count(x), to: Elementwise

  @doc ~S'''
  `stablehlo.count_leading_zeros`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 32}, [3]}], fn [x] -> M.count_leading_zeros(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xi32>) -> (tensor<3xi32>) {
        %0 = "stablehlo.count_leading_zeros"(%arg0) : (tensor<3xi32>) -> tensor<3xi32>
        "func.return"(%0) : (tensor<3xi32>) -> ()
      }
      """
  '''
  defdelegate count_leading_zeros(x), to: Elementwise

  @doc ~S'''
  `stablehlo.is_finite`: a pred tensor.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.is_finite(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xi1>) {
        %0 = "stablehlo.is_finite"(%arg0) : (tensor<3xf32>) -> tensor<3xi1>
        "func.return"(%0) : (tensor<3xi1>) -> ()
      }
      """
  '''
  defdelegate is_finite(x), to: Elementwise

  @doc ~S'''
  `chlo.is_inf`: a pred tensor.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.is_inf(x) end) end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xi1>) {
        %0 = "chlo.is_inf"(%arg0) : (tensor<3xf32>) -> tensor<3xi1>
        "func.return"(%0) : (tensor<3xi1>) -> ()
      }
      """
  '''
  defdelegate is_inf(x), to: Elementwise

  @doc ~S'''
  `chlo.is_pos_inf`: a pred tensor.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.is_pos_inf(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xi1>) {
        %0 = "chlo.is_pos_inf"(%arg0) : (tensor<3xf32>) -> tensor<3xi1>
        "func.return"(%0) : (tensor<3xi1>) -> ()
      }
      """
  '''
  defdelegate is_pos_inf(x), to: Elementwise

  @doc ~S'''
  `chlo.is_neg_inf`: a pred tensor.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.is_neg_inf(x) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xi1>) {
        %0 = "chlo.is_neg_inf"(%arg0) : (tensor<3xf32>) -> tensor<3xi1>
        "func.return"(%0) : (tensor<3xi1>) -> ()
      }
      """
  '''
  defdelegate is_neg_inf(x), to: Elementwise

  @doc ~S'''
  `stablehlo.imag`: the imaginary part of a complex tensor.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn -> M.function("main", [{{:c, 64}, [3]}], fn [z] -> M.imag(z) end) end)
      """
      func.func @main(%arg0: tensor<3xcomplex<f32>>) -> (tensor<3xf32>) {
        %0 = "stablehlo.imag"(%arg0) : (tensor<3xcomplex<f32>>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate imag(x), to: Elementwise

  @doc ~S'''
  `stablehlo.add`: two tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [a, b] -> M.add(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.add"(%arg0, %arg1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate add(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.subtract`: two tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [a, b] -> M.subtract(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.subtract"(%arg0, %arg1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate subtract(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.multiply`: two tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [a, b] -> M.multiply(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.multiply"(%arg0, %arg1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate multiply(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.divide`: two tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [a, b] -> M.divide(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.divide"(%arg0, %arg1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate divide(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.remainder`: two tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [a, b] -> M.remainder(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.remainder"(%arg0, %arg1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate remainder(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.power`: two tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [a, b] -> M.power(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.power"(%arg0, %arg1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate power(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.maximum`: two tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [a, b] -> M.maximum(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.maximum"(%arg0, %arg1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate maximum(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.minimum`: two tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [a, b] -> M.minimum(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.minimum"(%arg0, %arg1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate minimum(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.shift_left`: two integer tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 32}, [3]}, {{:s, 32}, [3]}], fn [a, b] -> M.shift_left(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xi32>, %arg1: tensor<3xi32>) -> (tensor<3xi32>) {
        %0 = "stablehlo.shift_left"(%arg0, %arg1) : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi32>
        "func.return"(%0) : (tensor<3xi32>) -> ()
      }
      """
  '''
  defdelegate shift_left(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.shift_right_arithmetic`: two integer tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 32}, [3]}, {{:s, 32}, [3]}], fn [a, b] -> M.shift_right_arithmetic(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xi32>, %arg1: tensor<3xi32>) -> (tensor<3xi32>) {
        %0 = "stablehlo.shift_right_arithmetic"(%arg0, %arg1) : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi32>
        "func.return"(%0) : (tensor<3xi32>) -> ()
      }
      """
  '''
  defdelegate shift_right_arithmetic(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.shift_right_logical`: two integer tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 32}, [3]}, {{:s, 32}, [3]}], fn [a, b] -> M.shift_right_logical(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xi32>, %arg1: tensor<3xi32>) -> (tensor<3xi32>) {
        %0 = "stablehlo.shift_right_logical"(%arg0, %arg1) : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi32>
        "func.return"(%0) : (tensor<3xi32>) -> ()
      }
      """
  '''
  defdelegate shift_right_logical(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.atan2`: two float or complex tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [a, b] -> M.atan2(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.atan2"(%arg0, %arg1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate atan2(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.compare`: `direction` is `:eq`, `:ne`, `:lt`, `:le`, `:gt` or `:ge`; the comparison
  type follows the operands (`FLOAT`, `SIGNED`, `UNSIGNED`) unless given as
  `:float`, `:totalorder`, `:signed` or `:unsigned`. Returns a pred tensor.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [a, b] -> M.compare(:lt, a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<3xi1>) {
        %0 = "stablehlo.compare"(%arg0, %arg1) {comparison_direction = #stablehlo<comparison_direction LT>, compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
        "func.return"(%0) : (tensor<3xi1>) -> ()
      }
      """
  '''
  defdelegate compare(direction, a, b, compare_type \\ nil), to: Elementwise

  @doc ~S'''
  `stablehlo.select`: `pred` picks from `on_true` or `on_false` (a scalar or same-shape pred).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:pred, 8}, [3]}, {{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [p, a, b] -> M.select(p, a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xi1>, %arg1: tensor<3xf32>, %arg2: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.select"(%arg0, %arg1, %arg2) : (tensor<3xi1>, tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate select(pred, on_true, on_false), to: Elementwise

  @doc ~S'''
  `stablehlo.clamp`: `min` and `max` of `x`'s type, or scalars of its element type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] ->
      ...>     M.clamp(M.constant(0.0, {{:f, 32}, []}), x, M.constant(1.0, {{:f, 32}, []}))
      ...>   end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.constant"() {value = dense<"0x00000000"> : tensor<f32>} : () -> tensor<f32>
        %1 = "stablehlo.constant"() {value = dense<"0x0000803F"> : tensor<f32>} : () -> tensor<f32>
        %2 = "stablehlo.clamp"(%0, %arg0, %1) : (tensor<f32>, tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
        "func.return"(%2) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate clamp(min, x, max), to: Elementwise

  @doc ~S'''
  `stablehlo.convert`: to another element type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.convert(x, {:s, 32}) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xi32>) {
        %0 = "stablehlo.convert"(%arg0) : (tensor<3xf32>) -> tensor<3xi32>
        "func.return"(%0) : (tensor<3xi32>) -> ()
      }
      """
  '''
  defdelegate convert(x, type), to: Elementwise

  @doc ~S'''
  `stablehlo.bitcast_convert`: the same bits as another element type. To a narrower type the
  result gains a last dimension (`bits / new bits`); to a wider one the operand's last dimension
  must be `new bits / bits` and goes away.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.bitcast_convert(x, {:u, 8}) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3x4xui8>) {
        %0 = "stablehlo.bitcast_convert"(%arg0) : (tensor<3xf32>) -> tensor<3x4xui8>
        "func.return"(%0) : (tensor<3x4xui8>) -> ()
      }
      """
  '''
  defdelegate bitcast_convert(x, type), to: Elementwise

  @doc ~S'''
  `stablehlo.rng_bit_generator`: from `state` (u64), returns `[new_state, bits]` with `bits` of
  `type`. `algorithm`: `:default`, `:three_fry` or `:philox`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:u, 64}, [2]}], fn [state] -> M.rng_bit_generator(state, {{:u, 32}, [4]}) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<2xui64>) -> (tensor<2xui64>, tensor<4xui32>) {
        %0:2 = "stablehlo.rng_bit_generator"(%arg0) {rng_algorithm = #stablehlo<rng_algorithm DEFAULT>} : (tensor<2xui64>) -> (tensor<2xui64>, tensor<4xui32>)
        "func.return"(%0#0, %0#1) : (tensor<2xui64>, tensor<4xui32>) -> ()
      }
      """
  '''
  defdelegate rng_bit_generator(state, type, algorithm \\ :default), to: Elementwise

  @doc ~S'''
  `stablehlo.and`: two integer or pred tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 32}, [3]}, {{:s, 32}, [3]}], fn [a, b] -> M.bitwise_and(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xi32>, %arg1: tensor<3xi32>) -> (tensor<3xi32>) {
        %0 = "stablehlo.and"(%arg0, %arg1) : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi32>
        "func.return"(%0) : (tensor<3xi32>) -> ()
      }
      """
  '''
  defdelegate bitwise_and(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.or`: two integer or pred tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 32}, [3]}, {{:s, 32}, [3]}], fn [a, b] -> M.bitwise_or(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xi32>, %arg1: tensor<3xi32>) -> (tensor<3xi32>) {
        %0 = "stablehlo.or"(%arg0, %arg1) : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi32>
        "func.return"(%0) : (tensor<3xi32>) -> ()
      }
      """
  '''
  defdelegate bitwise_or(a, b), to: Elementwise

  @doc ~S'''
  `stablehlo.xor`: two integer or pred tensors of one type.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 32}, [3]}, {{:s, 32}, [3]}], fn [a, b] -> M.bitwise_xor(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xi32>, %arg1: tensor<3xi32>) -> (tensor<3xi32>) {
        %0 = "stablehlo.xor"(%arg0, %arg1) : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi32>
        "func.return"(%0) : (tensor<3xi32>) -> ()
      }
      """
  '''
  defdelegate bitwise_xor(a, b), to: Elementwise

  ## Shapes

  @doc ~S'''
  `stablehlo.broadcast_in_dim`: operand dimension `i` becomes result dimension `Enum.at(axes, i)`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.broadcast_in_dim(x, [2, 3], [1]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<2x3xf32>) {
        %0 = "stablehlo.broadcast_in_dim"(%arg0) {broadcast_dimensions = array<i64: 1>} : (tensor<3xf32>) -> tensor<2x3xf32>
        "func.return"(%0) : (tensor<2x3xf32>) -> ()
      }
      """
  '''
  defdelegate broadcast_in_dim(x, dims, axes), to: Shape

  @doc ~S'''
  `stablehlo.reshape`: the same elements in new dimensions.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [2, 3]}], fn [x] -> M.reshape(x, [3, 2]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<2x3xf32>) -> (tensor<3x2xf32>) {
        %0 = "stablehlo.reshape"(%arg0) : (tensor<2x3xf32>) -> tensor<3x2xf32>
        "func.return"(%0) : (tensor<3x2xf32>) -> ()
      }
      """
  '''
  defdelegate reshape(x, dims), to: Shape

  @doc ~S'''
  `stablehlo.transpose`: result dimension `i` is operand dimension `Enum.at(permutation, i)`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [2, 3]}], fn [x] -> M.transpose(x, [1, 0]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<2x3xf32>) -> (tensor<3x2xf32>) {
        %0 = "stablehlo.transpose"(%arg0) {permutation = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<3x2xf32>
        "func.return"(%0) : (tensor<3x2xf32>) -> ()
      }
      """
  '''
  defdelegate transpose(x, permutation), to: Shape

  @doc ~S'''
  `stablehlo.reverse` along `axes`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.reverse(x, [0]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.reverse"(%arg0) {dimensions = array<i64: 0>} : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate reverse(x, axes), to: Shape

  @doc ~S'''
  `stablehlo.slice`: `start` (inclusive) to `limit` (exclusive) with `strides` per dimension.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [6]}], fn [x] -> M.slice(x, [1], [5], [2]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<6xf32>) -> (tensor<2xf32>) {
        %0 = "stablehlo.slice"(%arg0) {start_indices = array<i64: 1>, limit_indices = array<i64: 5>, strides = array<i64: 2>} : (tensor<6xf32>) -> tensor<2xf32>
        "func.return"(%0) : (tensor<2xf32>) -> ()
      }
      """
  '''
  defdelegate slice(x, start, limit, strides \\ nil), to: Shape

  @doc ~S'''
  `stablehlo.dynamic_slice`: `starts` are scalar integer values, one per dimension.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [6]}, {{:s, 32}, []}], fn [x, i] -> M.dynamic_slice(x, [i], [2]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<6xf32>, %arg1: tensor<i32>) -> (tensor<2xf32>) {
        %0 = "stablehlo.dynamic_slice"(%arg0, %arg1) {slice_sizes = array<i64: 2>} : (tensor<6xf32>, tensor<i32>) -> tensor<2xf32>
        "func.return"(%0) : (tensor<2xf32>) -> ()
      }
      """
  '''
  defdelegate dynamic_slice(x, starts, sizes), to: Shape

  @doc ~S'''
  `stablehlo.dynamic_update_slice`: writes `update` into `x` at `starts` (scalar integers).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [6]}, {{:f, 32}, [2]}, {{:s, 32}, []}], fn [x, u, i] -> M.dynamic_update_slice(x, u, [i]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<6xf32>, %arg1: tensor<2xf32>, %arg2: tensor<i32>) -> (tensor<6xf32>) {
        %0 = "stablehlo.dynamic_update_slice"(%arg0, %arg1, %arg2) : (tensor<6xf32>, tensor<2xf32>, tensor<i32>) -> tensor<6xf32>
        "func.return"(%0) : (tensor<6xf32>) -> ()
      }
      """
  '''
  defdelegate dynamic_update_slice(x, update, starts), to: Shape

  @doc ~S'''
  `stablehlo.concatenate` along `dimension`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}, {{:f, 32}, [3]}], fn [a, b] -> M.concatenate([a, b], 0) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>) -> (tensor<6xf32>) {
        %0 = "stablehlo.concatenate"(%arg0, %arg1) {dimension = 0 : i64} : (tensor<3xf32>, tensor<3xf32>) -> tensor<6xf32>
        "func.return"(%0) : (tensor<6xf32>) -> ()
      }
      """
  '''
  defdelegate concatenate(values, dimension), to: Shape

  @doc ~S'''
  `stablehlo.pad`: `low`, `high` (may be negative) and `interior` padding per dimension.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.pad(x, M.constant(0.0, {{:f, 32}, []}), [1], [2], [1]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<8xf32>) {
        %0 = "stablehlo.constant"() {value = dense<"0x00000000"> : tensor<f32>} : () -> tensor<f32>
        %1 = "stablehlo.pad"(%arg0, %0) {edge_padding_low = array<i64: 1>, edge_padding_high = array<i64: 2>, interior_padding = array<i64: 1>} : (tensor<3xf32>, tensor<f32>) -> tensor<8xf32>
        "func.return"(%1) : (tensor<8xf32>) -> ()
      }
      """
  '''
  defdelegate pad(x, value, low, high, interior \\ nil), to: Shape

  ## Contractions and linear algebra

  @doc ~S'''
  `stablehlo.dot_general`. Options: `contracting: {lhs_dims, rhs_dims}` (default: the last of
  `lhs` with the first of `rhs` that is not a batch dimension), `batch: {lhs_dims, rhs_dims}`
  (default none), `precision: :default | :high | :highest`. The result's dimensions are the
  batch dimensions, then `lhs`'s free ones, then `rhs`'s.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [2, 3]}, {{:f, 32}, [3, 4]}], fn [a, b] -> M.dot_general(a, b) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3x4xf32>) -> (tensor<2x4xf32>) {
        %0 = "stablehlo.dot_general"(%arg0, %arg1) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
        "func.return"(%0) : (tensor<2x4xf32>) -> ()
      }
      """
  '''
  defdelegate dot_general(lhs, rhs, opts \\ []), to: Linear

  @doc ~S'''
  `stablehlo.fft`: `type` is `:fft`, `:ifft` (complex to complex), `:rfft` (float to complex, the
  last dimension becoming `n / 2 + 1`) or `:irfft` (complex to float); `lengths` are the sizes
  of the transformed trailing dimensions.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [8]}], fn [x] -> M.fft(x, :rfft, [8]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<8xf32>) -> (tensor<5xcomplex<f32>>) {
        %0 = "stablehlo.fft"(%arg0) {fft_type = #stablehlo<fft_type RFFT>, fft_length = array<i64: 8>} : (tensor<8xf32>) -> tensor<5xcomplex<f32>>
        "func.return"(%0) : (tensor<5xcomplex<f32>>) -> ()
      }
      """
  '''
  defdelegate fft(x, type, lengths), to: Linear

  @doc ~S'''
  `stablehlo.triangular_solve`: solves `op(a) x = b` (or `x op(a) = b` with `left_side:
  false`) for a triangular `a` (`[..., m, m]`) and `b` (`[..., m, n]`, or `[..., n, m]`).
  Options: `left_side` (default true), `lower` (default true), `unit_diagonal` (default false),
  `transpose_a`: `:no_transpose` (default), `:transpose` or `:adjoint`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3, 3]}, {{:f, 32}, [3, 2]}], fn [a, b] -> M.triangular_solve(a, b, lower: true) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3x3xf32>, %arg1: tensor<3x2xf32>) -> (tensor<3x2xf32>) {
        %0 = "stablehlo.triangular_solve"(%arg0, %arg1) {left_side = true, lower = true, unit_diagonal = false, transpose_a = #stablehlo<transpose NO_TRANSPOSE>} : (tensor<3x3xf32>, tensor<3x2xf32>) -> tensor<3x2xf32>
        "func.return"(%0) : (tensor<3x2xf32>) -> ()
      }
      """
  '''
  defdelegate triangular_solve(a, b, opts \\ []), to: Linear

  @doc ~S'''
  `chlo.top_k`: the `k` largest values along the last dimension and their s32 indices.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [5]}], fn [x] -> M.top_k(x, 2) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<5xf32>) -> (tensor<2xf32>, tensor<2xi32>) {
        %0:2 = "chlo.top_k"(%arg0) {k = 2 : i64} : (tensor<5xf32>) -> (tensor<2xf32>, tensor<2xi32>)
        "func.return"(%0#0, %0#1) : (tensor<2xf32>, tensor<2xi32>) -> ()
      }
      """
  '''
  defdelegate top_k(x, k), to: Linear

  ## Ops with regions

  @doc ~S'''
  `stablehlo.sort` of `operands` (one shape) along `dimension`. `comparator` receives
  `[a_1, b_1, ..., a_n, b_n]` (scalars) and returns a pred scalar: whether `a` goes first.
  Options: `stable: true`. Returns one value per operand (a single value for one operand).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [5]}], fn [x] -> M.sort([x], 0, fn [a, b] -> M.compare(:lt, a, b) end) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<5xf32>) -> (tensor<5xf32>) {
        %3 = "stablehlo.sort"(%arg0) ({
        ^bb0(%0: tensor<f32>, %1: tensor<f32>):
          %2 = "stablehlo.compare"(%0, %1) {comparison_direction = #stablehlo<comparison_direction LT>, compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
          "stablehlo.return"(%2) : (tensor<i1>) -> ()
        }) {dimension = 0 : i64, is_stable = false} : (tensor<5xf32>) -> tensor<5xf32>
        "func.return"(%3) : (tensor<5xf32>) -> ()
      }
      """
  '''
  defdelegate sort(operands, dimension, comparator, opts \\ []), to: Control

  @doc ~S'''
  `stablehlo.reduce` of `operands` (one shape) with `inits` (scalars of their element types)
  over `axes`. `fun` receives `[acc_1, ..., acc_n, x_1, ..., x_n]` (scalars) and returns `n`
  scalars. Returns one value per operand (a single value for one operand).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [2, 3]}], fn [x] ->
      ...>     M.reduce([x], [M.constant(0.0, {{:f, 32}, []})], [1], fn [acc, v] -> M.add(acc, v) end)
      ...>   end)
      ...> end)
      """
      func.func @main(%arg0: tensor<2x3xf32>) -> (tensor<2xf32>) {
        %0 = "stablehlo.constant"() {value = dense<"0x00000000"> : tensor<f32>} : () -> tensor<f32>
        %4 = "stablehlo.reduce"(%arg0, %0) ({
        ^bb0(%1: tensor<f32>, %2: tensor<f32>):
          %3 = "stablehlo.add"(%1, %2) : (tensor<f32>, tensor<f32>) -> tensor<f32>
          "stablehlo.return"(%3) : (tensor<f32>) -> ()
        }) {dimensions = array<i64: 1>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
        "func.return"(%4) : (tensor<2xf32>) -> ()
      }
      """
  '''
  defdelegate reduce(operands, inits, axes, fun), to: Control

  @doc ~S'''
  `stablehlo.while`: `cond` receives the loop values and returns a pred scalar; `body` receives
  them and returns new values of the same types. Returns the final values (a list).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 32}, []}], fn [n] ->
      ...>     ten = M.constant(10, {{:s, 32}, []})
      ...>     one = M.constant(1, {{:s, 32}, []})
      ...>     M.while_loop([n], fn [i] -> M.compare(:lt, i, ten) end, fn [i] -> [M.add(i, one)] end)
      ...>   end)
      ...> end)
      """
      func.func @main(%arg0: tensor<i32>) -> (tensor<i32>) {
        %0 = "stablehlo.constant"() {value = dense<"0x0A000000"> : tensor<i32>} : () -> tensor<i32>
        %1 = "stablehlo.constant"() {value = dense<"0x01000000"> : tensor<i32>} : () -> tensor<i32>
        %6 = "stablehlo.while"(%arg0) ({
        ^bb0(%2: tensor<i32>):
          %3 = "stablehlo.compare"(%2, %0) {comparison_direction = #stablehlo<comparison_direction LT>, compare_type = #stablehlo<comparison_type SIGNED>} : (tensor<i32>, tensor<i32>) -> tensor<i1>
          "stablehlo.return"(%3) : (tensor<i1>) -> ()
        }, {
        ^bb0(%4: tensor<i32>):
          %5 = "stablehlo.add"(%4, %1) : (tensor<i32>, tensor<i32>) -> tensor<i32>
          "stablehlo.return"(%5) : (tensor<i32>) -> ()
        }) : (tensor<i32>) -> tensor<i32>
        "func.return"(%6) : (tensor<i32>) -> ()
      }
      """
  '''
  defdelegate while_loop(initial, cond, body), to: Control

  @doc ~S'''
  `stablehlo.if`: `pred` (a pred scalar) chooses `on_true` or `on_false`, functions of no
  arguments that return values of the same types (they may use any value of the function).
  Returns the chosen branch's values (a list).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:pred, 8}, []}, {{:f, 32}, [3]}], fn [p, x] -> M.if_then_else(p, fn -> [x] end, fn -> [M.negate(x)] end) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<i1>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %1 = "stablehlo.if"(%arg0) ({
            "stablehlo.return"(%arg1) : (tensor<3xf32>) -> ()
        }, {
            %0 = "stablehlo.negate"(%arg1) : (tensor<3xf32>) -> tensor<3xf32>
          "stablehlo.return"(%0) : (tensor<3xf32>) -> ()
        }) : (tensor<i1>) -> tensor<3xf32>
        "func.return"(%1) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate if_then_else(pred, on_true, on_false), to: Control

  @doc ~S'''
  `stablehlo.case`: `index` (an s32 scalar) chooses one of `branches` (functions of no
  arguments returning values of the same types); out of range picks the last. Returns a list.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:s, 32}, []}, {{:f, 32}, [3]}], fn [i, x] -> M.case_of(i, [fn -> [x] end, fn -> [M.negate(x)] end]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<i32>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %1 = "stablehlo.case"(%arg0) ({
            "stablehlo.return"(%arg1) : (tensor<3xf32>) -> ()
        }, {
            %0 = "stablehlo.negate"(%arg1) : (tensor<3xf32>) -> tensor<3xf32>
          "stablehlo.return"(%0) : (tensor<3xf32>) -> ()
        }) : (tensor<i32>) -> tensor<3xf32>
        "func.return"(%1) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate case_of(index, branches), to: Control

  @doc ~S'''
  `stablehlo.optimization_barrier`: the values unchanged (a list).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] -> M.optimization_barrier([x]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.optimization_barrier"(%arg0) : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate optimization_barrier(values), to: Control

  ## Gather, scatter, windows, convolution

  @doc ~S'''
  `stablehlo.scatter`: writes `updates` into `inputs` where `indices` say, combining each
  element with `fun` (`[current_1, ..., current_n, update_1, ..., update_n]` -> `n` scalars).
  Options (StableHLO's dimension numbers): `update_window_dims`, `inserted_window_dims`,
  `scatter_dims_to_operand_dims`, `index_vector_dim` (default: the last dimension of
  `indices`), `input_batching_dims`, `scatter_indices_batching_dims`, `indices_are_sorted`,
  `unique_indices`. Returns one value per input (a single value for one input).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [5]}, {{:s, 32}, [2, 1]}, {{:f, 32}, [2]}], fn [x, indices, updates] ->
      ...>     M.scatter([x], indices, [updates], fn [current, update] -> [M.add(current, update)] end,
      ...>       update_window_dims: [],
      ...>       inserted_window_dims: [0],
      ...>       scatter_dims_to_operand_dims: [0]
      ...>     )
      ...>   end)
      ...> end)
      """
      func.func @main(%arg0: tensor<5xf32>, %arg1: tensor<2x1xi32>, %arg2: tensor<2xf32>) -> (tensor<5xf32>) {
        %3 = "stablehlo.scatter"(%arg0, %arg1, %arg2) ({
        ^bb0(%0: tensor<f32>, %1: tensor<f32>):
          %2 = "stablehlo.add"(%0, %1) : (tensor<f32>, tensor<f32>) -> tensor<f32>
          "stablehlo.return"(%2) : (tensor<f32>) -> ()
        }) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false} : (tensor<5xf32>, tensor<2x1xi32>, tensor<2xf32>) -> tensor<5xf32>
        "func.return"(%3) : (tensor<5xf32>) -> ()
      }
      """
  '''
  defdelegate scatter(inputs, indices, updates, fun, opts), to: Window

  @doc ~S'''
  `stablehlo.convolution`. Options:

    * `:input` - `{batch_dim, feature_dim, spatial_dims}` of `lhs` (default `{0, 1, [2, ...]}`)
    * `:kernel` - `{input_feature_dim, output_feature_dim, spatial_dims}` of `rhs`
      (default `{1, 0, [2, ...]}`)
    * `:output` - `{batch_dim, feature_dim, spatial_dims}` of the result (default as `:input`)
    * `:strides`, `:lhs_dilation`, `:rhs_dilation` (default all 1), `:padding` (`[{low, high}]`)
    * `:feature_group_count`, `:batch_group_count` (default 1), `:precision`

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [1, 1, 5]}, {{:f, 32}, [1, 1, 3]}], fn [input, kernel] -> M.convolution(input, kernel) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<1x1x5xf32>, %arg1: tensor<1x1x3xf32>) -> (tensor<1x1x3xf32>) {
        %0 = "stablehlo.convolution"(%arg0, %arg1) {dimension_numbers = #stablehlo.conv<[b, f, 0]x[o, i, 0]->[b, f, 0]>, window_strides = array<i64: 1>, padding = dense<[[0, 0]]> : tensor<1x2xi64>, lhs_dilation = array<i64: 1>, rhs_dilation = array<i64: 1>, feature_group_count = 1 : i64, batch_group_count = 1 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<1x1x5xf32>, tensor<1x1x3xf32>) -> tensor<1x1x3xf32>
        "func.return"(%0) : (tensor<1x1x3xf32>) -> ()
      }
      """
  '''
  defdelegate convolution(lhs, rhs, opts \\ []), to: Window

  @doc ~S'''
  `stablehlo.gather`: slices of `operand` of `slice_sizes`, starting where `indices` say.
  Options (StableHLO's dimension numbers): `offset_dims`, `collapsed_slice_dims`,
  `start_index_map`, `index_vector_dim` (default: the last dimension of `indices`),
  `operand_batching_dims`, `start_indices_batching_dims` (default `[]`), `indices_are_sorted`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [5]}, {{:s, 32}, [2, 1]}], fn [x, indices] ->
      ...>     M.gather(x, indices, [1], offset_dims: [], collapsed_slice_dims: [0], start_index_map: [0])
      ...>   end)
      ...> end)
      """
      func.func @main(%arg0: tensor<5xf32>, %arg1: tensor<2x1xi32>) -> (tensor<2xf32>) {
        %0 = "stablehlo.gather"(%arg0, %arg1) {dimension_numbers = #stablehlo.gather<offset_dims = [], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1>, indices_are_sorted = false} : (tensor<5xf32>, tensor<2x1xi32>) -> tensor<2xf32>
        "func.return"(%0) : (tensor<2xf32>) -> ()
      }
      """
  '''
  defdelegate gather(operand, indices, slice_sizes, opts), to: Window

  @doc ~S'''
  `stablehlo.reduce_window`: reduces each window of `operands` (one shape) with `fun`, as
  `reduce/4` does. Options: `strides`, `base_dilations`, `window_dilations` (default all 1),
  `padding: [{low, high}, ...]` (default none). Returns one value per operand (a single value
  for one operand).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [6]}], fn [x] ->
      ...>     zero = M.constant(0.0, {{:f, 32}, []})
      ...>     M.reduce_window([x], [zero], [2], fn [acc, v] -> M.add(acc, v) end, strides: [2])
      ...>   end)
      ...> end)
      """
      func.func @main(%arg0: tensor<6xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.constant"() {value = dense<"0x00000000"> : tensor<f32>} : () -> tensor<f32>
        %4 = "stablehlo.reduce_window"(%arg0, %0) ({
        ^bb0(%1: tensor<f32>, %2: tensor<f32>):
          %3 = "stablehlo.add"(%1, %2) : (tensor<f32>, tensor<f32>) -> tensor<f32>
          "stablehlo.return"(%3) : (tensor<f32>) -> ()
        }) {window_dimensions = array<i64: 2>, window_strides = array<i64: 2>, base_dilations = array<i64: 1>, window_dilations = array<i64: 1>, padding = dense<[[0, 0]]> : tensor<1x2xi64>} : (tensor<6xf32>, tensor<f32>) -> tensor<3xf32>
        "func.return"(%4) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate reduce_window(operands, inits, window, fun, opts \\ []), to: Window

  @doc ~S'''
  `stablehlo.select_and_scatter`: for each window of `operand`, `select` (two scalars -> pred)
  picks an element, and the matching element of `source` is combined into it with `scatter`
  (two scalars -> scalar), starting from `init`. Options: `strides`, `padding` as in
  `reduce_window/5`.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [4]}, {{:f, 32}, [2]}], fn [x, source] ->
      ...>     zero = M.constant(0.0, {{:f, 32}, []})
      ...>     select = fn [a, b] -> M.compare(:ge, a, b) end
      ...>     scatter = fn [a, b] -> M.add(a, b) end
      ...>     M.select_and_scatter(x, source, zero, [2], select, scatter, strides: [2])
      ...>   end)
      ...> end)
      """
      func.func @main(%arg0: tensor<4xf32>, %arg1: tensor<2xf32>) -> (tensor<4xf32>) {
        %0 = "stablehlo.constant"() {value = dense<"0x00000000"> : tensor<f32>} : () -> tensor<f32>
        %7 = "stablehlo.select_and_scatter"(%arg0, %arg1, %0) ({
        ^bb0(%1: tensor<f32>, %2: tensor<f32>):
          %3 = "stablehlo.compare"(%1, %2) {comparison_direction = #stablehlo<comparison_direction GE>, compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
          "stablehlo.return"(%3) : (tensor<i1>) -> ()
        }, {
        ^bb0(%4: tensor<f32>, %5: tensor<f32>):
          %6 = "stablehlo.add"(%4, %5) : (tensor<f32>, tensor<f32>) -> tensor<f32>
          "stablehlo.return"(%6) : (tensor<f32>) -> ()
        }) {window_dimensions = array<i64: 2>, window_strides = array<i64: 2>, padding = dense<[[0, 0]]> : tensor<1x2xi64>} : (tensor<4xf32>, tensor<2xf32>, tensor<f32>) -> tensor<4xf32>
        "func.return"(%7) : (tensor<4xf32>) -> ()
      }
      """
  '''
  defdelegate select_and_scatter(operand, source, init, window, select, scatter, opts \\ []),
    to: Window

  ## Calls out of the program

  @doc ~S'''
  A custom call to a registered FFI target (`api_version = 4`) returning `result_types`.
  Options: `backend_config: [{name, attr_text}]` (MLIR attribute text, e.g. `"3 : i64"`, as
  `attribute/1` writes it),
  `has_side_effect: true`, `output_operand_aliases: [{result, operand}]`. Returns a list.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:f, 32}, [3]}], fn [x] ->
      ...>     M.custom_call("my_kernel", [x], [{{:f, 32}, [3]}], backend_config: [{"scale", "2.0 : f32"}])
      ...>   end)
      ...> end)
      """
      func.func @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.custom_call"(%arg0) {call_target_name = "my_kernel", api_version = 4 : i32, has_side_effect = false, backend_config = {scale = 2.0 : f32}} : (tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate custom_call(target, operands, result_types, opts \\ []), to: Calls

  @doc ~S'''
  `Nx.runtime_call` as EXLA lowers it: sends `{:exla_runtime_call, callback_id, args, tag}` to
  the run's callback server and returns its reply as values of `result_types` (a list).
  `handle` is the function's `{{:u, 8}, [8]}` first parameter; `callback_id` any term.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:u, 8}, [8]}, {{:f, 32}, [3]}], fn [handle, x] -> M.runtime_call(handle, :double, [x], [{{:f, 32}, [3]}]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<8xui8>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.custom_call"(%arg0, %arg1) {call_target_name = "exla_runtime_callback", api_version = 4 : i32, has_side_effect = true, backend_config = {callback_id = array<i64: 7809933825093826435, 101>, callback_id_size = 9 : ui64, num_aliased_data_outputs = 0 : ui64}} : (tensor<8xui8>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate runtime_call(handle, callback_id, args, result_types), to: Calls

  @doc ~S'''
  A hook (`Nx.Defn.Kernel.hook/3`, `print_value`) as EXLA lowers it: sends the arguments to the
  callback server, waits for its `{:ok, []}`, and returns the arguments unchanged (a list,
  aliased to the operands).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:u, 8}, [8]}, {{:f, 32}, [3]}], fn [handle, x] -> M.io_call(handle, :log, [x]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<8xui8>, %arg1: tensor<3xf32>) -> (tensor<3xf32>) {
        %0 = "stablehlo.custom_call"(%arg0, %arg1) {call_target_name = "exla_runtime_callback", api_version = 4 : i32, has_side_effect = true, backend_config = {callback_id = array<i64: 113728251197315>, callback_id_size = 6 : ui64, num_aliased_data_outputs = 1 : ui64}, output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 1, operand_tuple_indices = []>]} : (tensor<8xui8>, tensor<3xf32>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate io_call(handle, callback_id, args), to: Calls

  @doc ~S'''
  Sends `{:exla_outfeed, args}` to the stream target (see `stream_target/1`) without waiting;
  returns a `u8` scalar: 1 sent, 0 failed.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:u, 8}, [8]}, {{:f, 32}, [3]}], fn [handle, x] -> M.outfeed(handle, [x]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<8xui8>, %arg1: tensor<3xf32>) -> (tensor<ui8>) {
        %0 = "stablehlo.custom_call"(%arg0, %arg1) {call_target_name = "exla_beam_outfeed", api_version = 4 : i32, has_side_effect = true, backend_config = {}} : (tensor<8xui8>, tensor<3xf32>) -> tensor<ui8>
        "func.return"(%0) : (tensor<ui8>) -> ()
      }
      """
  '''
  defdelegate outfeed(target, payloads), to: Calls

  @doc ~S'''
  Asks the stream target for its next value (see `XlaNode.CallbackServer.push_infeed/2`) and
  waits for it; returns values of `result_types` (a list).

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:u, 8}, [8]}], fn [handle] -> M.infeed(handle, [{{:f, 32}, [3]}]) end)
      ...> end)
      """
      func.func @main(%arg0: tensor<8xui8>) -> (tensor<3xf32>) {
        %0 = "stablehlo.custom_call"(%arg0) {call_target_name = "exla_beam_infeed", api_version = 4 : i32, has_side_effect = true, backend_config = {}} : (tensor<8xui8>) -> tensor<3xf32>
        "func.return"(%0) : (tensor<3xf32>) -> ()
      }
      """
  '''
  defdelegate infeed(target, result_types), to: Calls

  @doc ~S"""
  A stream target as a program constant: `:erlang.term_to_binary(target, minor_version: 2)` (the
  encoding of every release since OTP 26) as a `u8` tensor, for `outfeed/2` and `infeed/2` in
  programs that name their stream process themselves (a pid or `{name, node}`). Programs may
  instead pass the callback handle parameter, which names the run's `callback_server:`.

      iex> alias XlaNode.MLIR, as: M
      iex> text =
      ...>   M.module(fn ->
      ...>     M.function("main", [{{:f, 32}, [3]}], fn [x] ->
      ...>       M.outfeed(M.stream_target({:my_stream, :"me@host"}), [x])
      ...>     end)
      ...>   end)
      iex> size = byte_size(:erlang.term_to_binary({:my_stream, :"me@host"}, minor_version: 2))
      iex> text =~ ~s|"stablehlo.constant"() {value = dense<"0x83| and text =~ "tensor<#{size}xui8>"
      true
  """
  defdelegate stream_target(target), to: Calls

  @doc """
  The MLIR text of one FFI attribute for `custom_call/4`'s `backend_config`, from an Elixir
  value, typed as `jax.ffi` types Python values: a float is an `f32`, an integer an `i64`.
  `{type, number}` gives any other scalar type, `{type, [numbers]}` (or a bare list of
  integers) an array, and `{:mlir, text}` passes attribute text through.

      iex> XlaNode.MLIR.attribute(2.5)
      "2.5 : f32"
      iex> XlaNode.MLIR.attribute({{:f, 64}, -1.0e-10})
      "-1.0e-10 : f64"
      iex> XlaNode.MLIR.attribute({{:u, 8}, 7})
      "7 : ui8"
      iex> XlaNode.MLIR.attribute("relu")
      ~s("relu")
      iex> XlaNode.MLIR.attribute(true)
      "true"
      iex> XlaNode.MLIR.attribute([1, 2, 3])
      "array<i64: 1, 2, 3>"
      iex> XlaNode.MLIR.attribute({{:f, 32}, [0.5, 2.0]})
      "array<f32: 0.5, 2.0>"
  """
  def attribute(value), do: Attribute.text(value)
end
