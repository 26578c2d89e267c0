defmodule XlaNode.LibraryPatternsTest do
  # What Nx libraries (Axon, Scholar) hand a defn compiler, through XlaNode.Compiler and
  # against Nx.Defn.Evaluator: one function met with several argument structures, arguments
  # the expression does not use (templates, lazy containers' members, large tensors), and
  # options the compiler does not know. Not async: it counts the bytes on the connection to
  # the node.
  use ExUnit.Case, async: false

  import Nx.Defn

  alias Nx.Defn.Composite
  alias XlaNode.NxTest.{LazyBatch, Moded}

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  defn(ident(x), do: x)

  defn branches_and_loops(flag, x, y, _unused) do
    picked = if flag > 0, do: x, else: y

    {_, total, _} =
      while({i = 0, total = picked, x}, i < 3, do: {i + 1, total + hook(x, :seen), x})

    total
  end

  # Each result with its structure: container kinds and keys, and each tensor's type, shape,
  # names and vectorized axes, then the values.
  defp assert_same_result(ours, theirs) do
    skeleton = &Composite.traverse(&1, fn t -> {t.type, t.shape, t.names, t.vectorized_axes} end)
    assert skeleton.(ours) == skeleton.(theirs)

    for {a, b} <- Enum.zip(Composite.flatten_list([ours]), Composite.flatten_list([theirs])) do
      assert Nx.to_flat_list(Nx.devectorize(a)) == Nx.to_flat_list(Nx.devectorize(b))
    end
  end

  # Calls one jitted function with the first arguments, then the second, on the node and under
  # the Evaluator, and compares every result.
  defp assert_both_as_evaluator(fun, first, second, opts) do
    ours = Nx.Defn.jit(fun, [compiler: XlaNode.Compiler, node: xla()] ++ opts)
    theirs = Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator)

    for args <- [first, second, first] do
      assert_same_result(apply(ours, args), apply(theirs, args))
    end
  end

  describe "a program is reused only for arguments of its structure" do
    for callbacks <- [:inside, :split] do
      test "container kinds and keys, kept fields, types, shapes, names, vectorized axes (#{callbacks})" do
        opts = [callbacks: unquote(callbacks)]
        a = Nx.tensor([1.0, 2.0])
        b = Nx.tensor([3.0, 4.0])

        # Tuple, then map; a map, then one with other keys.
        assert_both_as_evaluator(&ident/1, [{a, b}], [%{a: a, b: b}], opts)
        assert_both_as_evaluator(&ident/1, [%{a: a, b: b}], [%{c: a, d: b}], opts)
        assert_both_as_evaluator(&ident/1, [{a, {b}}], [{{a}, b}], opts)

        # A kept field chooses the computation. (Programs no other test compiles: the node's
        # cache of compiled texts would otherwise answer another test's first compile.)
        by_mode = fn
          %Moded{x: x, mode: :scale} -> Nx.multiply(x, 10)
          %Moded{x: x, mode: :shift} -> Nx.add(x, 10)
        end

        assert_both_as_evaluator(
          by_mode,
          [%Moded{x: a, mode: :scale}],
          [%Moded{x: a, mode: :shift}],
          opts
        )

        # Types, shapes, axis names, vectorized axes.
        assert_both_as_evaluator(&ident/1, [a], [Nx.as_type(a, :s32)], opts)
        assert_both_as_evaluator(&ident/1, [a], [Nx.tensor([1.0, 2.0, 3.0])], opts)

        assert_both_as_evaluator(
          &ident/1,
          [Nx.rename(a, [:i])],
          [Nx.rename(a, [:j])],
          opts
        )

        assert_both_as_evaluator(&ident/1, [Nx.vectorize(a, :rows)], [a], opts)

        assert_both_as_evaluator(
          &Nx.sum/1,
          [Nx.vectorize(Nx.iota({2, 3}), :rows)],
          [Nx.vectorize(Nx.iota({2, 3}), :cols)],
          opts
        )
      end
    end
  end

  describe "only the arguments the expression uses are read and sent" do
    for callbacks <- [:inside, :split] do
      test "a template argument read only for its shape (#{callbacks})" do
        init = fn template, scale ->
          Nx.multiply(Nx.iota(Nx.shape(template), type: :f32), scale)
        end

        opts = [compiler: XlaNode.Compiler, node: xla(), callbacks: unquote(callbacks)]
        template = Nx.template({2, 3}, :f32)
        ours = Nx.Defn.jit(init, opts).(template, Nx.tensor(2.0))
        theirs = Nx.Defn.jit(init, compiler: Nx.Defn.Evaluator).(template, Nx.tensor(2.0))
        assert_same_result(ours, theirs)
      end

      test "a lazy container whose unused member must not be computed (#{callbacks})" do
        batch = %LazyBatch{
          x: Nx.tensor([1.0, 2.0]),
          y: Nx.tensor([0.5, 0.5]),
          poison_template: Nx.template({1000}, :f32)
        }

        fun = fn %{x: x, y: y} -> Nx.subtract(x, y) end
        opts = [compiler: XlaNode.Compiler, node: xla(), callbacks: unquote(callbacks)]
        ours = Nx.Defn.jit(fun, opts).(batch)
        theirs = Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator).(batch)
        assert_same_result(ours, theirs)
      end

      test "an unused large argument does not cross the connection (#{callbacks})" do
        # 4 MB the function ignores, beside 8 bytes it uses.
        state = Nx.iota({1_000_000}, type: :f32)
        x = Nx.tensor([1.0, 2.0])
        fun = fn _state, x -> Nx.multiply(x, 2) end
        opts = [compiler: XlaNode.Compiler, node: xla(), callbacks: unquote(callbacks)]
        jitted = Nx.Defn.jit(fun, opts)
        assert Nx.to_flat_list(jitted.(state, x)) == [2.0, 4.0]

        {received0, _} = node_traffic()
        for _ <- 1..5, do: assert(Nx.to_flat_list(jitted.(state, x)) == [2.0, 4.0])
        {received1, _} = node_traffic()

        # Five runs' requests and the :info call that reads the count: a few hundred bytes
        # each, not the 4 MB.
        assert received1 - received0 < 16_384,
               "the node received #{received1 - received0} bytes for 5 runs"
      end
    end

    test "an argument used only in a while loop, a cond or a hook is read" do
      args = [Nx.tensor(1), Nx.tensor([1.0, 2.0]), Nx.tensor([5.0, 6.0]), Nx.template({3}, :f32)]

      ours =
        apply(Nx.Defn.jit(&branches_and_loops/4, compiler: XlaNode.Compiler, node: xla()), args)

      theirs = apply(Nx.Defn.jit(&branches_and_loops/4, compiler: Nx.Defn.Evaluator), args)
      assert_same_result(ours, theirs)
    end
  end

  # The node's own count of the bytes it received on its distribution connections.
  defp node_traffic do
    {:ok, %{traffic: %{received_bytes: received, sent_bytes: sent}}} = XlaNode.info(xla())
    {received, sent}
  end

  ## A small model trained as Nx libraries train one

  # Parameters from the input's template: only its shape is read (as Axon's init does).
  defn init_params(input_template, key) do
    {_, features} = Nx.shape(input_template)
    {w1, key} = Nx.Random.normal(key, 0.0, 0.5, shape: {features, 16})
    {w2, _key} = Nx.Random.normal(key, 0.0, 0.5, shape: {16, 1})
    %{w1: w1, b1: Nx.broadcast(0.0, {16}), w2: w2, b2: Nx.broadcast(0.0, {1})}
  end

  defn predict(params, x) do
    x
    |> Nx.dot(params.w1)
    |> Nx.add(params.b1)
    |> Nx.tanh()
    |> Nx.dot(params.w2)
    |> Nx.add(params.b2)
  end

  defn(loss(params, x, y), do: Nx.mean((predict(params, x) - y) ** 2))

  # The batch is a lazy container with a member that raises if read; `model_state` (as a
  # library's step takes its whole state) is not used.
  defn train_step(params, _model_state, batch) do
    {loss, grads} = value_and_grad(params, &loss(&1, batch.x, batch.y))
    {update(params, grads), loss}
  end

  defnp update(params, grads) do
    %{
      w1: params.w1 - 0.2 * grads.w1,
      b1: params.b1 - 0.2 * grads.b1,
      w2: params.w2 - 0.2 * grads.w2,
      b2: params.b2 - 0.2 * grads.b2
    }
  end

  defp batch(i) do
    key = Nx.Random.key(100 + i)
    {x, _} = Nx.Random.uniform(key, -1.0, 1.0, shape: {8, 3})
    y = x |> Nx.sum(axes: [1], keep_axes: true) |> Nx.sin()
    %LazyBatch{x: x, y: y, poison_template: Nx.template({8, 1000}, :f32)}
  end

  # Initialises from a template and trains `steps` steps with the options a library forwards
  # (as Axon.build(model, mode: :train) and its loop do); returns the losses.
  defp train(compiler_opts, steps) do
    library_opts = [mode: :train, global_layer_options: [], print_values: false]
    opts = compiler_opts ++ library_opts
    params = Nx.Defn.jit(&init_params/2, opts).(Nx.template({1, 3}, :f32), Nx.Random.key(1))
    model_state = %{step_log: Nx.iota({100_000}, type: :f32)}
    step = Nx.Defn.jit(&train_step/3, opts)

    {losses, _params} =
      Enum.map_reduce(1..steps, params, fn i, params ->
        {params, loss} = step.(params, model_state, batch(rem(i, 4)))
        {Nx.to_number(loss), params}
      end)

    losses
  end

  test "a small model initialised from a template and trained on lazy batches, as the Evaluator" do
    steps = 30
    evaluator = train([compiler: Nx.Defn.Evaluator], steps)
    ours = train([compiler: XlaNode.Compiler, node: xla()], steps)

    assert List.last(evaluator) < hd(evaluator) / 2
    assert List.last(ours) < hd(ours) / 2

    for {a, b} <- Enum.zip(ours, evaluator), do: assert_in_delta(a, b, 1.0e-4 + 1.0e-3 * b)
  end
end
