defmodule XlaNode.LinAlgTest do
  # Not async: it measures this VM's CPU time, which tests running beside it would add to.
  use ExUnit.Case, async: false

  # Each test compiles tens of programs, some of which take XLA seconds: on a busy machine more
  # than ExUnit's default minute.
  @moduletag timeout: 300_000

  import XlaNode.NxTest.Compare

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  # Symmetric positive definite (cholesky needs it), and its lower triangle.
  @spd Nx.tensor([
         [4.0, 1.0, 0.5, 0.2],
         [1.0, 3.0, 0.3, 0.1],
         [0.5, 0.3, 2.0, 0.4],
         [0.2, 0.1, 0.4, 1.0]
       ])
  @general Nx.tensor([
             [2.0, -1.0, 0.5, 3.0],
             [1.0, 4.0, -2.0, 0.5],
             [0.0, 1.5, 3.0, -1.0],
             [-2.0, 0.5, 1.0, 2.5]
           ])
  @b Nx.tensor([1.0, -2.0, 3.0, 0.5])

  # Nx's default expressions for these are what the node runs; eigh and svd are while loops
  # whose bodies reuse their state many times over (the shape of graph that once took the
  # caller's VM down), and iterate, hence their wider tolerance.
  defp cases do
    iterative = [atol: 1.0e-4, rtol: 1.0e-3]

    [
      {"eigh", &Nx.LinAlg.eigh/1, [@spd], iterative},
      {"eigh, batched", &Nx.LinAlg.eigh/1, [Nx.stack([@spd, Nx.multiply(@spd, 2)])], iterative},
      {"svd", &Nx.LinAlg.svd/1, [@general], iterative},
      {"qr", &Nx.LinAlg.qr/1, [@general], []},
      {"qr, complete", &Nx.LinAlg.qr(&1, mode: :complete), [@general], []},
      {"lu", &Nx.LinAlg.lu/1, [@general], []},
      {"cholesky", &Nx.LinAlg.cholesky/1, [@spd], []},
      {"triangular_solve", &Nx.LinAlg.triangular_solve/2, [Nx.tril(@spd), @b], []},
      {"solve", &Nx.LinAlg.solve/2, [@general, @b], []},
      {"invert", &Nx.LinAlg.invert/1, [@general], []},
      {"determinant", &Nx.LinAlg.determinant/1, [@general], []},
      {"norm, Frobenius", &Nx.LinAlg.norm/1, [@general], []},
      {"norm, ord 1", &Nx.LinAlg.norm(&1, ord: 1), [@general], []},
      {"norm, ord :inf", &Nx.LinAlg.norm(&1, ord: :inf), [@general], []},
      {"norm, ord 2 (svd)", &Nx.LinAlg.norm(&1, ord: 2), [@general], iterative},
      {"norm, nuclear (svd)", &Nx.LinAlg.norm(&1, ord: :nuclear), [@general], iterative},
      {"norm of a vector, ord 3", &Nx.LinAlg.norm(&1, ord: 3), [@b], []}
    ]
  end

  test "linear algebra runs on the node, as the Evaluator computes it, cheaply once compiled" do
    for {name, fun, args, tolerance} <- cases() do
      jitted = Nx.Defn.jit(fun, compiler: XlaNode.Compiler, node: xla())
      # The first call lowers and compiles.
      ours = apply(jitted, args)
      theirs = apply(Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator), args)
      assert_match(ours, theirs, tolerance)

      # Later calls find the program in the cache: the caller only moves the data. Measured on
      # the caller's side, in CPU (this VM's, and the calling process's reductions; lowering
      # svd alone takes some 800,000), never in wall-clock time.
      {again, runtime_ms, reductions} = caller_cost(fn -> apply(jitted, args) end)
      assert_match(again, theirs, tolerance)
      assert runtime_ms < 250, "#{name}: #{runtime_ms} ms of CPU for a compiled call"
      assert reductions < 20_000, "#{name}: #{reductions} reductions for a compiled call"
    end
  end

  ## Every Nx.LinAlg function, with each option

  # Nx's default expressions run on the node for all but triangular_solve (one StableHLO op):
  # each with every option, on real and complex inputs where Nx takes them (svd, and so pinv
  # and the nuclear norm, take only real ones), and batched.
  defp option_cases do
    gen = Nx.slice(@general, [0, 0], [3, 3])
    spd = Nx.slice(@spd, [0, 0], [3, 3])
    imag = Nx.tensor([[0.5, 1.0, -1.0], [0.0, -0.5, 2.0], [1.0, 0.25, 0.0]])
    complex = Nx.complex(gen, imag)
    hermitian = Nx.add(Nx.dot(Nx.LinAlg.adjoint(complex), complex), Nx.eye(3))
    tall = Nx.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.5]])
    wide = Nx.transpose(tall)
    b = Nx.slice(@b, [0], [3])
    complex_b = Nx.complex(b, Nx.tensor([0.5, 1.0, -1.5]))
    b_matrix = Nx.tensor([[1.0, 2.0], [-1.0, 0.5], [3.0, 1.0]])
    batch = fn t -> Nx.stack([t, Nx.multiply(t, 2)]) end
    iterative = [atol: 1.0e-4, rtol: 1.0e-3]

    [
      factorizations: [
        {&Nx.LinAlg.cholesky/1, [spd], []},
        {&Nx.LinAlg.cholesky/1, [hermitian], []},
        {&Nx.LinAlg.cholesky/1, [batch.(spd)], []},
        {&Nx.LinAlg.qr/1, [complex], []},
        {&Nx.LinAlg.qr(&1, mode: :complete), [tall], []},
        {&Nx.LinAlg.qr(&1, mode: :reduced), [tall], []},
        {&Nx.LinAlg.qr/1, [wide], []},
        {&Nx.LinAlg.qr(&1, eps: 1.0e-3), [gen], []},
        {&Nx.LinAlg.qr/1, [batch.(Nx.as_type(gen, :f64))], []},
        {&Nx.LinAlg.lu/1, [complex], []},
        {&Nx.LinAlg.lu/1, [batch.(gen)], []}
      ],
      iterative: [
        {&Nx.LinAlg.eigh/1, [hermitian], iterative},
        {&Nx.LinAlg.eigh(&1, max_iter: 5, eps: 1.0e-2), [spd], iterative},
        {&Nx.LinAlg.svd(&1, full_matrices?: false), [tall], iterative},
        {&Nx.LinAlg.svd/1, [tall], iterative},
        {&Nx.LinAlg.svd(&1, max_iter: 2), [gen], iterative},
        {&Nx.LinAlg.svd/1, [batch.(gen)], iterative}
      ],
      solving: [
        {&Nx.LinAlg.determinant/1, [complex], []},
        {&Nx.LinAlg.determinant/1, [batch.(gen)], []},
        {&Nx.LinAlg.determinant/1, [Nx.slice(gen, [0, 0], [2, 2])], []},
        {&Nx.LinAlg.solve/2, [complex, complex_b], []},
        {&Nx.LinAlg.solve/2, [gen, b_matrix], []},
        {&Nx.LinAlg.solve/2, [batch.(gen), batch.(b)], []},
        {&Nx.LinAlg.solve/2, [batch.(gen), batch.(b_matrix)], []},
        {&Nx.LinAlg.invert/1, [complex], []},
        {&Nx.LinAlg.invert/1, [batch.(gen)], []}
      ],
      derived: [
        {&Nx.LinAlg.pinv/1, [tall], []},
        {&Nx.LinAlg.pinv(&1, eps: 1.0e-3), [gen], []},
        {&Nx.LinAlg.pinv/1, [b], []},
        {&Nx.LinAlg.pinv/1, [Nx.broadcast(0.0, {2, 3})], []},
        {&Nx.LinAlg.pinv/1, [Nx.tensor(4.0)], []},
        {&Nx.LinAlg.matrix_power(&1, 3), [gen], []},
        {&Nx.LinAlg.matrix_power(&1, 0), [gen], []},
        {&Nx.LinAlg.matrix_power(&1, -2), [complex], []},
        {&Nx.LinAlg.matrix_power(&1, -1), [batch.(gen)], []},
        {&Nx.LinAlg.matrix_rank/1, [gen], []},
        {&Nx.LinAlg.matrix_rank(&1, eps: 1.0e-5), [Nx.tensor([[1.0, 2.0], [2.0, 4.0]])], []},
        {&Nx.LinAlg.least_squares/2, [tall, b], []},
        {&Nx.LinAlg.least_squares(&1, &2, eps: 1.0e-3), [tall, b], []}
      ],
      norms: [
        {&Nx.LinAlg.adjoint/1, [batch.(complex)], []},
        {&Nx.LinAlg.norm/1, [complex], []},
        {&Nx.LinAlg.norm(&1, ord: :neg_inf), [gen], []},
        {&Nx.LinAlg.norm(&1, ord: -1), [gen], []},
        {&Nx.LinAlg.norm(&1, ord: -2), [gen], iterative},
        {&Nx.LinAlg.norm(&1, ord: :nuclear), [gen], iterative},
        {&Nx.LinAlg.norm(&1, ord: 2), [complex], []},
        {&Nx.LinAlg.norm(&1, ord: 0), [b], []},
        {&Nx.LinAlg.norm(&1, ord: :inf), [complex_b], []},
        {&Nx.LinAlg.norm(&1, ord: 1), [complex_b], []},
        {&Nx.LinAlg.norm(&1, axes: [1]), [gen], []},
        {&Nx.LinAlg.norm(&1, axes: [0], keep_axes: true), [gen], []},
        {&Nx.LinAlg.norm(&1, keep_axes: true, ord: 3), [b], []},
        {&Nx.LinAlg.norm/1, [Nx.tensor([[1, 2], [3, 4]])], []}
      ]
    ]
  end

  for group <- [:factorizations, :iterative, :solving, :derived, :norms] do
    test "every Nx.LinAlg function, with each of its options, real and complex, batched: #{group}" do
      for {fun, args, tolerance} <- Keyword.fetch!(option_cases(), unquote(group)) do
        assert_same(fun, args, tolerance)
      end
    end
  end

  test "gradients of the Nx.LinAlg functions" do
    gen = Nx.slice(@general, [0, 0], [3, 3])
    spd = Nx.slice(@spd, [0, 0], [3, 3])
    batched = Nx.stack([gen, Nx.multiply(gen, 2)])
    b = Nx.slice(@b, [0], [3])
    grad = fn f -> &Nx.Defn.grad(&1, f) end

    sum_all = fn tuple ->
      tuple |> Tuple.to_list() |> Enum.map(&Nx.sum/1) |> Enum.reduce(&Nx.add/2)
    end

    for {fun, args} <- [
          {grad.(&Nx.sum(Nx.LinAlg.cholesky(&1))), [spd]},
          {grad.(&sum_all.(Nx.LinAlg.qr(&1))), [gen]},
          {grad.(&sum_all.(Nx.LinAlg.eigh(&1))), [spd]},
          {grad.(&sum_all.(Nx.LinAlg.svd(&1))), [gen]},
          {grad.(&sum_all.(Nx.LinAlg.lu(&1))), [gen]},
          {grad.(&Nx.sum(Nx.LinAlg.determinant(&1))), [batched]},
          {grad.(&Nx.sum(Nx.LinAlg.invert(&1))), [batched]},
          {grad.(&Nx.sum(Nx.LinAlg.pinv(&1))), [gen]},
          {grad.(&Nx.LinAlg.norm(&1, ord: 2)), [gen]},
          {&Nx.Defn.grad({&1, &2}, fn {a, b} -> Nx.sum(Nx.LinAlg.solve(a, b)) end),
           [batched, Nx.stack([b, b])]}
        ] do
      assert_same(fun, args, atol: 1.0e-3, rtol: 1.0e-3)
    end
  end

  ## triangular_solve: every option, type and shape

  # n x n systems (n = 3), b of m = 2 columns (rows with left_side: false).
  @n 3
  @m 2
  @options for lower <- [true, false],
               left_side <- [true, false],
               transform_a <- [:none, :transpose, :conjugate],
               do: [lower: lower, left_side: left_side, transform_a: transform_a]

  # A well-conditioned a (a dominant diagonal) whose other triangle holds values the solve must
  # not read: both Nx and XLA take only the triangle `lower:` names.
  defp square(batch, type) do
    shape = List.to_tuple(batch ++ [@n, @n])
    k = Nx.iota(shape, type: :f32)
    real = k |> Nx.multiply(1.7) |> Nx.sin() |> Nx.add(Nx.multiply(Nx.eye(shape), 3))
    imag = k |> Nx.multiply(0.9) |> Nx.cos() |> Nx.multiply(0.5)
    typed(real, imag, type)
  end

  defp rhs(dims, type) do
    k = Nx.iota(List.to_tuple(dims), type: :f32)
    real = k |> Nx.multiply(1.3) |> Nx.cos() |> Nx.multiply(2)
    imag = k |> Nx.multiply(0.7) |> Nx.sin()
    typed(real, imag, type)
  end

  defp typed(real, imag, {:c, _} = type), do: real |> Nx.complex(imag) |> Nx.as_type(type)

  defp typed(real, _imag, {:s, _} = type),
    do: real |> Nx.multiply(3) |> Nx.round() |> Nx.as_type(type)

  defp typed(real, _imag, type), do: Nx.as_type(real, type)

  # b for `a` of batch `batch`, as a vector (or a batch of them) or as a matrix, for each side.
  defp rhs(batch, :vector, type), do: {rhs(batch ++ [@n], type), rhs(batch ++ [@n], type)}
  defp rhs(batch, :matrix, type), do: {rhs(batch ++ [@n, @m], type), rhs(batch ++ [@m, @n], type)}

  # Every option at once, in one program: a map of `opts` (as a string) to the solution.
  defp solve_all(a, b_left, b_right) do
    Map.new(@options, fn opts ->
      b = if opts[:left_side], do: b_left, else: b_right
      {inspect(opts), Nx.LinAlg.triangular_solve(a, b, opts)}
    end)
  end

  # The same with the gradients of each solution (of a real function of it) by a and b.
  defp grad_all(a, b_left, b_right) do
    Map.new(@options, fn opts ->
      b = if opts[:left_side], do: b_left, else: b_right

      grads =
        Nx.Defn.grad({a, b}, fn {a, b} ->
          x = Nx.LinAlg.triangular_solve(a, b, opts)
          weights = x |> Nx.shape() |> Nx.iota(type: :f32) |> Nx.cos()
          Nx.add(Nx.sum(Nx.multiply(Nx.real(x), weights)), Nx.sum(Nx.imag(x)))
        end)

      {inspect(opts), grads}
    end)
  end

  @shapes [{[], :vector}, {[], :matrix}, {[2], :vector}, {[2], :matrix}, {[2, 2], :vector}]

  test "triangular_solve: every option on every type, vectors, matrices and batches of both" do
    for type <- [{:f, 32}, {:f, 64}, {:c, 64}, {:c, 128}, {:s, 32}], {batch, kind} <- @shapes do
      a = square(batch, type)
      {b_left, b_right} = rhs(batch, kind, type)
      {ours, theirs} = both(&solve_all/3, [a, b_left, b_right])
      assert_match(ours, theirs, tolerance(type))
    end

    # A real a and a complex b, and the other way round: complex results.
    for {a_type, b_type} <- [{{:f, 32}, {:c, 64}}, {{:c, 64}, {:f, 32}}] do
      {b_left, b_right} = rhs([2], :matrix, b_type)
      assert_same(&solve_all/3, [square([2], a_type), b_left, b_right], tolerance({:c, 64}))
    end
  end

  # Fewer shapes than above: each program takes XLA seconds to compile (a gradient inverts a).
  test "triangular_solve's gradients: every option, real and complex, vectors and matrices" do
    for {type, shapes} <- [
          {{:f, 32}, [{[], :vector}, {[2], :vector}, {[2], :matrix}]},
          {{:c, 64}, [{[], :matrix}, {[2], :vector}]}
        ],
        {batch, kind} <- shapes do
      {b_left, b_right} = rhs(batch, kind, type)
      assert_same(&grad_all/3, [square(batch, type), b_left, b_right], tolerance(type))
    end
  end

  test "triangular_solve, transform_a: :conjugate on complex inputs solves conj(a) x = b" do
    a =
      Nx.tensor([
        [1, 0, 0],
        [Complex.new(1, 2), Complex.new(0, 1), 0],
        [Complex.new(0, 1), 1, Complex.new(2, -1)]
      ])

    b = Nx.tensor([1, -1, Complex.new(3, 3)])
    solve = &Nx.LinAlg.triangular_solve(&1, &2, transform_a: :conjugate)
    {x, theirs} = both(solve, [a, b])
    assert_match(x, theirs, tolerance({:c, 64}))
    # Nx's answer: conj(a) x = b.
    assert_match(Nx.dot(Nx.conjugate(a), x), Nx.as_type(b, :c64), tolerance({:c, 64}))

    grad = fn a, b -> Nx.Defn.grad({a, b}, &Nx.sum(Nx.real(solve.(elem(&1, 0), elem(&1, 1))))) end
    assert_same(grad, [a, b], tolerance({:c, 64}))
  end

  test "triangular_solve of a batch of vectors: b of one rank less than a batched a" do
    a = Nx.tensor([[[1.0, 0.0], [2.0, 3.0]], [[4.0, 0.0], [5.0, 6.0]]])
    b = Nx.tensor([[2.0, -1.0], [3.0, 7.0]])

    for opts <- [[], [left_side: false], [transform_a: :transpose], [lower: false]] do
      solve = &Nx.LinAlg.triangular_solve(&1, &2, opts)
      assert_same(solve, [a, b], tolerance({:f, 32}))
      grad = fn a, b -> Nx.Defn.grad({a, b}, &Nx.sum(solve.(elem(&1, 0), elem(&1, 1)))) end
      assert_same(grad, [a, b], tolerance({:f, 32}))
    end

    # Nx's doctest: vectorized a and b, which reach the compiler as such batches.
    a = Nx.tensor([[[1, 1], [0, 1]], [[2, 0], [0, 2]]]) |> Nx.vectorize(x: 2)
    b = Nx.tensor([[[2, 1], [5, -1]]]) |> Nx.vectorize(x: 1, y: 2)
    {ours, theirs} = both(&Nx.LinAlg.triangular_solve(&1, &2, lower: false), [a, b])
    assert ours.vectorized_axes == [x: 2, y: 2]
    assert_match(Nx.devectorize(ours), Nx.devectorize(theirs), [])
  end

  defp tolerance({:f, 64}), do: []
  defp tolerance({:c, 128}), do: []
  defp tolerance(_single), do: [atol: 1.0e-4, rtol: 1.0e-3]

  defp caller_cost(fun) do
    {runtime0, _} = :erlang.statistics(:runtime)
    {:reductions, reductions0} = Process.info(self(), :reductions)
    result = fun.()
    {:reductions, reductions1} = Process.info(self(), :reductions)
    {runtime1, _} = :erlang.statistics(:runtime)
    {result, runtime1 - runtime0, reductions1 - reductions0}
  end
end
