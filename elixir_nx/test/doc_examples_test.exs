defmodule XlaNode.NxTest.DocExamplesTest do
  # The examples of this library's documentation, run as written against the test node (its
  # `:"xla@host"`; another node of the cluster running the client, `:"client@host"`, is a peer
  # started here), with the integration suite's reader of examples (see
  # `XlaNode.DocExamplesTest` there); the `iex>` ones are doctests, run here too.
  use ExUnit.Case, async: false

  doctest XlaNode.Compiler.CustomCall
  doctest XlaNode.Compiler.CustomCall.Spec

  @modules [XlaNode.Compiler, XlaNode.Backend, XlaNode.Compiler.CustomCall]

  # Its protocol implementation would come after the protocol's consolidation:
  # test/support/add_scaled.ex is this example, and compiler_test.exs runs it.
  @not_run [{XlaNode.Compiler.CustomCall, "@moduledoc"}]

  examples = XlaNode.DocExamples.examples(@modules, @not_run)

  if length(examples) < 4, do: raise("found only #{length(examples)} examples to run")

  setup_all do
    peer = XlaNode.NxTest.Node.start_peer!()
    on_exit(fn -> XlaNode.NxTest.Node.stop_peer(peer) end)
    %{client: peer.node}
  end

  setup do
    backend = Nx.default_backend()
    on_exit(fn -> Nx.default_backend(backend) end)
    %{node: Application.fetch_env!(:xla_node_nx, :test_node).name}
  end

  for {module, entry, line, code} <- examples do
    test "#{inspect(module)} #{entry} (line #{line})", %{node: node, client: client} do
      code =
        unquote(code)
        |> String.replace(~s(:"xla@host"), inspect(node))
        |> String.replace(~s(:"client@host"), inspect(client))

      XlaNode.DocExamples.run!(code, unquote(inspect(module)), unquote(entry))
    end
  end
end
