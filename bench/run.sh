#!/usr/bin/env bash
# Runs the benchmarks: xla_node against a BEAM node doing the same work, measured in the same run
# and reported as ratios (these machines are shared and noisy; absolute numbers drift).
#   bench/run.sh            # all parts
#   bench/run.sh node       # only: tiny call latency, 16 MiB echo
#   bench/run.sh kernels    # only: native-kernel calls, against JAX calling the same library
#   bench/run.sh nx         # only: defn MLP forward/gradient (XlaNode.Compiler) against jax.jit
#   bench/run.sh metrics    # only: tiny calls and runs with --metrics-addr (scraped) against without
#                           # (XLA_NODE_BENCH_BASELINE_BIN=path/to/xla_node adds a node of that build)
# Needs scripts/setup.sh to have run (release build, plugin, Erlang/Elixir); the kernels and nx
# parts run scripts/kernels.sh (JAX, the test kernel library). The nx part runs only where
# NX_PATH points at a local Nx checkout (with COMPLEX_PATH, TELEMETRY_PATH, and Elixir >= 1.17 on
# PATH, as for elixir_nx's tests), and says it was skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/xla_node ] || cargo build --release --quiet
epmd -daemon
cookie="bench_$$"
name="xla_bench_$$"
part="${1:-all}"
kernel_args=()
if [ "$part" = all ] || [ "$part" = kernels ] || [ "$part" = nx ]; then
    scripts/kernels.sh
    export XLA_NODE_BENCH_JAX="${XDG_DATA_HOME:-$HOME/.local/share}/xla_node/jax"
fi
if [ "$part" = all ] || [ "$part" = kernels ]; then
    export XLA_NODE_BENCH_KERNELS="$PWD/target/kernels/libxn_test_kernels_ffi02.so"
    kernel_args=(--kernel "xn_increment=$XLA_NODE_BENCH_KERNELS:xn_increment")
fi
target/release/xla_node --sname "$name" --cookie "$cookie" "${kernel_args[@]}" 2>/tmp/xla_bench_node.log &
node_pids=($!)
trap 'kill "${node_pids[@]}" 2>/dev/null || true' EXIT
wait_registered() {
    for _ in $(seq 50); do epmd -names 2>/dev/null | grep -q "name $1 " && return; sleep 0.1; done
}
wait_registered "$name"
if [ "$part" = all ] || [ "$part" = metrics ]; then
    # The same build with the metrics endpoint on, and optionally another build, side by side.
    export XLA_NODE_BENCH_METRICS_NODE="xla_bench_metrics_$$"
    log=/tmp/xla_bench_metrics_node.log
    target/release/xla_node --sname "$XLA_NODE_BENCH_METRICS_NODE" --cookie "$cookie" \
        --metrics-addr 127.0.0.1:0 2>"$log" &
    node_pids+=($!)
    wait_registered "$XLA_NODE_BENCH_METRICS_NODE"
    # The node names the port it was given once it serves.
    for _ in $(seq 50); do grep -q 'serving metrics at' "$log" && break; sleep 0.1; done
    XLA_NODE_BENCH_METRICS_URL="$(grep -o 'http://[^ ]*/metrics' "$log" | head -1)"
    export XLA_NODE_BENCH_METRICS_URL
    if [ -n "${XLA_NODE_BENCH_BASELINE_BIN:-}" ]; then
        export XLA_NODE_BENCH_BASELINE_NODE="xla_bench_baseline_$$"
        "$XLA_NODE_BENCH_BASELINE_BIN" --sname "$XLA_NODE_BENCH_BASELINE_NODE" --cookie "$cookie" \
            2>/tmp/xla_bench_baseline_node.log &
        node_pids+=($!)
        wait_registered "$XLA_NODE_BENCH_BASELINE_NODE"
    fi
fi
if [ "$part" != nx ]; then
    elixir --sname "bench_client_$$" --cookie "$cookie" bench/bench.exs "$name" "$part"
fi
if [ "$part" = all ] || [ "$part" = nx ]; then
    # The defn part runs in elixir_nx's Mix project, which needs Nx, hence Elixir >= 1.17.
    if [ -z "${NX_PATH:-}" ]; then
        printf '\n## defn: skipped: Nx is not present (set NX_PATH to a local Nx checkout, with COMPLEX_PATH, TELEMETRY_PATH and Elixir >= 1.17, to run it)\n'
    elif ! elixir -e 'System.halt(if Version.match?(System.version(), ">= 1.17.0"), do: 0, else: 1)'; then
        printf '\n## defn: skipped: elixir_nx needs Elixir >= 1.17, and the elixir on PATH is %s\n' \
            "$(elixir -e 'IO.write(System.version())')"
    else
        (cd elixir_nx && elixir --sname "bench_nx_$$" --cookie "$cookie" -S mix run ../bench/nx_mlp.exs "$name" </dev/null)
    fi
fi
