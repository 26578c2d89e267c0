#!/usr/bin/env bash
# Prepares the native-kernel (XLA FFI) fixtures, quietly and idempotently:
#   $JAX_DIR  = ${XDG_DATA_HOME:-~/.local/share}/xla_node/jax
#       JAX 0.8.1 + jaxlib 0.8.1 and their deps (put it on PYTHONPATH to run
#       integration/jax/ffi_crosscheck.py and bench/kernels_jax.py);
#       its jaxlib/include holds the FFI 0.2 headers.
#   ${XDG_DATA_HOME:-~/.local/share}/xla_node/ffi-headers/0.3/jaxlib/include
#       the FFI 0.3 headers (xla/ffi/api/*), taken from the jaxlib 0.10.2 wheel.
#   target/kernels/libxn_test_kernels_ffi02.so, target/kernels/libxn_test_kernels_ffi03.so
#       integration/kernels/test_kernels.cc built against each header set.
#   target/kernels/libxn_renamed_platform_plugin.so
#       integration/kernels/renamed_platform_plugin.c (the CPU plugin under another platform
#       name), built against the CPU plugin's pjrt_c_api.h (scripts/setup.sh installs it).
# Each step is skipped when its result is already there; prints nothing then.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'kernels: %s\n' "$*" >&2; }

data="${XDG_DATA_HOME:-$HOME/.local/share}/xla_node"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/xla_node/wheels"
JAX_DIR="$data/jax"
headers03="$data/ffi-headers/0.3"

# Runs pip quietly; shows its output only when it fails.
pip_quiet() {
    local out
    if ! out=$(python3 -m pip -q --disable-pip-version-check --no-input "$@" </dev/null 2>&1); then
        printf '%s\n' "$out" >&2
        return 1
    fi
}

if [ ! -f "$JAX_DIR/jax/__init__.py" ] || [ ! -f "$JAX_DIR/jaxlib/include/xla/ffi/api/ffi.h" ]; then
    log "installing jax 0.8.1 into $JAX_DIR"
    rm -rf "$JAX_DIR.partial"
    pip_quiet install --target "$JAX_DIR.partial" jax==0.8.1 jaxlib==0.8.1
    rm -rf "$JAX_DIR"
    mv "$JAX_DIR.partial" "$JAX_DIR"
fi

if [ ! -f "$headers03/jaxlib/include/xla/ffi/api/ffi.h" ]; then
    log "fetching the FFI 0.3 headers (jaxlib 0.10.2) into $headers03"
    mkdir -p "$cache"
    pip_quiet download --no-deps --only-binary=:all: --dest "$cache" jaxlib==0.10.2
    rm -rf "$headers03.partial"
    python3 - "$cache" "$headers03.partial" <<'EOF'
import glob, sys, zipfile
wheels = glob.glob(f"{sys.argv[1]}/jaxlib-0.10.2-*.whl")
if len(wheels) != 1:
    sys.exit(f"kernels: expected one jaxlib 0.10.2 wheel in {sys.argv[1]}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as z:
    names = [n for n in z.namelist() if n.startswith("jaxlib/include/xla/ffi/api/")]
    if not names:
        sys.exit(f"kernels: no FFI headers in {wheels[0]}")
    z.extractall(sys.argv[2], names)
EOF
    mkdir -p "$(dirname "$headers03")"
    rm -rf "$headers03"
    mv "$headers03.partial" "$headers03"
    rm -f "$cache"/jaxlib-0.10.2-*.whl
fi

src=integration/kernels/test_kernels.cc
self=scripts/kernels.sh
mkdir -p target/kernels
for variant in "02:$JAX_DIR/jaxlib/include" "03:$headers03/jaxlib/include"; do
    lib="target/kernels/libxn_test_kernels_ffi${variant%%:*}.so"
    if [ ! -f "$lib" ] || [ "$src" -nt "$lib" ] || [ "$self" -nt "$lib" ]; then
        log "building $lib"
        "${CXX:-g++}" -std=c++17 -O2 -fPIC -shared -Wall -isystem "${variant#*:}" "$src" -o "$lib.partial"
        mv "$lib.partial" "$lib"
    fi
done

plugin_include="$data/pjrt/xla_plugins/xla_cpu_pjrt/include"
src=integration/kernels/renamed_platform_plugin.c
lib=target/kernels/libxn_renamed_platform_plugin.so
if [ ! -f "$lib" ] || [ "$src" -nt "$lib" ] || [ "$self" -nt "$lib" ]; then
    log "building $lib"
    "${CC:-gcc}" -std=c11 -O2 -fPIC -shared -Wall -isystem "$plugin_include" "$src" -o "$lib.partial" -ldl
    mv "$lib.partial" "$lib"
fi
