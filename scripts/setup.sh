#!/usr/bin/env bash
# Installs what xla_node needs on a fresh Debian machine, quietly and idempotently:
#   - Erlang/OTP (erlang-nox, which brings epmd), Elixir and a C++ compiler (g++: the build
#     compiles src/xla/catch.cc, and scripts/kernels.sh the test kernels), from apt;
#   - the PJRT CPU plugin (PyPI wheel xla-cpu-pjrt) into the fixed place the node looks in;
#   - a release build of xla_node;
#   - with --gpu, also the CUDA PJRT plugin (PyPI wheel jax-cuda13-pjrt) and the NVIDIA libraries
#     it loads (the wheels jax[cuda13] of the same release installs), into one directory where the
#     plugin finds them by itself (scripts/gpu_env.sh says which versions and where). Several GB;
#     on a machine without an NVIDIA driver it stops first, with one message, having installed
#     nothing.
# Safe to run again: each step is skipped when its result is already there.
# Usage: scripts/setup.sh [--gpu]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh

log() { printf 'setup: %s\n' "$*" >&2; }

gpu=false
for arg in "$@"; do
    case "$arg" in
        --gpu) gpu=true ;;
        *)
            log "unknown argument $arg (usage: scripts/setup.sh [--gpu])"
            exit 2
            ;;
    esac
done

# Before anything is downloaded: the CUDA libraries are of no use without the driver.
if $gpu && ! xla_node_nvidia_driver_present; then
    log "$xla_node_no_driver_message"
    exit 1
fi

# Runs a command with its output held back, and shows it only if the command fails (apt and pip
# talk on stderr even when all goes well).
quiet() {
    local out
    if ! out=$("$@" </dev/null 2>&1); then
        printf '%s\n' "$out" >&2
        return 1
    fi
}

packages=()
command -v erl >/dev/null 2>&1 || packages+=(erlang-nox)
command -v elixir >/dev/null 2>&1 || packages+=(elixir)
command -v "${CXX:-g++}" >/dev/null 2>&1 || packages+=(g++)
if ((${#packages[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    log "installing ${packages[*]} from apt"
    quiet $sudo apt-get update -qq
    quiet $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}"
fi

plugin_dir="${XDG_DATA_HOME:-$HOME/.local/share}/xla_node/pjrt"
if [ ! -f "$plugin_dir/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so" ]; then
    log "installing the PJRT CPU plugin (xla-cpu-pjrt) into $plugin_dir"
    quiet python3 -m pip install -q --disable-pip-version-check --no-input --target "$plugin_dir" xla-cpu-pjrt
fi

if $gpu && { [ ! -f "$xla_node_cuda_plugin" ] ||
    [ "$(cat "$xla_node_cuda_stamp" 2>/dev/null)" != "$xla_node_jax_cuda_version" ]; }; then
    log "installing the CUDA PJRT plugin (jax-cuda13-pjrt $xla_node_jax_cuda_version) and the NVIDIA libraries it loads into $xla_node_cuda_dir (several GB)"
    # Into a fresh directory moved into place once complete: an interrupted install is redone.
    partial="$xla_node_cuda_dir.partial"
    rm -rf "$partial"
    quiet python3 -m pip install -q --disable-pip-version-check --no-input --target "$partial" \
        "jax-cuda13-pjrt==$xla_node_jax_cuda_version" "${xla_node_nvidia_requirements[@]}"
    printf '%s\n' "$xla_node_jax_cuda_version" >"$partial/${xla_node_cuda_stamp##*/}"
    rm -rf "$xla_node_cuda_dir"
    mv "$partial" "$xla_node_cuda_dir"
fi

command -v cargo >/dev/null 2>&1 || { log "cargo not found: install Rust (https://rustup.rs) first"; exit 1; }
log "building xla_node (release)"
cargo build --release --quiet
