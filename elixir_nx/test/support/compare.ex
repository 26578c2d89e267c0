defmodule XlaNode.NxTest.Compare do
  @moduledoc "Runs a function through XlaNode.Compiler and Nx.Defn.Evaluator and compares."

  import ExUnit.Assertions

  @doc "The results of `fun` on `args` through XlaNode.Compiler (on the test node) and the Evaluator."
  def both(fun, args) do
    node = Application.fetch_env!(:xla_node_nx, :test_node).name
    ours = apply(Nx.Defn.jit(fun, compiler: XlaNode.Compiler, node: node), args)
    theirs = apply(Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator), args)
    {ours, theirs}
  end

  @doc "Asserts that both compilers agree on `fun` (see `assert_match/3` for `opts`)."
  def assert_same(fun, args, opts \\ []) do
    {ours, theirs} = both(fun, args)
    assert_match(ours, theirs, opts)
  end

  @doc """
  Asserts that two results (tensors, or tuples or maps of them) have the same types and shapes,
  and the same values: integers exactly, floats within `opts[:atol]` (default `1.0e-5`) and
  `opts[:rtol]` (default `1.0e-4`, or `1.0e-2` for 16-bit floats).
  """
  def assert_match(%Nx.Tensor{} = ours, %Nx.Tensor{} = theirs, opts) do
    assert ours.type == theirs.type,
           "type #{inspect(ours.type)}, expected #{inspect(theirs.type)}"

    assert ours.shape == theirs.shape,
           "shape #{inspect(ours.shape)}, expected #{inspect(theirs.shape)}"

    if Nx.Type.integer?(theirs.type) do
      assert Nx.to_flat_list(ours) == Nx.to_flat_list(theirs)
    else
      # Half-precision results may round the other way: XLA computes in f32 and rounds once.
      rtol = opts[:rtol] || if elem(theirs.type, 1) == 16, do: 1.0e-2, else: 1.0e-4

      assert Nx.all_close(ours, theirs,
               atol: opts[:atol] || 1.0e-5,
               rtol: rtol,
               equal_nan: true
             )
             |> Nx.to_number() == 1,
             "got #{inspect(ours)}\nexpected #{inspect(theirs)}"
    end
  end

  def assert_match(ours, theirs, opts) when is_tuple(ours) do
    Enum.zip_with(Tuple.to_list(ours), Tuple.to_list(theirs), &assert_match(&1, &2, opts))
  end

  def assert_match(%{} = ours, %{} = theirs, opts) do
    assert Map.keys(ours) == Map.keys(theirs)
    for k <- Map.keys(ours), do: assert_match(ours[k], theirs[k], opts)
  end
end
