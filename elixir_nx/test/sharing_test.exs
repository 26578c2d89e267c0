defmodule XlaNode.SharingTest do
  # Not async: it counts the node's compiles, which other tests would add to.
  use ExUnit.Case, async: false

  import Nx.Defn

  alias XlaNode.Compiler.{Cache, Program}

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  # `x` added to itself `n` times over: a graph of n + 1 nodes, each using the one before twice,
  # which a copy that does not keep the sharing (between processes, into ETS) makes 2^n.
  deftransformp(double(x, n), do: Enum.reduce(1..n//1, x, fn _, acc -> Nx.add(acc, acc) end))

  # The same, each step halving the sum: the value stays `x`.
  deftransformp(keep(x, n),
    do: Enum.reduce(1..n//1, x, fn _, acc -> Nx.multiply(Nx.add(acc, acc), 0.5) end)
  )

  defn(doubled16(x), do: double(x, 16))
  defn(doubled64(x), do: double(x, 64))

  # A while loop whose body uses its state 2^48 times over.
  defn looped(x) do
    {_i, x} =
      while {i = 0, x}, i < 3 do
        {i + 1, keep(x, 48) + 1}
      end

    x
  end

  def times(t, opts), do: Nx.multiply(t, opts[:by])

  # Shared graphs before, between and after two runtime_calls.
  defn called_back(x) do
    y = Nx.runtime_call(x, keep(x, 64), [by: 3], &times/2)
    z = y |> keep(40) |> Nx.sin()
    z |> Nx.runtime_call(z, [by: 2], &times/2) |> keep(64)
  end

  defn(stages(x), do: x |> keep(64) |> Nx.sin() |> keep(64))

  @x Nx.tensor([1.0, -0.5])
  @two64 2.0 ** 64

  # The entry the cache holds for `fun` on `args`.
  defp cache_entry(fun, args) do
    key = {Program.function_key(fun), Program.arguments_key(args), xla()}
    Cache.get(key) || flunk("no cache entry for #{inspect(fun)}")
  end

  defp size(term), do: :erts_debug.flat_size(term)

  # The ops of the expressions in `term` (a function: in what it captured). Called only on terms
  # already known to be small.
  defp expression_ops(%Nx.Tensor{data: %Nx.Defn.Expr{op: op, args: args}}),
    do: MapSet.put(expression_ops(args), op)

  defp expression_ops(term) when is_map(term), do: term |> Map.values() |> expression_ops()
  defp expression_ops(term) when is_tuple(term), do: term |> Tuple.to_list() |> expression_ops()

  defp expression_ops(term) when is_list(term),
    do: Enum.reduce(term, MapSet.new(), &MapSet.union(expression_ops(&1), &2))

  defp expression_ops(term) when is_function(term),
    do: term |> Function.info(:env) |> elem(1) |> expression_ops()

  defp expression_ops(_term), do: MapSet.new()

  defp compiles do
    {:ok, %{compiles: compiles}} = XlaNode.info(xla())
    compiles
  end

  defp assert_values(tensor, expected) do
    assert Nx.all_close(tensor, expected, rtol: 1.0e-5) |> Nx.to_number() == 1,
           "got #{inspect(tensor)}, expected #{inspect(expected)}"
  end

  test "an expression sharing one subexpression 2^64 times compiles and runs, leaving only templates in the cache" do
    f16 = Nx.Defn.jit(&doubled16/1, compiler: XlaNode.Compiler, node: xla())
    assert_values(f16.(@x), Nx.multiply(@x, 2 ** 16))
    # The expression alone would be over a million words here, 2^64 times 20 below.
    entry = cache_entry(&doubled16/1, [@x])
    assert size(entry) < 500
    assert expression_ops(entry) == MapSet.new()

    f64 = Nx.Defn.jit(&doubled64/1, compiler: XlaNode.Compiler, node: xla())
    assert_values(f64.(@x), Nx.multiply(@x, @two64))
    assert size(cache_entry(&doubled64/1, [@x])) == size(entry)

    looped = Nx.Defn.jit(&looped/1, compiler: XlaNode.Compiler, node: xla())
    assert_values(looped.(@x), Nx.add(@x, 3))
    assert size(cache_entry(&looped/1, [@x])) < 500

    # And again, from the cache.
    c0 = compiles()
    assert_values(f64.(@x), Nx.multiply(@x, @two64))
    assert_values(looped.(@x), Nx.add(@x, 3))
    assert compiles() == c0
  end

  test "a compiled function holds no expression but a split's callbacks, and runs in any process" do
    expected = @x |> Nx.multiply(3) |> Nx.sin() |> Nx.multiply(2)

    for callbacks <- [:inside, :split], fun <- [&doubled64/1, &called_back/1, &looped/1] do
      opts = [compiler: XlaNode.Compiler, node: xla(), callbacks: callbacks]
      compiled = Nx.Defn.compile(fun, [Nx.template({2}, :f32)], opts)
      assert size(compiled) < 2_000, "#{inspect(fun)}, #{callbacks}: #{size(compiled)} words"
      # Split, the stages that call back hold each its runtime_call or hook, on parameters.
      allowed = if callbacks == :split, do: [:parameter, :runtime_call, :hook], else: []
      assert MapSet.subset?(expression_ops(compiled), MapSet.new(allowed))

      # What Nx.Serving does with it: a task per batch.
      result = Task.await(Task.async(fn -> compiled.(@x) end), 60_000)

      cond do
        fun == (&doubled64/1) -> assert_values(result, Nx.multiply(@x, @two64))
        fun == (&called_back/1) -> assert_values(result, expected)
        true -> assert_values(result, Nx.add(@x, 3))
      end
    end
  end

  test "callbacks: :split compiles each stage of a shared expression once, its entries templates" do
    split =
      Nx.Defn.jit(&called_back/1, compiler: XlaNode.Compiler, node: xla(), callbacks: :split)

    expected = @x |> Nx.multiply(3) |> Nx.sin() |> Nx.multiply(2)
    assert_values(split.(@x), expected)
    c0 = compiles()
    assert_values(split.(@x), expected)
    assert compiles() == c0

    # The node stages: before, between and after the two runtime_calls.
    split_key =
      {:split, Program.function_key(&called_back/1), Program.arguments_key([@x])}

    stages = :ets.match_object(Cache, {{{split_key, :_}, :_, xla()}, :_})
    assert length(stages) == 3

    for {key, entry} <- stages do
      assert size(entry) < 500
      assert expression_ops({key, entry}) == MapSet.new()
    end
  end

  test "Nx.Serving runs a shared expression in its own processes, compiled ahead or jitted" do
    input = Nx.stack([@x, Nx.negate(@x)])
    template = [Nx.template({2, 2}, :f32)]
    doubled = Nx.multiply(input, @two64)
    called_back = input |> Nx.multiply(3) |> Nx.sin() |> Nx.multiply(2)

    for {callbacks, make, expected} <- [
          {:inside, fn opts -> Nx.Defn.compile(&doubled64/1, template, opts) end, doubled},
          {:inside, fn opts -> Nx.Defn.compile(&called_back/1, template, opts) end, called_back},
          {:split, fn opts -> Nx.Defn.compile(&called_back/1, template, opts) end, called_back},
          {:split, fn opts -> Nx.Defn.jit(&called_back/1, opts) end, called_back}
        ] do
      serving =
        Nx.Serving.new(make, compiler: XlaNode.Compiler, node: xla(), callbacks: callbacks)

      name = :"shared_serving_#{System.unique_integer([:positive])}"
      start_supervised!({Nx.Serving, serving: serving, name: name, batch_size: 2})
      result = Nx.Serving.batched_run(name, Nx.Batch.stack([@x, Nx.negate(@x)]))
      assert_values(result, expected)
    end
  end

  test "Nx.Defn.Graph.run stages, closures over their expression, are cached by its id" do
    cut = fn
      %Nx.Tensor{data: %Nx.Defn.Expr{op: :sin}} -> :before
      _ -> :none
    end

    expr = Nx.Defn.debug_expr(&stages/1).(@x)
    chain = Nx.Defn.Graph.split(expr, cut)
    assert length(chain) == 2
    expected = Nx.sin(@x)
    opts = [compiler: XlaNode.Compiler, node: xla()]
    assert_values(Nx.Defn.Graph.run(chain, [@x], opts), expected)
    c0 = compiles()
    assert_values(Nx.Defn.Graph.run(chain, [@x], opts), expected)
    assert compiles() == c0
  end
end
