# Runs against a real node: the release binary (`XLA_NODE_BIN`, default
# ../target/release/xla_node), started here with its own name and cookie, and real epmd.
node = XlaNode.NxTest.Node.start!()
Application.put_env(:xla_node_nx, :test_node, node)
ExUnit.after_suite(fn _ -> XlaNode.NxTest.Node.stop(node) end)
ExUnit.start()
