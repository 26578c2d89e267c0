defmodule XlaNode.TrainingStepTest do
  # Not async: it counts the messages on the node's connections, which other tests would add to.
  use ExUnit.Case, async: false

  @moduledoc """
  A training step as users write it (`XlaNode.Backend` as default backend, `Nx.Defn.jit`,
  `XlaNode.Backend.scope/1`, `Nx.to_number/1` of the loss), counted by the node's own `:info`
  traffic counters: the run keeps the new params on the node and returns the loss in its reply
  (inline behind an `XlaNode.Backend` tensor), so the step is one call, whatever the number of
  params; dropping the old params with `XlaNode.Backend.free_all/1`, or tensor by tensor with
  `Nx.backend_deallocate/1` (each free noted to leave with the next request), is one cast more:
  at most 4 messages in and 1 out a step.
  """

  @steps 10

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  defp info do
    {:ok, info} = XlaNode.info(xla())
    info
  end

  defp traffic do
    %{traffic: %{received_messages: received, sent_messages: sent}} = info()
    {received, sent}
  end

  # `n` params of 4x8 f32 (128 bytes: above the inline bound, so they stay on the node), each
  # fitting y from x on its own; the loss is the sum of their mean squared errors.
  defp step(params, x, y) do
    {loss, grads} =
      Nx.Defn.value_and_grad(params, fn params ->
        params
        |> Tuple.to_list()
        |> Enum.map(&Nx.mean(Nx.pow(Nx.subtract(Nx.dot(x, &1), y), 2)))
        |> Enum.reduce(&Nx.add/2)
      end)

    new_params =
      Enum.zip_with(
        Tuple.to_list(params),
        Tuple.to_list(grads),
        &Nx.subtract(&1, Nx.multiply(&2, 0.1))
      )

    {List.to_tuple(new_params), loss}
  end

  defp init_params(n) do
    for(i <- 1..n, do: Nx.multiply(Nx.iota({4, 8}, type: :f32), 0.01 * i)) |> List.to_tuple()
  end

  # Runs `@steps` steps in a process whose default backend is XlaNode.Backend, as
  # `config :nx, default_backend: ..., default_defn_options: ...` sets it; `drop` frees the old
  # params each step. Returns the losses, the messages in and out over the steps (less the two
  # :info calls that count them, measured the same way, and the casts of the keeper's sweeps),
  # and the buffers left beyond those the last params hold.
  defp train(n, drop) do
    Task.async(fn ->
      Nx.default_backend({XlaNode.Backend, node: xla()})
      Nx.Defn.default_options(compiler: XlaNode.Compiler, node: xla())
      x = Nx.iota({8, 4}, type: :f32) |> Nx.divide(32) |> Nx.backend_copy(Nx.BinaryBackend)
      y = Nx.sin(Nx.iota({8, 8}, type: :f32)) |> Nx.backend_copy(Nx.BinaryBackend)
      jit = Nx.Defn.jit(&step/3)
      first = init_params(n)
      # One step first: the program is compiled then, outside the count.
      {params, _} = XlaNode.Backend.scope(fn -> jit.(first, x, y) end)
      # The first params, and what made them, go now rather than while the steps are counted.
      XlaNode.Backend.free_all(first)
      :erlang.garbage_collect()
      XlaNode.Keeper.sweep()
      before = info().buffers
      sweeps = XlaNode.Keeper.stats().sweeps
      {in0, out0} = traffic()
      {in1, out1} = traffic()
      # The frees `Nx.backend_deallocate/1` notes go with the process's next request; those it
      # leaves 1 ms go on their own, from XlaNode.Frees. Held meanwhile, so that a step delayed
      # by a busy machine in the middle of its notes does not send them in two casts.
      :ok = :sys.suspend(XlaNode.Frees)

      {losses, params, in2, out2} =
        try do
          {losses, params} =
            Enum.map_reduce(1..@steps, params, fn _, params ->
              {new_params, loss} =
                XlaNode.Backend.scope(fn ->
                  {new_params, loss} = jit.(params, x, y)
                  {new_params, Nx.to_number(loss)}
                end)

              drop.(params)
              {loss, new_params}
            end)

          {in2, out2} = traffic()
          {losses, params, in2, out2}
        after
          :ok = :sys.resume(XlaNode.Frees)
        end

      # A sweep of the keeper meanwhile may send the node one cast of releases (of tokens it
      # saw dropped before it heard that they were freed): not the steps' own messages.
      keeper_casts = XlaNode.Keeper.stats().sweeps - sweeps
      left = info().buffers - before
      :ok = XlaNode.Backend.free_all(params)
      {losses, {in2 - in1 - (in1 - in0) - keeper_casts, out2 - out1 - (out1 - out0)}, left}
    end)
    |> Task.await(:infinity)
  end

  for n <- [3, 12] do
    test "a step of #{n} params, the old ones dropped with XlaNode.Backend.free_all/1: at most 4 messages in and 1 out" do
      {losses, {received, sent}, left} = train(unquote(n), &XlaNode.Backend.free_all/1)
      assert left == 0, "the old params were freed, the new ones kept"
      assert Enum.sort(losses, :desc) == losses and List.last(losses) < hd(losses)

      assert received <= 4 * @steps and sent <= @steps,
             "#{received} messages in and #{sent} out over #{@steps} steps"
    end

    test "a step of #{n} params, the old ones dropped with Nx.backend_deallocate/1: at most 4 messages in and 1 out" do
      {losses, {received, sent}, left} = train(unquote(n), &Nx.backend_deallocate/1)
      assert left == 0, "the frees left with the :info call that counts the buffers"
      assert Enum.sort(losses, :desc) == losses and List.last(losses) < hd(losses)

      # The run: its monitor, request and demonitor, and its reply; no read of the loss; the
      # frees of the step before in one cast just before it.
      assert received <= 4 * @steps and sent <= @steps,
             "#{received} messages in and #{sent} out over #{@steps} steps"
    end
  end

  test "wait: true: a run whose results all stay on the node returns once they are computed" do
    f =
      Nx.Defn.jit(&Nx.multiply(&1, 2),
        compiler: XlaNode.Compiler,
        node: xla(),
        keep_on_device: true,
        wait: true
      )

    y = f.(Nx.iota({64}, type: :f32))
    assert %XlaNode.Backend{buffer: buffer} = y.data
    assert is_reference(buffer)
    assert Nx.to_flat_list(y) == Enum.map(0..63, &(&1 * 2.0))
    assert Nx.backend_deallocate(y) == :ok
  end

  test "results of 64 bytes or less come back inline in the run's reply; larger ones stay" do
    Task.async(fn ->
      Nx.default_backend({XlaNode.Backend, node: xla()})

      f =
        Nx.Defn.jit(&{Nx.sum(&1), Nx.multiply(&1, 2), Nx.slice(&1, [0], [16])},
          compiler: XlaNode.Compiler,
          node: xla()
        )

      t = Nx.iota({17}, type: :f32)
      {sum, twice, head} = f.(t)
      assert %XlaNode.Backend{buffer: {:inline, _}} = sum.data
      assert %XlaNode.Backend{buffer: b} = twice.data
      assert is_reference(b)
      assert %XlaNode.Backend{buffer: {:inline, _}} = head.data
      {in0, _} = traffic()
      {in1, _} = traffic()
      assert Nx.to_number(sum) == 136.0
      assert Nx.to_flat_list(head) == Enum.map(0..15, &(&1 * 1.0))
      {in2, _} = traffic()
      assert in2 - in1 == in1 - in0, "reading them asked the node nothing"
      # An inline result is an argument like any other.
      assert Nx.to_number(f.(Nx.add(head, twice[0..15]) |> Nx.pad(0.0, [{0, 1, 0}])) |> elem(0)) ==
               360.0
    end)
    |> Task.await(:infinity)
  end
end
