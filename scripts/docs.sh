#!/usr/bin/env bash
# Builds the HTML documentation, as HexDocs shows it, of the Elixir client (elixir_client/doc/)
# and, where Nx is present (NX_PATH, with COMPLEX_PATH and TELEMETRY_PATH, as for its tests), of
# the Nx compiler and backend (elixir_nx/doc/). ExDoc is Debian 13's (the elixir-ex-doc package),
# run by `mix docs` in the Debian 13 userland (scripts/userland.sh); the README and the docs/
# pages are among the extras (each project's `docs:` in its mix.exs says which). Fails, showing
# them, on any warning ExDoc prints: a broken link, a reference to a hidden or missing function.
# Quiet otherwise: prints where each index.html is.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

if ! why=$(scripts/userland.sh available); then
    echo "docs: not built: ExDoc runs in the Debian 13 userland, and $why" >&2
    exit 1
fi
scripts/userland.sh make trixie

# Runs a command from the project directory $project, in the Debian 13 userland, with Mix
# building for it there; $binds are the `--bind DIR` arguments of scripts/userland.sh it needs.
project=
binds=()
in_userland() {
    (cd "$project" && "$repo/scripts/userland.sh" run ${binds[@]+"${binds[@]}"} trixie \
        env MIX_BUILD_ROOT=_build/trixie MIX_ENV=dev "$@" </dev/null 2>&1)
}

# Compiles $project, then runs `mix docs` there; fails on any warning of ExDoc's. (Compiler
# warnings are the tests' to catch: the client compiles with --warnings-as-errors, and Nx's own
# are not ours.)
build() {
    local output status=0
    if ! output=$(in_userland mix compile); then
        printf '%s\n' "$output" >&2
        echo "docs: $project: does not compile (above)" >&2
        return 1
    fi
    output=$(in_userland mix docs --formatter html) || status=$?
    if [ "$status" -ne 0 ] || grep -qi 'warning' <<<"$output"; then
        printf '%s\n' "$output" >&2
        echo "docs: $project: ExDoc failed or warned (above)" >&2
        return 1
    fi
    echo "docs: $project/doc/index.html"
}

project=elixir_client
build

if [ -n "${NX_PATH:-}" ]; then
    for dir in "$NX_PATH" "${COMPLEX_PATH:-}" "${TELEMETRY_PATH:-}"; do
        [ -z "$dir" ] || binds+=(--bind "$dir")
    done
    project=elixir_nx
    build
else
    echo "docs: elixir_nx: not built: Nx is not present (set NX_PATH to a local Nx checkout, with COMPLEX_PATH and TELEMETRY_PATH)"
fi
