#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every test: formatting and lints, the Rust unit,
# executor and callback tests (real PJRT plugin, real Elixir peers), the Elixir client's unit
# tests, and the multi-node integration suite (real epmd, real BEAM nodes, the release binary).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

if cargo fmt --version >/dev/null 2>&1; then
    cargo fmt --all --check
fi
if cargo clippy --version >/dev/null 2>&1; then
    cargo clippy --release --quiet --all-targets -- -D warnings
fi

# A debug build, so that the debug assertions run too (among them: no thread of the async
# runtime ever waits on XLA).
cargo test

(cd elixir_client && MIX_ENV=test mix test </dev/null)

epmd -daemon
cd integration
export MIX_ENV=test XLA_NODE_BIN="$PWD/../target/release/xla_node"
elixir --sname "xla_itest_$$" --cookie xla_test -S mix test </dev/null
