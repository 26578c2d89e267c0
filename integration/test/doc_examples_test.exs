defmodule XlaNode.DocExamplesTest do
  @moduledoc """
  Every example in the client's documentation that needs a node runs here, as written, against
  real nodes. The examples name the node `:"xla@host"` (a pool's, `:"xla1@host"` and
  `:"xla2@host"`; another node of the cluster running the client, `:"client@host"`); those
  names become the nodes this module starts, and the kernel library an
  example loads becomes the suite's test kernel library. Examples written as doctests (`iex>`)
  run in the client's own tests, without a node.

  An example is a code block of a function's or a module's documentation (indented, or fenced
  as `elixir`; fenced as anything else, such as `text`, it is an illustration and is not run).
  The blocks of one documentation entry run in order, in one fresh process, sharing their
  variables: each entry's examples stand on their own. A line `#=> value` checks the value of
  the line above it when `value` is a literal; the run fails on any exception. The processes an
  example starts linked to it (pools, callback servers, supervisors) stop after it.
  """
  use ExUnit.Case, async: true

  alias XlaNode.Harness

  @modules [
    XlaNode,
    XlaNode.CallbackServer,
    XlaNode.Keeper,
    XlaNode.Launcher,
    XlaNode.Launcher.Local,
    XlaNode.Launcher.SSH,
    XlaNode.Local,
    XlaNode.Pool,
    XlaNode.Pool.Executable,
    XlaNode.Transfer
  ]

  # What the examples say, and what it is here.
  defp substitutions(nodes) do
    [
      {~s(:"xla@host"), inspect(nodes.one)},
      {~s(:"xla1@host"), inspect(nodes.one)},
      {~s(:"xla2@host"), inspect(nodes.two)},
      {~s(:"client@host"), inspect(nodes.client)},
      {~s("libmy_kernels.so"), inspect(Path.basename(Harness.kernel_library("02")))},
      {~s("AddScaled"), ~s("xn_add_scaled")}
    ]
  end

  examples = XlaNode.DocExamples.examples(@modules)

  if length(examples) < 30 do
    raise "found only #{length(examples)} documented examples to run: is the client compiled " <>
            "with its docs?"
  end

  setup_all do
    Harness.ensure_kernels!()
    kernel_dir = Path.dirname(Harness.kernel_library("02"))

    one =
      Harness.start_node(
        args: ["--pjrt-option", "cpu_device_count=4", "--kernel-dir", kernel_dir]
      )

    two = Harness.start_node()
    client = Harness.start_peer()
    {:ok, _} = Harness.peer_call(client, XlaNode.PeerHelpers, :start_client, [])
    %{nodes: %{one: one.name, two: two.name, client: client.node}}
  end

  for {module, entry, line, code} <- examples do
    @tag timeout: 300_000
    test "#{inspect(module)} #{entry} (line #{line})", %{nodes: nodes} do
      code =
        Enum.reduce(substitutions(nodes), unquote(code), fn {from, to}, code ->
          String.replace(code, from, to)
        end)

      XlaNode.DocExamples.run!(code, unquote(inspect(module)), unquote(entry))
    end
  end
end
