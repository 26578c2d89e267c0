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

# Runs `mix docs` for the project in $1 (extra arguments: `--bind DIR` for scripts/userland.sh);
# fails on any warning.
build() {
    local project=$1 output status=0
    shift
    output=$(cd "$project" && "$repo/scripts/userland.sh" run "$@" trixie \
        env MIX_BUILD_ROOT=_build/trixie MIX_ENV=dev mix docs --formatter html </dev/null 2>&1) ||
        status=$?
    if [ "$status" -ne 0 ] || grep -qi 'warning' <<<"$output"; then
        printf '%s\n' "$output" >&2
        echo "docs: $project: ExDoc failed or warned (above)" >&2
        return 1
    fi
    echo "docs: $project/doc/index.html"
}

build elixir_client

if [ -n "${NX_PATH:-}" ]; then
    binds=()
    for dir in "$NX_PATH" "${COMPLEX_PATH:-}" "${TELEMETRY_PATH:-}"; do
        [ -z "$dir" ] || binds+=(--bind "$dir")
    done
    build elixir_nx "${binds[@]}"
else
    echo "docs: elixir_nx: not built: Nx is not present (set NX_PATH to a local Nx checkout, with COMPLEX_PATH and TELEMETRY_PATH)"
fi
