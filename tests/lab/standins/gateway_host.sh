#!/bin/sh
# Shape a booted lab host like the plain Debian server a fleet's gateway runs on (run once, as root, after
# sudo_user.sh): its apt source is Debian's own archive, which lab hosts reach over plain HTTP, so the deploy
# installs HAProxy from the distribution for real. Nothing else: no GPU, toolkit or endpoint.
set -eu

cat > /etc/apt/sources.list <<'EOF'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
mkdir -p /var/lib/sparkfleet-lab && echo gateway > /var/lib/sparkfleet-lab/profile
