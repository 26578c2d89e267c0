defmodule XlaNode.CallbackServerTest do
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog

  alias XlaNode.{CallbackServer, Tensor}

  doctest XlaNode.CallbackServer

  # What the node sends: {:exla_runtime_call, id, args, {pid, ref}}; the reply comes back to pid
  # as {ref, reply}.
  defp call_back(server, id, args) do
    ref = make_ref()
    send(server, {:exla_runtime_call, id, args, {self(), ref}})
    ref
  end

  # Generous: a reply that never comes fails the test, a slow machine must not.
  defp await(ref, timeout \\ 10_000) do
    receive do
      {^ref, reply} -> reply
    after
      timeout -> flunk("no reply for #{inspect(ref)}")
    end
  end

  defp double([x]) do
    values = Tensor.to_list(x) |> Enum.map(&(&1 * 2))
    {:ok, [Tensor.from_list(values, Tensor.type(x))]}
  end

  test "a map of callbacks, arity 1 and 2" do
    {:ok, cb} =
      CallbackServer.start_link(%{
        :erlang.term_to_binary({:any, :term}) => fn id, [_] -> {:ok, [id]} end,
        double: &double/1
      })

    x = Tensor.from_list([1.0, 2.5], :f32)

    assert await(call_back(cb, :double, [x])) ==
             {:ok, [elem(Tensor.from_list([2.0, 5.0], :f32), 0)]}

    id = :erlang.term_to_binary({:any, :term})
    assert await(call_back(cb, id, [x])) == {:ok, [id]}
  end

  test "a single function gets the id" do
    {:ok, cb} =
      CallbackServer.start_link(fn id, args -> {:ok, [<<id>> | Enum.map(args, &elem(&1, 0))]} end)

    x = Tensor.from_list([7], :u8)
    assert await(call_back(cb, 42, [x, x])) == {:ok, [<<42>>, <<7>>, <<7>>]}
  end

  test "2- and 4-bit tensors come and go as bitstrings" do
    {:ok, cb} =
      CallbackServer.start_link(%{double: &double/1, raw: fn _ -> {:ok, [<<0x5::3>>]} end})

    x = Tensor.from_list([1, -2, 3], :s4)
    assert elem(x, 0) == <<0x1E, 0x3::4>>
    assert await(call_back(cb, :double, [x])) == {:ok, [<<0x2C, 0x6::4>>]}
    assert await(call_back(cb, :raw, [])) == {:ok, [<<0x5::3>>]}
  end

  test "unknown callback ids" do
    {:ok, cb} = CallbackServer.start_link(%{known: &double/1})
    assert {:error, {:unknown_callback, msg}} = await(call_back(cb, :unknown, []))
    assert msg =~ ":unknown"
  end

  test "errors, exceptions, throws and exits become {kind, message} replies" do
    {:ok, cb} =
      CallbackServer.start_link(%{
        error: fn _ -> {:error, {:argument_error, "bad input"}} end,
        error_term: fn _ -> {:error, {:my_error, {1, 2}}} end,
        error_bare: fn _ -> {:error, :oops} end,
        raise: fn _ -> raise ArgumentError, "boom" end,
        raise_runtime: fn _ -> raise "kaboom" end,
        throw: fn _ -> throw(:ball) end,
        exit: fn _ -> exit(:bye) end,
        invalid: fn _ -> :what end,
        invalid_list: fn _ -> {:ok, [1, 2]} end
      })

    assert await(call_back(cb, :error, [])) == {:error, {:argument_error, "bad input"}}
    assert await(call_back(cb, :error_term, [])) == {:error, {:my_error, "{1, 2}"}}

    assert {:error, {:runtime_error, "Elixir callback error: :oops"}} =
             await(call_back(cb, :error_bare, []))

    assert await(call_back(cb, :raise, [])) ==
             {:error, {:runtime_error, "Elixir callback raised ArgumentError: boom"}}

    assert await(call_back(cb, :raise_runtime, [])) ==
             {:error, {:runtime_error, "Elixir callback raised RuntimeError: kaboom"}}

    assert await(call_back(cb, :throw, [])) ==
             {:error, {:runtime_error, "Elixir callback threw: :ball"}}

    assert await(call_back(cb, :exit, [])) ==
             {:error, {:runtime_error, "Elixir callback exited: :bye"}}

    assert {:error, {:runtime_error, "expected the callback" <> _}} =
             await(call_back(cb, :invalid, []))

    assert {:error, {:runtime_error, "expected the callback" <> _}} =
             await(call_back(cb, :invalid_list, []))

    # the server survived all of it
    assert Process.alive?(cb)
  end

  test "a callback process killed from outside still gets an answer" do
    test = self()

    {:ok, cb} =
      CallbackServer.start_link(%{
        hang: fn _ ->
          send(test, {:callback_pid, self()})
          Process.sleep(:infinity)
        end
      })

    ref = call_back(cb, :hang, [])
    assert_receive {:callback_pid, pid}
    Process.exit(pid, :kill)
    assert {:error, {:runtime_error, "Elixir callback exited: :killed"}} = await(ref)
  end

  test "a callback that ends its own process, even normally, still gets an answer" do
    {:ok, cb} =
      CallbackServer.start_link(%{
        normal: fn _ -> Process.exit(self(), :normal) end,
        killed: fn _ -> Process.exit(self(), :kill) end,
        fine: fn _ -> {:ok, []} end
      })

    assert {:error, {:runtime_error, "Elixir callback exited: :normal"}} =
             await(call_back(cb, :normal, []))

    assert {:error, {:runtime_error, "Elixir callback exited: :killed"}} =
             await(call_back(cb, :killed, []))

    # A callback that replied is not answered for again when its process ends.
    ref = call_back(cb, :fine, [])
    assert await(ref) == {:ok, []}
    refute_receive {^ref, _}, 100
  end

  test "slow callbacks do not block others" do
    {:ok, cb} =
      CallbackServer.start_link(%{
        slow: fn _ ->
          receive do
            :go -> {:ok, [<<1>>]}
          end
        end,
        fast: fn _ -> {:ok, [<<2>>]} end
      })

    slow = call_back(cb, :slow, [])
    fast = call_back(cb, :fast, [])
    assert await(fast) == {:ok, [<<2>>]}
    refute_received {^slow, _}

    # find the slow callback's process (the server monitors it) and release it
    {:monitors, monitors} = Process.info(cb, :monitors)
    for {:process, pid} <- monitors, do: send(pid, :go)
    assert await(slow) == {:ok, [<<1>>]}
  end

  test "put_callback adds callbacks" do
    {:ok, cb} = CallbackServer.start_link(%{})
    assert {:error, {:unknown_callback, _}} = await(call_back(cb, :late, []))
    :ok = CallbackServer.put_callback(cb, :late, fn [] -> {:ok, [<<9>>]} end)
    assert await(call_back(cb, :late, [])) == {:ok, [<<9>>]}

    {:ok, fun_cb} = CallbackServer.start_link(fn _, _ -> {:ok, []} end)
    assert CallbackServer.put_callback(fun_cb, :x, fn _ -> {:ok, []} end) == {:error, :not_a_map}
  end

  test "name registration and child specs" do
    name = :"cb_#{System.unique_integer([:positive])}"
    {:ok, pid} = CallbackServer.start_link(%{id: fn _ -> {:ok, [<<0>>]} end}, name: name)
    assert Process.whereis(name) == pid
    assert await(call_back(name, :id, [])) == {:ok, [<<0>>]}

    spec = CallbackServer.child_spec({%{}, name: :other})
    assert spec.id == :other
    assert spec.start == {CallbackServer, :start_link, [%{}, [name: :other]]}

    sup_name = :"cb_#{System.unique_integer([:positive])}"
    start_supervised!({CallbackServer, {%{}, name: sup_name}})
    assert is_pid(Process.whereis(sup_name))
  end

  test "bad arguments raise in the caller, before a process starts" do
    assert_raise ArgumentError, ~r/callbacks must be a function of two arguments/, fn ->
      CallbackServer.start_link(:nope)
    end

    assert_raise ArgumentError, ~r/option :outfeed must be a pid/, fn ->
      CallbackServer.start_link(%{}, outfeed: 12)
    end
  end

  describe "outfeed" do
    test "to a pid" do
      {:ok, cb} = CallbackServer.start_link(%{}, outfeed: self())
      x = Tensor.from_list([1, 2], :s32)
      send(cb, {:exla_outfeed, [x]})
      send(cb, {:exla_outfeed, [x, x]})
      assert_receive {:xla_outfeed, [^x]}
      assert_receive {:xla_outfeed, [^x, ^x]}
    end

    test "to a function, in order" do
      test = self()
      {:ok, cb} = CallbackServer.start_link(%{}, outfeed: fn args -> send(test, {:got, args}) end)
      for i <- 1..20, do: send(cb, {:exla_outfeed, [i]})
      for i <- 1..20, do: assert_receive({:got, [^i]})
    end

    test "a raising handler is logged and the server lives on" do
      {:ok, cb} = CallbackServer.start_link(%{}, outfeed: fn _ -> raise "nope" end)

      log =
        capture_log(fn ->
          send(cb, {:exla_outfeed, [:x]})
          CallbackServer.infeed_status(cb)
        end)

      assert log =~ "outfeed handler raised"
      assert Process.alive?(cb)
    end

    test "without a handler values are dropped" do
      {:ok, cb} = CallbackServer.start_link(%{})
      send(cb, {:exla_outfeed, [:x]})
      assert CallbackServer.infeed_status(cb) == %{queued: 0, waiting: 0}
    end
  end

  describe "infeed" do
    defp infeed(server, out_spec) do
      ref = make_ref()
      send(server, {:exla_infeed, {self(), ref}, out_spec})
      ref
    end

    @spec_f32 [{{:f, 32}, [2]}]

    test "pushed values are taken in order" do
      {:ok, cb} = CallbackServer.start_link(%{})
      a = <<1.0::float-little-32, 2.0::float-little-32>>
      b = Tensor.from_list([3.0, 4.0], :f32)
      :ok = CallbackServer.push_infeed(cb, [a])
      :ok = CallbackServer.push_infeed(cb, [b])
      assert CallbackServer.infeed_status(cb) == %{queued: 2, waiting: 0}

      assert await(infeed(cb, @spec_f32)) == {:ok, [a]}
      assert await(infeed(cb, @spec_f32)) == {:ok, [elem(b, 0)]}
      assert CallbackServer.infeed_status(cb) == %{queued: 0, waiting: 0}
    end

    test "a request on an empty queue waits for a push" do
      {:ok, cb} = CallbackServer.start_link(%{})
      first = infeed(cb, @spec_f32)
      second = infeed(cb, [{{:s, 8}, []}, {{:u, 16}, [3]}])
      Process.sleep(20)
      refute_received {^first, _}
      assert CallbackServer.infeed_status(cb) == %{queued: 0, waiting: 2}

      :ok = CallbackServer.push_infeed(cb, [<<0::64>>])
      assert await(first) == {:ok, [<<0::64>>]}
      refute_received {^second, _}

      :ok = CallbackServer.push_infeed(cb, [<<1>>, <<1::48>>])
      assert await(second) == {:ok, [<<1>>, <<1::48>>]}
      assert CallbackServer.infeed_status(cb) == %{queued: 0, waiting: 0}
    end

    test "2- and 4-bit values are sized in bits" do
      {:ok, cb} = CallbackServer.start_link(%{})
      :ok = CallbackServer.push_infeed(cb, [<<0::16>>])
      assert {:error, {:argument_error, msg}} = await(infeed(cb, [{{:u, 4}, [3]}]))
      assert msg =~ "[12] bits"
      assert msg =~ "got 1 of [16] bits"
      :ok = CallbackServer.push_infeed(cb, [Tensor.from_list([1, 2, 3], :u4)])
      assert await(infeed(cb, [{{:u, 4}, [3]}])) == {:ok, [<<0x12, 0x3::4>>]}
    end

    test "values of the wrong size are answered with an argument error" do
      {:ok, cb} = CallbackServer.start_link(%{})
      :ok = CallbackServer.push_infeed(cb, [<<1, 2, 3>>])
      assert {:error, {:argument_error, msg}} = await(infeed(cb, @spec_f32))
      assert msg =~ "[8]"
      :ok = CallbackServer.push_infeed(cb, [<<0::64>>, <<0::64>>])
      assert {:error, {:argument_error, _}} = await(infeed(cb, @spec_f32))
    end
  end
end
