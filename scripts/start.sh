#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and starts the node in the foreground.
# Arguments go to xla_node; default: --sname xla.  Example: scripts/start.sh --sname xla --cookie secret
# With --gpu first (scripts/start.sh --gpu --sname xla), setup also installs the CUDA PJRT plugin
# and the NVIDIA libraries it loads (scripts/setup.sh --gpu), and the node starts on that plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
gpu=false
if [ "${1:-}" = --gpu ]; then
    gpu=true
    shift
fi
if $gpu; then
    scripts/setup.sh --gpu
else
    scripts/setup.sh
fi
[ $# -gt 0 ] || set -- --sname xla
if $gpu; then
    # XLA looks for ptxas and libdevice beside the plugin too; naming the directory makes sure it
    # uses the ones installed with it. A directory the caller named already wins.
    case "${XLA_FLAGS:-}" in
        *--xla_gpu_cuda_data_dir=*) ;;
        *) export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_cuda_data_dir=$xla_node_cuda_data_dir" ;;
    esac
    set -- --pjrt-plugin "$xla_node_cuda_plugin" "$@"
fi
exec target/release/xla_node "$@"
