#!/usr/bin/env bash
# Prepare this machine to run the Spark lab: system packages, a running dockerd, arm64 emulation.
# Idempotent: each step only acts when something is missing. Needs root (apt-get, dockerd, binfmt).
set -euo pipefail

packages=(docker.io debootstrap qemu-user-static binfmt-support rsync gnupg gpgv dpkg openssh-client curl)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    echo "setup: starting dockerd"
    (dockerd >/var/log/dockerd.log 2>&1 &)
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null
fi

if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    update-binfmts --enable qemu-aarch64 || true
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || { echo "setup: arm64 emulation could not be registered" >&2; exit 1; }
fi
# The arm64 hosts are reached as a sudo user, and sudo is setuid: qemu-user honours that only when the binfmt
# entry has the C (credentials) flag, which Debian's qemu-user-static does not set.
binfmt=/proc/sys/fs/binfmt_misc/qemu-aarch64
if ! sed -n 's/^flags: //p' "$binfmt" | grep -q C; then
    echo "setup: registering arm64 emulation with credentials (setuid sudo)"
    spec=/usr/share/binfmts/qemu-aarch64
    field() { sed -n "s/^$1 //p" "$spec"; }
    entry=":qemu-aarch64:M:$(field offset):$(field magic):$(field mask):$(field interpreter):OCPF"
    echo -1 > "$binfmt"
    printf '%s\n' "$entry" > /proc/sys/fs/binfmt_misc/register
fi
