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

  Values carry their function, as EXLA's values do, and an op writes its operation into the
  function of its operands: the builder is split as EXLA's is, into `XlaNode.MLIR.Module`,
  `XlaNode.MLIR.Function`, `XlaNode.MLIR.Value`, `XlaNode.MLIR.Region` and
  `XlaNode.MLIR.Operation` (with `XlaNode.MLIR.Type` and `XlaNode.MLIR.Attribute` for their
  text), and the ops into families, `XlaNode.MLIR.Ops.*`, which this module documents and
  delegates to. The process keeps no builder state; `XlaNode.MLIR.Builders` says which module
  and function it is building, for the ops that have no operand to say so (constants, iota).

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

  @doc "Calls a function of the module (`func.call`); returns its result, or a list of results."
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

  @doc "`stablehlo.iota`: values counting along `dimension`."
  defdelegate iota(type, dimension), to: Elementwise

  @doc ~S"""
  A constant of type `{type, dims}`: a single value (repeated, a splat) or a flat list of
  `product(dims)` values, as `XlaNode.Tensor.from_list/3` accepts them (`:nan`, `:infinity`,
  `:neg_infinity` included).
  """
  defdelegate constant(value, type), to: Elementwise

  @doc ~S"""
  A constant from the raw row-major little-endian bytes of a tensor of `type`, as a tensor's
  binary holds them (see `XlaNode.Tensor`: a `pred` constant takes one byte, 0 or 1, per element;
  2- and 4-bit elements are packed in a bitstring).
  """
  defdelegate constant_binary(binary, type), to: Elementwise

  @doc "`stablehlo.exponential` (float or complex)."
  defdelegate exponential(x), to: Elementwise

  @doc "`stablehlo.exponential_minus_one` (float or complex)."
  defdelegate exponential_minus_one(x), to: Elementwise

  @doc "`stablehlo.log` (float or complex)."
  defdelegate log(x), to: Elementwise

  @doc "`stablehlo.log_plus_one` (float or complex)."
  defdelegate log_plus_one(x), to: Elementwise

  @doc "`stablehlo.logistic` (float or complex)."
  defdelegate logistic(x), to: Elementwise

  @doc "`stablehlo.sqrt` (float or complex)."
  defdelegate sqrt(x), to: Elementwise

  @doc "`stablehlo.rsqrt` (float or complex)."
  defdelegate rsqrt(x), to: Elementwise

  @doc "`stablehlo.cbrt` (float or complex)."
  defdelegate cbrt(x), to: Elementwise

  @doc "`stablehlo.sine` (float or complex)."
  defdelegate sine(x), to: Elementwise

  @doc "`stablehlo.cosine` (float or complex)."
  defdelegate cosine(x), to: Elementwise

  @doc "`stablehlo.tan` (float or complex)."
  defdelegate tan(x), to: Elementwise

  @doc "`stablehlo.tanh` (float or complex)."
  defdelegate tanh(x), to: Elementwise

  @doc "`stablehlo.floor` (float)."
  defdelegate floor(x), to: Elementwise

  @doc "`stablehlo.ceil` (float)."
  defdelegate ceil(x), to: Elementwise

  @doc "`stablehlo.round_nearest_even` (float)."
  defdelegate round_nearest_even(x), to: Elementwise

  @doc "`stablehlo.round_nearest_afz` (float)."
  defdelegate round_nearest_afz(x), to: Elementwise

  @doc "`chlo.erf` (float)."
  defdelegate erf(x), to: Elementwise

  @doc "`chlo.erfc` (float)."
  defdelegate erfc(x), to: Elementwise

  @doc "`chlo.erf_inv` (float)."
  defdelegate erf_inv(x), to: Elementwise

  @doc "`chlo.lgamma` (float)."
  defdelegate lgamma(x), to: Elementwise

  @doc "`chlo.digamma` (float)."
  defdelegate digamma(x), to: Elementwise

  @doc "`chlo.asin` (float or complex)."
  defdelegate asin(x), to: Elementwise

  @doc "`chlo.acos` (float or complex)."
  defdelegate acos(x), to: Elementwise

  @doc "`chlo.atan` (float or complex)."
  defdelegate atan(x), to: Elementwise

  @doc "`chlo.sinh` (float or complex)."
  defdelegate sinh(x), to: Elementwise

  @doc "`chlo.cosh` (float or complex)."
  defdelegate cosh(x), to: Elementwise

  @doc "`chlo.asinh` (float or complex)."
  defdelegate asinh(x), to: Elementwise

  @doc "`chlo.acosh` (float or complex)."
  defdelegate acosh(x), to: Elementwise

  @doc "`chlo.atanh` (float or complex)."
  defdelegate atanh(x), to: Elementwise

  @doc "`stablehlo.complex`: a complex tensor from real and imaginary parts (f32 or f64)."
  defdelegate complex(re, im), to: Elementwise

  @doc "`stablehlo.negate`."
  defdelegate negate(x), to: Elementwise

  @doc "`stablehlo.sign`."
  defdelegate sign(x), to: Elementwise

  @doc "`stablehlo.abs`: for complex operands, the result is the real magnitude."
  defdelegate abs(x), to: Elementwise

  @doc "`stablehlo.real`: the real part of a complex tensor (floats pass through)."
  defdelegate real(x), to: Elementwise

  @doc "`stablehlo.not` (integer or pred)."
  defdelegate bitwise_not(x), to: Elementwise

  @doc "`stablehlo.popcnt`."
  defdelegate population_count(x), to: Elementwise

  @doc "`stablehlo.count_leading_zeros`."
  defdelegate count_leading_zeros(x), to: Elementwise

  @doc "`stablehlo.is_finite`: a pred tensor."
  defdelegate is_finite(x), to: Elementwise

  @doc "`chlo.is_inf`: a pred tensor."
  defdelegate is_inf(x), to: Elementwise

  @doc "`chlo.is_pos_inf`: a pred tensor."
  defdelegate is_pos_inf(x), to: Elementwise

  @doc "`chlo.is_neg_inf`: a pred tensor."
  defdelegate is_neg_inf(x), to: Elementwise

  @doc "`stablehlo.imag`: the imaginary part of a complex tensor."
  defdelegate imag(x), to: Elementwise

  @doc "`stablehlo.add`: two tensors of one type."
  defdelegate add(a, b), to: Elementwise

  @doc "`stablehlo.subtract`: two tensors of one type."
  defdelegate subtract(a, b), to: Elementwise

  @doc "`stablehlo.multiply`: two tensors of one type."
  defdelegate multiply(a, b), to: Elementwise

  @doc "`stablehlo.divide`: two tensors of one type."
  defdelegate divide(a, b), to: Elementwise

  @doc "`stablehlo.remainder`: two tensors of one type."
  defdelegate remainder(a, b), to: Elementwise

  @doc "`stablehlo.power`: two tensors of one type."
  defdelegate power(a, b), to: Elementwise

  @doc "`stablehlo.maximum`: two tensors of one type."
  defdelegate maximum(a, b), to: Elementwise

  @doc "`stablehlo.minimum`: two tensors of one type."
  defdelegate minimum(a, b), to: Elementwise

  @doc "`stablehlo.shift_left`: two integer tensors of one type."
  defdelegate shift_left(a, b), to: Elementwise

  @doc "`stablehlo.shift_right_arithmetic`: two integer tensors of one type."
  defdelegate shift_right_arithmetic(a, b), to: Elementwise

  @doc "`stablehlo.shift_right_logical`: two integer tensors of one type."
  defdelegate shift_right_logical(a, b), to: Elementwise

  @doc "`stablehlo.atan2`: two float or complex tensors of one type."
  defdelegate atan2(a, b), to: Elementwise

  @doc ~S"""
  `stablehlo.compare`: `direction` is `:eq`, `:ne`, `:lt`, `:le`, `:gt` or `:ge`; the comparison
  type follows the operands (`FLOAT`, `SIGNED`, `UNSIGNED`) unless given as
  `:float`, `:totalorder`, `:signed` or `:unsigned`. Returns a pred tensor.
  """
  defdelegate compare(direction, a, b, compare_type \\ nil), to: Elementwise

  @doc ~S"""
  `stablehlo.select`: `pred` picks from `on_true` or `on_false` (a scalar or same-shape pred).
  """
  defdelegate select(pred, on_true, on_false), to: Elementwise

  @doc "`stablehlo.clamp`: `min` and `max` of `x`'s type, or scalars of its element type."
  defdelegate clamp(min, x, max), to: Elementwise

  @doc "`stablehlo.convert`: to another element type."
  defdelegate convert(x, type), to: Elementwise

  @doc ~S"""
  `stablehlo.bitcast_convert`: the same bits as another element type. To a narrower type the
  result gains a last dimension (`bits / new bits`); to a wider one the operand's last dimension
  must be `new bits / bits` and goes away.
  """
  defdelegate bitcast_convert(x, type), to: Elementwise

  @doc ~S"""
  `stablehlo.rng_bit_generator`: from `state` (u64), returns `[new_state, bits]` with `bits` of
  `type`. `algorithm`: `:default`, `:three_fry` or `:philox`.
  """
  defdelegate rng_bit_generator(state, type, algorithm \\ :default), to: Elementwise

  @doc "`stablehlo.and`: two integer or pred tensors of one type."
  defdelegate bitwise_and(a, b), to: Elementwise

  @doc "`stablehlo.or`: two integer or pred tensors of one type."
  defdelegate bitwise_or(a, b), to: Elementwise

  @doc "`stablehlo.xor`: two integer or pred tensors of one type."
  defdelegate bitwise_xor(a, b), to: Elementwise

  ## Shapes

  @doc ~S"""
  `stablehlo.broadcast_in_dim`: operand dimension `i` becomes result dimension `Enum.at(axes, i)`.
  """
  defdelegate broadcast_in_dim(x, dims, axes), to: Shape

  @doc "`stablehlo.reshape`: the same elements in new dimensions."
  defdelegate reshape(x, dims), to: Shape

  @doc ~S"""
  `stablehlo.transpose`: result dimension `i` is operand dimension `Enum.at(permutation, i)`.
  """
  defdelegate transpose(x, permutation), to: Shape

  @doc "`stablehlo.reverse` along `axes`."
  defdelegate reverse(x, axes), to: Shape

  @doc ~S"""
  `stablehlo.slice`: `start` (inclusive) to `limit` (exclusive) with `strides` per dimension.
  """
  defdelegate slice(x, start, limit, strides \\ nil), to: Shape

  @doc "`stablehlo.dynamic_slice`: `starts` are scalar integer values, one per dimension."
  defdelegate dynamic_slice(x, starts, sizes), to: Shape

  @doc ~S"""
  `stablehlo.dynamic_update_slice`: writes `update` into `x` at `starts` (scalar integers).
  """
  defdelegate dynamic_update_slice(x, update, starts), to: Shape

  @doc "`stablehlo.concatenate` along `dimension`."
  defdelegate concatenate(values, dimension), to: Shape

  @doc "`stablehlo.pad`: `low`, `high` (may be negative) and `interior` padding per dimension."
  defdelegate pad(x, value, low, high, interior \\ nil), to: Shape

  ## Contractions and linear algebra

  @doc ~S"""
  `stablehlo.dot_general`. Options: `contracting: {lhs_dims, rhs_dims}` (default: the last of
  `lhs` with the first of `rhs` that is not a batch dimension), `batch: {lhs_dims, rhs_dims}`
  (default none), `precision: :default | :high | :highest`. The result's dimensions are the
  batch dimensions, then `lhs`'s free ones, then `rhs`'s.
  """
  defdelegate dot_general(lhs, rhs, opts \\ []), to: Linear

  @doc ~S"""
  `stablehlo.fft`: `type` is `:fft`, `:ifft` (complex to complex), `:rfft` (float to complex, the
  last dimension becoming `n / 2 + 1`) or `:irfft` (complex to float); `lengths` are the sizes
  of the transformed trailing dimensions.
  """
  defdelegate fft(x, type, lengths), to: Linear

  @doc ~S"""
  `stablehlo.triangular_solve`: solves `op(a) x = b` (or `x op(a) = b` with `left_side:
  false`) for a triangular `a` (`[..., m, m]`) and `b` (`[..., m, n]`, or `[..., n, m]`).
  Options: `left_side` (default true), `lower` (default true), `unit_diagonal` (default false),
  `transpose_a`: `:no_transpose` (default), `:transpose` or `:adjoint`.
  """
  defdelegate triangular_solve(a, b, opts \\ []), to: Linear

  @doc "`chlo.top_k`: the `k` largest values along the last dimension and their s32 indices."
  defdelegate top_k(x, k), to: Linear

  ## Ops with regions

  @doc ~S"""
  `stablehlo.sort` of `operands` (one shape) along `dimension`. `comparator` receives
  `[a_1, b_1, ..., a_n, b_n]` (scalars) and returns a pred scalar: whether `a` goes first.
  Options: `stable: true`. Returns one value per operand (a single value for one operand).
  """
  defdelegate sort(operands, dimension, comparator, opts \\ []), to: Control

  @doc ~S"""
  `stablehlo.reduce` of `operands` (one shape) with `inits` (scalars of their element types)
  over `axes`. `fun` receives `[acc_1, ..., acc_n, x_1, ..., x_n]` (scalars) and returns `n`
  scalars. Returns one value per operand (a single value for one operand).
  """
  defdelegate reduce(operands, inits, axes, fun), to: Control

  @doc ~S"""
  `stablehlo.while`: `cond` receives the loop values and returns a pred scalar; `body` receives
  them and returns new values of the same types. Returns the final values (a list).
  """
  defdelegate while_loop(initial, cond, body), to: Control

  @doc ~S"""
  `stablehlo.if`: `pred` (a pred scalar) chooses `on_true` or `on_false`, functions of no
  arguments that return values of the same types (they may use any value of the function).
  Returns the chosen branch's values (a list).
  """
  defdelegate if_then_else(pred, on_true, on_false), to: Control

  @doc ~S"""
  `stablehlo.case`: `index` (an s32 scalar) chooses one of `branches` (functions of no
  arguments returning values of the same types); out of range picks the last. Returns a list.
  """
  defdelegate case_of(index, branches), to: Control

  @doc "`stablehlo.optimization_barrier`: the values unchanged (a list)."
  defdelegate optimization_barrier(values), to: Control

  ## Gather, scatter, windows, convolution

  @doc ~S"""
  `stablehlo.scatter`: writes `updates` into `inputs` where `indices` say, combining each
  element with `fun` (`[current_1, ..., current_n, update_1, ..., update_n]` -> `n` scalars).
  Options (StableHLO's dimension numbers): `update_window_dims`, `inserted_window_dims`,
  `scatter_dims_to_operand_dims`, `index_vector_dim` (default: the last dimension of
  `indices`), `input_batching_dims`, `scatter_indices_batching_dims`, `indices_are_sorted`,
  `unique_indices`. Returns one value per input (a single value for one input).
  """
  defdelegate scatter(inputs, indices, updates, fun, opts), to: Window

  @doc ~S"""
  `stablehlo.convolution`. Options:

    * `:input` - `{batch_dim, feature_dim, spatial_dims}` of `lhs` (default `{0, 1, [2, ...]}`)
    * `:kernel` - `{input_feature_dim, output_feature_dim, spatial_dims}` of `rhs`
      (default `{1, 0, [2, ...]}`)
    * `:output` - `{batch_dim, feature_dim, spatial_dims}` of the result (default as `:input`)
    * `:strides`, `:lhs_dilation`, `:rhs_dilation` (default all 1), `:padding` (`[{low, high}]`)
    * `:feature_group_count`, `:batch_group_count` (default 1), `:precision`
  """
  defdelegate convolution(lhs, rhs, opts \\ []), to: Window

  @doc ~S"""
  `stablehlo.gather`: slices of `operand` of `slice_sizes`, starting where `indices` say.
  Options (StableHLO's dimension numbers): `offset_dims`, `collapsed_slice_dims`,
  `start_index_map`, `index_vector_dim` (default: the last dimension of `indices`),
  `operand_batching_dims`, `start_indices_batching_dims` (default `[]`), `indices_are_sorted`.
  """
  defdelegate gather(operand, indices, slice_sizes, opts), to: Window

  @doc ~S"""
  `stablehlo.reduce_window`: reduces each window of `operands` (one shape) with `fun`, as
  `reduce/4` does. Options: `strides`, `base_dilations`, `window_dilations` (default all 1),
  `padding: [{low, high}, ...]` (default none). Returns one value per operand (a single value
  for one operand).
  """
  defdelegate reduce_window(operands, inits, window, fun, opts \\ []), to: Window

  @doc ~S"""
  `stablehlo.select_and_scatter`: for each window of `operand`, `select` (two scalars -> pred)
  picks an element, and the matching element of `source` is combined into it with `scatter`
  (two scalars -> scalar), starting from `init`. Options: `strides`, `padding` as in
  `reduce_window/5`.
  """
  defdelegate select_and_scatter(operand, source, init, window, select, scatter, opts \\ []),
    to: Window

  ## Calls out of the program

  @doc ~S"""
  A custom call to a registered FFI target (`api_version = 4`) returning `result_types`.
  Options: `backend_config: [{name, attr_text}]` (MLIR attribute text, e.g. `"3 : i64"`, as
  `attribute/1` writes it),
  `has_side_effect: true`, `output_operand_aliases: [{result, operand}]`. Returns a list.
  """
  defdelegate custom_call(target, operands, result_types, opts \\ []), to: Calls

  @doc ~S"""
  `Nx.runtime_call` as EXLA lowers it: sends `{:exla_runtime_call, callback_id, args, tag}` to
  the run's callback server and returns its reply as values of `result_types` (a list).
  `handle` is the function's `{{:u, 8}, [8]}` first parameter; `callback_id` any term.
  """
  defdelegate runtime_call(handle, callback_id, args, result_types), to: Calls

  @doc ~S"""
  `Nx.io_call` as EXLA lowers it: sends the arguments to the callback server, waits for its
  `{:ok, []}`, and returns the arguments unchanged (a list, aliased to the operands).
  """
  defdelegate io_call(handle, callback_id, args), to: Calls

  @doc ~S"""
  Sends `{:exla_outfeed, args}` to the stream target (see `stream_target/1`) without waiting;
  returns a `u8` scalar: 1 sent, 0 failed.
  """
  defdelegate outfeed(target, payloads), to: Calls

  @doc ~S"""
  Asks the stream target for its next value (see `XlaNode.CallbackServer.push_infeed/2`) and
  waits for it; returns values of `result_types` (a list).
  """
  defdelegate infeed(target, result_types), to: Calls

  @doc ~S"""
  A stream target as a program constant: `:erlang.term_to_binary(target)` as a `u8` tensor, for
  `outfeed/2` and `infeed/2` in programs that name their stream process themselves (a pid or
  `{name, node}`). Programs may instead pass the callback handle parameter, which names the
  run's `callback_server:`.
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
