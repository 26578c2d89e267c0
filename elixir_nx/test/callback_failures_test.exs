defmodule XlaNode.CallbackFailuresTest do
  @moduledoc """
  What the caller of a function jitted with `XlaNode.Compiler` gets when one of its callbacks
  (`Nx.runtime_call/4`, `hook/3`, `print_value/2`) fails, against `Nx.Defn.Evaluator`, which
  runs them in the caller's process: the same exception (struct and stacktrace), throw or exit,
  and for a `runtime_call` whose result does not match its template, the Evaluator's
  `RuntimeError`. Callbacks inside the program and `callbacks: :split` alike. Failures the
  Evaluator cannot have (the callback's process killed or ended, a callback timeout, the node
  down: see compiler_test.exs) are an `XlaNode.Error` that says what happened.
  """
  use ExUnit.Case, async: true

  import Nx.Defn

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  defmodule Refused do
    defexception [:message, :value]
  end

  # The runtime_call callback of these tests (defn takes named captures only): fails, or not,
  # as opts[:how] says.
  def callback(t, opts) do
    case opts[:how] do
      :raise -> raise ArgumentError, "no callback today"
      :raise_own -> raise Refused, message: "refused", value: Nx.to_flat_list(t)
      :throw -> throw({:ball, 1})
      :exit -> exit(:gone_fishing)
      {:call, target} -> GenServer.call(target, :anyone_there?)
      :negative_refused -> if Nx.to_number(Nx.sum(t)) < 0, do: raise("negative"), else: t
      :kill -> Process.exit(self(), :kill)
      :end_normally -> Process.exit(self(), :normal)
      {:late, test} -> send(test, {:callback, self()}) && receive(do: (:fail -> raise "late"))
      :shape -> Nx.concatenate([t, t])
      :type -> Nx.as_type(t, :f64)
      :rank -> Nx.reshape(t, {1, 2})
      :tuple -> {t}
      :number -> 1.0
      :atom -> :not_a_tensor
    end
  end

  # For a template {x, x}.
  def container_callback({a, b}, opts) do
    case opts[:how] do
      :missing -> {a}
      :extra -> {a, b, b}
      :map -> %{a: a, b: b}
    end
  end

  def plus_one(t, _opts), do: Nx.add(t, 1)

  defn(call(x, opts \\ []), do: Nx.runtime_call(x, x, [how: opts[:how]], &callback/2) * 2)

  defn call_two(x, opts \\ []) do
    Nx.runtime_call({x, x}, {x, x}, [how: opts[:how]], &container_callback/2)
  end

  # hook/2 and print_value/2 with a function of the test's (outside defn: inside, the function
  # must be known when the module compiles).
  defp hooked(fun), do: &(&1 |> Nx.multiply(2) |> Nx.Defn.Kernel.hook(fun) |> Nx.add(1))
  defp printed(fun), do: &(&1 |> Nx.multiply(2) |> Nx.Defn.Kernel.print_value(fun) |> Nx.add(1))
  defn(named_hook(x), do: hook(x * 2, :doubled) + 1)

  # The second of two runtime_calls fails, the first runs.
  defn second_fails(x, opts \\ []) do
    y = Nx.runtime_call(x, x, [], &plus_one/2)
    Nx.runtime_call(y, y, [how: opts[:how]], &callback/2)
  end

  defn in_while(x, opts \\ []) do
    {_i, x} =
      while {i = 0, x}, i < 2 do
        {i + 1, Nx.runtime_call(x, x, [how: opts[:how]], &callback/2)}
      end

    x
  end

  # What calling `fun` gives: its result, or how it failed.
  defp outcome(fun) do
    {:ok, fun.(), []}
  rescue
    exception -> {:raise, exception, __STACKTRACE__}
  catch
    kind, reason -> {kind, reason, __STACKTRACE__}
  end

  # Runs `fun` on `args` under the Evaluator and XlaNode.Compiler (callbacks inside the
  # program, and split), with `opts` besides, asserts that each fails as the Evaluator does,
  # and returns how.
  defp assert_fails_as_evaluator(fun, args, opts \\ []) do
    {modes, opts} = Keyword.pop(opts, :modes, [:inside, :split])
    # Inside the program where the node's platform runs host callbacks.
    modes = if host_callbacks?(), do: modes, else: modes -- [:inside]
    evaluator = Nx.Defn.jit(fun, [compiler: Nx.Defn.Evaluator] ++ opts)
    {kind, reason, _} = theirs = outcome(fn -> apply(evaluator, args) end)

    assert kind != :ok, "the Evaluator did not fail: #{inspect(theirs)}"

    for callbacks <- modes do
      jit_opts = [compiler: XlaNode.Compiler, node: xla(), callbacks: callbacks] ++ opts

      assert {^kind, ^reason, _stacktrace} =
               outcome(fn -> apply(Nx.Defn.jit(fun, jit_opts), args) end),
             "callbacks: #{callbacks}"

      assert_clean_mailbox()
    end

    {kind, reason}
  end

  defp host_callbacks?, do: XlaNode.Compiler.Cache.node_info(xla()).host_callbacks

  # Nothing of the failed run is left in the caller's mailbox.
  defp assert_clean_mailbox do
    assert {:messages, []} = Process.info(self(), :messages)
  end

  @x Nx.tensor([1.0, 2.0])

  test "a runtime_call that raises raises the exception itself, where it was raised" do
    assert {:raise, %ArgumentError{message: "no callback today"}} =
             assert_fails_as_evaluator(&call/2, [@x, [how: :raise]])

    # An exception of the caller's own, with its fields.
    assert {:raise, %Refused{message: "refused", value: [1.0, 2.0]}} =
             assert_fails_as_evaluator(&call/2, [@x, [how: :raise_own]])

    # The stacktrace is the callback's: it names the function that raised.
    f = Nx.Defn.jit(&call/2, compiler: XlaNode.Compiler, node: xla())
    {:raise, _, stacktrace} = outcome(fn -> f.(@x, how: :raise) end)

    assert Enum.any?(stacktrace, &match?({__MODULE__, :callback, 2, _}, &1)),
           Exception.format_stacktrace(stacktrace)
  end

  test "a runtime_call that throws or exits throws or exits with the same value" do
    assert {:throw, {:ball, 1}} = assert_fails_as_evaluator(&call/2, [@x, [how: :throw]])
    assert {:exit, :gone_fishing} = assert_fails_as_evaluator(&call/2, [@x, [how: :exit]])
  end

  test "a runtime_call that calls a dead process, here or on a node that is down, exits as it" do
    dead = spawn(fn -> :ok end)
    ref = Process.monitor(dead)
    assert_receive {:DOWN, ^ref, _, _, _}

    assert {:exit, {:noproc, {GenServer, :call, [^dead, :anyone_there?, 5000]}}} =
             assert_fails_as_evaluator(&call/2, [@x, [how: {:call, dead}]])

    remote = {:nobody, :nowhere@nohost}

    assert {:exit, {{:nodedown, :nowhere@nohost}, {GenServer, :call, _}}} =
             assert_fails_as_evaluator(&call/2, [@x, [how: {:call, remote}]])
  end

  test "a runtime_call whose result does not match its template raises the Evaluator's error" do
    for wrong <- [:shape, :type, :rank, :tuple, :number, :atom] do
      assert {:raise,
              %RuntimeError{
                message: "expected the runtime_call function to match the given output template"
              }} = assert_fails_as_evaluator(&call/2, [@x, [how: wrong]])
    end

    # A container template: too few or too many members, or another kind of container.
    for wrong <- [:missing, :extra, :map] do
      assert {:raise, %RuntimeError{message: "expected the runtime_call" <> _}} =
               assert_fails_as_evaluator(&call_two/2, [@x, [how: wrong]])
    end
  end

  test "hooks and print_value that fail fail the call as they did" do
    assert {:raise, %ArgumentError{message: "no hooking"}} =
             assert_fails_as_evaluator(hooked(fn _ -> raise ArgumentError, "no hooking" end), [@x])

    assert {:throw, :hooked} = assert_fails_as_evaluator(hooked(fn _ -> throw(:hooked) end), [@x])
    assert {:exit, :hooked} = assert_fails_as_evaluator(hooked(fn _ -> exit(:hooked) end), [@x])

    # A named hook given by the hooks: option.
    assert {:raise, %RuntimeError{message: "overridden"}} =
             assert_fails_as_evaluator(&named_hook/1, [@x],
               hooks: %{doubled: fn _ -> raise "overridden" end}
             )

    # print_value's function.
    assert {:raise, %Enum.OutOfBoundsError{}} =
             assert_fails_as_evaluator(printed(fn _ -> Enum.fetch!([], 0) end), [@x])
  end

  test "the failing one of several callbacks, and one inside a while, fail the call as they did" do
    assert {:raise, %ArgumentError{}} =
             assert_fails_as_evaluator(&second_fails/2, [@x, [how: :raise]])

    assert {:throw, {:ball, 1}} = assert_fails_as_evaluator(&in_while/2, [@x, [how: :throw]])
  end

  test "the program and the node are fine after a failed call" do
    f = Nx.Defn.jit(&call/2, compiler: XlaNode.Compiler, node: xla())
    assert_raise RuntimeError, "negative", fn -> f.(Nx.negate(@x), how: :negative_refused) end
    assert Nx.to_flat_list(f.(@x, how: :negative_refused)) == [2.0, 4.0]
    assert_clean_mailbox()
  end

  describe "failures the Evaluator cannot have are an XlaNode.Error" do
    # With callbacks inside the program, the default on CPU.
    @describetag :cpu_only

    test "the callback's process killed, or ended normally, at once" do
      for {how, reason} <- [kill: :killed, end_normally: :normal] do
        # Under the Evaluator these would end the caller itself. Answered at once, not when
        # the callback timeout (here longer than the test's) runs out.
        error =
          assert_raise XlaNode.Error, fn ->
            Nx.Defn.jit(&call/2,
              compiler: XlaNode.Compiler,
              node: xla(),
              callback_timeout: 600_000
            ).(@x, how: how)
          end

        assert error.kind == :runtime_error
        assert error.message =~ "Elixir callback exited: #{inspect(reason)}"
        assert_clean_mailbox()
      end
    end

    test "a callback that outlives its timeout; failing later, it changes nothing" do
      f = Nx.Defn.jit(&call/2, compiler: XlaNode.Compiler, node: xla(), callback_timeout: 200)
      error = assert_raise XlaNode.Error, fn -> f.(@x, how: {:late, self()}) end
      assert error.message =~ "timed out after 200 ms"
      assert_receive {:callback, callback}
      ref = Process.monitor(callback)
      send(callback, :fail)
      assert_receive {:DOWN, ^ref, _, _, _}
      refute_receive _, 100
    end
  end
end
