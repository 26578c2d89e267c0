#!/usr/bin/env bash
# A real OpenSSH server on loopback for the tests of XlaNode.Launcher.SSH, quietly and
# idempotently: installs Debian's openssh-server (apt, as root or through sudo -n) when sshd is
# missing, and starts, once, an sshd of its own on 127.0.0.1 with its own configuration, host
# key and authorised key, under target/sshd/ (the machine's own sshd and ~/.ssh are left alone):
#   port         the port it listens on (a free one, chosen the first time)
#   id_ed25519   the private key that logs in as the user running this script
#   other_key    a key it does not accept (for the tests of a wrong key)
#   known_hosts  its host key, for [127.0.0.1]:PORT and [localhost]:PORT
# Run again, it does nothing while that sshd runs (its pid is in target/sshd/sshd.pid; `kill` it
# to stop it). The integration suite runs this script itself (XlaNode.Harness.ensure_sshd!/0).
# Usage: scripts/sshd.sh
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'sshd: %s\n' "$*" >&2; }

quiet() {
    local out
    if ! out=$("$@" </dev/null 2>&1); then
        printf '%s\n' "$out" >&2
        return 1
    fi
}

sshd=/usr/sbin/sshd
if [ ! -x "$sshd" ] || ! command -v ssh >/dev/null 2>&1 || ! command -v ssh-keygen >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    log "installing openssh-server from apt"
    quiet $sudo apt-get update -qq
    quiet $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server openssh-client
fi

dir="$PWD/target/sshd"
mkdir -p "$dir"
chmod 700 "$dir"

if [ -f "$dir/sshd.pid" ] && kill -0 "$(cat "$dir/sshd.pid")" 2>/dev/null; then
    exit 0
fi

[ -f "$dir/host_ed25519" ] || quiet ssh-keygen -q -t ed25519 -N "" -C xla_node-test-host -f "$dir/host_ed25519"
[ -f "$dir/id_ed25519" ] || quiet ssh-keygen -q -t ed25519 -N "" -C xla_node-test-client -f "$dir/id_ed25519"
[ -f "$dir/other_key" ] || quiet ssh-keygen -q -t ed25519 -N "" -C xla_node-test-unknown -f "$dir/other_key"
cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
chmod 600 "$dir/authorized_keys"

if [ ! -s "$dir/port" ]; then
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' >"$dir/port"
fi
port=$(cat "$dir/port")
user=$(id -un)

{
    printf '[127.0.0.1]:%s %s\n' "$port" "$(cut -d' ' -f1,2 "$dir/host_ed25519.pub")"
    printf '[localhost]:%s %s\n' "$port" "$(cut -d' ' -f1,2 "$dir/host_ed25519.pub")"
} >"$dir/known_hosts"

# Keys only, this user only, loopback only. UsePAM no and StrictModes no let it run without the
# system's PAM stack and with its files under this checkout.
cat >"$dir/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $dir/host_ed25519
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/authorized_keys
AllowUsers $user
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
LogLevel ERROR
EOF

# Privilege separation wants its directory (made by the system's service otherwise).
if [ "$(id -u)" -eq 0 ]; then
    mkdir -p /run/sshd
    chmod 755 /run/sshd
fi

rm -f "$dir/sshd.pid"
"$sshd" -f "$dir/sshd_config" -E "$dir/sshd.log"
for _ in $(seq 50); do
    [ -s "$dir/sshd.pid" ] && exit 0
    sleep 0.1
done
log "sshd did not start; its log ($dir/sshd.log):"
cat "$dir/sshd.log" >&2 || true
exit 1
