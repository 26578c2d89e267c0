defmodule XlaNode.BackendTrainingTest do
  # Not async: it sets the application-wide default backend and defn options, as
  # `config :nx, ...` does, and counts the bytes on the connection to the node.
  use ExUnit.Case, async: false

  import Nx.Defn

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  @batch 8
  @inputs 4
  @hidden 512
  @outputs 4
  @steps 100

  defn predict(params, x) do
    h = Nx.tanh(Nx.dot(x, params.w1) + params.b1)
    Nx.dot(h, params.w2) + params.b2
  end

  defn(loss(params, x, y), do: Nx.mean((predict(params, x) - y) ** 2))

  defn step(params, x, y) do
    {loss, grads} = value_and_grad(params, &loss(&1, x, y))

    params = %{
      w1: params.w1 - 0.1 * grads.w1,
      b1: params.b1 - 0.1 * grads.b1,
      w2: params.w2 - 0.1 * grads.w2,
      b2: params.b2 - 0.1 * grads.b2
    }

    {params, loss}
  end

  defn init_params(key) do
    {w1, key} = Nx.Random.normal(key, 0.0, 0.25, shape: {@inputs, @hidden})
    {w2, _key} = Nx.Random.normal(key, 0.0, 0.05, shape: {@hidden, @outputs})
    %{w1: w1, b1: Nx.broadcast(0.0, {@hidden}), w2: w2, b2: Nx.broadcast(0.0, {@outputs})}
  end

  # Four batches made on this node (the test process's default is BinaryBackend), used in turn:
  # a smooth target of the input.
  defp batches do
    key = Nx.Random.key(7)
    {x, _} = Nx.Random.uniform(key, -1.0, 1.0, shape: {4, @batch, @inputs})
    mix = Nx.iota({@inputs, @outputs}, type: :f32) |> Nx.divide(10)
    y = x |> Nx.dot([2], mix, [0]) |> Nx.sin()
    for i <- 0..3, do: {x[i], y[i]}
  end

  # The loss at every step, from `params` on: each step a scope that keeps the new params and
  # the loss as a number; the old params are freed.
  defp train(params, batches) do
    step = Nx.Defn.jit(&step/3)

    Enum.map_reduce(1..@steps, params, fn i, params ->
      {x, y} = Enum.at(batches, rem(i, 4))

      {new_params, loss} =
        XlaNode.Backend.scope(fn ->
          {new_params, loss} = step.(params, x, y)
          {new_params, Nx.to_number(loss)}
        end)

      Nx.backend_deallocate(params)
      {loss, new_params}
    end)
  end

  # The node's own counts of the bytes through its distribution connections.
  defp node_traffic do
    {:ok, %{traffic: %{received_bytes: received, sent_bytes: sent}}} = XlaNode.info(xla())
    {received, sent}
  end

  defp node_buffers do
    {:ok, %{buffers: buffers}} = XlaNode.info(xla())
    buffers
  end

  setup do
    previous = {Application.get_env(:nx, :default_backend), Nx.Defn.default_options()}

    on_exit(fn ->
      {backend, defn_options} = previous
      Application.put_env(:nx, :default_backend, backend)
      Application.put_env(:nx, :default_defn_options, defn_options)
    end)
  end

  test "an Nx.Serving under this configuration returns results its caller can read" do
    Application.put_env(:nx, :default_backend, {XlaNode.Backend, node: xla()})
    Application.put_env(:nx, :default_defn_options, compiler: XlaNode.Compiler, node: xla())

    # It returns its results to the caller (keep_on_device is not the default in a serving).
    serving = Nx.Serving.jit(&Nx.multiply(&1, 3)) |> Nx.Serving.batch_size(2)
    start_supervised!({Nx.Serving, serving: serving, name: __MODULE__.Serving, batch_timeout: 10})
    result = Nx.Serving.batched_run(__MODULE__.Serving, Nx.Batch.stack([Nx.tensor([1.0, 2.0])]))
    Process.sleep(100)
    assert Nx.to_flat_list(result) == [3.0, 6.0]
  end

  test "an MLP trained on the node with its params kept there, configured as config :nx does" do
    batches = batches()
    key = Nx.Random.key(42)

    # Under Nx.Defn.Evaluator, on this node.
    {evaluator_losses, _} =
      Task.async(fn ->
        Nx.default_backend(Nx.BinaryBackend)
        Nx.Defn.default_options(compiler: Nx.Defn.Evaluator)
        train(init_params(key), batches)
      end)
      |> Task.await(:infinity)

    # What `config :nx, default_backend: ..., default_defn_options: ...` sets.
    Application.put_env(:nx, :default_backend, {XlaNode.Backend, node: xla()})
    Application.put_env(:nx, :default_defn_options, compiler: XlaNode.Compiler, node: xla())

    {losses, before, traffic} =
      Task.async(fn ->
        before = node_buffers()
        params = init_params(key)
        assert %{w1: %Nx.Tensor{data: %XlaNode.Backend{}}} = params
        {received0, sent0} = node_traffic()
        {losses, params} = train(params, batches)
        {received1, sent1} = node_traffic()
        # Only the last params are left on the node; read back at the end. b2 (16 bytes) is
        # not among them: the run returns it inline, with the loss.
        assert %XlaNode.Backend{buffer: {:inline, _}} = params.b2.data
        assert node_buffers() == before + 3
        assert Nx.shape(Nx.backend_transfer(params.w1)) == {@inputs, @hidden}
        {losses, before, {received1 - received0, sent1 - sent0}}
      end)
      |> Task.await(:infinity)

    # The rest went when the process that made them exited.
    assert Enum.any?(1..50, fn _ -> node_buffers() == before or (Process.sleep(20) && false) end)

    # The loss falls, as it does under the Evaluator.
    assert List.last(losses) < hd(losses) / 4

    for {a, b} <- Enum.zip(losses, evaluator_losses) do
      assert_in_delta a, b, 1.0e-3 * b
    end

    # Per step, the connection carries the batch and the loss, not the params: the node's own
    # counts over the 100 steps (and the :info call that reads them).
    {received, sent} = traffic
    {received, sent} = {received / @steps, sent / @steps}
    batch_bytes = 4 * @batch * (@inputs + @outputs)
    params_bytes = 4 * (@inputs * @hidden + @hidden + @hidden * @outputs + @outputs)
    # Besides the batch, a step sends its requests (run, read the loss, free the old params),
    # a few hundred bytes each, and receives their replies.
    assert received < batch_bytes + 4096,
           "the node received #{received} bytes a step, the batch is #{batch_bytes}"

    assert sent < 4096, "the node sent #{sent} bytes a step"
    assert received < params_bytes / 4 and sent < params_bytes / 4
  end
end
