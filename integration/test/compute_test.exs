defmodule XlaNode.ComputeTest do
  @moduledoc """
  The `:xla` server as a user drives it from another node: compile, run, device buffers, the
  checks made before XLA sees anything, ownership of executables and buffers, and concurrency.
  """
  use ExUnit.Case, async: true

  alias XlaNode.Harness

  setup_all do
    Harness.start_shared_node()
  end

  defp call(node, request, timeout \\ 30_000),
    do: GenServer.call({:xla, node.name}, request, timeout)

  defp compile!(node, mlir) do
    assert {:ok, exe} = call(node, {:compile, mlir})
    assert is_reference(exe)
    exe
  end

  defp f32(list), do: for(v <- list, into: <<>>, do: <<v::float-32-little>>)
  defp to_f32(bin), do: for(<<v::float-32-little <- bin>>, do: v)

  @add_one """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %y = stablehlo.add %x, %one : tensor<4xf32>
    return %y : tensor<4xf32>
  }
  """

  # Each Nx type: how to encode [1, 2, 3] (pred: [1, 0, 1]) and what `x + x` gives back.
  @types [
    {{:s, 8}, "i8"},
    {{:s, 16}, "i16"},
    {{:s, 32}, "i32"},
    {{:s, 64}, "i64"},
    {{:u, 8}, "ui8"},
    {{:u, 16}, "ui16"},
    {{:u, 32}, "ui32"},
    {{:u, 64}, "ui64"},
    {{:f, 16}, "f16"},
    {{:bf, 16}, "bf16"},
    {{:f, 32}, "f32"},
    {{:f, 64}, "f64"},
    {{:c, 64}, "complex<f32>"},
    {{:c, 128}, "complex<f64>"},
    {{:pred, 8}, "i1"}
  ]

  defp encode({:s, n}, vs), do: for(v <- vs, into: <<>>, do: <<v::signed-little-size(n)>>)
  defp encode({:u, n}, vs), do: for(v <- vs, into: <<>>, do: <<v::unsigned-little-size(n)>>)
  defp encode({:f, n}, vs), do: for(v <- vs, into: <<>>, do: <<v * 1.0::float-little-size(n)>>)
  # bf16 is the upper half of an f32: exact for small integers.
  defp encode({:bf, 16}, vs),
    do: for(v <- vs, into: <<>>, do: binary_part(<<v * 1.0::float-little-32>>, 2, 2))

  defp encode({:c, n}, vs),
    do:
      for(
        v <- vs,
        into: <<>>,
        do: <<v * 1.0::float-little-size(div(n, 2)), 0.5::float-little-size(div(n, 2))>>
      )

  defp encode({:pred, 8}, vs), do: for(v <- vs, into: <<>>, do: <<v>>)

  test "x + x is right for every Nx type", %{node: node} do
    for {type, mlir_type} <- @types do
      mlir = """
      func.func @main(%x: tensor<3x#{mlir_type}>) -> tensor<3x#{mlir_type}> {
        %y = stablehlo.add %x, %x : tensor<3x#{mlir_type}>
        return %y : tensor<3x#{mlir_type}>
      }
      """

      exe = compile!(node, mlir)

      {input, expected} =
        case type do
          # pred addition is logical or
          {:pred, 8} ->
            {encode(type, [1, 0, 1]), encode(type, [1, 0, 1])}

          # complex: (v + 0.5i) * 2
          {:c, n} ->
            {encode(type, [1, 2, 3]),
             for(
               v <- [2, 4, 6],
               into: <<>>,
               do: <<v * 1.0::float-little-size(div(n, 2)), 1.0::float-little-size(div(n, 2))>>
             )}

          _ ->
            {encode(type, [1, 2, 3]), encode(type, [2, 4, 6])}
        end

      assert {:ok, [{^expected, {^type, [3]}}]} = call(node, {:run, exe, [{input, {type, [3]}}]}),
             "#{inspect(type)}"
    end
  end

  test "a multi-output program returns every result in order", %{node: node} do
    exe =
      compile!(node, """
      func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<i32>) {
        %s = stablehlo.add %a, %b : tensor<2xf32>
        %p = stablehlo.multiply %a, %b : tensor<2xf32>
        %k = stablehlo.constant dense<42> : tensor<i32>
        return %s, %p, %k : tensor<2xf32>, tensor<2xf32>, tensor<i32>
      }
      """)

    assert {:ok,
            [{s, {{:f, 32}, [2]}}, {p, {{:f, 32}, [2]}}, {<<42::little-32>>, {{:s, 32}, []}}]} =
             call(
               node,
               {:run, exe,
                [{f32([1.0, 2.0]), {{:f, 32}, [2]}}, {f32([3.0, 4.0]), {{:f, 32}, [2]}}]}
             )

    assert to_f32(s) == [4.0, 6.0]
    assert to_f32(p) == [3.0, 8.0]
  end

  # To 1e-5: an f32 dot_general at default precision runs in TF32 on an NVIDIA GPU (~1e-3).
  @tag :cpu_only
  test "an MLP layer (dot_general, tanh, reduce) matches values computed here", %{node: node} do
    exe =
      compile!(node, """
      func.func @main(%x: tensor<2x3xf32>, %w: tensor<3x4xf32>, %b: tensor<4xf32>) -> (tensor<2x4xf32>, tensor<f32>) {
        %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
        %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<4xf32>) -> tensor<2x4xf32>
        %z = stablehlo.add %d, %bb : tensor<2x4xf32>
        %h = stablehlo.tanh %z : tensor<2x4xf32>
        %zero = stablehlo.constant dense<0.0> : tensor<f32>
        %sum = stablehlo.reduce(%h init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<f32>
        return %h, %sum : tensor<2x4xf32>, tensor<f32>
      }
      """)

    x = [[0.1, -0.2, 0.3], [0.5, 0.25, -0.75]]
    w = for i <- 0..2, do: for(j <- 0..3, do: (i + 1) * 0.1 - j * 0.05)
    b = [0.01, -0.02, 0.03, -0.04]

    expected =
      for row <- x do
        for {bj, j} <- Enum.with_index(b) do
          z =
            Enum.sum(for {xi, i} <- Enum.with_index(row), do: xi * Enum.at(Enum.at(w, i), j)) + bj

          :math.tanh(z)
        end
      end

    args = [
      {f32(List.flatten(x)), {{:f, 32}, [2, 3]}},
      {f32(List.flatten(w)), {{:f, 32}, [3, 4]}},
      {f32(b), {{:f, 32}, [4]}}
    ]

    assert {:ok, [{h, {{:f, 32}, [2, 4]}}, {<<sum::float-32-little>>, {{:f, 32}, []}}]} =
             call(node, {:run, exe, args})

    for {got, want} <- Enum.zip(to_f32(h), List.flatten(expected)),
        do: assert_in_delta(got, want, 1.0e-5)

    assert_in_delta sum, Enum.sum(List.flatten(expected)), 1.0e-5
  end

  test "compiling the same module twice is a cache hit", %{node: node} do
    mlir = String.replace(@add_one, "1.0", "7.0")
    {:ok, %{cache_hits: hits}} = call(node, :info)
    compile!(node, mlir)
    compile!(node, mlir)
    {:ok, %{cache_hits: hits_after}} = call(node, :info)
    assert hits_after >= hits + 1
  end

  test ":info names the platform and whether its programs can call host callbacks", %{node: node} do
    platform = Harness.platform()

    assert {:ok, %{platform: ^platform, host_callbacks: true, devices: [_ | _]}} =
             call(node, :info)
  end

  test "invalid MLIR is a compile error and the node keeps serving", %{node: node} do
    for bad <- [
          "",
          "garbage",
          "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> { return %y : tensor<4xf32> }",
          <<0, 255, 3>>
        ] do
      assert {:error, {kind, message}} = call(node, {:compile, bad})
      assert kind in [:compile_error, :argument_error]
      assert is_binary(message) and message != ""
    end

    assert {:error, {:argument_error, _}} = call(node, {:compile, ~c"not a binary"})
    assert call(node, :ping) == :pong
  end

  test "wrong arity, dtype, dims and byte size are argument errors naming the argument", %{
    node: node
  } do
    exe = compile!(node, @add_one)
    good = {f32([1.0, 2.0, 3.0, 4.0]), {{:f, 32}, [4]}}

    assert {:error, {:argument_error, m}} = call(node, {:run, exe, []})
    assert m =~ "expected 1 arguments, got 0"
    assert {:error, {:argument_error, m}} = call(node, {:run, exe, [good, good]})
    assert m =~ "got 2"

    assert {:error, {:argument_error, m}} =
             call(node, {:run, exe, [{<<0::128>>, {{:s, 32}, [4]}}]})

    assert m =~ "argument 0" and m =~ "f32[4]" and m =~ "s32[4]"

    assert {:error, {:argument_error, m}} =
             call(node, {:run, exe, [{f32([1.0, 2.0]), {{:f, 32}, [2]}}]})

    assert m =~ "argument 0" and m =~ "f32[2]"

    assert {:error, {:argument_error, m}} =
             call(node, {:run, exe, [{<<1, 2, 3>>, {{:f, 32}, [4]}}]})

    assert m =~ "argument 0" and m =~ "3 bytes"

    assert {:error, {:argument_error, m}} =
             call(node, {:run, exe, [{<<1::32>>, {{:f, 31}, [1]}}]})

    assert m =~ "unknown tensor type"
    assert {:error, {:argument_error, _}} = call(node, {:run, exe, [good], [bogus: true]})
    assert {:ok, [_]} = call(node, {:run, exe, [good]})
  end

  test "unknown and freed references are clear errors", %{node: node} do
    exe = compile!(node, @add_one)
    assert {:error, {:argument_error, m}} = call(node, {:run, make_ref(), []})
    assert m =~ "unknown or freed reference"
    assert {:ok, buf} = call(node, {:to_device, {f32([1.0, 2.0, 3.0, 4.0]), {{:f, 32}, [4]}}})
    assert call(node, {:free, buf}) == :ok
    assert {:error, {:argument_error, m}} = call(node, {:read, buf})
    assert m =~ "unknown or freed reference"
    assert {:error, {:argument_error, m}} = call(node, {:run, exe, [buf]})
    assert m =~ "argument 0"
    assert {:error, {:argument_error, _}} = call(node, {:free, buf})
    assert {:error, {:argument_error, m}} = call(node, {:run, exe, [exe]})
    assert m =~ "not a buffer"
  end

  test "device buffers: to_device, run with keep_on_device, read, free", %{node: node} do
    exe = compile!(node, @add_one)
    assert {:ok, buf} = call(node, {:to_device, {f32([1.0, 2.0, 3.0, 4.0]), {{:f, 32}, [4]}}})
    assert {:ok, [out]} = call(node, {:run, exe, [buf], [keep_on_device: true]})
    assert is_reference(out)
    assert {:ok, [out2]} = call(node, {:run, exe, [out], [keep_on_device: true]})
    assert {:ok, {bin, {{:f, 32}, [4]}}} = call(node, {:read, out2})
    assert to_f32(bin) == [3.0, 4.0, 5.0, 6.0]
    assert {:ok, [{bin, _}]} = call(node, {:run, exe, [buf]})
    assert to_f32(bin) == [2.0, 3.0, 4.0, 5.0]
    for r <- [buf, out, out2, exe], do: assert(call(node, {:free, r}) == :ok)
  end

  test "a caller that dies frees its executables and buffers", %{node: node} do
    {:ok, %{buffers: b0, executables: e0}} = call(node, :info)
    parent = self()

    {pid, ref} =
      spawn_monitor(fn ->
        {:ok, _} = call(node, {:compile, @add_one})

        for _ <- 1..3,
            do: {:ok, _} = call(node, {:to_device, {f32([0.0, 0.0, 0.0, 0.0]), {{:f, 32}, [4]}}})

        send(parent, :allocated)
      end)

    assert_receive :allocated, 10_000
    assert_receive {:DOWN, ^ref, :process, ^pid, :normal}

    assert Harness.eventually(fn ->
             {:ok, %{buffers: b, executables: e}} = call(node, :info)
             b == b0 and e == e0
           end)
  end

  test "a peer node that disconnects has its buffers freed", %{node: node} do
    {:ok, %{buffers: b0}} = call(node, :info)
    peer = Harness.start_peer()
    tensor = {f32([1.0, 2.0, 3.0, 4.0]), {{:f, 32}, [4]}}
    # A long-lived process on the peer owns the buffer; the peer then goes away entirely.
    [{mod, bin}] =
      Code.compile_string("""
      defmodule XlaNode.ComputeTest.Owner do
        def start(xla, tensor, reply_to) do
          spawn(fn ->
            send(reply_to, {:owned, GenServer.call(xla, {:to_device, tensor})})
            Process.sleep(:infinity)
          end)
        end
      end
      """)

    {:module, ^mod} = Harness.peer_call(peer, :code, :load_binary, [mod, ~c"owner.ex", bin])
    Harness.peer_call(peer, mod, :start, [{:xla, node.name}, tensor, self()])
    assert_receive {:owned, {:ok, _buffer}}, 10_000
    {:ok, %{buffers: b1}} = call(node, :info)
    assert b1 == b0 + 1
    Harness.stop_peer(peer)
    assert Harness.eventually(fn -> match?({:ok, %{buffers: ^b0}}, call(node, :info)) end, 10_000)
  end

  # A `while` loop of `n` steps over a 16-element vector (shared with the Rust tests).
  @long_loop_path Path.expand("../../tests/fixtures/long_loop.mlir", __DIR__)
  @external_resource @long_loop_path
  @long_loop File.read!(@long_loop_path)

  # The CPU client runs programs side by side on threads; a GPU runs them in turn on the
  # device's stream, so there the tiny runs wait for the long one by design.
  @tag :cpu_only
  @tag timeout: 120_000
  test "a run that never ends does not delay 100 tiny runs from other callers" do
    # A node of this test's own, for a run of 2^62 steps: it still executes when the test ends,
    # and goes with the node.
    node = Harness.start_node()
    long = compile!(node, @long_loop)
    tiny = compile!(node, @add_one)
    x = {:binary.copy(<<0::32>>, 16), {{:f, 32}, [16]}}
    steps = {<<2 ** 62::little-signed-64>>, {{:s, 64}, []}}

    caller =
      spawn_link(fn -> GenServer.call({:xla, node.name}, {:run, long, [steps, x]}, :infinity) end)

    assert Harness.eventually(fn -> runs_running(node) == 1 end)

    tiny_done =
      1..100
      |> Task.async_stream(
        fn i ->
          {:ok, [{bin, _}]} =
            call(node, {:run, tiny, [{f32([i * 1.0, 0.0, 0.0, 0.0]), {{:f, 32}, [4]}}]})

          {i, to_f32(bin)}
        end,
        max_concurrency: 20
      )
      |> Enum.map(fn {:ok, {i, out}} -> assert out == [i + 1.0, 1.0, 1.0, 1.0] end)

    assert length(tiny_done) == 100
    assert Process.alive?(caller), "the long run is still executing"
  end

  defp runs_running(node) do
    {:ok, %{runs_running: running}} = call(node, :info)
    running
  end
end
