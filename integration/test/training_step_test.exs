defmodule XlaNode.TrainingStepTest do
  @moduledoc """
  A training step in one round trip: a run keeps some results on the device and
  returns the others in the same reply (`keep_on_device: [indices]`), so a step as users write
  it (params kept on the node, the batch from the host, the loss back, the old params freed with
  one cast) is one call and one cast, counted by the node's own `:info` traffic counters: at most
  4 messages in (the call's monitor, request and demonitor, and the cast) and 1 out, whatever the
  number of parameters. Also: the option's checks, and a run whose results all stay on the
  device answered once launched (`wait: true` to answer at completion).
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, Tensor}

  @steps 10

  defp call(node, request), do: GenServer.call({:xla, node.name}, request, 60_000)

  defp info(node) do
    {:ok, info} = call(node, :info)
    info
  end

  defp traffic(node) do
    %{traffic: %{received_messages: received, sent_messages: sent}} = info(node)
    {received, sent}
  end

  # A step of `n` parameters (each f32[4]) fitting `p_i * x ~ y` by gradient descent: returns
  # the new parameters, then the mean squared error before the step.
  defp step_program(n) do
    params = Enum.map_join(0..(n - 1), ", ", &"%p#{&1}: tensor<4xf32>")
    types = List.duplicate("tensor<4xf32>", n)

    body =
      for i <- 0..(n - 1) do
        """
            %m#{i} = stablehlo.multiply %p#{i}, %x : tensor<4xf32>
            %e#{i} = stablehlo.subtract %m#{i}, %y : tensor<4xf32>
            %sq#{i} = stablehlo.multiply %e#{i}, %e#{i} : tensor<4xf32>
            %l#{i} = stablehlo.reduce(%sq#{i} init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
            %g#{i} = stablehlo.multiply %e#{i}, %x : tensor<4xf32>
            %u#{i} = stablehlo.multiply %g#{i}, %rate : tensor<4xf32>
            %n#{i} = stablehlo.subtract %p#{i}, %u#{i} : tensor<4xf32>
        """
      end

    adds =
      for i <- 1..(n - 1)//1 do
        prev = if i == 1, do: "%l0", else: "%s#{i - 1}"
        "    %s#{i} = stablehlo.add #{prev}, %l#{i} : tensor<f32>\n"
      end

    total = if n == 1, do: "%l0", else: "%s#{n - 1}"

    """
    func.func @main(#{params}, %x: tensor<4xf32>, %y: tensor<4xf32>) -> (#{Enum.join(types ++ ["tensor<f32>"], ", ")}) {
        %zero = stablehlo.constant dense<0.0> : tensor<f32>
        %rate = stablehlo.constant dense<0.1> : tensor<4xf32>
        %count = stablehlo.constant dense<#{4.0 * n}> : tensor<f32>
    #{Enum.join(body)}#{Enum.join(adds)}    %loss = stablehlo.divide #{total}, %count : tensor<f32>
        return #{Enum.map_join(0..(n - 1), ", ", &"%n#{&1}")}, %loss : #{Enum.join(types ++ ["tensor<f32>"], ", ")}
    }
    """
  end

  defp f32(list), do: Tensor.from_list(list, {:f, 32})
  defp loss_value({<<loss::float-little-32>>, {{:f, 32}, []}}), do: loss

  # `steps` training steps from fresh params: each one `step_fun.(params)` returning the new
  # params and the loss. Returns the losses and the node's message counts over the steps, less
  # what the two :info calls that count them cost (measured the same way without steps).
  defp count_steps(node, n, step_fun) do
    params = for i <- 1..n, do: XlaNode.to_device!(node.name, f32([0.1 * i, 0.0, -0.1, 0.2]))
    {in0, out0} = traffic(node)
    {in1, out1} = traffic(node)
    {overhead_in, overhead_out} = {in1 - in0, out1 - out0}

    # The frees noted with `XlaNode.free_later/1` go with the process's next request; those it
    # leaves 1 ms go on their own, from XlaNode.Frees. Held meanwhile, so that a step delayed by
    # a busy machine in the middle of its notes does not send them in two casts.
    :ok = :sys.suspend(XlaNode.Frees)

    {losses, params, in2, out2} =
      try do
        {losses, params} =
          Enum.map_reduce(1..@steps, params, fn _, params ->
            {new_params, loss} = step_fun.(params)
            {loss, new_params}
          end)

        # Through the client, which sends the frees a step noted with `XlaNode.free_later/1`
        # first.
        {:ok, %{traffic: %{received_messages: in2, sent_messages: out2}}} =
          XlaNode.info(node.name)

        {losses, params, in2, out2}
      after
        :ok = :sys.resume(XlaNode.Frees)
      end

    assert info(node).buffers == n, "the old params were freed, the new ones kept"
    XlaNode.free_all(params)
    {losses, {in2 - in1 - overhead_in, out2 - out1 - overhead_out}}
  end

  setup_all do
    # A node of its own: its traffic counters see this module's messages only (its tests run one
    # after another).
    Harness.start_shared_node()
  end

  for n <- [3, 12] do
    test "a step of #{n} params as a raw call and one cast: at most 4 messages in and 1 out", %{
      node: node
    } do
      n = unquote(n)
      {:ok, exe} = call(node, {:compile, step_program(n)})
      {x, y} = {f32([1.0, 2.0, -1.0, 0.5]), f32([0.5, 1.0, -0.5, 0.25])}

      {losses, {received, sent}} =
        count_steps(node, n, fn params ->
          {:ok, results} =
            call(node, {:run, exe, params ++ [x, y], [keep_on_device: Enum.to_list(0..(n - 1))]})

          {new_params, [loss]} = Enum.split(results, n)
          assert Enum.all?(new_params, &is_reference/1)
          GenServer.cast({:xla, node.name}, {:free, params})
          {new_params, loss_value(loss)}
        end)

      assert received <= 4 * @steps and sent <= @steps,
             "#{received} messages in and #{sent} out over #{@steps} steps"

      assert Enum.sort(losses, :desc) == losses and List.last(losses) < hd(losses)
      call(node, {:free, exe})
    end

    # The old params dropped with one cast, or tensor by tensor with frees that leave in one cast
    # with the next step's run.
    for {how, drop} <- [
          {"XlaNode.free_all/1", quote(do: &(:ok = XlaNode.free_all(&1)))},
          {"XlaNode.free_later/1, one by one",
           quote(do: &Enum.each(&1, fn ref -> :ok = XlaNode.free_later(ref) end))}
        ] do
      test "a step of #{n} params through the client (XlaNode.run/4, #{how}): at most 4 in and 1 out",
           %{node: node} do
        n = unquote(n)
        drop = unquote(drop)
        exe = XlaNode.compile!(node.name, step_program(n))
        {x, y} = {f32([1.0, 2.0, -1.0, 0.5]), f32([0.5, 1.0, -0.5, 0.25])}

        {losses, {received, sent}} =
          count_steps(node, n, fn params ->
            results =
              XlaNode.run!(node.name, exe, params ++ [x, y],
                keep_on_device: Enum.to_list(0..(n - 1))
              )

            {new_params, [loss]} = Enum.split(results, n)
            drop.(params)
            {new_params, loss_value(loss)}
          end)

        assert received <= 4 * @steps and sent <= @steps,
               "#{received} messages in and #{sent} out over #{@steps} steps"

        assert Enum.sort(losses, :desc) == losses and List.last(losses) < hd(losses)
        XlaNode.free!(node.name, exe)
      end
    end
  end

  describe "XlaNode.free_later/1" do
    setup %{node: node} do
      %{buffers: before} = info(node)
      bufs = for i <- 1..3, do: XlaNode.to_device!(node.name, f32([1.0 * i]))
      on_exit(fn -> XlaNode.free_all(bufs) end)
      %{bufs: bufs, before: before}
    end

    test "a free leaves with the process's next request, in order with it", %{
      node: node,
      bufs: [a, b, c],
      before: before
    } do
      assert XlaNode.free_later(a) == :ok
      assert XlaNode.free_later(a) == :already_noted
      assert XlaNode.free_later(b) == :ok
      # The read of a noted buffer goes after its free: it is gone.
      assert {:error, %XlaNode.Error{}} = XlaNode.read(node.name, a)
      assert info(node).buffers == before + 1
      assert {:ok, {_, _}} = XlaNode.read(node.name, c)
    end

    test "the notes of an idle process leave by themselves", %{node: node, bufs: [a, b, _]} do
      before = info(node).buffers
      :ok = XlaNode.free_later(a)
      :ok = XlaNode.free_later(b)
      # Raw calls only: nothing of this process sends the notes.
      Harness.eventually(fn -> info(node).buffers == before - 2 end)
    end

    test "the notes of a process that exits leave with it", %{node: node, bufs: [a, b, c]} do
      before = info(node).buffers
      # Buffers this test process made, noted by another that then exits at once.
      Task.async(fn -> Enum.each([a, b, c], &XlaNode.free_later/1) end) |> Task.await()
      Harness.eventually(fn -> info(node).buffers == before - 3 end)
    end

    test "many notes leave without waiting for a request", %{node: node, before: before} do
      bufs = for i <- 1..300, do: XlaNode.to_device!(node.name, f32([1.0 * i]))
      {in0, _} = traffic(node)
      {in1, _} = traffic(node)
      Enum.each(bufs, &(:ok = XlaNode.free_later(&1)))
      {in2, _} = traffic(node)
      assert info(node).buffers < before + 3 + 300, "some left without a request"
      # One cast when the notes reached their bound (256), not one per free (and one more should
      # the rest idle long enough to leave by themselves).
      assert in2 - in1 - (in1 - in0) <= 2
      XlaNode.free_all([])
      assert info(node).buffers == before + 3
    end

    test "a free of something that is not a reference is an ArgumentError" do
      assert_raise ArgumentError, ~r/XlaNode.free_later\/1 takes the reference/, fn ->
        XlaNode.free_later(:xla@host)
      end
    end
  end

  describe "keep_on_device" do
    @three """
    func.func @main(%a: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<f32>) {
      %s = stablehlo.add %a, %a : tensor<2xf32>
      %p = stablehlo.multiply %a, %a : tensor<2xf32>
      %zero = stablehlo.constant dense<0.0> : tensor<f32>
      %t = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
      return %s, %p, %t : tensor<2xf32>, tensor<2xf32>, tensor<f32>
    }
    """

    test "a list keeps the results it names and returns the others, in order", %{node: node} do
      {:ok, exe} = call(node, {:compile, @three})
      a = f32([1.0, 3.0])

      assert {:ok, [s, p, t]} = call(node, {:run, exe, [a], [keep_on_device: [2, 0]]})
      assert is_reference(s) and is_reference(t)
      assert Tensor.to_list(p) == [1.0, 9.0]
      assert {:ok, {s_data, _}} = call(node, {:read, s})
      assert Tensor.to_list({s_data, {{:f, 32}, [2]}}) == [2.0, 6.0]
      assert {:ok, {<<4.0::float-little-32>>, {{:f, 32}, []}}} = call(node, {:read, t})

      # Every index listed is `true`; none is `false`.
      assert {:ok, [_, _, _] = all} = call(node, {:run, exe, [a], [keep_on_device: [0, 1, 2]]})
      assert Enum.all?(all, &is_reference/1)
      assert {:ok, [{_, _}, {_, _}, {_, _}]} = call(node, {:run, exe, [a], [keep_on_device: []]})
      GenServer.cast({:xla, node.name}, {:free, [s, t | all]})

      assert {:ok, [_, {_, _}, _]} = XlaNode.run(node.name, exe, [a], keep_on_device: [0, 2])
    end

    test "indices out of range, repeated or not integers are argument errors", %{node: node} do
      {:ok, exe} = call(node, {:compile, @three})
      a = f32([1.0, 3.0])
      buffers = info(node).buffers

      for {bad, message} <- [
            {[3], ~r/keep_on_device: result 3 does not exist \(the program has 3 results\)/},
            {[0, 0], ~r/keep_on_device lists result 0 twice/},
            {[-1], ~r/keep_on_device must be a boolean or a list of distinct result indices/},
            {[:a], ~r/keep_on_device must be a boolean or a list of distinct result indices/},
            {:yes, ~r/keep_on_device must be a boolean or a list of distinct result indices/}
          ] do
        assert {:error, {:argument_error, text}} =
                 call(node, {:run, exe, [a], [keep_on_device: bad]})

        assert text =~ message
      end

      assert info(node).buffers == buffers

      # The client checks what it can before sending: the node's result count it cannot know.
      for bad <- [[0, 0], [-1], [:a], :yes] do
        assert_raise ArgumentError,
                     ~r/option :keep_on_device must be a boolean or a list of distinct/,
                     fn ->
                       XlaNode.run(node.name, exe, [a], keep_on_device: bad)
                     end
      end

      assert {:error, %XlaNode.Error{kind: :argument_error, message: text}} =
               XlaNode.run(node.name, exe, [a], keep_on_device: [5])

      assert text =~ "result 5 does not exist"
    end
  end

  describe "a run whose results all stay on the device" do
    # Two 1024^3 products: a program XLA queues (on the CPU) or enqueues on the device's stream,
    # rather than running it within `Execute`.
    @heavy """
    func.func @main(%s: tensor<f32>) -> tensor<1024x1024xf32> {
      %a = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<1024x1024xf32>
      %b = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
      %c = stablehlo.dot_general %b, %a, contracting_dims = [1] x [0] : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
      %d = stablehlo.dot_general %c, %b, contracting_dims = [1] x [0] : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
      return %d : tensor<1024x1024xf32>
    }
    """

    # The same products, then a callback on four of their entries: while the test holds the
    # callback's reply, this run has not completed, and a run launched after it (XLA's CPU client
    # executes queued programs in order, client-wide) cannot complete either. The order of events, not their durations, is what the test asserts.
    defp holding_program do
      alias XlaNode.MLIR, as: M

      M.module(fn ->
        M.function("main", [{{:u, 8}, [8]}, {{:f, 32}, []}], fn [cb, s] ->
          a = M.broadcast_in_dim(s, [1024, 1024], [])
          b = M.dot_general(a, a)
          c = M.dot_general(b, a)
          head = c |> M.slice([0, 0], [1, 4]) |> M.reshape([4])
          M.runtime_call(cb, :hold, [head], [{{:f, 32}, [4]}])
        end)
      end)
    end

    # Starts a run of the holding program whose callback comes to the test; returns the task that
    # asked for it and the callback's reply tag, once the callback is waiting.
    defp hold(node, exe, s) do
      test = self()
      held = Task.async(fn -> call(node, {:run, exe, [s], [callback_server: test]}) end)
      assert_receive {:exla_runtime_call, :hold, [{head, _}], reply_tag}, 60_000
      {held, reply_tag, head}
    end

    defp release({held, {pid, ref}, head}) do
      send(pid, {ref, {:ok, [head]}})
      assert {:ok, [{^head, _}]} = Task.await(held, 60_000)
    end

    # On the CPU only: a GPU client enqueues a run's kernels as its host thread goes through the
    # program, so a run held at a callback does not hold the runs launched after it, and nothing
    # the test controls can hold a run that does not call back.
    @tag :cpu_only
    test "is answered once launched; a read waits for it; wait: true answers at completion", %{
      node: node
    } do
      {:ok, exe} = call(node, {:compile, @heavy})
      {:ok, holder} = call(node, {:compile, holding_program()})
      s = Tensor.scalar(0.125, {:f, 32})
      # Every entry 0.125^5 * 1024^4 = 2^25, exact in f32.
      expected = 33_554_432.0

      held = hold(node, holder, s)
      assert {:ok, [buffer]} = call(node, {:run, exe, [s], [keep_on_device: true]})
      assert info(node).runs_running == 2, "answered while the run still executes"
      read = Task.async(fn -> call(node, {:read, buffer}) end)
      assert Task.yield(read, 200) == nil, "the read answered before the run completed"
      release(held)
      assert {:ok, {data, _}} = Task.await(read, 60_000)
      assert <<^expected::float-little-32, _::binary>> = data

      held = hold(node, holder, s)
      test = self()

      waited =
        Task.async(fn ->
          {:ok, [w]} = call(node, {:run, exe, [s], [keep_on_device: true, wait: true]})
          send(test, :waited_answered)
          call(node, {:read, w})
        end)

      refute_receive :waited_answered, 200, "wait: true answered before the run completed"
      release(held)
      assert {:ok, {^data, _}} = Task.await(waited, 60_000)
      GenServer.cast({:xla, node.name}, {:free, [buffer, exe, holder]})
    end
  end
end
