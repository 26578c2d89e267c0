#!/usr/bin/env bash
# The GPU check: what anyone with an NVIDIA GPU runs to check xla_node on it. In turn:
#   1. set-up: scripts/setup.sh --gpu (the CUDA PJRT plugin and the NVIDIA libraries it loads,
#      a release build); on a machine without an NVIDIA driver it stops here, with one message;
#   2. the node on that plugin: it starts, `:info` names the platform and devices, a tiny
#      program runs and a tensor goes to the device and back (scripts/gpu_check_node.exs);
#   3. bench/run.sh gpu: the node against JAX on the same GPU, alone on it;
#   4. the integration suite with every node it starts on that plugin (XLA_NODE_PJRT_PLUGIN,
#      XLA_NODE_EXTRA_ARGS): compile and run, buffers, transfers, every callback kind, the
#      errors; the tests tagged :cpu_only are excluded there by the suite itself;
#   5. side by side with it, elixir_nx's suite on that plugin, where NX_PATH points at a local
#      Nx checkout (its CPU-only and four-device tests likewise excluded elsewhere).
# and ends with one line: "gpu_check: N passed, N failed, N skipped on PLATFORM (DEVICES); ...".
# Exit status 0 when nothing failed. Each step's output is in target/gpu_check/TIME/.
#
# Usage: scripts/gpu_check.sh [--plugin cuda|cpu|PATH] [--quick]
#   --plugin cuda   (the default) the CUDA plugin scripts/setup.sh --gpu installs
#   --plugin cpu    the PJRT CPU plugin, JAX on CPU and small benchmark sizes: the same check,
#                   end to end, on a machine without a GPU
#   --plugin PATH   a PJRT plugin already there (e.g. JAX's own xla_cuda_plugin.so in
#                   site-packages); no set-up is run: the node binary must be built, and the
#                   test fixtures (scripts/kernels.sh) are built only if they are missing
#   --quick         leaves out the integration tests tagged :slow, and takes small benchmark
#                   sizes
# Environment: XLA_NODE_BIN (the node binary, default target/release/xla_node); NX_PATH (and
# COMPLEX_PATH, TELEMETRY_PATH, as for elixir_nx's tests); XLA_NODE_GPU_CHECK_NODE_ARGS (the
# arguments every node gets, default "--preallocate false" off CPU, so that the nodes the suite
# starts side by side share the GPU's memory instead of each taking 75% of it).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh

usage="usage: scripts/gpu_check.sh [--plugin cuda|cpu|PATH] [--quick]"
plugin=cuda
quick=false
while [ $# -gt 0 ]; do
    case "$1" in
        --plugin)
            [ $# -ge 2 ] || { echo "gpu_check: --plugin needs a value ($usage)" >&2; exit 2; }
            plugin="$2"
            shift 2
            ;;
        --quick)
            quick=true
            shift
            ;;
        *)
            echo "gpu_check: unknown argument $1 ($usage)" >&2
            exit 2
            ;;
    esac
done

log() { printf 'gpu_check: %s\n' "$*" >&2; }
# The summary line of a check that could not begin.
not_run() {
    printf 'gpu_check: 0 passed, 1 failed, 0 skipped: not run: %s\n' "$*"
    exit 1
}

# 1. Set-up, and what the rest runs on.
bench_plugin=""
case "$plugin" in
    cuda)
        scripts/setup.sh --gpu || not_run "scripts/setup.sh --gpu failed (above)"
        plugin_path="$xla_node_cuda_plugin"
        bench_plugin="$plugin_path"
        case "${XLA_FLAGS:-}" in
            *--xla_gpu_cuda_data_dir=*) ;;
            *) export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_cuda_data_dir=$xla_node_cuda_data_dir" ;;
        esac
        default_node_args="--preallocate false"
        ;;
    cpu)
        scripts/setup.sh || not_run "scripts/setup.sh failed (above)"
        plugin_path="${XDG_DATA_HOME:-$HOME/.local/share}/xla_node/pjrt/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"
        bench_plugin=cpu
        default_node_args=""
        ;;
    *)
        [ -f "$plugin" ] || not_run "no plugin at $plugin"
        plugin_path=$(realpath "$plugin")
        bench_plugin="$plugin_path"
        default_node_args="--preallocate false"
        ;;
esac
node_args="${XLA_NODE_GPU_CHECK_NODE_ARGS-$default_node_args}"
bin=$(realpath "${XLA_NODE_BIN:-target/release/xla_node}" 2>/dev/null) && [ -x "$bin" ] ||
    not_run "no node binary (build it with cargo build --release, or set XLA_NODE_BIN)"
epmd -daemon
logs="target/gpu_check/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$logs"
logs=$(realpath "$logs")

passed=0
failed=0
skipped=0
notes=()

# Adds an ExUnit run's counts (from its output file) to the totals; a run that never printed
# them (it crashed, or could not start) counts as one failure.
count_exunit() {
    local what="$1" file="$2" line n total=0 failures=0 excluded=0
    line=$(grep -E '^([0-9]+ doctests?, )?[0-9]+ tests?, [0-9]+ failures?' "$file" | tail -1)
    if [ -z "$line" ]; then
        failed=$((failed + 1))
        notes+=("$what: did not finish (see $file)")
        return
    fi
    for n in $(grep -oE '[0-9]+ (doctests?|tests?)' <<<"$line" | cut -d' ' -f1); do total=$((total + n)); done
    for n in $(grep -oE '[0-9]+ (failures?|invalid)' <<<"$line" | cut -d' ' -f1); do failures=$((failures + n)); done
    for n in $(grep -oE '[0-9]+ (excluded|skipped)' <<<"$line" | cut -d' ' -f1); do excluded=$((excluded + n)); done
    passed=$((passed + total - failures - excluded))
    failed=$((failed + failures))
    skipped=$((skipped + excluded))
    notes+=("$what: $line")
}

# The integration suite and the benchmark's callback and kernel parts need these fixtures. With
# --plugin PATH nothing is set up where they are built already (a machine without network).
if { [ "$plugin" = cuda ] || [ "$plugin" = cpu ] || [ ! -f target/kernels/libxn_test_kernels_ffi02.so ]; } &&
    ! scripts/kernels.sh >"$logs/kernels.log" 2>&1; then
    failed=$((failed + 1))
    notes+=("scripts/kernels.sh failed (see $logs/kernels.log)")
fi

# 2. The node on the plugin.
read -r -a node_argv <<<"$node_args"
check_name="gpu_check_$$"
"$bin" --sname "$check_name" --cookie "$check_name" --pjrt-plugin "$plugin_path" "${node_argv[@]}" \
    >"$logs/node.log" 2>&1 &
node_pid=$!
for _ in $(seq 300); do
    epmd -names 2>/dev/null | grep -q "name $check_name " && break
    kill -0 "$node_pid" 2>/dev/null || break
    sleep 0.1
done
if elixir --sname "gpu_check_client_$$" --cookie "$check_name" scripts/gpu_check_node.exs \
    "$check_name" "$logs/device.txt" >"$logs/node_check.log" 2>&1; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    notes+=("the node on $plugin_path failed its check (see $logs/node_check.log, $logs/node.log)")
fi
kill "$node_pid" 2>/dev/null
wait "$node_pid" 2>/dev/null
device=$(cat "$logs/device.txt" 2>/dev/null || echo "device unknown")
log "node: $device"

# 3. The benchmark, first and alone on the device.
log "bench/run.sh gpu (log: $logs/bench.log)"
small=""
{ $quick || [ "$plugin" = cpu ]; } && small=1
if XLA_NODE_BIN="$bin" XLA_NODE_BENCH_GPU_PLUGIN="$bench_plugin" XLA_NODE_BENCH_GPU_SMALL="$small" \
    XLA_NODE_BENCH_GPU_NODE_ARGS="$node_args" bench/run.sh gpu </dev/null >"$logs/bench.log" 2>&1; then
    passed=$((passed + 1))
    sed -n '/^## gpu/,$p' "$logs/bench.log" >&2
else
    failed=$((failed + 1))
    notes+=("bench/run.sh gpu failed (see $logs/bench.log)")
fi

# 4. The integration suite and 5. elixir_nx's suite (where Nx is present), side by side: each
# starts its own nodes (off CPU they share the device's memory, --preallocate false).
# Each node the suites start keeps its output under nodes/, and integration_trace.txt says
# which tests started and finished (what a run stopped from outside was waiting on).
suite_args=()
! $quick || suite_args=(--exclude slow)
export XLA_NODE_TEST_LOG_DIR="$logs/nodes"
log "integration suite (log: $logs/integration.log)"
(cd integration && MIX_ENV=test XLA_NODE_BIN="$bin" XLA_NODE_PJRT_PLUGIN="$plugin_path" \
    XLA_NODE_EXTRA_ARGS="$node_args" XLA_NODE_TEST_TRACE="$logs/integration_trace.txt" elixir --sname "gpu_check_itest_$$" --cookie xla_test \
    -S mix test "${suite_args[@]}" </dev/null) >"$logs/integration.log" 2>&1 &
integration_pid=$!
if [ -n "${NX_PATH:-}" ]; then
    log "elixir_nx suite (log: $logs/elixir_nx.log)"
    (cd elixir_nx && MIX_ENV=test XLA_NODE_BIN="$bin" XLA_NODE_PJRT_PLUGIN="$plugin_path" \
        XLA_NODE_EXTRA_ARGS="$node_args" mix test </dev/null) >"$logs/elixir_nx.log" 2>&1
    count_exunit elixir_nx "$logs/elixir_nx.log"
else
    notes+=("elixir_nx: skipped (NX_PATH is not set)")
fi
wait "$integration_pid"
count_exunit integration "$logs/integration.log"

for note in "${notes[@]}"; do log "$note"; done
printf 'gpu_check: %d passed, %d failed, %d skipped on %s; logs in %s\n' \
    "$passed" "$failed" "$skipped" "$device" "$logs"
[ "$failed" -eq 0 ]
