# Multi-node integration tests for xla_node.
#
# Run (from the repository root, after `cargo build --release`):
#
#     cd integration && mix test
#
# This file makes the runner a distributed node itself: it runs `epmd -daemon` and
# `Node.start(:"itest_runner_<ospid>", :shortnames)` with cookie `xla_test`. Starting the runner
# distributed by hand also works (`elixir --sname itest_runner --cookie xla_test -S mix test`).
#
# Environment:
#   XLA_NODE_BIN          node binary (default ../target/release/xla_node)
#   XLA_NODE_PJRT_PLUGIN  PJRT plugin passed as --pjrt-plugin (default: the installed CPU plugin)
#   XLA_NODE_EXTRA_ARGS   more arguments for every node the suite starts (shell-quoted), e.g.
#                         "--preallocate false" (scripts/gpu_check.sh runs the suite this way)
#   XLA_NODE_TEST_TRACE   a file where each test's start and end are written (XlaNode.TestTrace)
#   XLA_NODE_TEST_LOG_DIR a folder where every node the suite starts also writes its output
#
# Tests tagged :cpu_only hold only on XLA's CPU platform (native CPU kernels, exact CPU float
# results, CPU-specific XLA faults, the CPU client's device count, ...). When either variable
# above is set, a node started on those terms says which platform it runs on, and on any but
# "cpu" those tests are excluded.
#
# Tests tagged :known_bug document node bugs and are excluded; run them with
# `mix test --include known_bug`. Slow tests are tagged :slow (included by default; exclude with
# `mix test --exclude slow` for a quick run).

XlaNode.Harness.ensure_distribution!()
ExUnit.after_suite(fn _ -> XlaNode.Harness.kill_all() end)
platform = XlaNode.Harness.probe_platform()
Application.put_env(:xla_node_integration, :platform, platform)
cpu_only = if platform == "cpu", do: [], else: [:cpu_only]
if cpu_only != [], do: IO.puts("platform #{platform}: excluding the tests tagged :cpu_only")

formatters =
  if System.get_env("XLA_NODE_TEST_TRACE"),
    do: [ExUnit.CLIFormatter, XlaNode.TestTrace],
    else: [ExUnit.CLIFormatter]

ExUnit.start(exclude: [:known_bug | cpu_only], capture_log: true, formatters: formatters)
