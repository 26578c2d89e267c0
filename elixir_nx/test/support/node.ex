defmodule XlaNode.NxTest.Node do
  @moduledoc "Starts and stops the xla_node binary the tests run on."

  @cookie :xla_nx_test

  @doc "Starts a node named `sname` (by default one per test run) and waits until it serves."
  def start!(sname \\ "xla_nx_#{System.pid()}") do
    System.cmd("epmd", ["-daemon"])

    unless Node.alive?() do
      {:ok, _} = Node.start(:"nx_test_runner_#{System.pid()}", :shortnames)
    end

    Node.set_cookie(@cookie)

    bin =
      System.get_env("XLA_NODE_BIN") || Path.expand("../../../target/release/xla_node", __DIR__)

    {:ok, host} = :inet.gethostname()
    name = :"#{sname}@#{host}"
    # Through a shell that ends the node when this VM closes the port (its standard input),
    # however the test run ends. With XLA_NODE_TEST_LOG_DIR (scripts/gpu_check.sh sets it) the
    # node's output is also kept there, for a look after the run.
    {log_env, redirect} =
      case System.get_env("XLA_NODE_TEST_LOG_DIR") do
        nil ->
          {[], ""}

        dir ->
          File.mkdir_p!(dir)

          {[{~c"XLA_NODE_TEST_LOG", String.to_charlist(Path.join(dir, "#{sname}.log"))}],
           ~s( >>"$XLA_NODE_TEST_LOG" 2>&1)}
      end

    port =
      Port.open({:spawn_executable, "/bin/sh"}, [
        :binary,
        :exit_status,
        env: [{~c"XLA_NODE_LOG", ~c"warn"} | log_env],
        args:
          [
            "-c",
            ~s("$0" "$@"#{redirect} & pid=$!; read _; kill $pid),
            bin,
            "--sname",
            sname,
            "--cookie",
            "#{@cookie}",
            "--kernel-dir",
            kernel_dir()
          ] ++ plugin_args()
      ])

    wait_ready(name, 100)
    %{name: name, port: port}
  end

  # The plugin and further arguments scripts/gpu_check.sh runs the suite with (as the
  # integration suite's harness reads them): `$XLA_NODE_PJRT_PLUGIN` as `--pjrt-plugin`, then
  # `$XLA_NODE_EXTRA_ARGS` split as a shell would.
  defp plugin_args do
    plugin =
      case System.get_env("XLA_NODE_PJRT_PLUGIN") do
        nil -> []
        path -> ["--pjrt-plugin", path]
      end

    plugin ++ OptionParser.split(System.get_env("XLA_NODE_EXTRA_ARGS", ""))
  end

  @doc """
  Where `scripts/kernels.sh` builds the test kernel library (`integration/kernels/`), which
  the node may load kernels from.
  """
  def kernel_dir, do: Path.expand("../../../target/kernels", __DIR__)

  @doc "The test kernel library; raises, saying how to build it, when it is missing."
  def kernel_library! do
    path = Path.join(kernel_dir(), "libxn_test_kernels_ffi02.so")
    File.exists?(path) || raise "#{path} is missing: build it with scripts/kernels.sh"
    path
  end

  defp wait_ready(name, 0), do: raise("xla_node #{name} did not come up")

  defp wait_ready(name, tries) do
    if Node.connect(name) == true and ping(name) == :pong do
      :ok
    else
      Process.sleep(100)
      wait_ready(name, tries - 1)
    end
  end

  defp ping(name) do
    GenServer.call({:xla, name}, :ping, 1_000)
  catch
    :exit, _ -> :error
  end

  def stop(%{port: port}) do
    Port.close(port)
  catch
    :error, _ -> :ok
  end
end
