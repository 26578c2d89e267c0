#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and starts the node in the foreground.
# Arguments go to xla_node; default: --sname xla.  Example: scripts/start.sh --sname xla --cookie secret
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ $# -gt 0 ] || set -- --sname xla
exec target/release/xla_node "$@"
