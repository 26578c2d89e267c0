#!/usr/bin/env bash
# Installs what xla_node needs on a fresh Debian machine, quietly and idempotently:
#   - Erlang/OTP (erlang-nox, which brings epmd), Elixir and a C++ compiler (g++: the build
#     compiles src/xla/catch.cc, and scripts/kernels.sh the test kernels), from apt;
#   - the PJRT CPU plugin (PyPI wheel xla-cpu-pjrt) into the fixed place the node looks in;
#   - a release build of xla_node.
# Safe to run again: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'setup: %s\n' "$*" >&2; }

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

command -v cargo >/dev/null 2>&1 || { log "cargo not found: install Rust (https://rustup.rs) first"; exit 1; }
log "building xla_node (release)"
cargo build --release --quiet
