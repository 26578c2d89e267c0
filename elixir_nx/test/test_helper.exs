# Runs against a real node: the release binary (`XLA_NODE_BIN`, default
# ../target/release/xla_node), started here with its own name and cookie, and real epmd.
#
# The node runs on the plugin `XLA_NODE_PJRT_PLUGIN` names (default: the CPU plugin), with the
# arguments in `XLA_NODE_EXTRA_ARGS` (scripts/gpu_check.sh runs the suite on a GPU this way).
# Tests tagged :cpu_only hold only on XLA's CPU platform (exact CPU float results, native CPU
# kernels), and those tagged :multi_device need the CPU plugin's four devices: each set is
# excluded, saying so, where the node is not like that.
node = XlaNode.NxTest.Node.start!()
Application.put_env(:xla_node_nx, :test_node, node)
ExUnit.after_suite(fn _ -> XlaNode.NxTest.Node.stop(node) end)

{:ok, %{platform: platform, devices: devices}} = XlaNode.info(node.name)

exclude =
  if(platform == "cpu", do: [], else: [:cpu_only]) ++
    if length(devices) >= 4, do: [], else: [:multi_device]

if exclude != [] do
  IO.puts(
    "platform #{platform}, #{length(devices)} device(s): excluding the tests tagged " <>
      Enum.map_join(exclude, " and ", &inspect/1)
  )
end

ExUnit.start(exclude: exclude)
