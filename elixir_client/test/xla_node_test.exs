defmodule XlaNodeTest do
  use ExUnit.Case, async: true

  alias XlaNode.{Error, Tensor}

  doctest XlaNode

  # A stand-in for the node's `:xla` server: it answers like the node does and records requests.
  defmodule FakeXla do
    use GenServer

    def start_link(test_pid), do: GenServer.start_link(__MODULE__, test_pid)

    @impl true
    def init(test_pid), do: {:ok, test_pid}

    @impl true
    def handle_call(request, from, test_pid) do
      send(test_pid, {:request, request})

      reply =
        case request do
          :ping ->
            :pong

          :info ->
            {:ok, %{node: node(), platform: "fake"}}

          {:compile, "bad" <> _} ->
            {:error, {:compile_error, "cannot parse the module"}}

          {:compile, _} ->
            {:ok, make_ref()}

          {:compile, _, _} ->
            {:ok, make_ref()}

          {:describe, _exe} ->
            {:ok, %{parameters: [{{:f, 32}, [2]}], results: [{{:f, 32}, [1]}], devices: [0, 1]}}

          {:run, _exe, [{_, {{:f, 32}, _}} = x]} ->
            {:ok, [x]}

          {:run, _exe, _args} ->
            {:error, {:argument_error, "expected 1 arguments, got 0"}}

          {:run, _exe, _args, opts} ->
            if(opts[:keep_on_device], do: {:ok, [make_ref()]}, else: {:ok, []})

          {:to_device, t} ->
            {:ok, {:buffer, t}}

          {:read, {:buffer, t}} ->
            {:ok, t}

          {:read, _} ->
            {:error, {:argument_error, "unknown or freed reference"}}

          {:free, {:buffer, _}} ->
            :ok

          {:free, _} ->
            {:error, {:argument_error, "unknown or freed reference"}}

          {:load_kernel, "taken", _, _, _} ->
            {:error, {:kernel_error, "target taken is already served by /k/lib.so"}}

          {:load_kernel, _, _, _, _} ->
            :ok
        end

      GenServer.reply(from, reply)
      {:noreply, test_pid}
    end
  end

  setup do
    {:ok, server} = FakeXla.start_link(self())
    %{server: server}
  end

  test "a node atom means {:xla, node}" do
    assert XlaNode.server(:a@b) == {:xla, :a@b}
    pid = self()
    assert XlaNode.server(pid) == pid
    assert XlaNode.server({:global, :x}) == {:global, :x}
  end

  test "describe asks the node for an executable's types", %{server: s} do
    exe = make_ref()

    assert {:ok, %{results: [{{:f, 32}, [1]}], devices: [0, 1]}} = XlaNode.describe(s, exe)
    assert_received {:request, {:describe, ^exe}}
  end

  test "ping and info", %{server: s} do
    assert XlaNode.ping(s) == :pong
    assert {:ok, %{platform: "fake"}} = XlaNode.info(s)
  end

  test "compile sends {:compile, mlir} and accepts iodata", %{server: s} do
    assert {:ok, ref} = XlaNode.compile(s, ["module", " {}"])
    assert is_reference(ref)
    assert_received {:request, {:compile, "module {}"}}
    assert is_reference(XlaNode.compile!(s, "module {}", timeout: 1_000))
    # :timeout stays here
    assert_received {:request, {:compile, "module {}"}}
  end

  test "compile errors", %{server: s} do
    assert {:error, %Error{kind: :compile_error, message: "cannot parse the module"}} =
             XlaNode.compile(s, "bad mlir")

    assert_raise Error, "compile_error: cannot parse the module", fn ->
      XlaNode.compile!(s, "bad mlir")
    end
  end

  test "run", %{server: s} do
    x = Tensor.from_list([1.0, 2.0], :f32)
    assert {:ok, [^x]} = XlaNode.run(s, make_ref(), [x])
    assert [^x] = XlaNode.run!(s, make_ref(), [x], timeout: 5_000)
    assert_received {:request, {:run, _, [^x]}}

    assert {:error, %Error{kind: :argument_error}} = XlaNode.run(s, make_ref(), [])

    assert_raise Error, ~r/^argument_error: expected 1/, fn -> XlaNode.run!(s, make_ref(), []) end
  end

  test "run options go to the node; a bare callback_server name gets this node", %{server: s} do
    assert {:ok, [ref]} = XlaNode.run(s, :exe, [], keep_on_device: true, timeout: 1_000)
    assert is_reference(ref)
    assert_received {:request, {:run, :exe, [], [keep_on_device: true]}}

    XlaNode.run(s, :exe, [], callback_server: MyCallbacks, callback_timeout: 10)
    me = node()

    assert_received {:request,
                     {:run, :exe, [], [callback_server: {MyCallbacks, ^me}, callback_timeout: 10]}}

    pid = self()
    XlaNode.run(s, :exe, [], callback_server: pid)
    assert_received {:request, {:run, :exe, [], [callback_server: ^pid]}}
  end

  test "buffers", %{server: s} do
    t = Tensor.from_list([1, 2], :s64)
    assert {:ok, buf} = XlaNode.to_device(s, t)
    assert XlaNode.to_device!(s, t) == buf
    assert {:ok, ^t} = XlaNode.read(s, buf)
    assert XlaNode.read!(s, buf) == t
    assert XlaNode.free(s, buf) == :ok
    assert XlaNode.free!(s, buf) == :ok
    assert {:error, %Error{kind: :argument_error}} = XlaNode.free(s, :nope)
    assert {:error, %Error{kind: :argument_error}} = XlaNode.read(s, :nope)
    assert_raise Error, fn -> XlaNode.read!(s, :nope) end
    assert_raise Error, fn -> XlaNode.free!(s, :nope) end
  end

  test "load_kernel sends strings and the version_shim option; checks its arguments first", %{
    server: s
  } do
    assert :ok = XlaNode.load_kernel(s, :my_op, ~c"lib/k.so", "MyOp")
    assert_received {:request, {:load_kernel, "my_op", "lib/k.so", "MyOp", []}}
    assert :ok = XlaNode.load_kernel!(s, "my_op", "k.so", :MyOp, version_shim: true)
    assert_received {:request, {:load_kernel, "my_op", "k.so", "MyOp", [version_shim: true]}}

    assert {:error, %Error{kind: :kernel_error, message: "target taken" <> _}} =
             XlaNode.load_kernel(s, "taken", "k.so", "MyOp")

    assert_raise Error, ~r/kernel_error/, fn -> XlaNode.load_kernel!(s, "taken", "k.so", "S") end
    assert_received {:request, {:load_kernel, "taken", _, "MyOp", _}}
    assert_received {:request, {:load_kernel, "taken", _, "S", _}}

    for {args, message} <- [
          {["", "k.so", "S"], "target must be a non-empty string"},
          {["t", "", "S"], "path must not be empty"},
          {["t", 42, "S"], "path must be a string"},
          {["t", "k.so", 7], "symbol must be a non-empty string"}
        ] do
      assert {:error, %Error{kind: :argument_error, message: got}} =
               apply(XlaNode, :load_kernel, [s | args])

      assert got =~ message
    end

    refute_received {:request, _}
  end

  test "a dead server gives :noproc instead of exiting" do
    {pid, ref} = spawn_monitor(fn -> :ok end)
    assert_receive {:DOWN, ^ref, _, _, _}

    assert {:error, %Error{kind: :noproc}} = XlaNode.ping(pid)
    assert {:error, %Error{kind: :noproc}} = XlaNode.compile({:not_registered, node()}, "m")
    assert_raise Error, ~r/^noproc: /, fn -> XlaNode.run!(pid, :exe, []) end
  end

  test "an unreachable node gives :nodedown instead of exiting" do
    assert {:error, %Error{kind: :nodedown}} = XlaNode.ping(:"nobody@nowhere.invalid")
    assert {:error, %Error{kind: :nodedown}} = XlaNode.info(:"nobody@nowhere.invalid")

    assert_raise Error, ~r/^nodedown: /, fn ->
      XlaNode.compile!(:"nobody@nowhere.invalid", "m")
    end
  end

  test "a server that does not answer gives :timeout" do
    {:ok, silent} = Agent.start_link(fn -> nil end)
    :sys.suspend(silent)

    assert {:error, %Error{kind: :timeout, message: msg}} = XlaNode.ping(silent, timeout: 50)
    assert msg =~ "no reply"
    assert {:error, %Error{kind: :timeout}} = XlaNode.run(silent, :exe, [], timeout: 10)

    assert_raise Error, ~r/^timeout: /, fn ->
      XlaNode.to_device!(silent, {<<>>, {{:f, 32}, [0]}}, timeout: 10)
    end

    :sys.resume(silent)
  end
end
