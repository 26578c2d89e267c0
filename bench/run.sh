#!/usr/bin/env bash
# Runs the benchmarks: xla_node against a BEAM node doing the same work, measured in the same run
# and reported as ratios (these machines are shared and noisy; absolute numbers drift).
#   bench/run.sh            # all parts
#   bench/run.sh node       # only: tiny call latency, 16 MiB echo
#   bench/run.sh kernels    # only: native-kernel calls, against JAX calling the same library
# Needs scripts/setup.sh to have run (release build, plugin, Erlang/Elixir); the kernels part
# runs scripts/kernels.sh (JAX, the test kernel library).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/xla_node ] || cargo build --release --quiet
epmd -daemon
cookie="bench_$$"
name="xla_bench_$$"
kernel_args=()
if [ "${1:-all}" = all ] || [ "${1:-all}" = kernels ]; then
    scripts/kernels.sh
    export XLA_NODE_BENCH_KERNELS="$PWD/target/kernels/libxn_test_kernels_ffi02.so"
    export XLA_NODE_BENCH_JAX="${XDG_DATA_HOME:-$HOME/.local/share}/xla_node/jax"
    kernel_args=(--kernel "xn_increment=$XLA_NODE_BENCH_KERNELS:xn_increment")
fi
target/release/xla_node --sname "$name" --cookie "$cookie" "${kernel_args[@]}" 2>/tmp/xla_bench_node.log &
node_pid=$!
trap 'kill $node_pid 2>/dev/null || true' EXIT
for _ in $(seq 50); do epmd -names 2>/dev/null | grep -q "name $name " && break; sleep 0.1; done
elixir --sname "bench_client_$$" --cookie "$cookie" bench/bench.exs "$name" "${1:-all}"
