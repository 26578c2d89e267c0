defmodule XlaNode.ReadmeRequestsTest do
  @moduledoc """
  The README's `:xla` server table, row by row: every request form sent exactly as the table
  writes it, with `GenServer.call({:xla, node}, request)` from a BEAM node (no client library),
  every run option in each of its documented forms, the error kinds the README lists, and the
  README's "Using it" IEx session evaluated as written.

  The node runs with `--kernel-dir` (for the `:load_kernel` forms) and `--callback-timeout 2`
  (so that the `callback_timeout:` forms visibly override the default). Deeper checks of each
  request live next to its feature: compute_test.exs, callbacks_test.exs, kernels_test.exs,
  liveness_test.exs (a run that waits past its `queue_timeout`), xla_calls_test.exs (`:echo` of
  every term type).
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, Load}

  @readme Path.expand("../../README.md", __DIR__)
  @root Path.expand("../..", __DIR__)

  # The README's example program.
  @add_one """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %y = stablehlo.add %x, %one : tensor<4xf32>
    return %y : tensor<4xf32>
  }
  """

  @f32x4 {{:f, 32}, [4]}

  setup_all do
    Harness.ensure_kernels!()
    dir = Path.join(System.tmp_dir!(), "xn_readme_kernels_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    File.cp!(Harness.kernel_library("02"), Path.join(dir, "libk02.so"))
    File.cp!(Harness.kernel_library("03"), Path.join(dir, "libk03.so"))

    outside =
      Path.join(System.tmp_dir!(), "xn_readme_outside_#{System.unique_integer([:positive])}.so")

    File.cp!(Harness.kernel_library("02"), outside)

    on_exit(fn ->
      File.rm_rf(dir)
      File.rm(outside)
    end)

    Harness.start_shared_node(args: ["--kernel-dir", dir, "--callback-timeout", "2"])
    |> Map.merge(%{kernel_dir: dir, outside: outside})
  end

  defp call(node, request, timeout \\ 30_000),
    do: GenServer.call({:xla, node.name}, request, timeout)

  defp f32(list),
    do: {for(v <- list, into: <<>>, do: <<v::float-32-little>>), {{:f, 32}, [length(list)]}}

  defp to_f32(bin), do: for(<<v::float-32-little <- bin>>, do: v)

  defp compile!(node, mlir) do
    assert {:ok, exe} = call(node, {:compile, mlir})
    assert is_reference(exe)
    exe
  end

  # main(x: f32[4]) = TARGET(x), a custom call of a native kernel in EXLA's form.
  defp kernel_program(target) do
    """
    func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %r = stablehlo.custom_call @#{target}(%x) {api_version = 4 : i32, backend_config = {}} : (tensor<4xf32>) -> tensor<4xf32>
      return %r : tensor<4xf32>
    }
    """
  end

  defp kernels(node) do
    {:ok, %{kernels: kernels}} = call(node, :info)
    kernels
  end

  # Runs the kernel loaded as `target` on [1, 2, 3, 4]: xn_increment gives [2, 3, 4, 5].
  defp assert_increments(node, target) do
    exe = compile!(node, kernel_program(target))
    assert {:ok, [{bin, @f32x4}]} = call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])]})
    assert to_f32(bin) == [2.0, 3.0, 4.0, 5.0]
  end

  test ":ping answers :pong", %{node: node} do
    assert call(node, :ping) == :pong
  end

  test "{:echo, term} answers the term", %{node: node} do
    for term <- [
          :atom,
          42,
          -1.5,
          "text",
          {1, [2, %{3 => <<4::3>>}]},
          self(),
          make_ref(),
          :binary.copy(<<7>>, 1_048_576)
        ] do
      assert call(node, {:echo, term}) === term
    end
  end

  # It loads a native kernel, a host (CPU) handler, and names the platform "cpu".
  @tag :cpu_only
  test ":info answers every key the README lists, with values that make sense", %{
    node: node,
    kernel_dir: dir
  } do
    exe = compile!(node, @add_one)
    assert {:ok, [_]} = call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])]})
    assert call(node, {:load_kernel, "readme_info_increment", "libk02.so", "xn_increment"}) == :ok

    assert {:ok, info} = call(node, :info)
    name = node.name

    assert %{
             node: ^name,
             version: version,
             uptime_ms: uptime_ms,
             peers: peers,
             processes: processes,
             platform: "cpu",
             devices: [_ | _] = devices,
             host_callbacks: true,
             plugin: plugin,
             pjrt_api_version: pjrt_api_version,
             executables: executables,
             buffers: buffers,
             compiles: compiles,
             cache_hits: cache_hits,
             runs: runs,
             runs_running: runs_running,
             runs_queued: runs_queued,
             queue_timeouts: queue_timeouts,
             callbacks: callbacks,
             kernels: kernels
           } = info

    assert version =~ ~r/^\d+\.\d+\.\d+/
    assert is_integer(uptime_ms) and uptime_ms > 0
    assert node() in peers
    assert is_integer(processes) and processes >= 1
    assert Enum.all?(devices, &is_binary/1)
    assert File.regular?(plugin)
    assert pjrt_api_version =~ ~r/^\d+\.\d+$/
    assert executables >= 1 and compiles >= 1 and runs >= 1

    for n <- [buffers, cache_hits, runs_running, runs_queued, queue_timeouts],
        do: assert(is_integer(n) and n >= 0)

    assert %{
             sent: _,
             replies: _,
             errors: _,
             timeouts: _,
             reply_wait_us: _,
             pending: _,
             outfeeds: _,
             open_runs: _
           } = callbacks

    assert Enum.all?(Map.values(callbacks), &(is_integer(&1) and &1 >= 0))

    assert %{library: library, symbol: "xn_increment", ffi_version: "0.2", shimmed: false} =
             Enum.find(kernels, &(&1.target == "readme_info_increment"))

    assert library == Path.join(dir, "libk02.so")
  end

  test "{:compile, mlir} with MLIR text and with MLIR bytecode, and {:compile, mlir, []}", %{
    node: node
  } do
    x = f32([1.0, 2.0, 3.0, 4.0])

    text_exe = compile!(node, @add_one)
    assert {:ok, [{bin, @f32x4}]} = call(node, {:run, text_exe, [x]})
    assert to_f32(bin) == [2.0, 3.0, 4.0, 5.0]

    # The same module as bytecode, as JAX serializes what it lowers.
    out = Path.join(System.tmp_dir!(), "xn_readme_#{System.unique_integer([:positive])}.mlirbc")
    on_exit(fn -> File.rm(out) end)

    {log, status} =
      System.cmd("python3", [Path.join(@root, "integration/jax/bytecode.py"), out],
        env: [{"PYTHONPATH", Harness.jax_path()}],
        stderr_to_stdout: true
      )

    assert status == 0, "integration/jax/bytecode.py failed:\n#{log}"
    bytecode = File.read!(out)
    assert <<"ML", 0xEF, "R", _::binary>> = bytecode
    bytecode_exe = compile!(node, bytecode)
    assert {:ok, [{^bin, @f32x4}]} = call(node, {:run, bytecode_exe, [x]})

    # With the (empty) options list; cached by content.
    {:ok, %{cache_hits: hits}} = call(node, :info)
    assert {:ok, exe} = call(node, {:compile, @add_one, []})
    assert {:ok, [{^bin, @f32x4}]} = call(node, {:run, exe, [x]})
    assert {:ok, %{cache_hits: hits_after}} = call(node, :info)
    assert hits_after == hits + 1
  end

  test "{:describe, exe} gives what a run takes and gives; {:describe, buffer} its shape and device",
       %{node: node} do
    {:ok, exe} = call(node, {:compile, @add_one})

    assert {:ok, %{parameters: [@f32x4], results: [@f32x4], devices: []}} =
             call(node, {:describe, exe})

    x = {<<1.0::float-32-little, 2.0::float-32-little, 3.0::float-32-little, 4.0::float-32-little>>, @f32x4}
    {:ok, buffer} = call(node, {:to_device, x})
    assert {:ok, %{shape: @f32x4, device: 0}} = call(node, {:describe, buffer})
    assert {:ok, %{shape: @f32x4, device: 0}} = XlaNode.describe(node.name, buffer)
    call(node, {:free, buffer})

    # An upload not yet done is not a buffer yet: the request says so.
    {:ok, upload} = call(node, {:upload, @f32x4})
    assert {:error, {:argument_error, message}} = call(node, {:describe, upload})
    assert message =~ "is an upload not yet done"
  end

  test "{:run, exe, args}: one result per output leaf, in order", %{node: node} do
    exe =
      compile!(node, """
      func.func @main(%x: tensor<4xf32>, %k: tensor<i32>) -> (tensor<4xf32>, tensor<i32>, tensor<2x2xf32>) {
        %one = stablehlo.constant dense<1.0> : tensor<4xf32>
        %y = stablehlo.add %x, %one : tensor<4xf32>
        %m = stablehlo.reshape %x : (tensor<4xf32>) -> tensor<2x2xf32>
        return %y, %k, %m : tensor<4xf32>, tensor<i32>, tensor<2x2xf32>
      }
      """)

    {xbin, _} = x = f32([1.0, 2.0, 3.0, 4.0])

    assert {:ok,
            [{y, @f32x4}, {<<-7::signed-little-32>>, {{:s, 32}, []}}, {^xbin, {{:f, 32}, [2, 2]}}]} =
             call(node, {:run, exe, [x, {<<-7::signed-little-32>>, {{:s, 32}, []}}]})

    assert to_f32(y) == [2.0, 3.0, 4.0, 5.0]
  end

  test "{:run, exe, args, opts} with keep_on_device: true gives buffers", %{node: node} do
    exe = compile!(node, @add_one)
    x = f32([1.0, 2.0, 3.0, 4.0])

    assert {:ok, [buf]} = call(node, {:run, exe, [x], [keep_on_device: true]})
    assert is_reference(buf)
    assert {:ok, [{bin, @f32x4}]} = call(node, {:run, exe, [buf], [keep_on_device: false]})
    assert to_f32(bin) == [3.0, 4.0, 5.0, 6.0]
    assert {:ok, [{^bin, @f32x4}]} = call(node, {:run, exe, [buf], []})
  end

  test "{:run, exe, args, opts} with callback_server: pid, atom and {atom, node}", %{node: node} do
    exe = compile!(node, Load.callback_program(:readme_plus_one))
    {xbin, _} = x = f32([1.0, 2.0, 3.0, 4.0])
    expected = Load.plus_one(xbin)
    name = :"readme_callbacks_#{System.unique_integer([:positive])}"
    server = Load.callback_server(0, name)
    on_exit(fn -> Process.exit(server, :kill) end)

    # A bare atom names a process registered on the node that asked for the run.
    for dest <- [server, name, {name, node()}] do
      assert {:ok, [{^expected, @f32x4}]} = call(node, {:run, exe, [x], [callback_server: dest]}),
             "callback_server: #{inspect(dest)}"
    end
  end

  test "{:run, exe, args, opts} with callback_timeout: ms and :infinity, over the node's --callback-timeout",
       %{node: node} do
    exe = compile!(node, Load.callback_program(:readme_slow))
    {xbin, _} = x = f32([1.0, 2.0, 3.0, 4.0])
    expected = Load.plus_one(xbin)
    # Answers each callback after 3 s: past the node's 2 s default.
    slow = Load.callback_server(3_000)
    on_exit(fn -> Process.exit(slow, :kill) end)

    assert {:error, {:runtime_error, message}} =
             call(node, {:run, exe, [x], [callback_server: slow]})

    assert message =~ "timed out"

    for timeout <- [10_000, :infinity] do
      assert {:ok, [{^expected, @f32x4}]} =
               call(node, {:run, exe, [x], [callback_server: slow, callback_timeout: timeout]}),
             "callback_timeout: #{inspect(timeout)}"
    end
  end

  test "{:run, exe, args, opts} with queue_timeout: ms and :infinity", %{node: node} do
    exe = compile!(node, @add_one)
    {_, @f32x4} = x = f32([1.0, 2.0, 3.0, 4.0])

    for timeout <- [0, 5_000, :infinity] do
      assert {:ok, [{bin, @f32x4}]} = call(node, {:run, exe, [x], [queue_timeout: timeout]}),
             "queue_timeout: #{inspect(timeout)}"

      assert to_f32(bin) == [2.0, 3.0, 4.0, 5.0]
    end

    # All four options at once.
    server = Load.callback_server(0)
    on_exit(fn -> Process.exit(server, :kill) end)
    cb_exe = compile!(node, Load.callback_program(:readme_all_options))

    opts = [
      keep_on_device: true,
      callback_server: server,
      callback_timeout: 10_000,
      queue_timeout: :infinity
    ]

    assert {:ok, [buf]} = call(node, {:run, cb_exe, [x], opts})
    assert {:ok, {bin, @f32x4}} = call(node, {:read, buf})
    assert to_f32(bin) == [2.0, 3.0, 4.0, 5.0]
  end

  test "{:to_device, tensor} and {:read, buffer} give back the same tensor", %{node: node} do
    for tensor <- [
          f32([1.5, -2.0, 0.0, 1.0e30]),
          {<<1::signed-little-64, -2::signed-little-64, 3::signed-little-64, 4::signed-little-64,
             5::signed-little-64, 6::signed-little-64>>, {{:s, 64}, [2, 3]}},
          {<<255>>, {{:u, 8}, []}},
          {<<1, 0, 1>>, {{:pred, 8}, [3]}}
        ] do
      assert {:ok, buf} = call(node, {:to_device, tensor})
      assert is_reference(buf)
      assert call(node, {:read, buf}) == {:ok, tensor}
    end
  end

  test "{:free, exe_or_buffer} frees an executable and a buffer", %{node: node} do
    exe = compile!(node, @add_one)
    assert {:ok, buf} = call(node, {:to_device, f32([1.0, 2.0, 3.0, 4.0])})
    {:ok, %{executables: executables, buffers: buffers}} = call(node, :info)

    assert call(node, {:free, buf}) == :ok
    assert call(node, {:free, exe}) == :ok
    assert {:ok, %{executables: executables_after, buffers: buffers_after}} = call(node, :info)
    assert {executables_after, buffers_after} == {executables - 1, buffers - 1}

    assert {:error, {:argument_error, m}} = call(node, {:read, buf})
    assert m =~ "unknown or freed reference"
    assert {:error, {:argument_error, m}} = call(node, {:run, exe, [f32([1.0, 2.0, 3.0, 4.0])]})
    assert m =~ "unknown or freed reference"
    assert {:error, {:argument_error, m}} = call(node, {:free, exe})
    assert m =~ "unknown or freed reference"
  end

  test "owner: on {:to_device, ...}, {:upload, ...} and {:run, ...}; {:share, refs, pid}, {:give_away, refs, pid}, {:release, refs} and {:release, refs, pid}",
       %{node: node} do
    holder = fn -> spawn(fn -> receive do: (:stop -> :ok) end) end
    {owner, other} = {holder.(), holder.()}
    exe = compile!(node, @add_one)
    {:ok, %{buffers: n0}} = call(node, :info)

    # Made for `owner` by a process that is gone at once.
    [placed, uploaded, kept] =
      fn ->
        {:ok, placed} =
          call(node, {:to_device, f32([1.0, 2.0, 3.0, 4.0]), [device: 1, owner: owner]})

        {:ok, upload} = call(node, {:upload, {{:f, 32}, [4]}, [device: 1, owner: owner]})
        GenServer.cast({:xla, node.name}, {:upload, upload, elem(f32([0.0, 0.0, 0.0, 0.0]), 0)})
        {:ok, uploaded} = call(node, {:upload_done, upload})
        {:ok, [kept]} = call(node, {:run, exe, [placed], [keep_on_device: true, owner: owner]})
        [placed, uploaded, kept]
      end
      |> Task.async()
      |> Task.await()

    assert {:ok, {bin, @f32x4}} = call(node, {:read, kept})
    assert to_f32(bin) == [2.0, 3.0, 4.0, 5.0]

    # This process holds one more: shared, then given away, then released.
    assert call(node, {:share, [placed, uploaded], self()}) == :ok
    GenServer.cast({:xla, node.name}, {:share, kept, self()})
    assert call(node, {:give_away, kept, other}) == :ok
    assert call(node, {:release, [placed, uploaded]}) == :ok
    assert {:error, {:argument_error, m}} = call(node, {:release, kept})
    assert m =~ "is not held by"

    # Owner's holds end with it; other's hold on `kept` stays until released.
    send(owner, :stop)
    assert Harness.eventually(fn -> elem(call(node, :info), 1).buffers == n0 + 1 end)
    assert call(node, {:release, kept, other}) == :ok
    assert {:ok, %{buffers: ^n0}} = call(node, :info)
    GenServer.cast({:xla, node.name}, {:release, [kept], other})
    send(other, :stop)
  end

  # Native kernels are host (CPU) handlers.
  @tag :cpu_only
  test "{:load_kernel, target, path, symbol}: loads, again :ok, and programs call it", %{
    node: node,
    kernel_dir: dir
  } do
    assert call(node, {:load_kernel, "readme_increment", "libk02.so", "xn_increment"}) == :ok
    assert call(node, {:load_kernel, "readme_increment", "libk02.so", "xn_increment"}) == :ok

    assert call(
             node,
             {:load_kernel, "readme_increment", Path.join(dir, "libk02.so"), "xn_increment"}
           ) == :ok

    assert_increments(node, "readme_increment")

    assert %{symbol: "xn_increment", shimmed: false} =
             Enum.find(kernels(node), &(&1.target == "readme_increment"))
  end

  # Native kernels are host (CPU) handlers.
  @tag :cpu_only
  test "{:load_kernel, target, path, symbol, [version_shim: bool]}", %{node: node} do
    # An FFI 0.3 build loads with the shim, and is refused without it.
    assert {:error, {:kernel_error, m}} =
             call(
               node,
               {:load_kernel, "readme_shim_off", "libk03.so", "xn_increment",
                [version_shim: false]}
             )

    assert m =~ "built against XLA FFI 0.3"

    assert call(
             node,
             {:load_kernel, "readme_shim_on", "libk03.so", "xn_increment", [version_shim: true]}
           ) == :ok

    assert call(
             node,
             {:load_kernel, "readme_shim_no", "libk02.so", "xn_increment", [version_shim: false]}
           ) == :ok

    assert %{ffi_version: "0.3", shimmed: true} =
             Enum.find(kernels(node), &(&1.target == "readme_shim_on"))

    assert %{ffi_version: "0.2", shimmed: false} =
             Enum.find(kernels(node), &(&1.target == "readme_shim_no"))

    refute Enum.find(kernels(node), &(&1.target == "readme_shim_off"))
    assert_increments(node, "readme_shim_on")
    assert_increments(node, "readme_shim_no")
  end

  test ":spawn_echo gives a process of the node that answers :ping and {:echo, t}, and stops as documented",
       %{node: node} do
    for stop <- [&GenServer.stop(&1, :normal), &Process.exit(&1, :kill)] do
      assert {:ok, pid} = call(node, :spawn_echo)
      assert is_pid(pid) and node(pid) == node.name
      assert GenServer.call(pid, :ping) == :pong
      assert GenServer.call(pid, {:echo, {:hello, [1]}}) == {:hello, [1]}
      ref = Process.monitor(pid)
      stop.(pid)
      assert_receive {:DOWN, ^ref, :process, ^pid, _}, 5_000
    end
  end

  describe "errors" do
    test "argument_error names the argument index, the expected and the given", %{node: node} do
      exe = compile!(node, @add_one)

      assert {:error, {:argument_error, m}} =
               call(node, {:run, exe, [{<<0::128>>, {{:s, 32}, [4]}}]})

      assert m =~ "argument 0" and m =~ "f32[4]" and m =~ "s32[4]"
      assert {:error, {:argument_error, m}} = call(node, {:run, exe, [{<<1, 2, 3>>, @f32x4}]})
      assert m =~ "argument 0" and m =~ "16" and m =~ "3 bytes"
      assert {:error, {:argument_error, m}} = call(node, {:run, exe, []})
      assert m =~ "expected 1 arguments, got 0"
    end

    test "compile_error carries XLA's text", %{node: node} do
      assert {:error, {:compile_error, m}} =
               call(
                 node,
                 {:compile, "func.func @main() -> tensor<f32> { return %nothing : tensor<f32> }"}
               )

      assert m =~ "undeclared SSA value"
    end

    test "unknown and freed references are argument errors", %{node: node} do
      for request <- [{:run, make_ref(), []}, {:read, make_ref()}, {:free, make_ref()}] do
        assert {:error, {:argument_error, m}} = call(node, request)
        assert m =~ "unknown or freed reference"
      end
    end

    test "unknown options are argument errors naming them", %{node: node} do
      exe = compile!(node, @add_one)
      x = f32([1.0, 2.0, 3.0, 4.0])

      assert {:error, {:argument_error, m}} = call(node, {:run, exe, [x], [keep_on_devise: true]})
      assert m =~ "keep_on_devise" and m =~ "keep_on_device"
      assert {:error, {:argument_error, m}} = call(node, {:compile, @add_one, [optimize: true]})
      assert m =~ "optimize"

      assert {:error, {:argument_error, m}} =
               call(node, {:load_kernel, "readme_opt", "libk02.so", "xn_increment", [shim: true]})

      assert m =~ "shim" and m =~ "version_shim"

      # Known options with values of the wrong kind.
      for opt <- [
            keep_on_device: :yes,
            callback_server: "cb",
            callback_timeout: -1,
            queue_timeout: :soon
          ] do
        assert {:error, {:argument_error, m}} = call(node, {:run, exe, [x], [opt]})
        assert m =~ Atom.to_string(elem(opt, 0))
      end

      assert {:error, {:argument_error, m}} =
               call(
                 node,
                 {:load_kernel, "readme_opt", "libk02.so", "xn_increment", [version_shim: :yes]}
               )

      assert m =~ "version_shim must be a boolean"
    end

    test "kernel_error for a library outside --kernel-dir", %{
      node: node,
      kernel_dir: dir,
      outside: outside
    } do
      assert {:error, {:kernel_error, m}} =
               call(node, {:load_kernel, "readme_outside", outside, "xn_increment"})

      assert m =~ "outside the directories allowed by --kernel-dir (#{dir})"
      refute Enum.find(kernels(node), &(&1.target == "readme_outside"))
    end

    test "an unknown request is a bad_request, and the server lives on", %{node: node} do
      for request <- [:pong, {:compile}, {:echo, 1, 2}, {:load_kernel, "t", "p"}, "ping"] do
        assert {:error, {:bad_request, m}} = call(node, request)
        assert m =~ "unknown request"
      end

      assert call(node, :ping) == :pong
    end
  end

  # The "Using it" IEx session: `{code, printed}` per `iex>` prompt, `printed` the lines shown
  # after it (nil when none), with the README's node name replaced by `node`'s.
  defp readme_session(node) do
    [_, section] = String.split(File.read!(@readme), "\n## Using it\n", parts: 2)
    [_, rest] = String.split(section, "```elixir\n", parts: 2)
    [block | _] = String.split(rest, "\n```", parts: 2)

    block
    |> String.replace("xla@myhost", Atom.to_string(node))
    |> String.split("\n")
    |> Enum.reduce([], fn
      "$ " <> _shell, steps -> steps
      "", steps -> steps
      "iex> " <> code, steps -> [{[code], []} | steps]
      "...> " <> more, [{code, printed} | steps] -> [{[more | code], printed} | steps]
      "...>" <> more, [{code, printed} | steps] -> [{[more | code], printed} | steps]
      line, [{code, printed} | steps] -> [{code, [line | printed]} | steps]
    end)
    |> Enum.reverse()
    |> Enum.map(fn {code, printed} ->
      {code |> Enum.reverse() |> Enum.join("\n"),
       if(printed != [], do: printed |> Enum.reverse() |> Enum.join("\n"))}
    end)
  end

  test "the README's \"Using it\" session, as written, from a BEAM node of its own", %{node: node} do
    steps = readme_session(node.name)
    assert Enum.any?(steps, fn {code, _} -> code =~ "{:compile, mlir}" end)
    assert Enum.any?(steps, fn {code, _} -> code =~ "{:run, exe," end)

    # A fresh node: its only hidden connection is the one the session makes.
    peer = Harness.start_peer()

    for {code, value, shown} <-
          Harness.peer_call(peer, XlaNode.PeerHelpers, :eval_session, [steps], 60_000),
        shown != :none do
      assert value == shown,
             "iex> #{code}\ngave #{inspect(value)}; the README shows #{inspect(shown)}"
    end
  end
end
