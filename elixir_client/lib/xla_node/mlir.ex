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

  alias XlaNode.MLIR.{CPUFaults, Value}
  alias XlaNode.{Options, Tensor}

  @state :xla_node_mlir
  @precision {:in, [:default, :high, :highest]}

  @typedoc "A tensor type: `{type, dims}`."
  @type type :: {Tensor.type(), [non_neg_integer()]}

  defmodule Value do
    @moduledoc "A typed SSA value of the function being built."
    @enforce_keys [:name, :type, :function]
    defstruct [:name, :type, :function]

    @type t :: %__MODULE__{name: String.t(), type: XlaNode.MLIR.type(), function: reference()}

    defimpl Inspect do
      def inspect(%{name: name, type: type}, _opts),
        do: "#MLIR.Value<#{name} : #{XlaNode.MLIR.type_text(type)}>"
    end
  end

  defmodule Func do
    @moduledoc "A function of the module being built, for `XlaNode.MLIR.call/2`."
    defstruct [:name, :arg_types, :result_types]
  end

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
    if Process.get(@state), do: raise(ArgumentError, "XlaNode.MLIR.module/1 calls cannot nest")
    Process.put(@state, %{functions: [], scopes: []})

    try do
      fun.()
      %{functions: functions} = Process.get(@state)

      unless Enum.any?(functions, fn {name, _} -> name == "main" end) do
        raise ArgumentError, "the module has no \"main\" function"
      end

      body = functions |> Enum.reverse() |> Enum.map_join("\n", fn {_, text} -> text end)

      # Without attributes the text stays as it was, so that programs keep their cache keys.
      case Keyword.get(opts, :attributes, []) do
        [] -> body
        attributes -> "module attributes {#{attributes_text(attributes)}} {\n" <> body <> "}\n"
      end
    after
      Process.delete(@state)
    end
  end

  defp attributes_text(attributes),
    do: Enum.map_join(attributes, ", ", fn {name, value} -> "#{name} = #{value}" end)

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

    state =
      Process.get(@state) ||
        raise ArgumentError, "function/4 must be called inside XlaNode.MLIR.module/1"

    if state.scopes != [],
      do: raise(ArgumentError, "function/4 cannot be called inside another function")

    if Enum.any?(state.functions, fn {n, _} -> n == name end),
      do: raise(ArgumentError, "function #{inspect(name)} is defined twice")

    arg_types = Enum.map(arg_types, &check_type!("function #{name}", &1))
    arg_attributes = arg_attributes!(name, opts, length(arg_types))
    id = make_ref()

    args =
      for {t, i} <- Enum.with_index(arg_types),
          do: %Value{name: "%arg#{i}", type: t, function: id}

    Process.put(@state, %{state | scopes: [%{function: id, counter: 0, lines: []}]})
    results = body.(args) |> List.wrap() |> Enum.map(&value!("return", &1))
    %{scopes: [scope]} = Process.get(@state)
    result_types = Enum.map(results, & &1.type)
    private = Keyword.get(opts, :private, name != "main")

    text =
      [
        "func.func #{if private, do: "private ", else: ""}@#{name}(",
        Enum.zip_with(args, arg_attributes, &argument_text/2) |> Enum.join(", "),
        ") -> (",
        Enum.map_join(result_types, ", ", &type_text/1),
        ") {\n",
        Enum.reverse(scope.lines),
        "  \"func.return\"(#{names(results)}) : (#{types_text(result_types)}) -> ()\n}\n"
      ]
      |> IO.iodata_to_binary()

    state = Process.get(@state)
    Process.put(@state, %{state | scopes: [], functions: [{name, text} | state.functions]})
    %Func{name: name, arg_types: arg_types, result_types: result_types}
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
    do: is_list(entry) and Enum.all?(entry, &match?({k, v} when is_binary(k) and is_binary(v), &1))

  defp argument_text(arg, attributes) when attributes in [nil, []],
    do: "#{arg.name}: #{type_text(arg.type)}"

  defp argument_text(arg, attributes),
    do: "#{arg.name}: #{type_text(arg.type)} {#{attributes_text(attributes)}}"

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
  def type_text({type, dims}) do
    "tensor<" <> Enum.map_join(dims, "", &"#{&1}x") <> element_text(type) <> ">"
  end

  defp element_text({:f, 8}), do: "f8E5M2"
  defp element_text({:f8_e4m3fn, 8}), do: "f8E4M3FN"
  defp element_text({:f, bits}), do: "f#{bits}"
  defp element_text({:bf, 16}), do: "bf16"
  defp element_text({:s, bits}), do: "i#{bits}"
  defp element_text({:u, bits}), do: "ui#{bits}"
  defp element_text({:pred, 8}), do: "i1"
  defp element_text({:c, 64}), do: "complex<f32>"
  defp element_text({:c, 128}), do: "complex<f64>"

  defp types_text(types), do: Enum.map_join(types, ", ", &type_text/1)
  defp names(values), do: Enum.map_join(values, ", ", & &1.name)

  defp check_type!(op, {type, dims} = t) when is_list(dims) do
    type =
      try do
        Tensor.normalize_type(type)
      rescue
        e in ArgumentError ->
          reraise ArgumentError, "#{op}: #{Exception.message(e)}", __STACKTRACE__
      end

    unless Enum.all?(dims, &(is_integer(&1) and &1 >= 0)) do
      raise ArgumentError, "#{op}: dims must be non-negative integers, got #{inspect(t)}"
    end

    {type, dims}
  end

  defp check_type!(op, other),
    do: raise(ArgumentError, "#{op}: expected a type {type, dims}, got #{inspect(other)}")

  @doc """
  The family of an element type: `:float`, `:complex`, `:signed`, `:unsigned` or `:pred`.

      iex> XlaNode.MLIR.category({:bf, 16})
      :float
  """
  def category({:f, _}), do: :float
  def category({:f8_e4m3fn, _}), do: :float
  def category({:bf, _}), do: :float
  def category({:c, _}), do: :complex
  def category({:s, _}), do: :signed
  def category({:u, _}), do: :unsigned
  def category({:pred, _}), do: :pred

  defp bits({_, b}), do: b

  ## Emitting

  # An op's options, checked: an unknown key or a value of the wrong kind raises ArgumentError.
  defp options!(opts, function, spec),
    do: Options.validate!(opts, "XlaNode.MLIR.#{function}", spec)

  defp value!(_op, %Value{} = v) do
    case Process.get(@state) do
      %{scopes: [%{function: f} | _]} when f == v.function -> v
      %{scopes: [_ | _]} -> raise ArgumentError, "#{v.name} belongs to another function"
      _ -> raise ArgumentError, "not inside XlaNode.MLIR.function/3"
    end
  end

  defp value!(op, other),
    do: raise(ArgumentError, "#{op}: expected a value, got #{inspect(other)}")

  defp scope! do
    case Process.get(@state) do
      %{scopes: [scope | _]} -> scope
      _ -> raise ArgumentError, "not inside XlaNode.MLIR.function/3"
    end
  end

  defp put_scope(scope) do
    state = Process.get(@state)
    Process.put(@state, %{state | scopes: [scope | tl(state.scopes)]})
  end

  defp fresh_name do
    scope = scope!()
    put_scope(%{scope | counter: scope.counter + 1})
    scope.counter
  end

  # Emits `"op"(operands) ({regions}) {attrs} : (operand types) -> (result types)`; returns the
  # result values.
  defp emit(op, operands, result_types, attrs, regions \\ []) do
    scope = scope!()
    n = fresh_name()
    count = length(result_types)

    {lhs, results} =
      case count do
        0 ->
          {"", []}

        1 ->
          {"%#{n} = ", [%Value{name: "%#{n}", type: hd(result_types), function: scope.function}]}

        _ ->
          {"%#{n}:#{count} = ",
           for(
             {t, i} <- Enum.with_index(result_types),
             do: %Value{name: "%#{n}##{i}", type: t, function: scope.function}
           )}
      end

    attrs = if attrs == [], do: "", else: " {" <> Enum.join(attrs, ", ") <> "}"
    regions = if regions == [], do: "", else: " (" <> Enum.join(regions, ", ") <> ")"

    results_text =
      if count == 1, do: type_text(hd(result_types)), else: "(#{types_text(result_types)})"

    line =
      "  #{lhs}\"#{op}\"(#{names(operands)})#{regions}#{attrs} : (#{types_text(Enum.map(operands, & &1.type))}) -> #{results_text}\n"

    scope = scope!()
    put_scope(%{scope | lines: [line | scope.lines]})
    results
  end

  defp emit1(op, operands, type, attrs \\ [], regions \\ []),
    do: hd(emit(op, operands, [type], attrs, regions))

  # Ops with one result per operand return a value for one operand, a list for several.
  defp one_or_list([result]), do: result
  defp one_or_list(results), do: results

  # A region: `fun` receives block arguments of `arg_types` and returns values.
  defp region(op, arg_types, fun) do
    outer = scope!()

    args =
      for t <- arg_types, do: %Value{name: "%#{fresh_name()}", type: t, function: outer.function}

    state = Process.get(@state)
    Process.put(@state, %{state | scopes: [%{scope!() | lines: []} | state.scopes]})

    {results, inner} =
      try do
        results = fun.(args) |> List.wrap() |> Enum.map(&value!(op, &1))
        {results, scope!()}
      after
        state = Process.get(@state)
        Process.put(@state, %{state | scopes: tl(state.scopes)})
      end

    # The counter moves on in the enclosing scope, so names stay unique in the function.
    put_scope(%{scope!() | counter: inner.counter})

    text =
      IO.iodata_to_binary([
        "{\n  ^bb0(",
        Enum.map_join(args, ", ", &"#{&1.name}: #{type_text(&1.type)}"),
        "):\n",
        Enum.map(Enum.reverse(inner.lines), &["  ", &1]),
        "    \"stablehlo.return\"(#{names(results)}) : (#{types_text(Enum.map(results, & &1.type))}) -> ()\n  }"
      ])

    {text, Enum.map(results, & &1.type)}
  end

  # A region whose results must be of `expected` types; `what` names it in the error.
  defp region!(op, what, arg_types, expected, fun) do
    {text, results} = region(op, arg_types, fun)

    if results != expected do
      raise ArgumentError,
            "#{op}: #{what} returned #{types_text(results)}; expected #{types_text(expected)}"
    end

    text
  end

  defp i64_array([]), do: "array<i64>"
  defp i64_array(list), do: "array<i64: #{Enum.join(list, ", ")}>"
  defp i64_list(list), do: "[#{Enum.join(list, ", ")}]"


  defp mismatch!(op, values, expected) do
    raise ArgumentError,
          "#{op}: got #{Enum.map_join(values, ", ", &type_text(&1.type))}; expected #{expected}"
  end

  ## Constants and iota

  @doc """
  A constant of type `{type, dims}`: a single value (repeated, a splat) or a flat list of
  `product(dims)` values, as `XlaNode.Tensor.from_list/3` accepts them (`:nan`, `:infinity`,
  `:neg_infinity` included).
  """
  def constant(value, type) do
    {elem, dims} = check_type!("constant", type)
    size = Enum.product(dims)

    values =
      case value do
        list when is_list(list) ->
          list = List.flatten(list)

          if length(list) != size do
            raise ArgumentError,
                  "constant: #{length(list)} values for #{type_text({elem, dims})} (#{size} elements)"
          end

          list

        single ->
          [single]
      end

    literal =
      case elem do
        {:pred, 8} ->
          bools = Enum.map(values, &if(&1 in [true, 1], do: "true", else: "false"))
          if length(bools) == 1, do: hd(bools), else: "[" <> Enum.join(bools, ", ") <> "]"

        {_, bits} when bits < 8 ->
          # Checked, then written as decimal integers: MLIR's hex form would take a byte each.
          values |> Tensor.from_list(elem, [length(values)]) |> Tensor.to_flat_list() |> ints()

        _ ->
          {bin, _} = Tensor.from_list(values, elem, [length(values)])
          ~s("0x#{Base.encode16(bin)}")
      end

    emit1("stablehlo.constant", [], {elem, dims}, [
      "value = dense<#{literal}> : #{type_text({elem, dims})}"
    ])
  end

  defp ints([value]), do: "#{value}"
  defp ints(values), do: "[" <> Enum.join(values, ", ") <> "]"

  @doc """
  A constant from the raw row-major little-endian bytes of a tensor of `type`, as a tensor's
  binary holds them (see `XlaNode.Tensor`: a `pred` constant takes one byte, 0 or 1, per element;
  2- and 4-bit elements are packed in a bitstring).
  """
  def constant_binary(binary, type) when is_bitstring(binary) do
    {elem, dims} = check_type!("constant", type)
    size = Tensor.bit_size(elem, dims)

    if bit_size(binary) != size do
      raise ArgumentError,
            "constant: #{Tensor.size_text(bit_size(binary), elem)} for " <>
              "#{type_text({elem, dims})} (#{Tensor.size_text(size, elem)})"
    end

    if elem == {:pred, 8} or Tensor.element_bits(elem) < 8 do
      constant(Tensor.to_flat_list({binary, {elem, [Enum.product(dims)]}}), {elem, dims})
    else
      emit1("stablehlo.constant", [], {elem, dims}, [
        ~s(value = dense<"0x#{Base.encode16(binary)}"> : #{type_text({elem, dims})})
      ])
    end
  end

  @doc "`stablehlo.iota`: values counting along `dimension`."
  def iota(type, dimension) do
    {elem, dims} = check_type!("iota", type)

    if dimension < 0 or dimension >= length(dims),
      do:
        raise(
          ArgumentError,
          "iota: dimension #{dimension} out of range for #{type_text({elem, dims})}"
        )

    emit1("stablehlo.iota", [], {elem, dims}, ["iota_dimension = #{dimension} : i64"])
  end

  ## Elementwise ops

  @float_unary ~w(exponential exponential_minus_one log log_plus_one logistic sqrt rsqrt cbrt sine cosine tan tanh)a
  @rounding ~w(floor ceil round_nearest_even round_nearest_afz)a
  @chlo_unary ~w(erf erfc erf_inv lgamma digamma asin acos atan sinh cosh asinh acosh atanh)a

  for op <- @float_unary do
    @doc "`stablehlo.#{op}` (float or complex)."
    def unquote(op)(x), do: unary(unquote("stablehlo.#{op}"), x, [:float, :complex])
  end

  for op <- @rounding do
    @doc "`stablehlo.#{op}` (float)."
    def unquote(op)(x), do: unary(unquote("stablehlo.#{op}"), x, [:float])
  end

  for op <- @chlo_unary do
    @doc "`chlo.#{op}` (float#{if op in [:asin, :acos, :atan, :sinh, :cosh, :asinh, :acosh, :atanh], do: " or complex"})."
    def unquote(op)(x) do
      cats =
        if unquote(op) in [:asin, :acos, :atan, :sinh, :cosh, :asinh, :acosh, :atanh],
          do: [:float, :complex],
          else: [:float]

      unary(unquote("chlo.#{op}"), x, cats)
    end
  end

  @doc "`stablehlo.negate`."
  def negate(x), do: unary("stablehlo.negate", x, [:float, :complex, :signed, :unsigned])

  @doc "`stablehlo.sign`."
  def sign(x), do: unary("stablehlo.sign", x, [:float, :complex, :signed])

  @doc "`stablehlo.abs`: for complex operands, the result is the real magnitude."
  def abs(x) do
    x = value!("stablehlo.abs", x)
    {elem, dims} = x.type
    check_category!("stablehlo.abs", [x], [:float, :complex, :signed])

    result =
      if elem == {:c, 64}, do: {:f, 32}, else: if(elem == {:c, 128}, do: {:f, 64}, else: elem)

    emit1("stablehlo.abs", [x], {result, dims})
  end

  @doc "`stablehlo.not` (integer or pred)."
  def bitwise_not(x), do: unary("stablehlo.not", x, [:signed, :unsigned, :pred])

  @doc "`stablehlo.popcnt`."
  def population_count(x), do: unary("stablehlo.popcnt", x, [:signed, :unsigned])

  @doc "`stablehlo.count_leading_zeros`."
  def count_leading_zeros(x), do: unary("stablehlo.count_leading_zeros", x, [:signed, :unsigned])

  @doc "`stablehlo.is_finite`: a pred tensor."
  def is_finite(x), do: predicate("stablehlo.is_finite", x)

  @doc "`chlo.is_inf`: a pred tensor."
  def is_inf(x), do: predicate("chlo.is_inf", x)

  @doc "`chlo.is_pos_inf`: a pred tensor."
  def is_pos_inf(x), do: predicate("chlo.is_pos_inf", x)

  @doc "`chlo.is_neg_inf`: a pred tensor."
  def is_neg_inf(x), do: predicate("chlo.is_neg_inf", x)

  @doc "`stablehlo.real`: the real part of a complex tensor (floats pass through)."
  def real(x), do: complex_part("stablehlo.real", x)

  @doc "`stablehlo.imag`: the imaginary part of a complex tensor."
  def imag(x), do: complex_part("stablehlo.imag", x)

  defp unary(op, x, cats) do
    x = value!(op, x)
    check_category!(op, [x], cats)
    emit1(op, [x], x.type)
  end

  defp predicate(op, x) do
    x = value!(op, x)
    check_category!(op, [x], [:float])
    {_, dims} = x.type
    emit1(op, [x], {{:pred, 8}, dims})
  end

  defp complex_part(op, x) do
    x = value!(op, x)
    check_category!(op, [x], [:float, :complex])
    {elem, dims} = x.type
    part = %{{:c, 64} => {:f, 32}, {:c, 128} => {:f, 64}}[elem] || elem
    emit1(op, [x], {part, dims})
  end

  defp check_category!(op, values, cats) do
    for v <- values do
      {elem, _} = v.type

      unless category(elem) in cats do
        mismatch!(op, values, "#{Enum.join(cats, " or ")} tensors")
      end
    end

    :ok
  end

  @arith ~w(add subtract multiply divide remainder power maximum minimum)a
  @bitwise ~w(and or xor)a
  @shifts ~w(shift_left shift_right_arithmetic shift_right_logical)a

  for op <- @arith do
    @doc "`stablehlo.#{op}`: two tensors of one type."
    def unquote(op)(a, b),
      do:
        binary(
          unquote("stablehlo.#{op}"),
          a,
          b,
          [:float, :complex, :signed, :unsigned] ++
            if(unquote(op) in [:add, :multiply, :maximum, :minimum], do: [:pred], else: [])
        )
  end

  for op <- @bitwise do
    @doc "`stablehlo.#{op}`: two integer or pred tensors of one type."
    def unquote(:"bitwise_#{op}")(a, b),
      do: binary(unquote("stablehlo.#{op}"), a, b, [:signed, :unsigned, :pred])
  end

  for op <- @shifts do
    @doc "`stablehlo.#{op}`: two integer tensors of one type."
    def unquote(op)(a, b), do: binary(unquote("stablehlo.#{op}"), a, b, [:signed, :unsigned])
  end

  @doc "`stablehlo.atan2`: two float or complex tensors of one type."
  def atan2(a, b), do: binary("stablehlo.atan2", a, b, [:float, :complex])

  @doc "`stablehlo.complex`: a complex tensor from real and imaginary parts (f32 or f64)."
  def complex(re, im) do
    [re, im] = same_type!("stablehlo.complex", [re, im])
    {elem, dims} = re.type

    result =
      case elem do
        {:f, 32} -> {:c, 64}
        {:f, 64} -> {:c, 128}
        _ -> mismatch!("stablehlo.complex", [re, im], "f32 or f64 tensors")
      end

    emit1("stablehlo.complex", [re, im], {result, dims})
  end

  defp binary(op, a, b, cats) do
    [a, b] = same_type!(op, [a, b])
    check_category!(op, [a, b], cats)
    emit1(op, [a, b], a.type)
  end

  defp same_type!(op, values) do
    values = Enum.map(values, &value!(op, &1))
    [first | rest] = values

    if Enum.any?(rest, &(&1.type != first.type)) do
      mismatch!(op, values, "operands of one type")
    end

    values
  end

  @doc """
  `stablehlo.compare`: `direction` is `:eq`, `:ne`, `:lt`, `:le`, `:gt` or `:ge`; the comparison
  type follows the operands (`FLOAT`, `SIGNED`, `UNSIGNED`) unless given as
  `:float`, `:totalorder`, `:signed` or `:unsigned`. Returns a pred tensor.
  """
  def compare(direction, a, b, compare_type \\ nil)
      when direction in [:eq, :ne, :lt, :le, :gt, :ge] do
    [a, b] = same_type!("stablehlo.compare", [a, b])
    {elem, dims} = a.type

    compare_type =
      compare_type ||
        case category(elem) do
          c when c in [:float, :complex] -> :float
          :signed -> :signed
          _ -> :unsigned
        end

    dir = direction |> Atom.to_string() |> String.upcase()
    ct = compare_type |> Atom.to_string() |> String.upcase()

    emit1("stablehlo.compare", [a, b], {{:pred, 8}, dims}, [
      "comparison_direction = #stablehlo<comparison_direction #{dir}>",
      "compare_type = #stablehlo<comparison_type #{ct}>"
    ])
  end

  @doc "`stablehlo.select`: `pred` picks from `on_true` or `on_false` (a scalar or same-shape pred)."
  def select(pred, on_true, on_false) do
    pred = value!("stablehlo.select", pred)
    [t, f] = same_type!("stablehlo.select", [on_true, on_false])
    {pelem, pdims} = pred.type
    {_, dims} = t.type

    unless pelem == {:pred, 8} and pdims in [[], dims] do
      mismatch!(
        "stablehlo.select",
        [pred, t, f],
        "a pred tensor of the branches' shape (or a scalar) and two branches of one type"
      )
    end

    emit1("stablehlo.select", [pred, t, f], t.type)
  end

  @doc "`stablehlo.clamp`: `min` and `max` of `x`'s type, or scalars of its element type."
  def clamp(min, x, max) do
    [min, x, max] = Enum.map([min, x, max], &value!("stablehlo.clamp", &1))
    {elem, _} = x.type

    for bound <- [min, max], bound.type != x.type and bound.type != {elem, []} do
      mismatch!(
        "stablehlo.clamp",
        [min, x, max],
        "bounds of the operand's type or scalars of its element type"
      )
    end

    emit1("stablehlo.clamp", [min, x, max], x.type)
  end

  @doc "`stablehlo.convert`: to another element type."
  def convert(x, type) do
    x = value!("stablehlo.convert", x)
    {_, dims} = x.type
    emit1("stablehlo.convert", [x], {Tensor.normalize_type(type), dims})
  end

  @doc """
  `stablehlo.bitcast_convert`: the same bits as another element type. To a narrower type the
  result gains a last dimension (`bits / new bits`); to a wider one the operand's last dimension
  must be `new bits / bits` and goes away.
  """
  def bitcast_convert(x, type) do
    x = value!("stablehlo.bitcast_convert", x)
    {elem, dims} = x.type
    type = Tensor.normalize_type(type)
    {from, to} = {bits(elem), bits(type)}

    dims =
      cond do
        from == to ->
          dims

        from > to ->
          dims ++ [div(from, to)]

        List.last(dims) == div(to, from) ->
          Enum.drop(dims, -1)

        true ->
          mismatch!(
            "stablehlo.bitcast_convert",
            [x],
            "a last dimension of #{div(to, from)} to convert to #{element_text(type)}"
          )
      end

    emit1("stablehlo.bitcast_convert", [x], {type, dims})
  end

  ## Shapes

  @doc "`stablehlo.broadcast_in_dim`: operand dimension `i` becomes result dimension `Enum.at(axes, i)`."
  def broadcast_in_dim(x, dims, axes) do
    x = value!("stablehlo.broadcast_in_dim", x)
    {elem, xdims} = x.type

    ok =
      length(axes) == length(xdims) and axes == Enum.sort(Enum.uniq(axes)) and
        Enum.all?(Enum.zip(xdims, axes), fn {d, a} ->
          a < length(dims) and d in [1, Enum.at(dims, a)]
        end)

    unless ok do
      mismatch!(
        "stablehlo.broadcast_in_dim",
        [x],
        "broadcast_dimensions #{inspect(axes)} that map the operand's dimensions onto #{inspect(dims)}"
      )
    end

    emit1("stablehlo.broadcast_in_dim", [x], {elem, dims}, [
      "broadcast_dimensions = #{i64_array(axes)}"
    ])
  end

  @doc "`stablehlo.reshape`: the same elements in new dimensions."
  def reshape(x, dims) do
    x = value!("stablehlo.reshape", x)
    {elem, xdims} = x.type

    if Enum.product(xdims) != Enum.product(dims) do
      mismatch!(
        "stablehlo.reshape",
        [x],
        "#{Enum.product(dims)} elements for dims #{inspect(dims)}"
      )
    end

    emit1("stablehlo.reshape", [x], {elem, dims})
  end

  @doc "`stablehlo.transpose`: result dimension `i` is operand dimension `Enum.at(permutation, i)`."
  def transpose(x, permutation) do
    x = value!("stablehlo.transpose", x)
    {elem, dims} = x.type

    if Enum.sort(permutation) != Enum.to_list(0..(length(dims) - 1)//1) do
      mismatch!(
        "stablehlo.transpose",
        [x],
        "a permutation of #{length(dims)} dimensions, got #{inspect(permutation)}"
      )
    end

    emit1("stablehlo.transpose", [x], {elem, Enum.map(permutation, &Enum.at(dims, &1))}, [
      "permutation = #{i64_array(permutation)}"
    ])
  end

  @doc "`stablehlo.reverse` along `axes`."
  def reverse(x, axes) do
    x = value!("stablehlo.reverse", x)
    {_, dims} = x.type
    check_axes!("stablehlo.reverse", x, axes, length(dims))
    emit1("stablehlo.reverse", [x], x.type, ["dimensions = #{i64_array(axes)}"])
  end

  defp check_axes!(op, x, axes, rank) do
    unless Enum.all?(axes, &(&1 >= 0 and &1 < rank)) and Enum.uniq(axes) == axes do
      mismatch!(op, [x], "distinct dimensions below #{rank}, got #{inspect(axes)}")
    end
  end

  @doc "`stablehlo.slice`: `start` (inclusive) to `limit` (exclusive) with `strides` per dimension."
  def slice(x, start, limit, strides \\ nil) do
    x = value!("stablehlo.slice", x)
    {elem, dims} = x.type
    strides = strides || Enum.map(dims, fn _ -> 1 end)

    ok =
      Enum.all?([start, limit, strides], &(length(&1) == length(dims))) and
        Enum.all?(Enum.zip([start, limit, strides, dims]), fn {s, l, st, d} ->
          0 <= s and s <= l and l <= d and st > 0
        end)

    unless ok,
      do:
        mismatch!(
          "stablehlo.slice",
          [x],
          "start <= limit <= dims and positive strides, got #{inspect({start, limit, strides})}"
        )

    out = Enum.zip_with([start, limit, strides], fn [s, l, st] -> div(l - s + st - 1, st) end)

    emit1("stablehlo.slice", [x], {elem, out}, [
      "start_indices = #{i64_array(start)}",
      "limit_indices = #{i64_array(limit)}",
      "strides = #{i64_array(strides)}"
    ])
  end

  @doc "`stablehlo.dynamic_slice`: `starts` are scalar integer values, one per dimension."
  def dynamic_slice(x, starts, sizes) do
    x = value!("stablehlo.dynamic_slice", x)
    starts = Enum.map(starts, &value!("stablehlo.dynamic_slice", &1))
    {elem, dims} = x.type
    check_indices!("stablehlo.dynamic_slice", x, starts, length(dims))

    unless length(sizes) == length(dims) and
             Enum.all?(Enum.zip(sizes, dims), fn {s, d} -> s >= 0 and s <= d end) do
      mismatch!(
        "stablehlo.dynamic_slice",
        [x],
        "slice_sizes within #{inspect(dims)}, got #{inspect(sizes)}"
      )
    end

    emit1("stablehlo.dynamic_slice", [x | starts], {elem, sizes}, [
      "slice_sizes = #{i64_array(sizes)}"
    ])
  end

  @doc "`stablehlo.dynamic_update_slice`: writes `update` into `x` at `starts` (scalar integers)."
  def dynamic_update_slice(x, update, starts) do
    [x, update] = Enum.map([x, update], &value!("stablehlo.dynamic_update_slice", &1))
    starts = Enum.map(starts, &value!("stablehlo.dynamic_update_slice", &1))
    {elem, dims} = x.type
    {uelem, udims} = update.type
    check_indices!("stablehlo.dynamic_update_slice", x, starts, length(dims))

    unless uelem == elem and length(udims) == length(dims) and
             Enum.all?(Enum.zip(udims, dims), fn {u, d} -> u <= d end) do
      mismatch!(
        "stablehlo.dynamic_update_slice",
        [x, update],
        "an update of the operand's element type that fits in it"
      )
    end

    emit1("stablehlo.dynamic_update_slice", [x, update | starts], x.type)
  end

  defp check_indices!(op, x, starts, rank) do
    types = Enum.map(starts, & &1.type)

    unless length(starts) == rank and
             Enum.all?(types, fn {e, d} -> d == [] and category(e) in [:signed, :unsigned] end) and
             length(Enum.uniq(types)) <= 1 do
      mismatch!(op, [x | starts], "#{rank} scalar integer start indices of one type")
    end
  end

  @doc "`stablehlo.concatenate` along `dimension`."
  def concatenate([_ | _] = values, dimension) do
    values = Enum.map(values, &value!("stablehlo.concatenate", &1))
    CPUFaults.check!(:concatenate, "stablehlo.concatenate", values)
    [{elem, dims} | _] = Enum.map(values, & &1.type)
    drop = fn d -> List.delete_at(d, dimension) end

    unless dimension >= 0 and dimension < length(dims) and
             Enum.all?(values, fn %{type: {e, d}} ->
               e == elem and length(d) == length(dims) and drop.(d) == drop.(dims)
             end) do
      mismatch!(
        "stablehlo.concatenate",
        values,
        "tensors of one element type that differ only in dimension #{dimension}"
      )
    end

    total = values |> Enum.map(fn %{type: {_, d}} -> Enum.at(d, dimension) end) |> Enum.sum()

    emit1("stablehlo.concatenate", values, {elem, List.replace_at(dims, dimension, total)}, [
      "dimension = #{dimension} : i64"
    ])
  end

  @doc "`stablehlo.pad`: `low`, `high` (may be negative) and `interior` padding per dimension."
  def pad(x, value, low, high, interior \\ nil) do
    [x, value] = Enum.map([x, value], &value!("stablehlo.pad", &1))
    {elem, dims} = x.type
    interior = interior || Enum.map(dims, fn _ -> 0 end)

    unless value.type == {elem, []} and
             Enum.all?([low, high, interior], &(length(&1) == length(dims))) and
             Enum.all?(interior, &(&1 >= 0)) do
      mismatch!(
        "stablehlo.pad",
        [x, value],
        "a scalar padding value of the operand's element type and one low, high and interior padding per dimension"
      )
    end

    out =
      Enum.zip_with([dims, low, high, interior], fn [d, l, h, i] ->
        l + d + h + max(d - 1, 0) * i
      end)

    emit1("stablehlo.pad", [x, value], {elem, out}, [
      "edge_padding_low = #{i64_array(low)}",
      "edge_padding_high = #{i64_array(high)}",
      "interior_padding = #{i64_array(interior)}"
    ])
  end

  ## Contractions

  @doc """
  `stablehlo.dot_general`. Options: `contracting: {lhs_dims, rhs_dims}` (default: the last of
  `lhs` with the first of `rhs` that is not a batch dimension), `batch: {lhs_dims, rhs_dims}`
  (default none), `precision: :default | :high | :highest`. The result's dimensions are the
  batch dimensions, then `lhs`'s free ones, then `rhs`'s.
  """
  def dot_general(lhs, rhs, opts \\ []) do
    opts =
      options!(opts, "dot_general/3",
        contracting: :integer_lists,
        batch: :integer_lists,
        precision: @precision
      )

    [lhs, rhs] = Enum.map([lhs, rhs], &value!("stablehlo.dot_general", &1))
    CPUFaults.check!(:dot, "stablehlo.dot_general", [lhs, rhs])
    {elem, ldims} = lhs.type
    {relem, rdims} = rhs.type
    {lb, rb} = Keyword.get(opts, :batch, {[], []})

    {lc, rc} =
      Keyword.get(
        opts,
        :contracting,
        {[length(ldims) - 1], [Enum.at(Enum.to_list(0..(length(rdims) - 1)//1) -- rb, 0)]}
      )

    at = fn dims, axes -> Enum.map(axes, &Enum.at(dims, &1)) end
    all = fn dims -> Enum.to_list(0..(length(dims) - 1)//1) end

    ok =
      elem == relem and length(lb) == length(rb) and length(lc) == length(rc) and
        at.(ldims, lb) == at.(rdims, rb) and at.(ldims, lc) == at.(rdims, rc) and
        Enum.all?(lb ++ lc, &(&1 in all.(ldims))) and Enum.all?(rb ++ rc, &(&1 in all.(rdims)))

    unless ok do
      mismatch!(
        "stablehlo.dot_general",
        [lhs, rhs],
        "one element type and matching batch #{inspect({lb, rb})} and contracting #{inspect({lc, rc})} dimensions"
      )
    end

    out =
      at.(ldims, lb) ++
        at.(ldims, all.(ldims) -- (lb ++ lc)) ++ at.(rdims, all.(rdims) -- (rb ++ rc))

    precision = opts |> Keyword.get(:precision, :default) |> Atom.to_string() |> String.upcase()

    emit1("stablehlo.dot_general", [lhs, rhs], {elem, out}, [
      "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = #{i64_list(lb)}, rhs_batching_dimensions = #{i64_list(rb)}, lhs_contracting_dimensions = #{i64_list(lc)}, rhs_contracting_dimensions = #{i64_list(rc)}>",
      "precision_config = [#stablehlo<precision #{precision}>, #stablehlo<precision #{precision}>]"
    ])
  end

  ## Regions

  @doc """
  `stablehlo.reduce` of `operands` (one shape) with `inits` (scalars of their element types)
  over `axes`. `fun` receives `[acc_1, ..., acc_n, x_1, ..., x_n]` (scalars) and returns `n`
  scalars. Returns one value per operand (a single value for one operand).
  """
  def reduce(operands, inits, axes, fun) do
    operands = Enum.map(List.wrap(operands), &value!("stablehlo.reduce", &1))
    inits = Enum.map(List.wrap(inits), &value!("stablehlo.reduce", &1))
    [{_, dims} | _] = Enum.map(operands, & &1.type)
    scalars = Enum.map(operands, fn %{type: {e, _}} -> {e, []} end)

    unless length(inits) == length(operands) and
             Enum.all?(operands, fn %{type: {_, d}} -> d == dims end) and
             Enum.map(inits, & &1.type) == scalars do
      mismatch!(
        "stablehlo.reduce",
        operands ++ inits,
        "operands of one shape and one scalar init of each operand's element type"
      )
    end

    check_axes!("stablehlo.reduce", hd(operands), axes, length(dims))
    body = region!("stablehlo.reduce", "the region", scalars ++ scalars, scalars, fun)

    out_dims = for {d, i} <- Enum.with_index(dims), i not in axes, do: d
    types = Enum.map(scalars, fn {e, []} -> {e, out_dims} end)

    results =
      emit("stablehlo.reduce", operands ++ inits, types, ["dimensions = #{i64_array(axes)}"], [
        body
      ])

    one_or_list(results)
  end

  @doc """
  `stablehlo.sort` of `operands` (one shape) along `dimension`. `comparator` receives
  `[a_1, b_1, ..., a_n, b_n]` (scalars) and returns a pred scalar: whether `a` goes first.
  Options: `stable: true`. Returns one value per operand (a single value for one operand).
  """
  def sort(operands, dimension, comparator, opts \\ []) do
    opts = options!(opts, "sort/4", stable: :boolean)
    operands = Enum.map(List.wrap(operands), &value!("stablehlo.sort", &1))

    CPUFaults.check!(:sort, "stablehlo.sort", operands)

    [{_, dims} | _] = Enum.map(operands, & &1.type)

    unless Enum.all?(operands, fn %{type: {_, d}} -> d == dims end) and dimension >= 0 and
             dimension < length(dims) do
      mismatch!(
        "stablehlo.sort",
        operands,
        "operands of one shape and a dimension below #{length(dims)}"
      )
    end

    scalars = Enum.flat_map(operands, fn %{type: {e, _}} -> [{e, []}, {e, []}] end)
    body = region!("stablehlo.sort", "the comparator", scalars, [{{:pred, 8}, []}], comparator)

    results =
      emit(
        "stablehlo.sort",
        operands,
        Enum.map(operands, & &1.type),
        ["dimension = #{dimension} : i64", "is_stable = #{Keyword.get(opts, :stable, false)}"],
        [body]
      )

    one_or_list(results)
  end

  @doc """
  `stablehlo.while`: `cond` receives the loop values and returns a pred scalar; `body` receives
  them and returns new values of the same types. Returns the final values (a list).
  """
  def while_loop(initial, cond, body) do
    initial = Enum.map(List.wrap(initial), &value!("stablehlo.while", &1))
    types = Enum.map(initial, & &1.type)
    cond_region = region!("stablehlo.while", "the condition", types, [{{:pred, 8}, []}], cond)
    body_region = region!("stablehlo.while", "the body", types, types, body)

    emit("stablehlo.while", initial, types, [], [cond_region, body_region])
  end

  @doc """
  `stablehlo.if`: `pred` (a pred scalar) chooses `on_true` or `on_false`, functions of no
  arguments that return values of the same types (they may use any value of the function).
  Returns the chosen branch's values (a list).
  """
  def if_then_else(pred, on_true, on_false) do
    pred = value!("stablehlo.if", pred)
    if pred.type != {{:pred, 8}, []}, do: mismatch!("stablehlo.if", [pred], "a pred scalar")
    branches([on_true, on_false], "stablehlo.if", pred)
  end

  @doc """
  `stablehlo.case`: `index` (an s32 scalar) chooses one of `branches` (functions of no
  arguments returning values of the same types); out of range picks the last. Returns a list.
  """
  def case_of(index, [_ | _] = branches) do
    index = value!("stablehlo.case", index)
    if index.type != {{:s, 32}, []}, do: mismatch!("stablehlo.case", [index], "an s32 scalar")
    branches(branches, "stablehlo.case", index)
  end

  defp branches(funs, op, selector) do
    regions = Enum.map(funs, fn f -> region(op, [], fn [] -> f.() end) end)
    [{_, types} | _] = regions

    if Enum.any?(regions, fn {_, t} -> t != types end) do
      raise ArgumentError,
            "#{op}: the branches return #{Enum.map_join(regions, " and ", fn {_, t} -> "(#{types_text(t)})" end)}; expected one list of types"
    end

    emit(
      op,
      [selector],
      types,
      [],
      Enum.map(regions, &String.replace(elem(&1, 0), "^bb0():\n", ""))
    )
  end

  ## Gather, scatter, windows, convolution

  @doc """
  `stablehlo.gather`: slices of `operand` of `slice_sizes`, starting where `indices` say.
  Options (StableHLO's dimension numbers): `offset_dims`, `collapsed_slice_dims`,
  `start_index_map`, `index_vector_dim` (default: the last dimension of `indices`),
  `operand_batching_dims`, `start_indices_batching_dims` (default `[]`), `indices_are_sorted`.
  """
  def gather(operand, indices, slice_sizes, opts) do
    opts =
      options!(opts, "gather/4",
        offset_dims: :integers,
        collapsed_slice_dims: :integers,
        start_index_map: :integers,
        index_vector_dim: :non_neg_integer,
        operand_batching_dims: :integers,
        start_indices_batching_dims: :integers,
        indices_are_sorted: :boolean
      )

    [operand, indices] = Enum.map([operand, indices], &value!("stablehlo.gather", &1))
    {elem, dims} = operand.type
    {ielem, idims} = indices.type
    offset_dims = Keyword.fetch!(opts, :offset_dims)
    collapsed = Keyword.get(opts, :collapsed_slice_dims, [])
    start_index_map = Keyword.fetch!(opts, :start_index_map)
    index_vector_dim = Keyword.get(opts, :index_vector_dim, length(idims) - 1)
    operand_batching = Keyword.get(opts, :operand_batching_dims, [])
    indices_batching = Keyword.get(opts, :start_indices_batching_dims, [])

    batch_dims =
      idims
      |> Enum.with_index()
      |> Enum.reject(fn {_, i} -> i == index_vector_dim end)
      |> Enum.map(&elem(&1, 0))

    offsets =
      for {s, i} <- Enum.with_index(slice_sizes),
          i not in collapsed and i not in operand_batching,
          do: s

    ok =
      category(ielem) in [:signed, :unsigned] and length(slice_sizes) == length(dims) and
        Enum.all?(Enum.zip(slice_sizes, dims), fn {s, d} -> s <= d end) and
        length(offsets) == length(offset_dims) and
        Enum.all?(collapsed ++ operand_batching, &(Enum.at(slice_sizes, &1) in [0, 1]))

    unless ok do
      mismatch!(
        "stablehlo.gather",
        [operand, indices],
        "integer indices and slice_sizes #{inspect(slice_sizes)} that fit the operand, one per offset dimension once collapsed"
      )
    end

    rank = length(batch_dims) + length(offsets)

    {out, _, _} =
      Enum.reduce(0..(rank - 1)//1, {[], batch_dims, offsets}, fn i, {acc, batch, offs} ->
        if i in offset_dims,
          do: {[hd(offs) | acc], batch, tl(offs)},
          else: {[hd(batch) | acc], tl(batch), offs}
      end)

    numbers =
      ["offset_dims = #{i64_list(offset_dims)}", "collapsed_slice_dims = #{i64_list(collapsed)}"] ++
        if(operand_batching == [],
          do: [],
          else: [
            "operand_batching_dims = #{i64_list(operand_batching)}",
            "start_indices_batching_dims = #{i64_list(indices_batching)}"
          ]
        ) ++
        [
          "start_index_map = #{i64_list(start_index_map)}",
          "index_vector_dim = #{index_vector_dim}"
        ]

    emit1("stablehlo.gather", [operand, indices], {elem, Enum.reverse(out)}, [
      "dimension_numbers = #stablehlo.gather<#{Enum.join(numbers, ", ")}>",
      "slice_sizes = #{i64_array(slice_sizes)}",
      "indices_are_sorted = #{Keyword.get(opts, :indices_are_sorted, false)}"
    ])
  end

  @doc """
  `stablehlo.scatter`: writes `updates` into `inputs` where `indices` say, combining each
  element with `fun` (`[current_1, ..., current_n, update_1, ..., update_n]` -> `n` scalars).
  Options (StableHLO's dimension numbers): `update_window_dims`, `inserted_window_dims`,
  `scatter_dims_to_operand_dims`, `index_vector_dim` (default: the last dimension of
  `indices`), `input_batching_dims`, `scatter_indices_batching_dims`, `indices_are_sorted`,
  `unique_indices`. Returns one value per input (a single value for one input).
  """
  def scatter(inputs, indices, updates, fun, opts) do
    opts =
      options!(opts, "scatter/5",
        update_window_dims: :integers,
        inserted_window_dims: :integers,
        scatter_dims_to_operand_dims: :integers,
        index_vector_dim: :non_neg_integer,
        input_batching_dims: :integers,
        scatter_indices_batching_dims: :integers,
        indices_are_sorted: :boolean,
        unique_indices: :boolean
      )

    inputs = Enum.map(List.wrap(inputs), &value!("stablehlo.scatter", &1))
    updates = Enum.map(List.wrap(updates), &value!("stablehlo.scatter", &1))
    indices = value!("stablehlo.scatter", indices)
    {ielem, idims} = indices.type
    scalars = Enum.map(inputs, fn %{type: {e, _}} -> {e, []} end)

    unless category(ielem) in [:signed, :unsigned] and length(inputs) == length(updates) and
             Enum.map(updates, fn %{type: {e, _}} -> {e, []} end) == scalars do
      mismatch!(
        "stablehlo.scatter",
        inputs ++ [indices | updates],
        "integer indices and one update per input, of its element type"
      )
    end

    body = region!("stablehlo.scatter", "the region", scalars ++ scalars, scalars, fun)

    batching = Keyword.get(opts, :input_batching_dims, [])

    numbers =
      [
        "update_window_dims = #{i64_list(Keyword.fetch!(opts, :update_window_dims))}",
        "inserted_window_dims = #{i64_list(Keyword.get(opts, :inserted_window_dims, []))}"
      ] ++
        if(batching == [],
          do: [],
          else: [
            "input_batching_dims = #{i64_list(batching)}",
            "scatter_indices_batching_dims = #{i64_list(Keyword.get(opts, :scatter_indices_batching_dims, []))}"
          ]
        ) ++
        [
          "scatter_dims_to_operand_dims = #{i64_list(Keyword.fetch!(opts, :scatter_dims_to_operand_dims))}",
          "index_vector_dim = #{Keyword.get(opts, :index_vector_dim, length(idims) - 1)}"
        ]

    results =
      emit(
        "stablehlo.scatter",
        inputs ++ [indices | updates],
        Enum.map(inputs, & &1.type),
        [
          "scatter_dimension_numbers = #stablehlo.scatter<#{Enum.join(numbers, ", ")}>",
          "indices_are_sorted = #{Keyword.get(opts, :indices_are_sorted, false)}",
          "unique_indices = #{Keyword.get(opts, :unique_indices, false)}"
        ],
        [body]
      )

    one_or_list(results)
  end

  @doc """
  `stablehlo.reduce_window`: reduces each window of `operands` (one shape) with `fun`, as
  `reduce/4` does. Options: `strides`, `base_dilations`, `window_dilations` (default all 1),
  `padding: [{low, high}, ...]` (default none). Returns one value per operand (a single value
  for one operand).
  """
  def reduce_window(operands, inits, window, fun, opts \\ []) do
    opts =
      options!(opts, "reduce_window/5",
        strides: :integers,
        base_dilations: :integers,
        window_dilations: :integers,
        padding: :integer_pairs
      )

    operands = Enum.map(List.wrap(operands), &value!("stablehlo.reduce_window", &1))
    inits = Enum.map(List.wrap(inits), &value!("stablehlo.reduce_window", &1))
    [{_, dims} | _] = Enum.map(operands, & &1.type)
    scalars = Enum.map(operands, fn %{type: {e, _}} -> {e, []} end)

    unless length(inits) == length(operands) and
             Enum.all?(operands, fn %{type: {_, d}} -> d == dims end) and
             Enum.map(inits, & &1.type) == scalars and length(window) == length(dims) do
      mismatch!(
        "stablehlo.reduce_window",
        operands ++ inits,
        "operands of one shape, a scalar init of each one's element type and a window of rank #{length(dims)}"
      )
    end

    w = window_options(dims, opts)
    body = region!("stablehlo.reduce_window", "the region", scalars ++ scalars, scalars, fun)

    out = windowed_dims(dims, window, w)

    results =
      emit(
        "stablehlo.reduce_window",
        operands ++ inits,
        Enum.map(scalars, fn {e, []} -> {e, out} end),
        [
          "window_dimensions = #{i64_array(window)}",
          "window_strides = #{i64_array(w.strides)}",
          "base_dilations = #{i64_array(w.base)}",
          "window_dilations = #{i64_array(w.dilations)}",
          "padding = #{padding_attr(w.padding)}"
        ],
        [body]
      )

    one_or_list(results)
  end

  @doc """
  `stablehlo.select_and_scatter`: for each window of `operand`, `select` (two scalars -> pred)
  picks an element, and the matching element of `source` is combined into it with `scatter`
  (two scalars -> scalar), starting from `init`. Options: `strides`, `padding` as in
  `reduce_window/5`.
  """
  def select_and_scatter(operand, source, init, window, select, scatter, opts \\ []) do
    opts = options!(opts, "select_and_scatter/7", strides: :integers, padding: :integer_pairs)

    [operand, source, init] =
      Enum.map([operand, source, init], &value!("stablehlo.select_and_scatter", &1))

    {elem, dims} = operand.type
    w = window_options(dims, opts)
    out = windowed_dims(dims, window, w)

    unless source.type == {elem, out} and init.type == {elem, []} do
      mismatch!(
        "stablehlo.select_and_scatter",
        [operand, source, init],
        "a source of the windows' shape #{type_text({elem, out})} and a scalar init"
      )
    end

    scalar = {elem, []}
    op = "stablehlo.select_and_scatter"
    select_region = region!(op, "select", [scalar, scalar], [{{:pred, 8}, []}], select)
    scatter_region = region!(op, "scatter", [scalar, scalar], [scalar], scatter)

    emit1(
      "stablehlo.select_and_scatter",
      [operand, source, init],
      operand.type,
      [
        "window_dimensions = #{i64_array(window)}",
        "window_strides = #{i64_array(w.strides)}",
        "padding = #{padding_attr(w.padding)}"
      ],
      [select_region, scatter_region]
    )
  end

  defp window_options(dims, opts) do
    ones = Enum.map(dims, fn _ -> 1 end)

    %{
      strides: Keyword.get(opts, :strides, ones),
      base: Keyword.get(opts, :base_dilations, ones),
      dilations: Keyword.get(opts, :window_dilations, ones),
      padding: Keyword.get(opts, :padding, Enum.map(dims, fn _ -> {0, 0} end))
    }
  end

  defp windowed_dims(dims, window, w) do
    Enum.zip_with([dims, window, w.strides, w.base, w.dilations, w.padding], fn [
                                                                                  d,
                                                                                  k,
                                                                                  s,
                                                                                  b,
                                                                                  dil,
                                                                                  {lo, hi}
                                                                                ] ->
      padded = if(d == 0, do: 0, else: (d - 1) * b + 1) + lo + hi
      effective = (k - 1) * dil + 1
      if padded < effective, do: 0, else: div(padded - effective, s) + 1
    end)
  end

  defp padding_attr(padding) do
    rows = Enum.map_join(padding, ", ", fn {lo, hi} -> "[#{lo}, #{hi}]" end)
    "dense<[#{rows}]> : tensor<#{length(padding)}x2xi64>"
  end

  @doc """
  `stablehlo.convolution`. Options:

    * `:input` - `{batch_dim, feature_dim, spatial_dims}` of `lhs` (default `{0, 1, [2, ...]}`)
    * `:kernel` - `{input_feature_dim, output_feature_dim, spatial_dims}` of `rhs`
      (default `{1, 0, [2, ...]}`)
    * `:output` - `{batch_dim, feature_dim, spatial_dims}` of the result (default as `:input`)
    * `:strides`, `:lhs_dilation`, `:rhs_dilation` (default all 1), `:padding` (`[{low, high}]`)
    * `:feature_group_count`, `:batch_group_count` (default 1), `:precision`
  """
  def convolution(lhs, rhs, opts \\ []) do
    opts =
      options!(opts, "convolution/3",
        input: :dimension_layout,
        kernel: :dimension_layout,
        output: :dimension_layout,
        strides: :integers,
        lhs_dilation: :integers,
        rhs_dilation: :integers,
        padding: :integer_pairs,
        feature_group_count: :pos_integer,
        batch_group_count: :pos_integer,
        precision: @precision
      )

    [lhs, rhs] = Enum.map([lhs, rhs], &value!("stablehlo.convolution", &1))
    CPUFaults.check!(:conv, "stablehlo.convolution", [lhs, rhs])
    {elem, ldims} = lhs.type
    {relem, rdims} = rhs.type
    n = length(ldims) - 2
    spatial = Enum.to_list(2..(n + 1)//1)
    {ib, if_, is} = Keyword.get(opts, :input, {0, 1, spatial})
    {ki, ko, ks} = Keyword.get(opts, :kernel, {1, 0, spatial})
    {ob, of, os} = Keyword.get(opts, :output, {ib, if_, is})
    ones = List.duplicate(1, n)
    strides = Keyword.get(opts, :strides, ones)
    lhs_dil = Keyword.get(opts, :lhs_dilation, ones)
    rhs_dil = Keyword.get(opts, :rhs_dilation, ones)
    padding = Keyword.get(opts, :padding, List.duplicate({0, 0}, n))
    fgc = Keyword.get(opts, :feature_group_count, 1)
    bgc = Keyword.get(opts, :batch_group_count, 1)
    at = fn dims, i -> Enum.at(dims, i) end

    ok =
      elem == relem and length(rdims) == length(ldims) and length(is) == n and length(ks) == n and
        length(os) == n and
        at.(ldims, if_) == at.(rdims, ki) * fgc and rem(at.(rdims, ko), fgc * bgc) == 0 and
        rem(at.(ldims, ib), bgc) == 0

    unless ok do
      mismatch!(
        "stablehlo.convolution",
        [lhs, rhs],
        "one element type, input features = kernel input features x feature_group_count (#{fgc}), and groups that divide the batch and output features"
      )
    end

    sizes =
      windowed_dims(Enum.map(is, &at.(ldims, &1)), Enum.map(ks, &at.(rdims, &1)), %{
        strides: strides,
        base: lhs_dil,
        dilations: rhs_dil,
        padding: padding
      })

    out =
      Enum.map(0..(n + 1), fn p ->
        cond do
          p == ob -> div(at.(ldims, ib), bgc)
          p == of -> at.(rdims, ko)
          true -> Enum.at(sizes, Enum.find_index(os, &(&1 == p)))
        end
      end)

    layout = fn rank, named ->
      "[" <>
        Enum.map_join(0..(rank - 1), ", ", fn p ->
          Enum.find_value(named, fn {label, dims} ->
            if is_list(dims),
              do: (i = Enum.find_index(dims, &(&1 == p))) && "#{i}",
              else: dims == p && label
          end)
        end) <> "]"
    end

    numbers =
      layout.(n + 2, [{"b", ib}, {"f", if_}, {"s", is}]) <>
        "x" <>
        layout.(n + 2, [{"i", ki}, {"o", ko}, {"s", ks}]) <>
        "->" <> layout.(n + 2, [{"b", ob}, {"f", of}, {"s", os}])

    precision = opts |> Keyword.get(:precision, :default) |> Atom.to_string() |> String.upcase()

    emit1("stablehlo.convolution", [lhs, rhs], {elem, out}, [
      "dimension_numbers = #stablehlo.conv<#{numbers}>",
      "window_strides = #{i64_array(strides)}",
      "padding = #{padding_attr(padding)}",
      "lhs_dilation = #{i64_array(lhs_dil)}",
      "rhs_dilation = #{i64_array(rhs_dil)}",
      "feature_group_count = #{fgc} : i64",
      "batch_group_count = #{bgc} : i64",
      "precision_config = [#stablehlo<precision #{precision}>, #stablehlo<precision #{precision}>]"
    ])
  end

  ## Other ops

  @doc "`stablehlo.optimization_barrier`: the values unchanged (a list)."
  def optimization_barrier(values) do
    values = Enum.map(List.wrap(values), &value!("stablehlo.optimization_barrier", &1))
    emit("stablehlo.optimization_barrier", values, Enum.map(values, & &1.type), [])
  end

  @doc """
  `stablehlo.rng_bit_generator`: from `state` (u64), returns `[new_state, bits]` with `bits` of
  `type`. `algorithm`: `:default`, `:three_fry` or `:philox`.
  """
  def rng_bit_generator(state, type, algorithm \\ :default) do
    state = value!("stablehlo.rng_bit_generator", state)
    type = check_type!("stablehlo.rng_bit_generator", type)
    alg = algorithm |> Atom.to_string() |> String.upcase()

    emit("stablehlo.rng_bit_generator", [state], [state.type, type], [
      "rng_algorithm = #stablehlo<rng_algorithm #{alg}>"
    ])
  end

  @doc """
  `stablehlo.fft`: `type` is `:fft`, `:ifft` (complex to complex), `:rfft` (float to complex, the
  last dimension becoming `n / 2 + 1`) or `:irfft` (complex to float); `lengths` are the sizes
  of the transformed trailing dimensions.
  """
  def fft(x, type, lengths) when type in [:fft, :ifft, :rfft, :irfft] do
    x = value!("stablehlo.fft", x)
    {elem, dims} = x.type
    {lead, _} = Enum.split(dims, length(dims) - length(lengths))

    result =
      case {type, elem} do
        {t, {:c, _}} when t in [:fft, :ifft] ->
          {elem, dims}

        {:rfft, {:f, 32}} ->
          {{:c, 64}, lead ++ List.update_at(lengths, -1, &(div(&1, 2) + 1))}

        {:rfft, {:f, 64}} ->
          {{:c, 128}, lead ++ List.update_at(lengths, -1, &(div(&1, 2) + 1))}

        {:irfft, {:c, 64}} ->
          {{:f, 32}, lead ++ lengths}

        {:irfft, {:c, 128}} ->
          {{:f, 64}, lead ++ lengths}

        _ ->
          mismatch!(
            "stablehlo.fft",
            [x],
            "a complex tensor (fft, ifft, irfft) or an f32/f64 one (rfft)"
          )
      end

    t = type |> Atom.to_string() |> String.upcase()

    emit1("stablehlo.fft", [x], result, [
      "fft_type = #stablehlo<fft_type #{t}>",
      "fft_length = #{i64_array(lengths)}"
    ])
  end

  @doc """
  `stablehlo.triangular_solve`: solves `op(a) x = b` (or `x op(a) = b` with `left_side:
  false`) for a triangular `a` (`[..., m, m]`) and `b` (`[..., m, n]`, or `[..., n, m]`).
  Options: `left_side` (default true), `lower` (default true), `unit_diagonal` (default false),
  `transpose_a`: `:no_transpose` (default), `:transpose` or `:adjoint`.
  """
  def triangular_solve(a, b, opts \\ []) do
    opts =
      options!(opts, "triangular_solve/3",
        left_side: :boolean,
        lower: :boolean,
        unit_diagonal: :boolean,
        transpose_a: {:in, [:no_transpose, :transpose, :adjoint]}
      )

    [a, b] = same_elem!("stablehlo.triangular_solve", [a, b])
    {_, adims} = a.type
    {_, bdims} = b.type
    left = Keyword.get(opts, :left_side, true)
    m = List.last(adims)
    solved = if left, do: Enum.at(bdims, -2), else: List.last(bdims)

    unless length(adims) >= 2 and length(adims) == length(bdims) and Enum.at(adims, -2) == m and
             solved == m and Enum.drop(adims, -2) == Enum.drop(bdims, -2) do
      mismatch!(
        "stablehlo.triangular_solve",
        [a, b],
        "a square [..., m, m] and b of the same rank whose #{if left, do: "second to last", else: "last"} dimension is m"
      )
    end

    transpose =
      opts |> Keyword.get(:transpose_a, :no_transpose) |> Atom.to_string() |> String.upcase()

    emit1("stablehlo.triangular_solve", [a, b], b.type, [
      "left_side = #{left}",
      "lower = #{Keyword.get(opts, :lower, true)}",
      "unit_diagonal = #{Keyword.get(opts, :unit_diagonal, false)}",
      "transpose_a = #stablehlo<transpose #{transpose}>"
    ])
  end

  defp same_elem!(op, values) do
    values = Enum.map(values, &value!(op, &1))
    elems = Enum.map(values, fn %{type: {e, _}} -> e end)
    if length(Enum.uniq(elems)) > 1, do: mismatch!(op, values, "operands of one element type")
    values
  end

  @doc "`chlo.top_k`: the `k` largest values along the last dimension and their s32 indices."
  def top_k(x, k) do
    x = value!("chlo.top_k", x)
    {elem, dims} = x.type

    CPUFaults.check!(:top_k, "chlo.top_k", [x])

    if dims == [] or k > List.last(dims),
      do: mismatch!("chlo.top_k", [x], "a last dimension of at least #{k}")

    out = List.replace_at(dims, -1, k)
    emit("chlo.top_k", [x], [{elem, out}, {{:s, 32}, out}], ["k = #{k} : i64"])
  end

  ## Custom calls

  @doc """
  A custom call to a registered FFI target (`api_version = 4`) returning `result_types`.
  Options: `backend_config: [{name, attr_text}]` (MLIR attribute text, e.g. `"3 : i64"`, as
  `attribute/1` writes it),
  `has_side_effect: true`, `output_operand_aliases: [{result, operand}]`. Returns a list.
  """
  def custom_call(target, operands, result_types, opts \\ []) do
    opts =
      options!(opts, "custom_call/4",
        backend_config: :attributes,
        has_side_effect: :boolean,
        output_operand_aliases: :integer_pairs
      )

    operands = Enum.map(operands, &value!("stablehlo.custom_call @#{target}", &1))
    result_types = Enum.map(result_types, &check_type!("stablehlo.custom_call @#{target}", &1))

    config =
      Keyword.get(opts, :backend_config, [])
      |> Enum.map_join(", ", fn {k, v} -> "#{k} = #{v}" end)

    aliases =
      case Keyword.get(opts, :output_operand_aliases, []) do
        [] ->
          []

        pairs ->
          one = length(result_types) == 1

          [
            "output_operand_aliases = [" <>
              Enum.map_join(pairs, ", ", fn {r, o} ->
                "#stablehlo.output_operand_alias<output_tuple_indices = #{if one, do: "[]", else: "[#{r}]"}, operand_index = #{o}, operand_tuple_indices = []>"
              end) <> "]"
          ]
      end

    emit(
      "stablehlo.custom_call",
      operands,
      result_types,
      [
        "call_target_name = \"#{target}\"",
        "api_version = 4 : i32",
        "has_side_effect = #{Keyword.get(opts, :has_side_effect, false)}",
        "backend_config = {#{config}}"
      ] ++ aliases
    )
  end

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
  def attribute(value) when is_boolean(value), do: to_string(value)
  def attribute(value) when is_float(value), do: attribute({{:f, 32}, value})
  def attribute(value) when is_integer(value), do: attribute({{:s, 64}, value})
  def attribute({:mlir, text}) when is_binary(text), do: text

  def attribute(value) when is_binary(value) do
    escaped =
      for <<byte <- value>>, into: "" do
        if byte in 0x20..0x7E and byte not in [?", ?\\],
          do: <<byte>>,
          else: "\\" <> Base.encode16(<<byte>>)
      end

    ~s("#{escaped}")
  end

  def attribute([n | _] = list) when is_integer(n), do: attribute({{:s, 64}, list})

  def attribute({type, list}) when is_list(list) do
    elem = attribute_type!(type)
    "array<#{element_text(elem)}: " <> Enum.map_join(list, ", ", &number_text(&1, elem)) <> ">"
  end

  def attribute({type, number}) when is_number(number) do
    elem = attribute_type!(type)
    "#{number_text(number, elem)} : #{element_text(elem)}"
  end

  def attribute(other) do
    raise ArgumentError,
          "attribute: expected a number, {type, number}, {type, [numbers]}, a string, a boolean " <>
            "or {:mlir, text}, got #{inspect(other)}"
  end

  defp attribute_type!(type) do
    case check_type!("attribute", {type, []}) do
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
    do: raise(ArgumentError, "attribute: #{inspect(n)} is not a #{element_text(elem)} value")

  @doc """
  `Nx.runtime_call` as EXLA lowers it: sends `{:exla_runtime_call, callback_id, args, tag}` to
  the run's callback server and returns its reply as values of `result_types` (a list).
  `handle` is the function's `{{:u, 8}, [8]}` first parameter; `callback_id` any term.
  """
  def runtime_call(handle, callback_id, args, result_types) do
    handle = check_handle!(handle)

    custom_call("exla_runtime_callback", [handle | args], result_types,
      backend_config: callback_config(callback_id, 0),
      has_side_effect: true
    )
  end

  @doc """
  `Nx.io_call` as EXLA lowers it: sends the arguments to the callback server, waits for its
  `{:ok, []}`, and returns the arguments unchanged (a list, aliased to the operands).
  """
  def io_call(handle, callback_id, args) do
    handle = check_handle!(handle)
    args = Enum.map(args, &value!("io_call", &1))

    custom_call("exla_runtime_callback", [handle | args], Enum.map(args, & &1.type),
      backend_config: callback_config(callback_id, length(args)),
      has_side_effect: true,
      output_operand_aliases: for(i <- 0..(length(args) - 1)//1, do: {i, i + 1})
    )
  end

  @doc """
  A stream target as a program constant: `:erlang.term_to_binary(target)` as a `u8` tensor, for
  `outfeed/2` and `infeed/2` in programs that name their stream process themselves (a pid or
  `{name, node}`). Programs may instead pass the callback handle parameter, which names the
  run's `callback_server:`.
  """
  def stream_target(target) do
    bin = :erlang.term_to_binary(target)
    constant(:binary.bin_to_list(bin), {{:u, 8}, [byte_size(bin)]})
  end

  @doc """
  Sends `{:exla_outfeed, args}` to the stream target (see `stream_target/1`) without waiting;
  returns a `u8` scalar: 1 sent, 0 failed.
  """
  def outfeed(target, payloads) do
    target = check_target!("outfeed", target)

    [flag] =
      custom_call("exla_beam_outfeed", [target | payloads], [{{:u, 8}, []}],
        has_side_effect: true
      )

    flag
  end

  @doc """
  Asks the stream target for its next value (see `XlaNode.CallbackServer.push_infeed/2`) and
  waits for it; returns values of `result_types` (a list).
  """
  def infeed(target, result_types) do
    target = check_target!("infeed", target)
    custom_call("exla_beam_infeed", [target], result_types, has_side_effect: true)
  end

  defp check_target!(op, target) do
    target = value!(op, target)

    case target.type do
      {{:u, 8}, [_]} -> target
      _ -> mismatch!(op, [target], "a u8 vector: the callback handle or a stream_target/1")
    end
  end

  defp check_handle!(handle) do
    handle = value!("runtime_call", handle)

    if handle.type != {{:u, 8}, [8]},
      do:
        mismatch!(
          "runtime_call",
          [handle],
          "the tensor<8xui8> callback handle (the function's first parameter)"
        )

    handle
  end

  defp callback_config(id, aliased) do
    bin = :erlang.term_to_binary(id)
    padded = bin <> :binary.copy(<<0>>, rem(8 - rem(byte_size(bin), 8), 8))
    words = for <<w::signed-native-64 <- padded>>, do: w

    [
      {"callback_id", i64_array(words)},
      {"callback_id_size", "#{byte_size(bin)} : ui64"},
      {"num_aliased_data_outputs", "#{aliased} : ui64"}
    ]
  end
end
