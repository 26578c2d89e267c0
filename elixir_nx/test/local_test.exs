defmodule XlaNode.NxLocalTest do
  @moduledoc """
  `defn` and `XlaNode.Backend` on a node this VM starts (`XlaNode.Local`), named in one line of
  options as `node: :name`; the name follows the node when its supervisor restarts it; and a
  new Mix application with `xla_node_nx` as a path dependency runs a `defn` on its own
  `XlaNode.Local` child from `mix run`. Real binary, real Nx.
  """
  use ExUnit.Case, async: false

  import Nx.Defn

  defn step(w, x, y) do
    loss = Nx.mean((Nx.dot(x, w) - y) ** 2)
    {w - 0.1 * grad(w, fn w -> Nx.mean((Nx.dot(x, w) - y) ** 2) end), loss}
  end

  defp start_local! do
    name = :"nx_local_#{System.unique_integer([:positive])}"
    # The suite's node arguments (a GPU run gives some: --preallocate false).
    args = OptionParser.split(System.get_env("XLA_NODE_EXTRA_ARGS", ""))
    start_supervised!({XlaNode.Local, name: name, log: "warn", args: args})
    name
  end

  test "node: the child's name, for the compiler and the backend, in one line each" do
    name = start_local!()
    node = XlaNode.Local.node(name)

    Nx.default_backend({XlaNode.Backend, node: name})
    Nx.Defn.default_options(compiler: XlaNode.Compiler, node: name)

    w = Nx.tensor([[1.0], [2.0]])
    x = Nx.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = Nx.tensor([[1.0], [1.0], [2.0]])
    # The tensors live on the child's node.
    assert %XlaNode.Backend{node: ^node} = w.data

    {w, loss} = step(w, x, y)
    assert %XlaNode.Backend{node: ^node} = w.data
    assert_in_delta Nx.to_number(loss), 2.0 / 3.0, 1.0e-6
    assert [[w0], [w1]] = Nx.to_list(w)
    assert_in_delta w0, 1.0 - 0.1 * (2 / 3) * 1.0, 1.0e-6
    assert_in_delta w1, 2.0 - 0.1 * (2 / 3) * 2.0, 1.0e-6

    jitted = Nx.Defn.jit(&Nx.add(&1, 1), compiler: XlaNode.Compiler, node: name)
    assert Nx.to_flat_list(jitted.(Nx.tensor([1, 2, 3], backend: Nx.BinaryBackend))) == [2, 3, 4]
  after
    Nx.default_backend(Nx.BinaryBackend)
    Nx.Defn.default_options([])
  end

  test "after the node restarts, the name is the new node; the old tensors are gone" do
    name = start_local!()
    first = XlaNode.Local.node(name)
    old = Nx.tensor([1.0, 2.0], backend: {XlaNode.Backend, node: name})
    add_one = Nx.Defn.jit(&Nx.add(&1, 1), compiler: XlaNode.Compiler, node: name)
    assert Nx.to_flat_list(add_one.(Nx.tensor([1.0]))) == [2.0]

    ExUnit.CaptureLog.capture_log(fn ->
      System.cmd("kill", ["-KILL", "#{XlaNode.Local.os_pid(name)}"])

      Enum.any?(1..300, fn _ ->
        XlaNode.Local.whereis_node(name) not in [nil, first] || (Process.sleep(50) && false)
      end) || flunk("#{inspect(name)} was not restarted")
    end)

    second = XlaNode.Local.node(name)
    assert second != first
    assert Nx.to_flat_list(add_one.(Nx.tensor([1.0]))) == [2.0]
    fresh = Nx.tensor([3.0], backend: {XlaNode.Backend, node: name})
    assert %XlaNode.Backend{node: ^second} = fresh.data
    assert_raise XlaNode.Error, ~r/#{first}/, fn -> Nx.to_flat_list(old) end
  end

  @tag :slow
  test "a new Mix application runs a defn on its XlaNode.Local child from mix run" do
    dir =
      Path.join(System.tmp_dir!(), "nx_app_#{System.pid()}_#{System.unique_integer([:positive])}")

    File.mkdir_p!(Path.join(dir, "lib"))
    on_exit(fn -> File.rm_rf!(dir) end)
    nx_app = Path.expand("..", __DIR__)

    File.write!(Path.join(dir, "mix.exs"), """
    defmodule NxApp.MixProject do
      use Mix.Project

      def project do
        [app: :nx_app, version: "0.1.0", deps: [{:xla_node_nx, path: #{inspect(nx_app)}}]]
      end

      def application do
        [extra_applications: [:logger], mod: {NxApp.Application, []}]
      end
    end
    """)

    File.write!(Path.join(dir, "lib/application.ex"), """
    defmodule NxApp.Application do
      use Application

      @impl true
      def start(_type, _args) do
        children = [{XlaNode.Local, name: :xla, distribution: :start, log: "warn"}]
        Supervisor.start_link(children, strategy: :one_for_one, name: NxApp.Supervisor)
      end
    end
    """)

    File.write!(Path.join(dir, "lib/model.ex"), """
    defmodule NxApp.Model do
      import Nx.Defn

      defn predict(w, x), do: Nx.sum(Nx.dot(x, w))
    end
    """)

    File.write!(Path.join(dir, "run.exs"), ~S"""
    Nx.default_backend({XlaNode.Backend, node: :xla})
    Nx.Defn.default_options(compiler: XlaNode.Compiler, node: :xla)
    w = Nx.tensor([1.0, 2.0, 3.0])
    x = Nx.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    %XlaNode.Backend{node: node} = w.data
    IO.puts("RESULT #{Nx.to_number(NxApp.Model.predict(w, x))} on #{node}")
    """)

    {out, status} =
      System.cmd(System.find_executable("mix"), ["run", "run.exs"],
        cd: dir,
        # The default plugin: a GPU run's, taken whole, is not for a node beside the suite's.
        env: [{"MIX_ENV", "dev"}, {"XLA_NODE_PJRT_PLUGIN", nil}],
        stderr_to_stdout: true
      )

    assert status == 0, out
    assert [_, node] = Regex.run(~r/RESULT 8\.0 on (\S+)/, out), out
    # Its VM stopped at the script's end: no node of it is left.
    assert Enum.any?(1..200, fn _ -> not registered?(node) || (Process.sleep(50) && false) end)
  end

  defp registered?(node) do
    name = node |> String.split("@") |> hd() |> String.to_charlist()
    {:ok, names} = :erl_epmd.names()
    List.keymember?(names, name, 0)
  end
end
