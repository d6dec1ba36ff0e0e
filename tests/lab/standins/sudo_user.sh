#!/bin/sh
# The account an operator logs in as on a lab host that is not blank (run first, as root, with the lab's public
# key on stdin): `admin`, uid 1000, passwordless sudo, the lab key; root does not log in over SSH.
set -eu

id admin >/dev/null 2>&1 || useradd --uid 1000 --create-home --shell /bin/bash admin
echo 'admin ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/admin
chmod 0440 /etc/sudoers.d/admin
install -d -m 0700 -o admin -g admin /home/admin/.ssh
install -m 0600 -o admin -g admin /dev/stdin /home/admin/.ssh/authorized_keys
printf 'PermitRootLogin no\nPasswordAuthentication no\n' > /etc/ssh/sshd_config.d/lab.conf
systemctl reload ssh
