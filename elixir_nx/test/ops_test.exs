defmodule XlaNode.OpsTest do
  # Every op that can appear in a `defn` expression, run through XlaNode.Compiler and through
  # Nx.Defn.Evaluator (Nx's semantics, on Nx.BinaryBackend) on the same inputs, for every dtype
  # the op accepts, on edge values, scalars and broadcasts.
  #
  # Each case names the op its expression must contain, the types Nx accepts for it (the meta
  # tests check that Nx rejects the others) and the kinds of input it runs on (`inputs/3`).
  # Edge values are left out of a case only where
  #
  #   * `:domain` - Nx does not define the result: the Evaluator raises on the values outside
  #     it (the meta tests check that it does), or
  #   * `:except` - a stated reason, such as a known quirk of Nx.BinaryBackend,
  #
  # and `:ref` compares with another expression where the Evaluator's own result is wrong.
  # All cases of one table and one type run as one program.
  use ExUnit.Case, async: true
  # Each table's test compiles one program per operation, option set and type: a few hundred,
  # minutes on a busy 2-core machine.
  @moduletag timeout: 600_000

  import Nx.Defn

  alias XlaNode.Compiler.Lower

  @signed [{:s, 2}, {:s, 4}, {:s, 8}, {:s, 16}, {:s, 32}, {:s, 64}]
  @unsigned [{:u, 2}, {:u, 4}, {:u, 8}, {:u, 16}, {:u, 32}, {:u, 64}]
  @int @signed ++ @unsigned
  @narrow_int [{:s, 2}, {:s, 4}, {:u, 2}, {:u, 4}]
  @f8 [{:f, 8}, {:f8_e4m3fn, 8}]
  @float [{:f, 16}, {:bf, 16}, {:f, 32}, {:f, 64}] ++ @f8
  @complex [{:c, 64}, {:c, 128}]
  @real @int ++ @float
  @all @real ++ @complex

  # Backend callbacks that never appear in an expression.
  @not_in_expressions [:init, :inspect, :to_binary, :from_binary, :from_pointer, :to_pointer] ++
                        [:to_batched, :backend_copy, :backend_transfer, :backend_deallocate]

  # Expression nodes this table does not run, and where they are tested instead.
  @elsewhere %{
    runtime_call:
      "compiler_test.exs: \"runtime_call runs on the caller's node\" and the tests after it",
    hook: "compiler_test.exs: \"hooks run on the caller...\" and \"print_value prints...\""
  }

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  ## Values

  defp neg_zero do
    <<z::float-64>> = <<0x8000000000000000::64>>
    z
  end

  # Edge values of each type: zeros, ones, the type's limits, non-finite values (those in the
  # range of a 2- or 4-bit type).
  defp edge({:s, bits} = type) do
    max = Bitwise.bsl(1, bits - 1) - 1
    in_range(type, [0, 1, -1, 2, -3, 7, 100, -max - 1, -max, max])
  end

  defp edge({:u, bits} = type) do
    max = Bitwise.bsl(1, bits) - 1
    in_range(type, [0, 1, 2, 3, 7, 100, div(max, 2) + 1, max - 1, max])
  end

  # (8-bit floats: values they hold, -3.5 and 96.0 for -7.25 and 100.0; f8_e4m3fn has no
  # infinities, and two more values in their place keep one NaN in the 24 of edge_grid/2:
  # of two NaNs, Nx.BinaryBackend's argmax picks the last.)
  defp edge({:f, 8} = type) do
    [0.0, neg_zero(), 1.0, -1.0, 0.5, -1.5, 2.5, 3.0, -3.5, 96.0] ++
      [max_finite(type), :infinity, :neg_infinity, :nan]
  end

  defp edge({:f8_e4m3fn, _} = type) do
    [0.0, neg_zero(), 1.0, -1.0, 0.5, -1.5, 2.5, 3.0, -3.5, 96.0, 0.25] ++
      [-max_finite(type), max_finite(type), :nan]
  end

  defp edge({kind, _} = type) when kind in [:f, :bf] do
    [0.0, neg_zero(), 1.0, -1.0, 0.5, -1.5, 2.5, 3.0, -7.25, 100.0] ++
      [max_finite(type), :infinity, :neg_infinity, :nan]
  end

  defp edge({:c, _}) do
    [{0.0, 0.0}, {1.0, 0.0}, {-1.5, 0.5}, {0.0, 2.0}, {-0.25, -3.0}, {1.0, 1.0}, {-2.0, 0.0}]
    |> Enum.map(fn {re, im} -> Complex.new(re, im) end)
  end

  # Complex values with non-finite parts (the other types' edge values have theirs).
  defp special({:c, _} = type) do
    [{:infinity, 0.0}, {0.0, :nan}, {:neg_infinity, 1.0}, {:nan, :nan}, {1.5, :infinity}]
    |> Enum.map(fn {re, im} -> Complex.new(re, im) end)
    |> Kernel.++(edge(type))
  end

  defp special(type), do: edge(type)

  defp max_finite(type),
    do: type |> Nx.Constants.max_finite(backend: Nx.BinaryBackend) |> Nx.to_number()

  defp in_range({kind, bits}, values) do
    {lo, hi} = int_range({kind, bits})
    values |> Enum.filter(&(&1 in lo..hi)) |> Enum.uniq()
  end

  defp int_range({:s, bits}), do: {-Bitwise.bsl(1, bits - 1), Bitwise.bsl(1, bits - 1) - 1}
  defp int_range({:u, bits}), do: {0, Bitwise.bsl(1, bits) - 1}

  # An integer taken into the range of `type`, as it wraps.
  defp wrap(value, {_, bits} = type) do
    {lo, _} = int_range(type)
    Integer.mod(value - lo, Bitwise.bsl(1, bits)) + lo
  end

  defp scalar({:s, 2}), do: -2
  defp scalar({:s, _}), do: -3
  defp scalar({:u, 2}), do: 3
  defp scalar({:u, _}), do: 7
  defp scalar({:c, _}), do: Complex.new(1.0, -2.0)
  defp scalar(_), do: -1.5

  defp three({:s, 2}), do: 1
  defp three({kind, _}) when kind in [:s, :u], do: 3
  defp three(_), do: 3.0

  # `size` small finite values of `type`, mixing signs and repeating some.
  defp small(type, size) do
    for i <- 0..(size - 1) do
      a = rem(i * 7, 11)

      case type do
        {:s, _} -> wrap(a - 5, type)
        {:u, _} -> wrap(a, type)
        {:c, _} -> Complex.new((a - 5) / 4, (rem(i * 5, 7) - 3) / 2)
        _ -> (a - 5) / 4
      end
    end
  end

  # Distinct values in `shape`, a permutation of `size` steps around zero.
  defp distinct(type, shape) do
    size = Nx.size(shape)

    for(i <- 0..(size - 1), do: rem(i * 7, size))
    |> Enum.map(fn a ->
      case type do
        {:u, _} -> a
        {:s, _} -> a - div(size, 2)
        _ -> (a - div(size, 2)) / 4
      end
    end)
    |> t(type)
    |> Nx.reshape(shape)
  end

  defp t(values, type), do: Nx.tensor(values, type: type, backend: Nx.BinaryBackend)
  defp grid(type, shape), do: type |> small(Nx.size(shape)) |> t(type) |> Nx.reshape(shape)

  # The edge values, cycled into `shape`. f64's largest value is left out: any overflow of f64
  # raises in Erlang, and so in Nx.BinaryBackend.
  defp edge_grid(type, shape) do
    values = if type == {:f, 64}, do: edge(type) -- [max_finite(type)], else: edge(type)
    values |> Stream.cycle() |> Enum.take(Nx.size(shape)) |> t(type) |> Nx.reshape(shape)
  end

  # Whether Erlang computes `fun` (it raises on float overflow and division by zero, as
  # Nx.BinaryBackend then does).
  defp computes?(fun) do
    fun.()
    true
  rescue
    _ in [ArithmeticError, SystemLimitError] -> false
  end

  defp both_numbers?(x, y), do: is_number(x) and is_number(y)

  # A domain: where Erlang computes `f` of a number.
  defp no_overflow(f), do: fn v -> not is_number(v) or computes?(fn -> f.(v) end) end

  # Below zero, -0.0 included.
  defp negative?(v), do: v < 0 or (v == 0 and <<v::float-64>> == <<neg_zero()::float-64>>)
  defp complex?(v), do: is_struct(v, Complex)

  ## Inputs

  # The arguments of each kind of input for case `c` on `type`: elementwise kinds keep the
  # values of the case's domain (less its exceptions).
  defp inputs(:x, type, c), do: [t(values(c, type), type)]
  defp inputs(:z, type, c), do: [t(Enum.filter(special(type), &ok?(c, [&1])), type)]

  defp inputs(:s, type, c),
    do: [t(hd(Enum.filter([scalar(type) | edge(type)], &ok?(c, [&1]))), type)]

  # Every pair of edge values: a column against a row when all pairs are in the domain,
  # otherwise the pairs that are, as two vectors.
  defp inputs(:xy, type, c) do
    e = edge(type)
    pairs = for x <- e, y <- e, ok?(c, [x, y]), do: {x, y}

    if length(pairs) == length(e) * length(e) do
      [t(e, type) |> Nx.reshape({length(e), 1}), t(e, type)]
    else
      {xs, ys} = Enum.unzip(pairs)
      [t(xs, type), t(ys, type)]
    end
  end

  # A vector and a scalar: the type's scalar, or 3 where that is out of the domain (a negative
  # shift).
  defp inputs(:xs, type, c) do
    [{xs, s} | _] =
      for s <- [scalar(type), three(type)],
          xs = Enum.filter(edge(type), &ok?(c, [&1, s])),
          xs != [],
          do: {xs, s}

    [t(xs, type), t(s, type)]
  end

  defp inputs(:sx, type, c) do
    [{s, ys} | _] =
      for s <- [scalar(type), three(type)],
          ys = Enum.filter(edge(type), &ok?(c, [s, &1])),
          ys != [],
          do: {s, ys}

    [t(s, type), t(ys, type)]
  end

  defp inputs(:m, type, _c), do: [grid(type, {2, 3, 4})]
  defp inputs(:e, type, _c), do: [edge_grid(type, {2, 3, 4})]
  defp inputs(:d, type, _c), do: [distinct(type, {2, 3, 4})]
  defp inputs(:mm, type, _c), do: [grid(type, {2, 3, 4}), grid(type, {2, 4, 3})]
  defp inputs(:conv, type, _c), do: [grid(type, {2, 2, 5, 5}), grid(type, {4, 2, 2, 2})]

  # A well-conditioned lower-triangular matrix and right-hand sides.
  defp inputs(:tri, type, _c) do
    eye = Nx.eye(3, type: type, backend: Nx.BinaryBackend)
    below = Nx.multiply(Nx.tril(grid(type, {3, 3})), Nx.subtract(1, eye))
    a = Nx.add(below, Nx.multiply(eye, 4))
    [a, grid(type, {3, 2}), grid(type, {2, 3})]
  end

  defp values(c, type), do: Enum.filter(edge(type), &ok?(c, [&1]))

  defp ok?(c, args), do: in_domain?(c, args) and not excepted?(c, args)

  # The case as it runs on `type`: its `:except_on` predicates for `type` join its `:except`.
  defp for_type(c, type) do
    Enum.reduce(c.except_on, c, fn
      {types, pred, why}, c when is_list(types) ->
        if type in types, do: %{c | except: either(c.except, {pred, why})}, else: c
    end)
  end

  defp either(nil, except), do: except

  defp either({p, w}, {q, why}) do
    case Function.info(p, :arity) do
      {:arity, 1} -> {&(p.(&1) or q.(&1)), w <> "; " <> why}
      {:arity, 2} -> {&(p.(&1, &2) or q.(&1, &2)), w <> "; " <> why}
    end
  end

  defp in_domain?(%{domain: nil}, _args), do: true
  defp in_domain?(%{domain: domain}, args), do: apply(domain, args)
  defp excepted?(%{except: nil}, _args), do: false
  defp excepted?(%{except: {pred, _why}}, args), do: apply(pred, args)

  ## Quirks of Nx.BinaryBackend on the newer types

  defp scalar_bug,
    do:
      "Nx.BinaryBackend broadcasts a 2- or 4-bit scalar with :binary.copy/2, which takes " <>
        "whole bytes only (it raises)"

  # `fun` on f32 copies of the arguments, its result rounded to the type `fun` gives (the
  # traced `fun` of the arguments, unused, is not computed).
  defp e4m3fn_pad_bug(fun) do
    {:arity, arity} = Function.info(fun, :arity)

    ref =
      case arity do
        1 -> &Nx.as_type(fun.(Nx.as_type(&1, :f32)), fun.(&1).type)
        2 -> &Nx.as_type(fun.(Nx.as_type(&1, :f32), Nx.as_type(&2, :f32)), fun.(&1, &2).type)
      end

    {[{:f8_e4m3fn, 8}], ref,
     "Nx.BinaryBackend's pad of f8_e4m3fn by a number writes the pad value as the result " <>
       "type (f32: Nx.Type.merge_number({:f8_e4m3fn, 8}, 0)) into the f8 data, and keeps " <>
       "the f8 type: padded on f32 and rounded instead"}
  end

  # count_leading_zeros of a 2- or 4-bit integer: that of its zero-extended byte, less the 4
  # or 6 zeros that adds.
  defp narrow_clz(%{type: {_, bits} = type} = x) do
    x
    |> Nx.bitcast({:u, bits})
    |> Nx.as_type(:u8)
    |> Nx.count_leading_zeros()
    |> Nx.subtract(8 - bits)
    |> Nx.as_type(type)
  end

  ## The table

  # `c(op, types, fun, opts)`: a case. Options:
  #   * `:inputs` - the kinds of input (default `[:x, :s]`, or `[:xy, :xs, :sx]` for arity 2)
  #   * `:domain` - a predicate on an element (or a pair): where Nx defines the result
  #   * `:except` - `{predicate, why}`: elements (or pairs) left out, and why
  #   * `:except_on` - `[{types, predicate, why}]`: the same, on those types only
  #   * `:ref` - `{types, fun, why}`: on those types, the Evaluator runs `fun` instead
  #   * `:exact` - floats must match exactly (`true` or a list of types)
  #   * `:tol` - `[{types, atol: ..., rtol: ...}]`, wider tolerances for those types, and why
  #   * `:skip` - `[{types, why}]`, types Nx accepts that are not compared, and why
  defp c(op, types, fun, opts \\ []) do
    {:arity, arity} = Function.info(fun, :arity)
    default = if arity == 2, do: [:xy, :xs, :sx], else: [:x, :s]

    %{
      op: op,
      types: types,
      fun: fun,
      inputs: Keyword.get(opts, :inputs, default),
      domain: opts[:domain],
      except: opts[:except],
      except_on: Keyword.get(opts, :except_on, []),
      ref: opts[:ref],
      exact: Keyword.get(opts, :exact, false),
      tol: Keyword.get(opts, :tol, []),
      skip: Keyword.get(opts, :skip, [])
    }
  end

  # Names each case after its op, numbered when an op has several.
  defp named(cases) do
    {cases, _} =
      Enum.map_reduce(cases, %{}, fn c, seen ->
        n = Map.get(seen, c.op, 0)
        {Map.put(c, :name, "#{c.op}##{n}"), Map.put(seen, c.op, n + 1)}
      end)

    cases
  end

  defp tables do
    [
      elementwise: elementwise(),
      binary: binary(),
      conversions: conversions(),
      reductions: reductions(),
      shapes: shapes(),
      indexing: indexing(),
      linear: linear(),
      control: control()
    ]
  end

  defp all_cases, do: tables() |> Enum.flat_map(fn {_, cases} -> named(cases) end)

  # Periodic functions of integers beyond 2^24: XLA converts the integer to f32 first (as Nx's
  # result type says), Nx.BinaryBackend computes on the exact integer.
  defp big_int,
    do:
      {&(is_integer(&1) and abs(&1) > 16_777_216),
       "XLA rounds integers beyond 2^24 to f32 first, Nx.BinaryBackend does not"}

  defp elementwise do
    [
      c(:exp, @all, &Nx.exp/1, domain: no_overflow(&:math.exp/1)),
      c(:expm1, @all, &Nx.expm1/1, domain: no_overflow(&:math.exp/1)),
      c(:log, @all, &Nx.log/1, domain: &(&1 != :neg_infinity)),
      c(:log1p, @all, &Nx.log1p/1, domain: &(&1 != :neg_infinity)),
      c(:sigmoid, @all, &Nx.sigmoid/1, domain: no_overflow(&:math.exp(-&1))),
      c(:sin, @all, &Nx.sin/1, except: big_int()),
      c(:cos, @all, &Nx.cos/1, except: big_int()),
      c(:tan, @all, &Nx.tan/1, except: big_int()),
      c(:sinh, @all, &Nx.sinh/1, domain: no_overflow(&:math.cosh/1)),
      c(:cosh, @all, &Nx.cosh/1, domain: no_overflow(&:math.cosh/1)),
      c(:tanh, @all, &Nx.tanh/1,
        except: {&(&1 in [:infinity, :neg_infinity]), "Complex.tanh(±inf) is NaN, not ±1"}
      ),
      c(:asin, @all, &Nx.asin/1, domain: &(not is_number(&1) or abs(&1) <= 1)),
      c(:acos, @all, &Nx.acos/1,
        domain: &(not is_number(&1) or abs(&1) <= 1),
        ref:
          {@complex, &Nx.subtract(:math.pi() / 2, Nx.asin(&1)),
           "Complex.acos is not always the principal value, pi/2 - asin(z) is"}
      ),
      c(:atan, @all, &Nx.atan/1),
      c(:asinh, @all, &Nx.asinh/1),
      c(:acosh, @all, &Nx.acosh/1,
        domain: &(complex?(&1) or &1 in [:infinity, :nan] or (is_number(&1) and &1 >= 1)),
        ref:
          {@complex,
           &Nx.log(Nx.add(&1, Nx.multiply(Nx.sqrt(Nx.add(&1, 1)), Nx.sqrt(Nx.subtract(&1, 1))))),
           "Complex.acosh is not always the principal value, log(z + sqrt(z + 1) sqrt(z - 1)) is"}
      ),
      c(:atanh, @all, &Nx.atanh/1,
        domain: &(complex?(&1) or (is_number(&1) and abs(&1) < 1)),
        except: {&(&1 == Complex.new(1.0, 0.0)), "Complex.atanh(1) is NaN (0 / 0), not +inf"}
      ),
      c(:sqrt, @all, &Nx.sqrt/1, domain: &(not is_number(&1) or &1 >= 0)),
      c(:rsqrt, @all, &Nx.rsqrt/1, domain: &(not is_number(&1) or &1 > 0)),
      c(:cbrt, @all, &Nx.cbrt/1),
      c(:erf, @real, &Nx.erf/1),
      c(:erfc, @real, &Nx.erfc/1),
      c(:erf_inv, @real, &Nx.erf_inv/1, domain: &(not is_number(&1) or abs(&1) <= 1)),
      c(:negate, @all, &Nx.negate/1, exact: true, inputs: [:z, :s]),
      c(:abs, @all, &Nx.abs/1, exact: @real),
      c(:sign, @all, &Nx.sign/1,
        exact: @real,
        except:
          {&(&1 in [:neg_infinity, :nan]),
           "Nx.BinaryBackend's sign compares atoms by term order: sign(-inf) and sign(NaN) are 1"},
        ref:
          {@complex, &Nx.divide(&1, Nx.max(Nx.abs(&1), 1.0e-30)),
           "Nx.BinaryBackend's sign of a complex is always 1 (term order); XLA's is z / |z|"}
      ),
      c(:floor, @real, &Nx.floor/1, exact: true, domain: &is_number/1),
      c(:ceil, @real, &Nx.ceil/1, exact: true, domain: &is_number/1),
      c(:round, @real, &Nx.round/1, exact: true, domain: &is_number/1),
      c(:bitwise_not, @int, &Nx.bitwise_not/1),
      c(:population_count, @int, &Nx.population_count/1),
      c(:count_leading_zeros, @int, &Nx.count_leading_zeros/1,
        ref:
          {@narrow_int, &narrow_clz/1,
           "Nx.BinaryBackend's count_leading_zeros has no clause for 2- and 4-bit integers " <>
             "(it raises): the count of the zero-extended byte, less the bits it adds"}
      ),
      c(:is_nan, @all, &Nx.is_nan/1, inputs: [:z, :s]),
      c(:is_infinity, @all, &Nx.is_infinity/1, inputs: [:z, :s]),
      c(:real, @all, &Nx.real/1, exact: true, inputs: [:z, :s]),
      c(:imag, @all, &Nx.imag/1, exact: true, inputs: [:z, :s]),
      c(:conjugate, @all, &Nx.conjugate/1, exact: true, inputs: [:z, :s])
    ]
  end

  defp binary do
    arith = fn f -> fn x, y -> not both_numbers?(x, y) or computes?(fn -> f.(x, y) end) end end

    [
      c(:add, @all, &Nx.add/2, domain: arith.(&+/2)),
      # Type promotion: integers and a float constant.
      c(:add, @all, &Nx.add(&1, 0.5), inputs: [:x, :s]),
      c(:subtract, @all, &Nx.subtract/2, domain: arith.(&-/2)),
      c(:multiply, @all, &Nx.multiply/2, domain: arith.(&*/2)),
      c(:divide, @all, &Nx.divide/2,
        domain: fn x, y ->
          not both_numbers?(x, y) or x == 0 or computes?(fn -> x / y end)
        end,
        except:
          {fn x, y ->
             (x in [:infinity, :neg_infinity] and y == 0 and negative?(y)) or
               (y == Complex.new(0.0, 0.0) and x != y)
           end,
           "Complex.divide(±inf, -0.0) keeps the sign of inf, and Complex.divide(z, 0) is NaN; " <>
             "IEEE and XLA give ∓inf and ±inf"}
      ),
      c(:pow, @all, &Nx.pow/2,
        domain: fn x, y ->
          cond do
            is_integer(x) and is_integer(y) -> y >= 0
            both_numbers?(x, y) -> computes?(fn -> :math.pow(x, y) end)
            x == :neg_infinity and is_number(y) -> y <= 0
            true -> true
          end
        end,
        except:
          {fn x, y ->
             (is_integer(y) and y > 1000) or
               (y in [:infinity, :neg_infinity] and is_number(x) and x != 0 and abs(x) <= 1) or
               (x == 1 and y == :nan) or (x == :nan and y == 0) or x == Complex.new(0.0, 0.0)
           end,
           "Nx.BinaryBackend computes integer powers as bignums: huge exponents would not " <>
             "finish; Complex.pow(x, ±inf) is inf or 0 whatever |x|, and pow(1, NaN) and " <>
             "pow(NaN, 0) are NaN, where IEEE and XLA say 0, inf or 1; XLA's complex power " <>
             "is exp(y log x), NaN at x = 0, where Complex.pow is 0"}
      ),
      c(:remainder, @real, &Nx.remainder/2,
        domain: fn x, y ->
          if is_integer(x), do: y != 0, else: both_numbers?(x, y) and y != 0
        end
      ),
      c(:quotient, @int, &Nx.quotient/2, domain: fn _x, y -> y != 0 end),
      c(:atan2, @all, &Nx.atan2/2,
        except:
          {&(&2 == :neg_infinity and is_number(&1) and negative?(&1)),
           "Complex.atan2(y, -inf) is pi for a negative y, not -pi"},
        except_on: [
          {@f8, fn y, _x -> y == 0 end,
           "Nx.Floating.load_f8 reads 0.0 as -0.0 on OTP 25 (whose compiler merges the " <>
             "literals 0.0 and -0.0): atan2(0.0, x < 0) is -pi there, not pi"}
        ],
        skip: [{@complex, "Nx traces it, but Complex.atan2 raises on complex numbers"}]
      ),
      c(:max, @real, &Nx.max/2),
      c(:min, @real, &Nx.min/2),
      c(:bitwise_and, @int, &Nx.bitwise_and/2),
      c(:bitwise_or, @int, &Nx.bitwise_or/2),
      c(:bitwise_xor, @int, &Nx.bitwise_xor/2),
      # Erlang cannot build the bignum of a left shift by billions.
      c(:left_shift, @int, &Nx.left_shift/2,
        domain: fn x, y -> y >= 0 and computes?(fn -> Bitwise.bsl(x, y) end) end
      ),
      c(:right_shift, @int, &Nx.right_shift/2, domain: fn _x, y -> y >= 0 end),
      c(:equal, @all, &Nx.equal/2),
      c(:not_equal, @all, &Nx.not_equal/2),
      c(:less, @real, &Nx.less/2),
      c(:less_equal, @real, &Nx.less_equal/2),
      c(:greater, @real, &Nx.greater/2),
      c(:greater_equal, @real, &Nx.greater_equal/2),
      c(:logical_and, @all, &Nx.logical_and/2),
      c(:logical_or, @all, &Nx.logical_or/2),
      c(:logical_xor, @all, &Nx.logical_xor/2),
      # A predicate of the operands' type; branches broadcast to a u8 predicate's shape.
      c(:select, @all, &Nx.select(&1, &1, &2),
        inputs: [:xs],
        ref:
          {@complex, &Nx.select(Nx.not_equal(&1, 0), &1, &2),
           "Nx.BinaryBackend's select takes a complex 0 as true (it compares with 0 by ==)"},
        skip: [{@narrow_int, scalar_bug()}]
      ),
      c(:select, @all, &Nx.select(Nx.logical_xor(&1, &2), &1, &2), inputs: [:xy]),
      c(:select, @all, &Nx.select(&2, &1, 0), inputs: [:xs]),
      c(:clip, @real, &Nx.clip(&1, &2, Nx.add(&2, 5)), inputs: [:xs]),
      c(:clip, @real, &Nx.clip(&1, 1, 7),
        inputs: [:x, :s],
        except:
          {&(&1 == :nan or (is_integer(&1) and &1 > 9_223_372_036_854_775_807)),
           "Nx.BinaryBackend clips NaN by term order (to 1), and compares u64 values beyond " <>
             "s64, the result type, before converting them"}
      )
    ]
  end

  defp conversions do
    for target <- @all do
      c(:as_type, @all, &Nx.as_type(&1, target),
        except:
          {&(out_of_range?(&1, target) or beyond_bf16?(&1, target)),
           "Nx does not define float-to-integer conversion out of range (Nx.BinaryBackend " <>
             "wraps, XLA saturates); Nx.BinaryBackend truncates to bf16 where XLA rounds, " <>
             "which takes f32's largest value to inf"}
      )
    end ++
      [
        c(:bitcast, @real, &Nx.bitcast(&1, partner(&1.type))),
        c(:parameter, @all, & &1),
        c(:constant, @all, &Nx.multiply(&1, 3), domain: no_overflow(&(&1 * 3))),
        c(
          :constant,
          @real,
          &Nx.select(&1, Nx.Constants.max_finite(&1.type), Nx.Constants.min_finite(&1.type)),
          skip: [{@narrow_int, scalar_bug()}]
        ),
        c(
          :constant,
          @float,
          &Nx.select(&1, Nx.Constants.infinity(&1.type), Nx.Constants.nan(&1.type))
        ),
        c(:constant, @all, &Nx.add(&1, Complex.new(-0.5, 2.0))),
        # A tensor literal with every edge value of the type.
        c(:tensor, @all, &Nx.concatenate([&1, t(edge(&1.type), &1.type)]), inputs: [:x]),
        c(:metadata, @all, &Nx.Defn.Kernel.stop_grad(Nx.add(&1, &1)),
          domain: no_overflow(&(&1 + &1))
        )
      ]
  end

  # Float (or complex) values out of an integer target's range, where Nx does not define the
  # conversion.
  defp out_of_range?(%Complex{re: re}, target), do: out_of_range?(re, target)

  defp out_of_range?(v, {kind, bits}) when is_float(v) and kind in [:s, :u] do
    {lo, hi} =
      if kind == :s,
        do: {-Bitwise.bsl(1, bits - 1), Bitwise.bsl(1, bits - 1) - 1},
        else: {0, Bitwise.bsl(1, bits) - 1}

    trunc(v) < lo or trunc(v) > hi
  end

  defp out_of_range?(_v, _target), do: false

  defp beyond_bf16?(v, target),
    do: target == {:bf, 16} and is_float(v) and abs(v) > max_finite({:bf, 16})

  defp partner({:s, b}), do: {:u, b}
  defp partner({:u, b}), do: {:s, b}
  defp partner({:f, 16}), do: {:bf, 16}
  defp partner({:f8_e4m3fn, 8}), do: {:f, 8}
  defp partner({:bf, 16}), do: {:s, 16}
  defp partner({:f, b}), do: {:u, b}

  defp reductions do
    [
      c(:sum, @all, &Nx.sum/1, inputs: [:m, :e, :s]),
      c(:sum, @all, &Nx.sum(&1, axes: [1]), inputs: [:m, :e]),
      c(:product, @all, &Nx.product(&1, axes: [0, 2], keep_axes: true), inputs: [:m, :e]),
      c(:reduce_max, @real, &Nx.reduce_max/1, inputs: [:m, :e, :s]),
      c(:reduce_max, @real, &Nx.reduce_max(&1, axes: [2]), inputs: [:m, :e]),
      c(:reduce_min, @real, &Nx.reduce_min(&1, axes: [0, 1]), inputs: [:m, :e]),
      c(:all, @all, &Nx.all(&1, axes: [2]),
        inputs: [:m, :e],
        ref:
          {@complex, &Nx.all(Nx.not_equal(&1, 0), axes: [2]),
           "Nx.BinaryBackend's all takes a complex 0 as true (it compares with 0 by ==)"}
      ),
      c(:any, @all, &Nx.any(&1, axes: [0]), inputs: [:m, :e]),
      c(:any, @all, &Nx.any/1, inputs: [:s]),
      c(:argmax, @real, &Nx.argmax/1, inputs: [:m, :e, :s]),
      c(:argmax, @real, &Nx.argmax(&1, axis: 2, tie_break: :high), inputs: [:m, :e]),
      c(:argmin, @real, &Nx.argmin(&1, axis: 1, keep_axis: true), inputs: [:m, :e]),
      c(:reduce, @all, &Nx.reduce(&1, 1, [axes: [1]], fn a, b -> Nx.add(a, b) end),
        inputs: [:m, :e]
      ),
      c(:window_sum, @all, &Nx.window_sum(&1, {1, 2, 2}, strides: [1, 1, 2], padding: :same),
        inputs: [:m, :e]
      ),
      c(:window_product, @all, &Nx.window_product(&1, {2, 2, 1}), inputs: [:m]),
      c(:window_max, @real, &Nx.window_max(&1, {1, 2, 3}, padding: [{0, 0}, {1, 1}, {0, 2}]),
        inputs: [:m, :e]
      ),
      c(:window_min, @real, &Nx.window_min(&1, {1, 2, 2}, window_dilations: [1, 2, 1]),
        inputs: [:m, :e]
      ),
      c(
        :window_reduce,
        @all,
        &Nx.window_reduce(&1, 0, {1, 2, 2}, [strides: [1, 1, 2]], fn a, b -> Nx.add(a, b) end),
        inputs: [:m]
      ),
      # On distinct values: Nx leaves ties open (Nx.BinaryBackend picks the last, XLA the first).
      c(
        :window_scatter_max,
        @real,
        &Nx.window_scatter_max(&1, Nx.slice(&1, [0, 0, 0], [2, 1, 2]), 0, {1, 3, 2},
          strides: [1, 1, 2]
        ),
        inputs: [:d]
      ),
      # With an init above every value: Nx.BinaryBackend pads with the init value, which its
      # select may then pick (dropping that source value), XLA never picks padding.
      c(
        :window_scatter_min,
        @real,
        &Nx.window_scatter_min(&1, Nx.slice(&1, [0, 0, 0], [2, 3, 2]), 100, {1, 2, 2},
          strides: [1, 1, 2],
          padding: [{0, 0}, {0, 1}, {0, 0}]
        ),
        inputs: [:d],
        skip: [
          {@narrow_int,
           "2- and 4-bit integers hold neither 24 distinct values nor an init of 100 above them"}
        ]
      )
    ]
  end

  defp shapes do
    [
      c(:reshape, @all, &Nx.reshape(&1, {4, 6}), inputs: [:e], exact: true),
      c(:squeeze, @all, &Nx.squeeze(Nx.reshape(&1, {2, 1, 12, 1}), axes: [1, 3]),
        inputs: [:e],
        exact: true
      ),
      c(:transpose, @all, &Nx.transpose(&1, axes: [2, 0, 1]), inputs: [:e], exact: true),
      c(:reverse, @all, &Nx.reverse(&1, axes: [0, 2]), inputs: [:e], exact: true),
      c(:broadcast, @all, &Nx.broadcast(&1, {2, 2, 3, 4}), inputs: [:e], exact: true),
      c(:broadcast, @all, &Nx.broadcast(&1, {2, 3}, axes: []),
        inputs: [:s],
        exact: true,
        skip: [{@narrow_int, scalar_bug()}]
      ),
      c(:pad, @all, &Nx.pad(&1, 1, [{1, 0, 1}, {0, -1, 0}, {-1, 2, 1}]),
        ref: e4m3fn_pad_bug(&Nx.pad(&1, 1, [{1, 0, 1}, {0, -1, 0}, {-1, 2, 1}])),
        inputs: [:e],
        exact: true
      ),
      c(:slice, @all, &Nx.slice(&1, [0, 1, 1], [2, 2, 3], strides: [1, 1, 2]),
        inputs: [:e],
        exact: true
      ),
      # Dynamic starts, one past the end: clipped so the slice fits.
      c(:slice, @all, &Nx.slice(&1, [Nx.tensor(1), 0, Nx.tensor(3)], [1, 3, 2]),
        inputs: [:e],
        exact: true
      ),
      c(
        :put_slice,
        @all,
        &Nx.put_slice(&1, [0, Nx.tensor(2), 1], Nx.slice(&1, [1, 0, 0], [1, 2, 2])),
        inputs: [:e],
        exact: true
      ),
      c(:concatenate, @all, &Nx.concatenate([&1, Nx.reverse(&1)], axis: 1),
        inputs: [:e],
        exact: true
      ),
      # Mixed types: the result type merges them.
      c(:concatenate, @all, &Nx.concatenate([&1, Nx.iota({2, 1, 4}, type: :s8)], axis: 1),
        inputs: [:m]
      ),
      c(:stack, @all, &Nx.stack([&1, Nx.negate(&1)], axis: 2), inputs: [:e], exact: true),
      c(:stack, @all, &Nx.stack([&1, &1, Nx.negate(&1)]), inputs: [:s], exact: true),
      c(:iota, @all, &Nx.iota({2, 3, 4}, type: &1.type, axis: 1), inputs: [:s]),
      c(:iota, @all, &Nx.iota({3, 5}, type: &1.type), inputs: [:s]),
      c(:eye, @all, &Nx.eye({2, 3, 4}, type: &1.type), inputs: [:s])
    ]
  end

  defp indexing do
    [
      c(:gather, @all, &Nx.gather(&1, Nx.tensor([[1, 2, 0], [0, 0, 3], [1, 1, 1]])), inputs: [:e]),
      c(:gather, @all, &Nx.gather(&1, Nx.tensor([[[2], [0]], [[1], [1]]]), axes: [1]),
        inputs: [:e]
      ),
      c(
        :indexed_add,
        @all,
        &Nx.indexed_add(
          &1,
          Nx.tensor([[0, 1, 2], [1, 0, 3], [0, 1, 2]]),
          Nx.tensor([1, 2, 3], type: &1.type)
        ),
        inputs: [:m]
      ),
      c(
        :indexed_add,
        @all,
        &Nx.indexed_add(&1, Nx.tensor([[1], [0], [1]]), Nx.iota({3, 2, 4}, type: &1.type),
          axes: [1]
        ),
        inputs: [:m],
        # The iota rounds too (Nx.BinaryBackend truncates 11 to 10, XLA rounds it to 12), and
        # then the sum: two roundings apart.
        tol: [{[{:f, 8}], rtol: 0.5}]
      ),
      c(
        :indexed_put,
        @all,
        &Nx.indexed_put(&1, Nx.tensor([[0, 1, 2], [1, 2, 3]]), Nx.tensor([5, 6], type: &1.type)),
        inputs: [:e]
      ),
      c(:sort, @real, &Nx.sort/1, inputs: [:x]),
      c(:sort, @real, &Nx.sort(&1, axis: 2, direction: :desc), inputs: [:m, :e]),
      c(:argsort, @real, &Nx.argsort(&1, stable: true), inputs: [:x]),
      c(:argsort, @real, &Nx.argsort(&1, axis: 1, direction: :desc, stable: true),
        inputs: [:m, :e]
      ),
      c(:block, @all, &Nx.take(&1, Nx.tensor([2, 0, 2]), axis: 1), inputs: [:e]),
      c(:block, @real, &Nx.top_k(&1, k: 2), inputs: [:m, :e]),
      c(:block, @all, &Nx.logical_not/1),
      c(:block, @all, &Nx.cumulative_sum(&1, axis: 2), inputs: [:m])
    ]
  end

  defp linear do
    [
      c(:dot, @all, &Nx.dot/2, inputs: [:mm]),
      c(:dot, @all, &Nx.dot(&1, [2], [0], &2, [1], [0]), inputs: [:mm]),
      c(:conv, @all, &Nx.conv/2, inputs: [:conv]),
      c(:conv, @all, &Nx.conv(&1, &2, strides: [2, 1], padding: :same, input_dilation: [1, 2]),
        inputs: [:conv],
        ref:
          e4m3fn_pad_bug(
            &Nx.conv(&1, &2, strides: [2, 1], padding: :same, input_dilation: [1, 2])
          )
      ),
      c(
        :conv,
        @all,
        &Nx.conv(&1, Nx.slice(&2, [0, 0, 0, 0], [4, 1, 2, 2]),
          feature_group_size: 2,
          kernel_dilation: [2, 1]
        ),
        inputs: [:conv],
        ref:
          e4m3fn_pad_bug(
            &Nx.conv(&1, Nx.slice(&2, [0, 0, 0, 0], [4, 1, 2, 2]),
              feature_group_size: 2,
              kernel_dilation: [2, 1]
            )
          )
      ),
      c(:triangular_solve, @all, fn a, b, _ -> Nx.LinAlg.triangular_solve(a, b) end,
        inputs: [:tri]
      ),
      c(
        :triangular_solve,
        @all,
        fn a, _, b ->
          Nx.LinAlg.triangular_solve(a, b, left_side: false, transform_a: :transpose)
        end,
        inputs: [:tri],
        # Each step rounds to 16 bits on XLA, Nx.BinaryBackend rounds once at the end.
        tol: [{[{:f, 16}, {:bf, 16}], atol: 2.0e-3}]
      ),
      c(
        :triangular_solve,
        @all,
        fn a, b, _ ->
          Nx.LinAlg.triangular_solve(
            Nx.transpose(a),
            Nx.slice_along_axis(b, 0, 1, axis: 1) |> Nx.squeeze(),
            lower: false
          )
        end,
        inputs: [:tri]
      ),
      c(:fft, @all, &Nx.fft/1, inputs: [:m]),
      c(:fft, @all, &Nx.fft(&1, length: 6, axis: 1), inputs: [:m]),
      c(:ifft, @all, &Nx.ifft(&1, length: 3), inputs: [:m])
    ]
  end

  # (`!= 0`: Nx.BinaryBackend's all and any take a complex 0 as true.)
  defn ops_cond(x) do
    cond do
      Nx.all(x != 0) -> {x * 2, 1}
      Nx.any(x != 0) -> {x - 1, 2}
      true -> {x, 3}
    end
  end

  defp control do
    [
      c(:cond, @all, &ops_cond/1, inputs: [:x, :s, :m]),
      c(:while, @all, &XlaNode.NxTest.Loop.doubled_three_times/1,
        inputs: [:x, :s],
        domain: no_overflow(&(&1 * 8))
      ),
      c(:elem, @all, &XlaNode.NxTest.Loop.doubled_three_times/1, inputs: [:s]),
      c(:fun, @all, &Nx.reduce(&1, 0, fn a, b -> Nx.add(a, b) end), inputs: [:m])
    ]
  end

  ## Meta tests

  test "meta: the table covers every backend op and every expression node" do
    covered = all_cases() |> Enum.map(& &1.op) |> MapSet.new()

    ops =
      Nx.Backend.behaviour_info(:callbacks)
      |> Keyword.keys()
      |> Enum.uniq()
      |> Kernel.--(@not_in_expressions)

    missing = Enum.reject(ops, &MapSet.member?(covered, &1))
    assert missing == [], "no case in the table for the Nx.Backend callbacks #{inspect(missing)}"

    # The syntax nodes listed in Nx.Defn.Expr's documentation.
    {:docs_v1, _, _, _, %{"en" => doc}, _, _} = Code.fetch_docs(Nx.Defn.Expr)
    nodes = for [_, name] <- Regex.scan(~r/^\s*\* `(\w+)\(/m, doc), do: String.to_atom(name)
    assert :parameter in nodes and :while in nodes

    missing = Enum.reject(nodes, &(MapSet.member?(covered, &1) or Map.has_key?(@elsewhere, &1)))

    assert missing == [],
           "no case (nor test elsewhere) for the expression nodes #{inspect(missing)}"

    # Nx 0.13 replaced `optional` with `block`.
    refute function_exported?(Nx.Defn.Expr, :optional, 3)
  end

  test "meta: each case has its op, types and domain right" do
    errors =
      for c <- all_cases(), error <- check_case(c), do: "#{c.name}: #{error}"

    assert errors == [], Enum.join(errors, "\n")
  end

  defp check_case(c) do
    # (Some ops are no-ops on some types, as floor on integers.)
    has_op =
      if Enum.any?(c.types, &Lower.has_op?(trace(c, hd(c.inputs), &1), [c.op])),
        do: [],
        else: ["its expression has no #{c.op}"]

    # Nx rejects the types a case leaves out.
    accepted =
      for type <- @all -- c.types,
          match?({:ok, _}, try_trace(c, type)),
          do: "Nx accepts #{inspect(type)}"

    # The Evaluator raises on what a domain leaves out.
    undefined =
      for type <- c.types,
          args <- excluded(for_type(c, type), type),
          computes_case?(c, args, type),
          do: "Nx computes #{inspect(args)} on #{inspect(type)}, outside the domain"

    has_op ++ accepted ++ undefined
  end

  defp trace(c, kind, type) do
    args = inputs(kind, type, c)
    apply(Nx.Defn.debug_expr(c.fun), args)
  end

  defp try_trace(c, type) do
    args = inputs(hd(c.inputs), type, %{c | domain: nil, except: nil})

    try do
      {:ok, apply(Nx.Defn.debug_expr(c.fun), args)}
    rescue
      e -> {:error, e}
    end
  end

  defp excluded(%{domain: nil}, _type), do: []

  defp excluded(c, type) do
    e = edge(type)
    {:arity, arity} = Function.info(c.domain, :arity)

    args = if arity == 1, do: Enum.map(e, &[&1]), else: for(x <- e, y <- e, do: [x, y])
    Enum.reject(args, &(in_domain?(c, &1) or excepted?(c, &1)))
  end

  defp computes_case?(c, args, type) do
    apply(c.fun, Enum.map(args, &t(&1, type)))
    true
  rescue
    _ -> false
  end

  # Erlang floats have no infinities or NaN: where an IEEE result is one, Nx.BinaryBackend
  # raises, and the domains above leave the values out. The node gives IEEE's results.
  test "IEEE results where Nx.BinaryBackend raises" do
    for type <- @float, Nx.Type.infinite_float?(type) do
      max = max_finite(type)

      checks = %{
        divide:
          {&Nx.divide/2, [[1.0, -1.0, 0.0, 1.0], [0.0, 0.0, 0.0, neg_zero()]],
           [:infinity, :neg_infinity, :nan, :neg_infinity]},
        multiply: {&Nx.multiply/2, [[max, max], [2.0, -2.0]], [:infinity, :neg_infinity]},
        remainder: {&Nx.remainder/2, [[5.0, :infinity], [0.0, 2.0]], [:nan, :nan]},
        exp: {&Nx.exp/1, [[max, -max]], [:infinity, 0.0]},
        sqrt: {&Nx.sqrt/1, [[-1.0, :neg_infinity]], [:nan, :nan]},
        log: {&Nx.log/1, [[0.0, -1.0]], [:neg_infinity, :nan]},
        floor:
          {&Nx.floor/1, [[:infinity, :neg_infinity, :nan]], [:infinity, :neg_infinity, :nan]},
        round: {&Nx.round/1, [[:infinity, :neg_infinity, :nan]], [:infinity, :neg_infinity, :nan]}
      }

      args =
        Map.new(checks, fn {k, {_, args, _}} ->
          {k, List.to_tuple(Enum.map(args, &t(&1, type)))}
        end)

      fun = fn args ->
        Map.new(checks, fn {k, {f, _, _}} -> {k, apply(f, Tuple.to_list(args[k]))} end)
      end

      results = Nx.Defn.jit(fun, compiler: XlaNode.Compiler, node: xla()).(args)

      for {k, {_, _, expected}} <- checks do
        assert Nx.to_flat_list(results[k]) == expected, "#{k} on #{inspect(type)}"
      end
    end
  end

  ## The table tests

  for {table, _} <- [
        elementwise: nil,
        binary: nil,
        conversions: nil,
        reductions: nil,
        shapes: nil,
        indexing: nil,
        linear: nil,
        control: nil
      ] do
    test "#{table} against the Evaluator" do
      run(unquote(table))
    end
  end

  defp run(table) do
    cases = named(tables()[table])

    failures =
      for type <- @all, failure <- run_type(cases, type), do: failure

    assert failures == [], Enum.join(failures, "\n\n")
  end

  # One program for every case and kind of input on `type`.
  defp run_type(cases, type) do
    runs =
      for c <- cases, type in c.types, not skipped?(c, type), kind <- c.inputs do
        {"#{c.name} #{kind}", c, List.to_tuple(inputs(kind, type, for_type(c, type)))}
      end

    run_batch(runs, type)
  end

  defp run_batch([], _type), do: []

  defp run_batch(runs, type) do
    args = Map.new(runs, fn {key, _, args} -> {key, args} end)

    ours_fun = fn args ->
      Map.new(runs, fn {key, c, _} -> {key, apply(c.fun, Tuple.to_list(args[key]))} end)
    end

    theirs_fun = fn args ->
      Map.new(runs, fn {key, c, _} ->
        {key, apply(evaluator_fun(c, type), Tuple.to_list(args[key]))}
      end)
    end

    try do
      theirs = Nx.Defn.jit(theirs_fun, compiler: Nx.Defn.Evaluator).(args)
      ours = Nx.Defn.jit(ours_fun, compiler: XlaNode.Compiler, node: xla()).(args)

      for {key, c, a} <- runs, msg = compare(ours[key], theirs[key], c, type, a) do
        "#{key} on #{inspect(type)}: #{msg}"
      end
    rescue
      e ->
        # Something raised: run the cases one by one to name it.
        case runs do
          [{key, _, _}] ->
            [
              "#{key} on #{inspect(type)} raised " <>
                String.slice(Exception.format(:error, e, __STACKTRACE__), 0, 2000)
            ]

          _ ->
            Enum.flat_map(runs, &run_batch([&1], type))
        end
    end
  end

  defp skipped?(c, type), do: Enum.any?(c.skip, fn {types, _why} -> type in types end)

  defp evaluator_fun(%{ref: {types, ref, _why}} = c, type),
    do: if(type in types, do: ref, else: c.fun)

  defp evaluator_fun(c, _type), do: c.fun

  ## Comparing

  defp compare(ours, theirs, c, type, args) do
    Enum.zip(
      Nx.Defn.Composite.flatten_list([ours]),
      Nx.Defn.Composite.flatten_list([theirs])
    )
    |> Enum.find_value(fn {o, t} ->
      if msg = compare_tensor(o, t, c, type), do: msg <> "\n" <> where(o, t, c, type, args)
    end)
  end

  defp compare_tensor(ours, theirs, c, in_type) do
    ours = overflowed_as_nx(ours, theirs)

    cond do
      ours.type != theirs.type ->
        "type #{inspect(ours.type)}, expected #{inspect(theirs.type)}"

      ours.shape != theirs.shape ->
        "shape #{inspect(ours.shape)}, expected #{inspect(theirs.shape)}"

      Nx.Type.integer?(theirs.type) or exact?(c, in_type) ->
        # Exact, with -0.0 == 0.0 and NaN == NaN.
        unless Nx.to_flat_list(ours) == Nx.to_flat_list(theirs), do: mismatch(ours, theirs)

      true ->
        tol = tolerance(c, in_type, theirs.type)
        # (Compared on f32 at least: 8-bit floats cannot hold the tolerances.)
        [o, t] = Enum.map([ours, theirs], &Nx.as_type(&1, Nx.Type.merge(&1.type, {:f, 32})))
        close = Nx.all_close(o, t, Keyword.put(tol, :equal_nan, true))
        unless Nx.to_number(close) == 1, do: mismatch(ours, theirs)
    end
  end

  # An f8_e4m3fn result that overflows is NaN on XLA (as on EXLA), where Nx.BinaryBackend
  # saturates it to ±448; one above f8's largest value (57344) rounds to ±inf on XLA, where
  # Nx.BinaryBackend truncates it to ±57344. Those count as Nx's results.
  defp overflowed_as_nx(%{type: {:f8_e4m3fn, 8}} = ours, theirs) do
    overflowed = Nx.logical_and(Nx.is_nan(ours), Nx.equal(Nx.abs(theirs), 448))
    Nx.select(overflowed, theirs, ours)
  end

  defp overflowed_as_nx(%{type: {:f, 8}} = ours, theirs) do
    overflowed =
      Nx.logical_and(Nx.is_infinity(ours), Nx.equal(theirs, Nx.multiply(Nx.sign(ours), 57344)))

    Nx.select(overflowed, theirs, ours)
  end

  defp overflowed_as_nx(ours, _theirs), do: ours

  defp exact?(%{exact: true}, _type), do: true
  defp exact?(%{exact: types}, type) when is_list(types), do: type in types
  defp exact?(_c, _type), do: false

  defp tolerance(c, in_type, out_type) do
    default = default_tolerance(out_type)

    Enum.reduce(c.tol, default, fn {types, kw}, acc ->
      if in_type in types, do: Keyword.merge(acc, kw), else: acc
    end)
  end

  # Half-precision results may round the other way: XLA computes in f32 and rounds once. 8-bit
  # floats, within one unit in the last place (or the smallest normal value near zero):
  # Nx.BinaryBackend truncates to f8 (E5M2) and rounds ties away from zero (E4M3FN) where XLA
  # rounds to nearest even.
  defp default_tolerance({:f, 8}), do: [atol: 6.2e-5, rtol: 0.25]
  defp default_tolerance({:f8_e4m3fn, 8}), do: [atol: 1.6e-2, rtol: 0.125]
  defp default_tolerance({_, 16}), do: [atol: 1.0e-5, rtol: 1.0e-2]
  defp default_tolerance(_type), do: [atol: 1.0e-5, rtol: 1.0e-4]

  defp mismatch(ours, theirs), do: "got #{inspect(ours)}\nexpected #{inspect(theirs)}"

  # The first elements that differ, with the inputs' elements at the same place when the
  # inputs have the result's size.
  defp where(ours, theirs, c, in_type, args) do
    tol = tolerance(c, in_type, theirs.type)
    exact = Nx.Type.integer?(theirs.type) or exact?(c, in_type)
    args = args |> Tuple.to_list() |> Enum.flat_map(&elements_at(&1, ours.shape))

    [Nx.to_flat_list(ours), Nx.to_flat_list(theirs) | args]
    |> Enum.zip()
    |> Enum.with_index()
    |> Enum.reject(fn {row, _} -> same?(elem(row, 0), elem(row, 1), exact, tol) end)
    |> Enum.take(6)
    |> Enum.map_join("\n", fn {row, i} ->
      [o, t | inputs] = Tuple.to_list(row)
      on = if inputs == [], do: "", else: " on #{Enum.map_join(inputs, ", ", &inspect/1)}"
      "  [#{i}] got #{inspect(o)}, expected #{inspect(t)}#{on}"
    end)
  end

  # An input's elements, one per result element, where it broadcasts to the result's shape.
  defp elements_at(arg, shape) do
    [Nx.to_flat_list(Nx.broadcast(arg, shape))]
  rescue
    _ -> []
  end

  defp same?(o, t, exact, tol) do
    o == t or (nan?(o) and nan?(t)) or (not exact and close?(o, t, tol))
  end

  defp nan?(%Complex{re: re, im: im}), do: nan?(re) or nan?(im)
  defp nan?(v), do: v == :nan

  defp close?(%Complex{} = o, %Complex{} = t, tol),
    do: close?(o.re, t.re, tol) and close?(o.im, t.im, tol)

  defp close?(o, t, tol) when is_number(o) and is_number(t),
    do: abs(o - t) <= tol[:atol] + tol[:rtol] * abs(t)

  defp close?(_o, _t, _tol), do: false
end
