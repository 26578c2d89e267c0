#!/usr/bin/env bash
# Runs the benchmarks: xla_node against a BEAM node doing the same work, measured in the same run
# and reported as ratios (these machines are shared and noisy; absolute numbers drift).
#   bench/run.sh            # all parts
#   bench/run.sh node       # only: tiny call latency, 16 MiB echo
#   bench/run.sh tls        # only: the same two over plain TCP, then over TLS distribution
#                           # (xla_node and the BEAM nodes with inet_tls, certificates made by
#                           # openssl for the run)
#   bench/run.sh xla        # only: a tiny {:run} of x + 1 against a trivial BEAM call
#   bench/run.sh callbacks  # only: one callback (with XLA_NODE_CALLBACK_TRACE=1 in the environment,
#                           # where its time goes), a native-kernel custom call beside it, a
#                           # 10,000-callback loop, a callback moving 16 MiB each way
#   bench/run.sh kernels    # only: native-kernel calls, against JAX calling the same library
#   bench/run.sh nx         # only: defn MLP forward/gradient/training step (XlaNode.Compiler,
#                           # params on the node) against jax.jit; eager XlaNode.Backend ops;
#                           # an Nx.Serving on one device against one partition per device;
#                           # jit on one device and shard_jit over every device against JAX's
#                           # jit on one and with NamedSharding over as many CPU devices, and
#                           # the most a caller on a BEAM node could reach there (JAX's
#                           # computation alone plus the faster round trip of the call's
#                           # bytes, between two BEAM nodes or to the node, refused before XLA)
#   bench/run.sh pool       # only: XlaNode.Pool failover time, throughput on one and two nodes
#   bench/run.sh lifetime   # only: what a tensor's lifetime (XlaNode.Keeper) costs, per tensor made
#                           # and per sweep, against an eager operation's request
#   bench/run.sh ondemand   # only: XlaNode.Pool with launcher: (min 0, max 3) against a fixed pool
#                           # of three nodes under the same load: first call on an empty pool,
#                           # throughput growing from no node and grown
#   bench/run.sh tenants    # only: three client nodes: tiny runs of two beside a flood from the
#                           # third (runs held on slow callbacks, and large plain runs), and two
#                           # saturating nodes under weights 3:1 (XLA_NODE_BENCH_BASELINE_BIN=path
#                           # to a build of main adds arrival order, measured alike;
#                           # XLA_NODE_BENCH_TENANTS_ROUNDS, default 3), and both floods' shapes
#                           # between BEAM nodes alone, an echo server in the node's place
#   bench/run.sh metrics    # only: tiny calls and runs with --metrics-addr (scraped) against without
#                           # (XLA_NODE_BENCH_BASELINE_BIN=path/to/xla_node adds a node of that build)
#   bench/run.sh gpu        # only: on an NVIDIA GPU, against JAX on the same GPU in the same run: a
#                           # tiny run with host tensors, an eager op on device tensors (needs Nx),
#                           # MLP training steps (width 1024 batch 256, width 4096 batch 4096),
#                           # an 8192^3 bf16 matmul, 128 MiB and 1 GiB to the device and back, one
#                           # runtime_call inside a program against pure_callback. Says it was
#                           # skipped on a machine without an NVIDIA driver. The node runs on the
#                           # CUDA plugin scripts/setup.sh --gpu installs, else on JAX's own;
#                           # XLA_NODE_BENCH_GPU_PLUGIN=PATH names another, and =cpu runs it all on
#                           # the CPU plugin and JAX on CPU (to try it out without a GPU);
#                           # XLA_NODE_BENCH_GPU_SMALL=1 takes small sizes; JAX is the python3's
#                           # own (jax[cuda13]), on CPU the one scripts/kernels.sh installs.
# XLA_NODE_BIN names another node binary to measure (default: target/release/xla_node).
# Needs scripts/setup.sh to have run (release build, plugin, Erlang/Elixir); the callbacks, kernels
# and nx parts run scripts/kernels.sh (JAX, the test kernel library). The nx part runs only where
# NX_PATH points at a local Nx checkout (with COMPLEX_PATH, TELEMETRY_PATH, and Elixir >= 1.17 on
# PATH, as for elixir_nx's tests), and says it was skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${XLA_NODE_BIN:-target/release/xla_node}"
[ -n "${XLA_NODE_BIN:-}" ] || [ -x "$bin" ] || cargo build --release --quiet
bin=$(realpath "$bin")
epmd -daemon
cookie="bench_$$"
name="xla_bench_$$"
part="${1:-all}"
kernel_args=()
if [ "$part" = all ] || [ "$part" = kernels ] || [ "$part" = callbacks ] || [ "$part" = nx ] ||
    { [ "$part" = gpu ] && [ "${XLA_NODE_BENCH_GPU_PLUGIN:-}" = cpu ]; }; then
    scripts/kernels.sh
    export XLA_NODE_BENCH_JAX="${XDG_DATA_HOME:-$HOME/.local/share}/xla_node/jax"
fi
if [ "$part" = all ] || [ "$part" = kernels ] || [ "$part" = callbacks ]; then
    export XLA_NODE_BENCH_KERNELS="$PWD/target/kernels/libxn_test_kernels_ffi02.so"
    kernel_args=(--kernel "xn_increment=$XLA_NODE_BENCH_KERNELS:xn_increment")
fi
pids=()
tls_dir=""
gpu_dir=""
cleanup() {
    kill "${pids[@]}" 2>/dev/null || true
    [ -z "$tls_dir" ] || rm -rf "$tls_dir"
    [ -z "$gpu_dir" ] || rm -rf "$gpu_dir"
}
trap cleanup EXIT
wait_registered() {
    for _ in $(seq 50); do epmd -names 2>/dev/null | grep -q "name $1 " && break; sleep 0.1; done
}
if [ "$part" != gpu ] && [ "$part" != tenants ]; then
    "$bin" --sname "$name" --cookie "$cookie" "${kernel_args[@]}" 2>/tmp/xla_bench_node.log &
    pids+=($!)
    wait_registered "$name"
fi
if [ "$part" = all ] || [ "$part" = metrics ]; then
    # The same build with the metrics endpoint on, and optionally another build, side by side.
    export XLA_NODE_BENCH_METRICS_NODE="xla_bench_metrics_$$"
    log=/tmp/xla_bench_metrics_node.log
    "$bin" --sname "$XLA_NODE_BENCH_METRICS_NODE" --cookie "$cookie" \
        --metrics-addr 127.0.0.1:0 2>"$log" &
    pids+=($!)
    wait_registered "$XLA_NODE_BENCH_METRICS_NODE"
    # The node names the port it was given once it serves.
    for _ in $(seq 50); do grep -q 'serving metrics at' "$log" && break; sleep 0.1; done
    XLA_NODE_BENCH_METRICS_URL="$(grep -o 'http://[^ ]*/metrics' "$log" | head -1)"
    export XLA_NODE_BENCH_METRICS_URL
    if [ -n "${XLA_NODE_BENCH_BASELINE_BIN:-}" ]; then
        export XLA_NODE_BENCH_BASELINE_NODE="xla_bench_baseline_$$"
        "$XLA_NODE_BENCH_BASELINE_BIN" --sname "$XLA_NODE_BENCH_BASELINE_NODE" --cookie "$cookie" \
            2>/tmp/xla_bench_baseline_node.log &
        pids+=($!)
        wait_registered "$XLA_NODE_BENCH_BASELINE_NODE"
    fi
fi
if [ "$part" != nx ] && [ "$part" != pool ] && [ "$part" != ondemand ] && [ "$part" != gpu ] && [ "$part" != tenants ]; then
    # The client's modules (bench.exs moves 1 GiB as XlaNode.Transfer does), compiled.
    (cd elixir_client && mix compile >/dev/null)
    client_ebin=elixir_client/_build/dev/lib/xla_node_client/ebin
    # The tls part compares with the same figures over plain TCP, taken in the same run.
    plain_part="$part"
    [ "$part" = tls ] && plain_part=node
    elixir --sname "bench_client_$$" --cookie "$cookie" -pa "$client_ebin" bench/bench.exs "$name" "$plain_part"
fi
if [ "$part" = all ] || [ "$part" = tls ]; then
    # One CA and one node certificate for this host, in the option file every node reads.
    tls_dir=$(mktemp -d)
    host=$(hostname -s)
    openssl_quiet() { openssl "$@" >/dev/null 2>&1; }
    openssl_quiet req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
        -keyout "$tls_dir/ca.key" -out "$tls_dir/ca.pem" -days 2 -subj /CN=bench_ca
    openssl_quiet req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
        -keyout "$tls_dir/node.key" -out "$tls_dir/node.csr" -subj /CN=bench_node
    printf 'subjectAltName = DNS:%s\nextendedKeyUsage = serverAuth, clientAuth\n' "$host" >"$tls_dir/node.ext"
    openssl_quiet x509 -req -in "$tls_dir/node.csr" -CA "$tls_dir/ca.pem" -CAkey "$tls_dir/ca.key" \
        -CAcreateserial -out "$tls_dir/node.pem" -days 2 -extfile "$tls_dir/node.ext"
    side="{certfile, \"$tls_dir/node.pem\"}, {keyfile, \"$tls_dir/node.key\"}, {cacertfile, \"$tls_dir/ca.pem\"}, {verify, verify_peer}"
    printf '[{server, [%s, {fail_if_no_peer_cert, true}]},\n {client, [%s]}].\n' "$side" "$side" >"$tls_dir/dist.conf"
    tls_args="-proto_dist inet_tls -ssl_dist_optfile $tls_dir/dist.conf"
    "$bin" --sname "${name}_tls" --cookie "$cookie" \
        --proto-dist inet_tls --ssl-dist-optfile "$tls_dir/dist.conf" 2>/tmp/xla_bench_tls_node.log &
    pids+=($!)
    wait_registered "${name}_tls"
    XLA_NODE_BENCH_TLS_ARGS="$tls_args" elixir --sname "bench_tls_client_$$" --cookie "$cookie" \
        --erl "$tls_args" -pa "$client_ebin" bench/bench.exs "${name}_tls" node
fi
if [ "$part" = all ] || [ "$part" = pool ]; then
    # The pool part starts, kills and restarts nodes of its own; it runs in the client's Mix
    # project, for XlaNode.Pool.
    (cd elixir_client && elixir --sname "bench_pool_$$" --cookie "$cookie" -S mix run ../bench/pool.exs \
        "$bin" "$cookie" </dev/null)
fi
if [ "$part" = all ] || [ "$part" = lifetime ]; then
    # In the client's Mix project, for XlaNode.Keeper.
    (cd elixir_client && elixir --sname "bench_lifetime_$$" --cookie "$cookie" -S mix run ../bench/lifetime.exs \
        "$name" </dev/null)
fi
if [ "$part" = all ] || [ "$part" = ondemand ]; then
    # Its nodes are started by XlaNode.Local and the pool's launcher, from this binary.
    (cd elixir_client && XLA_NODE_BIN="$bin" elixir --sname "bench_on_demand_$$" -S mix run \
        ../bench/pool_on_demand.exs </dev/null)
fi
if [ "$part" = all ] || [ "$part" = tenants ]; then
    # Starts its own nodes: one compute node per build and measurement, three client nodes.
    (cd elixir_client && mix compile >/dev/null)
    elixir --sname "bench_tenants_$$" --cookie "$cookie" -pa elixir_client/_build/dev/lib/xla_node_client/ebin \
        bench/tenants.exs "$bin" "$cookie" </dev/null
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
        (cd elixir_nx && elixir --sname "bench_nx_eager_$$" --cookie "$cookie" -S mix run ../bench/nx_eager.exs "$name" </dev/null)
        (cd elixir_nx && elixir --sname "bench_nx_devices_$$" --cookie "$cookie" -S mix run ../bench/nx_devices.exs "$name" </dev/null)
    fi
fi
if [ "$part" = all ] || [ "$part" = gpu ]; then
    source scripts/gpu_env.sh
    gpu_plugin="${XLA_NODE_BENCH_GPU_PLUGIN:-}"
    if [ "$gpu_plugin" = cpu ]; then
        jax_platform=cpu
        gpu_plugin=""
        export PYTHONPATH="$XLA_NODE_BENCH_JAX${PYTHONPATH:+:$PYTHONPATH}"
    else
        jax_platform=cuda
    fi
    if [ "$jax_platform" = cuda ] && ! xla_node_nvidia_driver_present; then
        printf '\n## gpu: skipped: no NVIDIA driver on this machine (XLA_NODE_BENCH_GPU_PLUGIN=cpu runs it on the CPU plugin)\n'
    else
        if [ "$jax_platform" = cuda ] && [ -z "$gpu_plugin" ]; then
            if [ -f "$xla_node_cuda_plugin" ]; then
                gpu_plugin="$xla_node_cuda_plugin"
            else
                # The plugin of the JAX this benchmark compares with, where setup --gpu has not run.
                gpu_plugin=$(python3 -c 'import os, jax_plugins.xla_cuda13 as p; print(os.path.join(os.path.dirname(p.__file__), "xla_cuda_plugin.so"))') || {
                    echo "bench: gpu: no CUDA PJRT plugin: run scripts/setup.sh --gpu, or set XLA_NODE_BENCH_GPU_PLUGIN" >&2
                    exit 1
                }
            fi
            if [ "$gpu_plugin" = "$xla_node_cuda_plugin" ] && [ -d "$xla_node_cuda_data_dir" ]; then
                case "${XLA_FLAGS:-}" in
                    *--xla_gpu_cuda_data_dir=*) ;;
                    *) export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_cuda_data_dir=$xla_node_cuda_data_dir" ;;
                esac
            fi
        fi
        gpu_dir=$(mktemp -d)
        small=()
        [ -z "${XLA_NODE_BENCH_GPU_SMALL:-}" ] || small=(--small)
        # JAX first, alone on the device; then the node, alone on it too.
        python3 bench/gpu_jax.py --out "$gpu_dir" --platform "$jax_platform" "${small[@]}" >/dev/null
        gpu_name="${name}_gpu"
        plugin_args=()
        [ -z "$gpu_plugin" ] || plugin_args=(--pjrt-plugin "$gpu_plugin")
        # 1 GiB goes through the connection each way. XLA_NODE_BENCH_GPU_NODE_ARGS: more node
        # arguments (e.g. "--preallocate false").
        read -r -a gpu_node_args <<<"${XLA_NODE_BENCH_GPU_NODE_ARGS:-}"
        "$bin" --sname "$gpu_name" --cookie "$cookie" --max-message-bytes 2G "${plugin_args[@]}" \
            "${gpu_node_args[@]}" 2>/tmp/xla_bench_gpu_node.log &
        pids+=($!)
        wait_registered "$gpu_name"
        elixir --sname "bench_gpu_$$" --cookie "$cookie" bench/gpu.exs "$gpu_name" "$gpu_dir"
        if [ -z "${NX_PATH:-}" ]; then
            printf '  eager op on device tensors: skipped: Nx is not present (set NX_PATH, as for the nx part)\n'
        else
            (cd elixir_nx && elixir --sname "bench_gpu_eager_$$" --cookie "$cookie" -S mix run ../bench/gpu_eager.exs \
                "$gpu_name" "$gpu_dir" </dev/null)
        fi
    fi
fi
