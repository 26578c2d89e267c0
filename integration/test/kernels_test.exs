defmodule XlaNode.KernelsTest do
  @moduledoc """
  Native kernels: XLA FFI handler libraries written for `jax.ffi` (here
  `integration/kernels/test_kernels.cc`, built by `scripts/kernels.sh` against the headers of the
  jaxlib 0.8.1 wheel, FFI 0.2, and of jaxlib 0.10.2, FFI 0.3), loaded by a real node at start-up
  and at run time, and called from programs in EXLA's form and in the form JAX itself emits.
  JAX 0.8.1, calling the same library, is the counterpart the results are checked against.
  """
  use ExUnit.Case, async: true

  # The kernels are host (CPU) handlers, registered for XLA's Host platform and called with
  # host memory; the JAX counterpart runs on CPU too.
  @moduletag :cpu_only

  alias XlaNode.{Harness, Tensor}
  alias XlaNode.MLIR, as: M

  @root Path.expand("../..", __DIR__)
  @kernels_dir Path.join(@root, "target/kernels")
  @ffi02 Path.join(@kernels_dir, "libxn_test_kernels_ffi02.so")
  @ffi03 Path.join(@kernels_dir, "libxn_test_kernels_ffi03.so")
  @symbols ~w(xn_add_scaled xn_sum_max xn_attrs xn_fail xn_increment)

  setup_all do
    Harness.ensure_kernels!()
  end

  defp kernel_args(lib, symbols \\ @symbols),
    do: Enum.flat_map(symbols, &["--kernel", "#{&1}=#{lib}:#{&1}"])

  defp f32(list), do: Tensor.from_list(list, {:f, 32})

  # xn_add_scaled(x, n) on f32[dims].
  defp add_scaled_module(n, dims) do
    kernel_call("xn_add_scaled", [{{:f, 32}, dims}], [{{:f, 32}, dims}], [{"n", "#{n} : f32"}])
  end

  # A module whose main(params) is one call of the kernel `target` on those parameters, in the
  # form a user writes with XlaNode.MLIR: EXLA's (api_version = 4, backend_config).
  defp kernel_call(target, params, results, config \\ []) do
    M.module(fn ->
      M.function("main", params, fn args -> M.custom_call(target, args, results, backend_config: config) end)
    end)
  end

  defp add_scaled(xs, n) do
    for x <- xs do
      <<y::float-32>> = <<x * n + :math.sin(x)::float-32>>
      y
    end
  end

  defp assert_close(got, expected) do
    assert Enum.all?(Enum.zip(got, expected), fn {g, e} -> abs(g - e) <= 1.0e-5 * max(1.0, abs(e)) end),
           "got #{inspect(got)}, expected #{inspect(expected)}"
  end

  # Starts a node binary that is expected to stop during start-up; returns its exit status and
  # its output.
  defp start_failing(args) do
    name = Harness.unique_name("xla_kfail")

    System.cmd(
      "timeout",
      ["30", Harness.bin_path(), "--sname", name, "--cookie", "#{Harness.cookie()}"] ++ Harness.node_args() ++ args,
      stderr_to_stdout: true,
      env: [{"XLA_NODE_LOG", "warn"}]
    )
  end

  describe "loaded at start-up" do
    setup do
      %{node: Harness.start_node(args: kernel_args(@ffi02))}
    end

    test ":info lists the kernels; a program calls one and gets its results", %{node: node} do
      {:ok, info} = XlaNode.info(node.name)
      assert length(info.kernels) == length(@symbols)

      add = Enum.find(info.kernels, &(&1.target == "xn_add_scaled"))
      assert add == %{target: "xn_add_scaled", library: @ffi02, symbol: "xn_add_scaled", ffi_version: "0.2", shimmed: false}

      xs = [0.5, -1.25, 3.0, 0.0, 10.0, -7.5]
      exe = XlaNode.compile!(node.name, add_scaled_module(2.5, [2, 3]))
      [y] = XlaNode.run!(node.name, exe, [Tensor.from_list(xs, {:f, 32}, [2, 3])])
      assert Tensor.shape(y) == [2, 3]
      assert_close(Tensor.to_flat_list(y), add_scaled(xs, 2.5))
    end

    test "a kernel with several results", %{node: node} do
      text = kernel_call("xn_sum_max", [{{:f, 32}, [5]}], [{{:f, 32}, []}, {{:f, 32}, []}])

      exe = XlaNode.compile!(node.name, text)
      [sum, max] = XlaNode.run!(node.name, exe, [f32([1.0, -2.0, 8.5, 3.0, 0.25])])
      assert Tensor.to_number(sum) == 10.75
      assert Tensor.to_number(max) == 8.5
    end

    test "attributes of every kind reach the kernel", %{node: node} do
      config = [
        {"a_i8", "-8 : i8"},
        {"a_i16", "-1600 : i16"},
        {"a_i32", "-320000 : i32"},
        {"a_i64", "-6400000000 : i64"},
        {"a_u8", "200 : ui8"},
        {"a_u16", "60000 : ui16"},
        {"a_u32", "4000000000 : ui32"},
        {"a_u64", "9000000000000 : ui64"},
        {"a_f32", "1.5 : f32"},
        {"a_f64", "-2.25 : f64"},
        {"a_pred", "true"},
        {"arr_i64", "array<i64: 1, -2, 3>"},
        {"arr_f32", "array<f32: 0.5, 1.5>"},
        {"name", ~s("héllo")},
        {"dict", ~s({k = 7 : i64, scale = 0.25 : f32, label = "abcd"})}
      ]

      name_bytes = byte_size("héllo")
      results = [{{:f, 64}, [11]}, {{:f, 64}, [5]}, {{:u, 8}, [name_bytes]}, {{:f, 64}, [3]}]

      text = kernel_call("xn_attrs", [], results, config)

      exe = XlaNode.compile!(node.name, text)
      [scalars, arrays, name, dict] = XlaNode.run!(node.name, exe, [])

      assert Tensor.to_list(scalars) ==
               [-8.0, -1600.0, -320_000.0, -6_400_000_000.0, 200.0, 60000.0, 4_000_000_000.0, 9_000_000_000_000.0, 1.5, -2.25, 1.0]

      assert Tensor.to_list(arrays) == [1.0, -2.0, 3.0, 0.5, 1.5]
      assert elem(name, 0) == "héllo"
      assert Tensor.to_list(dict) == [7.0, 0.25, 4.0]
    end

    test "a kernel's error fails the run with its message, and the node keeps serving", %{node: node} do
      failing = kernel_call("xn_fail", [{{:f, 32}, [2]}], [{{:f, 32}, [2]}], [{"message", ~s("no luck today")}])

      exe = XlaNode.compile!(node.name, failing)
      assert {:error, %XlaNode.Error{kind: :runtime_error, message: message}} = XlaNode.run(node.name, exe, [f32([1.0, 2.0])])
      assert message =~ "xn_fail: no luck today"

      # Attributes the kernel cannot decode are its error too, not the node's.
      wrong = kernel_call("xn_add_scaled", [{{:f, 32}, [2]}], [{{:f, 32}, [2]}], [{"n", ~s("not a number")}])

      exe2 = XlaNode.compile!(node.name, wrong)
      assert {:error, %XlaNode.Error{kind: :runtime_error}} = XlaNode.run(node.name, exe2, [f32([1.0, 2.0])])
      assert :pong = XlaNode.ping(node.name)
    end

    test "a kernel's error in a run answered at launch reaches the caller at the next use of its results", %{node: node} do
      # A matrix product of 1024x1024 before the kernel: XLA's CPU client runs that on its own
      # threads, after the launch.
      n = 1024
      t = {{:f, 32}, [n, n]}

      failing =
        M.module(fn ->
          M.function("main", [t], fn [a] ->
            p = M.dot_general(a, a, contracting: {[1], [0]})
            M.custom_call("xn_fail", [p], [t], backend_config: [{"message", ~s("late news")}])
          end)
        end)

      exe = XlaNode.compile!(node.name, failing)
      x = f32(List.duplicate(1.0, n * n)) |> then(fn {data, _} -> {data, t} end)

      {:ok, [buffer]} = XlaNode.run(node.name, exe, [x], keep_on_device: true)
      assert {:error, %XlaNode.Error{kind: :runtime_error, message: message}} = XlaNode.read(node.name, buffer)
      assert message =~ "xn_fail: late news"
      # A run taking it meets the same error; the node keeps serving.
      assert {:error, %XlaNode.Error{kind: :runtime_error, message: message}} = XlaNode.run(node.name, exe, [buffer])
      assert message =~ "xn_fail: late news"
      assert :pong = XlaNode.ping(node.name)
    end

    test "a program naming a target that is not loaded: a compile error listing the loaded kernels", %{node: node} do
      text = kernel_call("xn_nowhere", [{{:f, 32}, [2]}], [{{:f, 32}, [2]}])

      assert {:error, %XlaNode.Error{kind: :compile_error, message: message}} = XlaNode.compile(node.name, text)
      assert message =~ "No FFI handler registered for xn_nowhere"
      assert message =~ "Loaded kernels: xn_add_scaled (#{@ffi02}:xn_add_scaled)"
    end

    test "1,000 runs alternating a failing and a working kernel call leave nothing behind", %{node: node} do
      fail = kernel_call("xn_fail", [{{:f, 32}, []}], [{{:f, 32}, []}], [{"message", ~s("every other time")}])

      inc = kernel_call("xn_increment", [{{:f, 32}, []}], [{{:f, 32}, []}])

      fail_exe = XlaNode.compile!(node.name, fail)
      inc_exe = XlaNode.compile!(node.name, inc)
      {:ok, before} = XlaNode.info(node.name)

      for i <- 1..500 do
        x = Tensor.scalar(i * 1.0, {:f, 32})
        assert {:error, %XlaNode.Error{kind: :runtime_error}} = XlaNode.run(node.name, fail_exe, [x])
        assert [y] = XlaNode.run!(node.name, inc_exe, [x])
        assert Tensor.to_number(y) == i + 1.0
      end

      # A run's reply leaves before the node counts the run finished: read :info once the last
      # one is counted.
      keys = [:executables, :buffers, :runs_running, :runs_queued, :processes]
      settled? = fn info -> info.runs - before.runs == 1_000 and Enum.all?(keys, &(info[&1] == before[&1])) end
      Harness.eventually(fn -> settled?.(elem(XlaNode.info(node.name), 1)) end)
      {:ok, after_runs} = XlaNode.info(node.name)
      assert after_runs.runs - before.runs == 1_000
      assert after_runs.run_errors - before.run_errors == 500

      for key <- keys do
        assert after_runs[key] == before[key], "#{key}: #{before[key]} before, #{after_runs[key]} after"
      end
    end
  end

  describe "start-up refuses" do
    test "a missing file, a file that is no library, a missing symbol, a taken target", %{} do
      not_a_library = Path.join(System.tmp_dir!(), "xn_not_a_library_#{System.unique_integer([:positive])}.so")
      File.write!(not_a_library, "just text")
      on_exit(fn -> File.rm(not_a_library) end)

      for {args, expected} <- [
            {["--kernel", "k1=/nonexistent/libk.so:xn_add_scaled"], ~r"kernel k1 \(/nonexistent/libk.so, symbol xn_add_scaled\): cannot open the library"},
            {["--kernel", "k2=#{not_a_library}:xn_add_scaled"], ~r"kernel k2 .*not a loadable shared library"},
            {["--kernel", "k3=#{@ffi02}:no_such_symbol"], ~r"kernel k3 .*no exported symbol no_such_symbol"},
            {["--kernel", "k4=#{@ffi02}:xn_add_scaled", "--kernel", "k4=#{@ffi02}:xn_increment"],
             ~r"kernel k4 .*symbol xn_increment\): target k4 is already served by #{Regex.escape(@ffi02)} \(symbol xn_add_scaled\)"},
            {["--kernel", "exla_runtime_callback=#{@ffi02}:xn_add_scaled"], ~r"one of xla_node's own callback targets"},
            {["--kernel", "bad"], ~r"expected TARGET=PATH:SYMBOL"}
          ] do
        {out, status} = start_failing(args)
        assert status != 0 and status != 124, "#{inspect(args)}: status #{status}\n#{out}"
        assert out =~ expected, "#{inspect(args)}:\n#{out}"
      end
    end

    test "a kernel built against newer FFI headers than the node's XLA speaks, naming both versions and the remedy" do
      {out, status} = start_failing(["--kernel", "xn_add_scaled=#{@ffi03}:xn_add_scaled"])
      assert status != 0 and status != 124
      assert out =~ "built against XLA FFI 0.3 headers, but this node's XLA speaks FFI 0.2"
      assert out =~ "jaxlib 0.8.1"
      assert out =~ "--kernel-version-shim"
    end
  end

  describe "the version shim" do
    test "runs an FFI 0.3 kernel, with results identical to the FFI 0.2 build" do
      node03 = Harness.start_node(args: ["--kernel-version-shim" | kernel_args(@ffi03, ~w(xn_add_scaled xn_fail))])
      node02 = Harness.start_node(args: kernel_args(@ffi02, ~w(xn_add_scaled)))

      {:ok, info} = XlaNode.info(node03.name)
      assert %{ffi_version: "0.3", shimmed: true} = Enum.find(info.kernels, &(&1.target == "xn_add_scaled"))

      xs = Tensor.from_list([1.0, -0.5, 3.25, 1.0e-30, -1.0e30, 0.0], {:f, 32}, [6])
      text = add_scaled_module(0.75, [6])

      [y03] = XlaNode.run!(node03.name, XlaNode.compile!(node03.name, text), [xs])
      [y02] = XlaNode.run!(node02.name, XlaNode.compile!(node02.name, text), [xs])
      assert y03 == y02

      # Errors of a shimmed kernel come through as well.
      fail = kernel_call("xn_fail", [{{:f, 32}, [1]}], [{{:f, 32}, [1]}], [{"message", ~s("shimmed")}])

      assert {:error, %XlaNode.Error{kind: :runtime_error, message: "xn_fail: shimmed" <> _}} =
               XlaNode.run(node03.name, XlaNode.compile!(node03.name, fail), [f32([1.0])])
    end

    test "per kernel: --kernel-version-shim=TARGET shims only that one" do
      {out, status} =
        start_failing([
          "--kernel-version-shim=xn_add_scaled",
          "--kernel",
          "xn_add_scaled=#{@ffi03}:xn_add_scaled",
          "--kernel",
          "xn_increment=#{@ffi03}:xn_increment"
        ])

      assert status != 0 and status != 124
      assert out =~ "kernel xn_increment"
      assert out =~ "FFI 0.3"
    end
  end

  describe "loaded at run time" do
    setup do
      dir = Path.join(System.tmp_dir!(), "xn_kernel_dir_#{System.unique_integer([:positive])}")
      File.mkdir_p!(dir)
      File.cp!(@ffi02, Path.join(dir, "libk02.so"))
      File.cp!(@ffi03, Path.join(dir, "libk03.so"))
      File.write!(Path.join(dir, "notes.so"), "not a library")
      on_exit(fn -> File.rm_rf(dir) end)
      %{dir: dir, node: Harness.start_node(args: ["--kernel-dir", dir])}
    end

    test "loads, is idempotent, refuses a taken target, and serves programs", %{node: node, dir: dir} do
      assert :ok = XlaNode.load_kernel(node.name, "xn_add_scaled", "libk02.so", "xn_add_scaled")
      assert :ok = XlaNode.load_kernel(node.name, "xn_add_scaled", Path.join(dir, "libk02.so"), "xn_add_scaled")

      assert {:error, %XlaNode.Error{kind: :kernel_error, message: message}} =
               XlaNode.load_kernel(node.name, "xn_add_scaled", "libk02.so", "xn_increment")

      assert message =~ "already served by #{Path.join(dir, "libk02.so")} (symbol xn_add_scaled)"

      xs = [1.0, 2.0, -3.0]
      exe = XlaNode.compile!(node.name, add_scaled_module(-1.5, [3]))
      [y] = XlaNode.run!(node.name, exe, [f32(xs)])
      assert_close(Tensor.to_list(y), add_scaled(xs, -1.5))

      {:ok, info} = XlaNode.info(node.name)
      assert [%{target: "xn_add_scaled", ffi_version: "0.2", shimmed: false}] = info.kernels
    end

    test "clear errors for what cannot be loaded", %{node: node, dir: dir} do
      outside = Path.join(System.tmp_dir!(), "xn_outside_#{System.unique_integer([:positive])}.so")
      File.cp!(@ffi02, outside)
      on_exit(fn -> File.rm(outside) end)

      for {args, expected} <- [
            {["k_out", outside, "xn_add_scaled"], "outside the directories allowed by --kernel-dir (#{dir})"},
            {["k_up", "../#{Path.basename(outside)}", "xn_add_scaled"], "outside the directories allowed by --kernel-dir"},
            {["k_missing", "nothing.so", "xn_add_scaled"], "no such library: nothing.so"},
            {["k_text", "notes.so", "xn_add_scaled"], "not a loadable shared library"},
            {["k_sym", "libk02.so", "nope"], "no exported symbol nope"},
            {["k_v3", "libk03.so", "xn_add_scaled"], "built against XLA FFI 0.3 headers"}
          ] do
        assert {:error, %XlaNode.Error{kind: :kernel_error, message: message}} = apply(XlaNode, :load_kernel, [node.name | args])
        assert message =~ expected
      end

      assert {:error, %XlaNode.Error{kind: :argument_error}} = XlaNode.load_kernel(node.name, "", "libk02.so", "xn_add_scaled")
      assert_raise ArgumentError, ~r/option :version_shim must be a boolean/, fn -> XlaNode.load_kernel(node.name, "k", "libk02.so", "s", version_shim: :yes) end
      assert {:ok, %{kernels: []}} = XlaNode.info(node.name)
    end

    test "version_shim: true loads an FFI 0.3 kernel", %{node: node} do
      assert :ok = XlaNode.load_kernel(node.name, "xn_add_scaled", "libk03.so", "xn_add_scaled", version_shim: true)
      {:ok, info} = XlaNode.info(node.name)
      assert [%{ffi_version: "0.3", shimmed: true}] = info.kernels

      exe = XlaNode.compile!(node.name, add_scaled_module(2.0, [2]))
      [y] = XlaNode.run!(node.name, exe, [f32([1.0, 4.0])])
      assert_close(Tensor.to_list(y), add_scaled([1.0, 4.0], 2.0))
    end
  end

  test "a kernel that crashes takes the node down, not the BEAM nodes calling it" do
    node = Harness.start_node(args: kernel_args(@ffi02, ~w(xn_abort xn_increment)))
    peer = Harness.start_peer()
    assert :pong = Harness.peer_call(peer, XlaNode, :ping, [node.name])

    crash = kernel_call("xn_abort", [{{:f, 32}, [1]}], [{{:f, 32}, [1]}])

    exe = XlaNode.compile!(node.name, crash)
    assert {:error, %XlaNode.Error{kind: :nodedown}} = XlaNode.run(node.name, exe, [f32([1.0])])
    Harness.eventually(fn -> not Harness.os_alive?(node) end)

    # Another BEAM node that was connected to it carries on, and sees the node gone.
    refute node.name in Harness.peer_call(peer, :erlang, :nodes, [:hidden])
    assert {:error, %XlaNode.Error{kind: :nodedown}} = Harness.peer_call(peer, XlaNode, :ping, [node.name])
  end

  test "without --kernel-dir, run-time loading is refused with a message naming the flag" do
    node = Harness.start_node()

    assert {:error, %XlaNode.Error{kind: :kernel_error, message: message}} =
             XlaNode.load_kernel(node.name, "xn_add_scaled", @ffi02, "xn_add_scaled")

    assert message =~ "--kernel-dir"
  end

  describe "against JAX" do
    setup do
      out = Path.join(System.tmp_dir!(), "xn_jax_#{System.unique_integer([:positive])}")
      on_exit(fn -> File.rm_rf(out) end)
      script = Path.join(@root, "integration/jax/ffi_crosscheck.py")

      {log, status} =
        System.cmd("python3", [script, "--library", @ffi02, "--out", out],
          env: [{"PYTHONPATH", Harness.jax_path()}, {"JAX_PLATFORMS", "cpu"}],
          stderr_to_stdout: true
        )

      assert status == 0, "JAX cross-check script failed:\n#{log}"
      %{out: out, node: Harness.start_node(args: kernel_args(@ffi02, ~w(xn_add_scaled xn_sum_max)))}
    end

    defp read_case(dir) do
      {:ok, meta} = :file.consult(String.to_charlist(Path.join(dir, "meta.terms")))
      [{:input, :f32, input_dims}] = for {:input, _, _} = m <- meta, do: m
      input = {File.read!(Path.join(dir, "input.bin")), {{:f, 32}, input_dims}}

      outputs =
        for {{:output, :f32, dims}, i} <- Enum.with_index(for {:output, _, _} = m <- meta, do: m),
            do: {File.read!(Path.join(dir, "output_#{i}.bin")), {{:f, 32}, dims}}

      {File.read!(Path.join(dir, "module.mlir")), input, outputs}
    end

    test "the module JAX emitted gives bit-identical results on the node", %{out: out, node: node} do
      for case_name <- ["add_scaled", "sum_max"] do
        {module, input, outputs} = read_case(Path.join(out, case_name))
        exe = XlaNode.compile!(node.name, module)
        assert XlaNode.run!(node.name, exe, [input]) == outputs, "case #{case_name}"
      end
    end

    test "EXLA's form of the same call gives the same bits", %{out: out, node: node} do
      {jax_module, {_, {_, dims}} = input, [expected]} = read_case(Path.join(out, "add_scaled"))
      assert jax_module =~ "mhlo.backend_config"
      assert [^expected] = XlaNode.run!(node.name, XlaNode.compile!(node.name, add_scaled_module(2.5, dims)), [input])
    end
  end
end
