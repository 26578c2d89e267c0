defmodule XlaNode.Compiler.TelemetryTest do
  # Not async: handlers see every process's events, and the compiles happen in the cache's
  # process; alone, the events here are this module's.
  use ExUnit.Case, async: false

  import Nx.Defn

  defp xla, do: Application.fetch_env!(:xla_node_nx, :test_node).name

  setup do
    # telemetry's own test handler: each event as a message {event, ref, measurements, metadata}.
    ref = :telemetry_test.attach_event_handlers(self(), XlaNode.Telemetry.events())
    on_exit(fn -> :telemetry.detach(ref) end)
    %{ref: ref}
  end

  # Every event received so far.
  defp events(ref) do
    receive do
      {event, ^ref, measurements, metadata} -> [{event, measurements, metadata} | events(ref)]
    after
      0 -> []
    end
  end

  defp of(events, op, kind), do: for({[:xla_node, ^op, ^kind], m, meta} <- events, do: {m, meta})

  def tripled(t, _opts), do: Nx.multiply(t, 3)

  defn telemetry_affine(x) do
    Nx.runtime_call(x, x, [], &tripled/2) + 1
  end

  test "compiles and runs carry the compiler and the function's key; callbacks are spans", %{
    ref: ref
  } do
    f = Nx.Defn.jit(&telemetry_affine/1, compiler: XlaNode.Compiler, node: xla())
    assert Nx.to_flat_list(f.(Nx.tensor([1.0, 2.0]))) == [4.0, 7.0]
    assert Nx.to_flat_list(f.(Nx.tensor([3.0, 4.0]))) == [10.0, 13.0]
    received = events(ref)

    # One compile (the second call has the same shapes), two runs, two callbacks.
    assert [{start, compile}] = of(received, :compile, :start)
    assert is_integer(start.monotonic_time) and is_integer(start.system_time)
    assert %{compiler: XlaNode.Compiler, node: node, key: key} = compile
    assert node == xla()
    assert [{stop, compiled}] = of(received, :compile, :stop)
    assert is_integer(stop.duration) and stop.duration > 0
    assert %{error: nil, exe: exe, key: ^key} = compiled
    assert is_reference(exe)

    runs = of(received, :run, :stop)
    assert length(of(received, :run, :start)) == 2
    assert length(runs) == 2

    for {m, meta} <- runs do
      assert is_integer(m.duration) and m.duration > 0
      assert %{compiler: XlaNode.Compiler, key: ^key, exe: ^exe, node: ^node, error: nil} = meta
    end

    callbacks = of(received, :callback, :stop)
    assert length(of(received, :callback, :start)) == 2
    assert length(callbacks) == 2
    assert Enum.all?(callbacks, fn {_, meta} -> meta.node == xla() and meta.error == nil end)
    assert of(received, :run, :exception) ++ of(received, :callback, :exception) == []
  end

  def raising(_t, _opts), do: raise(ArgumentError, "no tripling today")

  defn telemetry_raising(x) do
    Nx.runtime_call(x, x, [], &raising/2) + 1
  end

  test "a callback that raises: its :exception, the run's :stop with the node's error", %{
    ref: ref
  } do
    f = Nx.Defn.jit(&telemetry_raising/1, compiler: XlaNode.Compiler, node: xla())
    # The call raises the callback's exception, as under the Evaluator.
    assert_raise ArgumentError, "no tripling today", fn -> f.(Nx.tensor([1.0])) end
    received = events(ref)

    assert [{m, %{kind: :error, reason: %ArgumentError{}, stacktrace: [_ | _]}}] =
             of(received, :callback, :exception)

    assert is_integer(m.duration)
    assert [{_, %{error: %XlaNode.Error{kind: :runtime_error}}}] = of(received, :run, :stop)
    assert of(received, :run, :exception) == []
  end
end
