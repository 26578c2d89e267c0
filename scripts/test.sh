#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every test: formatting and lints, the Rust unit,
# executor and callback tests (real PJRT plugin, real Elixir peers), the Elixir client's unit
# tests, and the multi-node integration suite (real epmd, real BEAM nodes, the release binary, a
# real sshd on loopback).
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

# Native-kernel fixtures: JAX 0.8.1 (the counterpart), FFI headers from the jaxlib wheels, and the
# test kernel library built against them (the integration suite and the Nx compiler's tests load
# it).
scripts/kernels.sh

# The Nx compiler (elixir_nx/) needs Nx 0.13, hence Elixir >= 1.17 and Nx itself, which this
# script does not install: its tests run where NX_PATH points at a local Nx checkout (with
# COMPLEX_PATH and TELEMETRY_PATH for its dependencies, and a new enough `elixir` on PATH).
epmd -daemon
if [ -n "${NX_PATH:-}" ]; then
    (cd elixir_nx && MIX_ENV=test mix test </dev/null)
else
    echo "elixir_nx: tests skipped: Nx is not present (set NX_PATH to a local Nx checkout, with COMPLEX_PATH, TELEMETRY_PATH and Elixir >= 1.17, to run them)"
fi

# A throwaway OpenSSH server on loopback (openssh-server from apt, keys under target/sshd) for
# the tests of XlaNode.Launcher.SSH.
scripts/sshd.sh

cd integration
export MIX_ENV=test XLA_NODE_BIN="$PWD/../target/release/xla_node"
elixir --sname "xla_itest_$$" --cookie xla_test -S mix test </dev/null
