#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every test: formatting and lints, the Rust unit,
# executor and callback tests (real PJRT plugin, real Elixir peers), the Elixir client's unit
# tests, and the multi-node integration suite (real epmd, real BEAM nodes, the release binary, a
# real sshd on loopback).
#
# The client's tests and the integration suite run on three Erlang/OTP and Elixir releases: this
# machine's, and those of two Debian userlands (scripts/userland.sh: Debian 13's OTP 27 / Elixir
# 1.18, Debian unstable's OTP 29 / Elixir 1.20), whose BEAMs run the same suite, unchanged,
# against the same node binary. Where this machine cannot make the userlands (not root, not
# Debian), one line says so and the rest runs. The integration suite runs on every release
# even when one fails; its result on each is summed up at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
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

# The releases the Elixir suites run on: "host", then the userlands this machine can make.
releases=(host)
if why=$(scripts/userland.sh available); then
    for suite in trixie sid; do
        scripts/userland.sh make "$suite"
        releases+=("$suite")
    done
else
    echo "OTP 27 and OTP 29 (Debian userlands): the suites run on this machine's release only: $why"
fi

# Runs a command from the BEAM of a release, in the current directory, with Mix building into a
# directory of that release's own (MIX_BUILD_ROOT): the releases' builds never mix.
beam() {
    local release=$1
    shift
    if [ "$release" = host ]; then
        "$@"
    else
        "$repo/scripts/userland.sh" run "$release" env MIX_BUILD_ROOT="_build/$release" "$@"
    fi
}

# "OTP 27.3.4 / Elixir 1.18.3 (Debian 13 trixie)"
describe() {
    if [ "$1" = host ]; then
        printf '%s (this machine)\n' "$(elixir scripts/releases.exs </dev/null)"
    else
        scripts/userland.sh describe "$1"
    fi
}

# The client compiles without a warning (deprecations included) on every release.
for release in "${releases[@]}"; do
    [ "$release" = host ] || echo "elixir_client on $(describe "$release"):"
    (cd elixir_client &&
        beam "$release" env MIX_ENV=test mix compile --force --warnings-as-errors </dev/null &&
        beam "$release" env MIX_ENV=test mix test --warnings-as-errors </dev/null)
done

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

# The integration suite from each release's BEAM; the nodes it starts are this build's.
output=$(mktemp)
trap 'rm -f "$output"' EXIT
summary=()
failures=()
failed=0
# Each failure ExUnit printed in FILE (a test, a doctest, a module's setup_all): its heading, place,
# assertion and stack trace (at most 40 lines), without the log captured with it.
failure_heads() {
    awk '/^ +[0-9]+\) / { on = 1; n = 0 }
         on && /The following output was logged/ { on = 0 }
         on && /^[^ ]/ { on = 0 }
         on && n++ < 40 { print }' "$1"
}
cd integration
for release in "${releases[@]}"; do
    label=$(cd "$repo" && describe "$release")
    [ "$release" = host ] || echo "integration suite on $label:"
    status=0
    beam "$release" env MIX_ENV=test XLA_NODE_BIN="$repo/target/release/xla_node" \
        elixir --sname "xla_itest_${release}_$$" --cookie xla_test -S mix test </dev/null 2>&1 |
        tee "$output" || status=$?
    # ExUnit's last line of counts ("302 tests, 0 failures", or from Elixir 1.19 on "Result: ...")
    counts=$(grep -E '^[0-9]+ (doctests?|tests?|propert(y|ies)),|^Result: ' "$output" | tail -n 1 || true)
    if [ "$status" -eq 0 ]; then
        summary+=("  $label: passed: ${counts:-no count printed}")
    else
        summary+=("  $label: FAILED (exit status $status): ${counts:-no count printed}")
        failures+=("$label:" "$(failure_heads "$output")")
        failed=1
    fi
done
# The failures again, without the logs captured beside them, where the end of a long output
# (all a CI page may show) still has them.
if [ "${#failures[@]}" -gt 0 ]; then
    echo "integration suite failures:"
    printf '%s\n' "${failures[@]}"
fi
echo "integration suite:"
printf '%s\n' "${summary[@]}"
exit "$failed"
