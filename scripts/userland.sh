#!/usr/bin/env bash
# Debian userlands that bring newer Erlang/OTP and Elixir releases onto this machine, from Debian's
# own packages: the suites run from their BEAMs against the host's build of the node.
#   trixie  Debian 13:        Erlang/OTP 27, Elixir 1.18 (and ex_doc, for scripts/docs.sh)
#   sid     Debian unstable:  Erlang/OTP 29, Elixir 1.20 (at the time of writing)
# Each is made once with `debootstrap --variant=minbase` from the Debian mirror this machine's apt
# sources name, plus `apt-get install erlang-nox elixir ...` inside, under
#   ${XDG_DATA_HOME:-~/.local/share}/xla_node/userlands/SUITE
# and kept. It is made in SUITE.partial and moved into place once complete, with a stamp naming
# what it holds: a userland without the stamp (or with another recipe's, or a package apt left
# unconfigured) is half made, and is removed and made again rather than used. Quiet: prints only
# what it makes, or why it cannot.
#
# A command runs inside with `chroot`, in a private mount namespace (its mounts vanish with it,
# however it ends) where the host's /dev, /proc, /sys, /tmp, /etc/hosts, the repository and the
# data directory (PJRT plugin, JAX) are seen at their own paths; the network is the host's, so
# the userland's epmd, nodes and the host's nodes meet on one loopback. `python3`, `cargo` and
# `g++` inside run the host's (JAX, the suites' counterpart, is installed for its Python; the
# node is the host's build): the host's root is seen at /mnt/host.
#
# Needs root (chroot, mounts) and debootstrap (installed from apt when missing).
#
# Usage:
#   scripts/userland.sh available        exit 0 if this machine can make and enter userlands,
#                                        else print why not, in one line, and exit 1
#   scripts/userland.sh make SUITE       make SUITE's userland unless it is there, complete
#   scripts/userland.sh state SUITE      print "complete", "missing" or "incomplete: WHY"
#   scripts/userland.sh recipe SUITE     print what a complete userland's stamp says (the file
#                                        etc/xla_node-userland in it)
#   scripts/userland.sh run [--bind DIR]... SUITE CMD...
#                                        run CMD inside (made first if needed), from the current
#                                        directory, which must lie in the repository, the data
#                                        directory, /tmp or a DIR given with --bind (seen inside
#                                        at its own path too)
#   scripts/userland.sh describe SUITE   print "OTP <release> / Elixir <version> (<Debian>)"
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
self="$repo/scripts/userland.sh"
data="${XDG_DATA_HOME:-$HOME/.local/share}/xla_node"
base="$data/userlands"

# Bump when what a userland holds changes: every userland made before is then remade.
recipe_version=1
# Where the host's root is seen inside a userland (for the host's python3).
host_root=/mnt/host

log() { printf 'userland: %s\n' "$*" >&2; }
die() {
    log "$*"
    exit 1
}

suite_label() {
    case "$1" in
        trixie) echo "Debian 13 trixie" ;;
        sid) echo "Debian unstable sid" ;;
        *) die "unknown suite $1 (known: trixie, sid)" ;;
    esac
}

suite_packages() {
    case "$1" in
        # erlang-nox: the whole OTP without X (ssl for TLS distribution, inets for the metrics
        # test's HTTP client, whose defaults read the system's CA certificates, hence
        # ca-certificates); openssl: the TLS test's certificates; procps: kill and pkill.
        trixie) echo "erlang-nox elixir ca-certificates openssl procps elixir-ex-doc" ;;
        sid) echo "erlang-nox elixir ca-certificates openssl procps" ;;
        *) die "unknown suite $1 (known: trixie, sid)" ;;
    esac
}

# What a complete userland's stamp says.
stamp_text() {
    printf 'xla_node userland, recipe %s\nsuite %s\npackages %s\n' \
        "$recipe_version" "$1" "$(suite_packages "$1")"
}
stamp_path() { printf '%s/etc/xla_node-userland' "$1"; }

# Runs a command with its output held back, shown only if it fails.
quiet() {
    local out
    if ! out=$("$@" </dev/null 2>&1); then
        printf '%s\n' "$out" >&2
        return 1
    fi
}

# The Debian mirror this machine's apt sources name for its own release (its security and
# updates suites aside): the first URI of an enabled `deb` source whose suites include the
# release's codename, from deb822 .sources files or one-line .list files.
debian_mirror() {
    local codename
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$codename" ] || return 1
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # Paragraphs separated by blank lines; continuation lines (leading space) joined.
        awk -v codename="$codename" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && enabled !~ /^(no|false)$/ && (" " suites " ") ~ (" " codename " ") && uris != "") {
                    split(uris, u, " "); print u[1]; found = 1; exit
                }
                types = ""; suites = ""; uris = ""; enabled = ""; field = ""
            }
            /^#/ { next }
            /^[ \t]*$/ { flush(); next }
            /^[ \t]/ { value = $0; sub(/^[ \t]+/, "", value)
                       if (field == "uris") uris = uris " " value
                       else if (field == "suites") suites = suites " " value
                       next }
            { name = tolower($0); sub(/:.*/, "", name); value = $0; sub(/^[^:]*:[ \t]*/, "", value)
              field = name
              if (name == "types") types = value
              else if (name == "uris") uris = value
              else if (name == "suites") suites = value
              else if (name == "enabled") enabled = tolower(value) }
            END { if (!found) flush() }
        ' "$f" | head -n 1 | grep . && return 0
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        # deb [options] URI SUITE COMPONENT...
        awk -v codename="$codename" '
            $1 != "deb" { next }
            { i = 2; if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } }
            $(i + 1) == codename { print $i; exit }
        ' "$f" | head -n 1 | grep . && return 0
    done
    return 1
}

# Why this machine cannot make or enter userlands (one line), or nothing when it can.
why_unavailable() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "they need root (debootstrap, chroot and mounts)"
    elif ! command -v debootstrap >/dev/null 2>&1 && ! command -v apt-get >/dev/null 2>&1; then
        echo "debootstrap is not installed, and there is no apt-get to install it"
    elif ! command -v unshare >/dev/null 2>&1 || ! command -v chroot >/dev/null 2>&1; then
        echo "unshare or chroot is missing"
    elif [ "$(. /etc/os-release && echo "${ID:-}")" != debian ]; then
        echo "this machine is not Debian, so its apt sources name no Debian mirror"
    elif ! debian_mirror >/dev/null; then
        echo "this machine's apt sources name no Debian mirror for its release"
    elif ! unshare --mount --propagation private true 2>/dev/null; then
        echo "this machine does not allow a private mount namespace (unshare --mount)"
    fi
}

# "complete", "missing" or "incomplete: WHY" for the userland at $1 of suite $2.
state_of() {
    local root=$1 suite=$2
    if [ ! -e "$root" ]; then
        echo missing
        return
    fi
    local stamp
    stamp=$(stamp_path "$root")
    if [ ! -f "$stamp" ]; then
        echo "incomplete: no stamp (a run that made it was interrupted)"
        return
    fi
    if [ "$(cat "$stamp")" != "$(stamp_text "$suite")" ]; then
        echo "incomplete: made by another recipe"
        return
    fi
    local program
    for program in erl elixir mix epmd openssl; do
        if [ ! -x "$root/usr/bin/$program" ]; then
            echo "incomplete: no /usr/bin/$program"
            return
        fi
    done
    # Every package installed and configured (an apt-get cut short leaves them half-installed).
    local missing
    missing=$(awk -v want="$(suite_packages "$suite")" '
        BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) need[w[i]] = 1 }
        /^Package: / { pkg = $2 }
        /^Status: / { if ($0 == "Status: install ok installed") ok[pkg] = 1 }
        END { for (p in need) if (!(p in ok)) printf "%s ", p }
    ' "$root/var/lib/dpkg/status" 2>/dev/null || echo "dpkg")
    if [ -n "$missing" ]; then
        echo "incomplete: not installed: ${missing% }"
        return
    fi
    echo complete
}

# Lists the mount points at or under $1 in this mount namespace, deepest first.
mounts_under() {
    awk -v dir="$1" '{ gsub(/\\040/, " ", $5) } $5 == dir || index($5, dir "/") == 1 { print $5 }' \
        /proc/self/mountinfo | sort -r
}

# Removes a (half-made) userland directory; never through a mount into the host's files.
remove_tree() {
    local dir=$1 mounted
    [ -e "$dir" ] || return 0
    mounted=$(mounts_under "$dir")
    if [ -n "$mounted" ]; then
        # Only a run from outside this script mounts there (its own mounts are private).
        die "$dir has mounts in it ($(echo $mounted)): unmount them, then run again"
    fi
    rm -rf --one-file-system "$dir"
}

# Makes the userland of suite $1 at $2: debootstrap into $2.partial, install the packages,
# write the stamp, move into place.
make_userland() {
    local suite=$1 root=$2 partial="$2.partial" mirror
    mirror=$(debian_mirror) || die "this machine's apt sources name no Debian mirror"
    log "making the $(suite_label "$suite") userland (Erlang/OTP, Elixir from Debian) in $root"
    remove_tree "$partial"
    remove_tree "$root"
    mkdir -p "$base"
    # In a private mount namespace: whatever debootstrap mounts inside vanishes with it.
    quiet unshare --mount --propagation private -- \
        debootstrap --variant=minbase "$suite" "$partial" "$mirror"
    # Services are never started inside; recommends are not installed; unstable's Release file
    # may be past its validity date on a mirror that is a snapshot.
    printf '#!/bin/sh\nexit 101\n' >"$partial/usr/sbin/policy-rc.d"
    chmod 755 "$partial/usr/sbin/policy-rc.d"
    printf '%s\n' 'APT::Install-Recommends "false";' 'Acquire::Check-Valid-Until "false";' \
        >"$partial/etc/apt/apt.conf.d/99xla_node"
    mkdir -p "$partial$host_root"
    local packages
    read -r -a packages <<<"$(suite_packages "$suite")"
    quiet unshare --mount --propagation private -- "$self" __enter bare "$partial" / \
        apt-get update -qq
    quiet unshare --mount --propagation private -- "$self" __enter bare "$partial" / \
        env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}"
    quiet unshare --mount --propagation private -- "$self" __enter bare "$partial" / \
        apt-get clean
    stamp_text "$suite" >"$(stamp_path "$partial")"
    mv "$partial" "$root"
}

# Takes the userland lock of suite $1 on file descriptor 9: shared (-s) or exclusive (-x).
lock() {
    mkdir -p "$base"
    exec 9>"$base/$1.lock"
    flock "$2" 9
}

ensure() {
    local suite=$1 root="$base/$1" state
    suite_label "$suite" >/dev/null
    local why
    why=$(why_unavailable)
    [ -z "$why" ] || die "cannot make the userlands here: $why"
    lock "$suite" -s
    [ "$(state_of "$root" "$suite")" = complete ] && return 0
    if ! command -v debootstrap >/dev/null 2>&1; then
        log "installing debootstrap from apt"
        quiet apt-get update -qq
        quiet env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
    fi
    # Remade under the exclusive lock, once no run is inside it.
    lock "$suite" -x
    state=$(state_of "$root" "$suite")
    if [ "$state" != complete ]; then
        [ "$state" = missing ] || log "$root is $state: removing it"
        make_userland "$suite" "$root"
    fi
    lock "$suite" -s
}

# Inside the private mount namespace: mounts what the command needs to see, then chroots.
#   __enter bare|full ROOT DIR [BIND:...] CMD...
# bare: /dev, /proc, /sys and the host's resolver files (for apt while making it); full: also
# /tmp, the repository, the data directory, the directories in BIND (separated by ":") and the
# host's root at $host_root.
enter_inside() {
    local mode=$1 root=$2 dir=$3 binds=()
    shift 3
    if [ "$mode" = full ]; then
        IFS=: read -r -a binds <<<"$1"
        shift
    fi
    local path
    if [ "$mode" = full ]; then
        mount --rbind / "$root$host_root"
    fi
    for path in /dev /proc /sys; do
        mount --rbind "$path" "$root$path"
    done
    for path in /etc/hosts /etc/resolv.conf; do
        [ -f "$path" ] || continue
        if [ -L "$root$path" ] || [ ! -f "$root$path" ]; then
            rm -f "$root$path"
            touch "$root$path"
        fi
        mount --bind "$path" "$root$path"
    done
    if [ "$mode" = full ]; then
        for path in /tmp "$repo" "$data" ${binds[@]+"${binds[@]}"}; do
            mkdir -p "$root$path"
            mount --bind "$path" "$root$path"
        done
        # The host's python3 (JAX, the suites' counterpart, is installed for it), and its cargo
        # and g++ (`mix xla_node.setup` builds the node with them), each in the caller's
        # directory and environment (written anew each time, through a file of this run's own,
        # as another run may be entering too).
        mkdir -p "$root/usr/local/bin"
        local tool wrapper
        for tool in python3 cargo g++; do
            wrapper="$root/usr/local/bin/$tool.$$"
            cat >"$wrapper" <<EOF
#!/bin/sh
# Written by xla_node's scripts/userland.sh: the host's $tool, run in the same directory with the
# same environment.
PATH="\${XLA_NODE_HOST_PATH:-/usr/local/bin:/usr/bin:/bin}" exec /usr/sbin/chroot $host_root \\
    /bin/sh -c 'cd "\$1" || exit 127; shift; exec $tool "\$@"' $tool "\$(pwd)" "\$@"
EOF
            chmod 755 "$wrapper"
            mv "$wrapper" "$root/usr/local/bin/$tool"
        done
    fi
    exec chroot "$root" /usr/bin/env \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        XLA_NODE_HOST_PATH="$PATH" LC_ALL=C.UTF-8 \
        /bin/sh -c 'cd "$1" || exit 127; shift; exec "$@"' sh "$dir" "$@"
}

run_in() {
    local binds=() bind
    while [ "${1:-}" = --bind ]; do
        [ $# -ge 2 ] || die "run: --bind needs a directory"
        [ -d "$2" ] || die "run: --bind $2: not a directory"
        bind=$(cd "$2" && pwd -P)
        case "$bind" in
            *:*) die "run: --bind $bind: a path with a colon cannot be bound" ;;
        esac
        binds+=("$bind")
        shift 2
    done
    [ $# -ge 2 ] || die "usage: scripts/userland.sh run [--bind DIR]... SUITE CMD..."
    local suite=$1
    shift
    local dir seen=false
    dir=$(pwd -P)
    for bind in /tmp "$repo" "$data" ${binds[@]+"${binds[@]}"}; do
        case "$dir/" in "$bind"/*) seen=true ;; esac
    done
    $seen || die "run: $dir is not seen inside the userland (run from the repository, $data, /tmp or a directory given with --bind)"
    ensure "$suite"
    # The shared lock (fd 9) is held by the command until it ends: no remake under it.
    local joined
    joined=$(IFS=:; echo "${binds[*]+${binds[*]}}")
    unshare --mount --propagation private -- "$self" __enter full "$base/$suite" "$dir" "$joined" "$@"
}

describe() {
    local releases
    releases=$(cd "$repo" && run_in "$1" elixir scripts/releases.exs </dev/null)
    printf '%s (%s)\n' "$releases" "$(suite_label "$1")"
}

# Everything runs from here, once bash has read the whole file: a run lasts as long as its
# command, and a checkout may change this file meanwhile.
main() {
    local command=${1:-} why
    [ $# -gt 0 ] && shift
    case "$command" in
        available)
            why=$(why_unavailable)
            if [ -n "$why" ]; then
                echo "$why"
                exit 1
            fi
            ;;
        make)
            [ $# -eq 1 ] || die "usage: scripts/userland.sh make SUITE"
            ensure "$1"
            ;;
        state)
            [ $# -eq 1 ] || die "usage: scripts/userland.sh state SUITE"
            suite_label "$1" >/dev/null
            state_of "$base/$1" "$1"
            ;;
        recipe)
            [ $# -eq 1 ] || die "usage: scripts/userland.sh recipe SUITE"
            stamp_text "$1"
            ;;
        run)
            run_in "$@"
            ;;
        describe)
            [ $# -eq 1 ] || die "usage: scripts/userland.sh describe SUITE"
            describe "$1"
            ;;
        __enter)
            enter_inside "$@"
            ;;
        *)
            die "usage: scripts/userland.sh available | make SUITE | state SUITE | recipe SUITE | run [--bind DIR]... SUITE CMD... | describe SUITE"
            ;;
    esac
}

main "$@"
exit
