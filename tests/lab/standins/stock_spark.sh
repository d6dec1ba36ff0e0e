#!/bin/sh
# Shape a booted lab host like a stock DGX OS Spark, the way its owner's setup left it (run once, as root, after
# sudo_user.sh has made the owner's account `admin`):
# - the NVIDIA Container Toolkit installed the way NVIDIA's install guide does it (keyring dearmored into
#   /usr/share/keyrings, nvidia-container-toolkit.list, the four packages pinned to one version), then
#   registered with `nvidia-ctk runtime configure --runtime=docker` and dockerd restarted, as the guide says;
# - optionally `--set-as-default` (one public report says DGX OS ships that), a runtime path written in full,
#   and a long-running container of the owner's with a restart policy (a chat UI, say).
# Settings come from the environment: NVIDIA_BASE, TOOLKIT_VERSION, SET_AS_DEFAULT, RUNTIME_PATH, OWNER_IMAGE.
set -eu

KEYRING=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg

# NVIDIA's install guide, step by step (the lab's stand-in repository instead of nvidia.github.io).
curl -fsSL "$NVIDIA_BASE/gpgkey" | gpg --dearmor -o "$KEYRING"
echo "deb [signed-by=$KEYRING] $NVIDIA_BASE/stable/deb/\$(ARCH) /" \
    > /etc/apt/sources.list.d/nvidia-container-toolkit.list
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    "nvidia-container-toolkit=$TOOLKIT_VERSION" "nvidia-container-toolkit-base=$TOOLKIT_VERSION" \
    "libnvidia-container-tools=$TOOLKIT_VERSION" "libnvidia-container1=$TOOLKIT_VERSION" >/dev/null
if [ "$SET_AS_DEFAULT" = yes ]; then
    nvidia-ctk runtime configure --runtime=docker --set-as-default
else
    nvidia-ctk runtime configure --runtime=docker
fi
if [ -n "$RUNTIME_PATH" ]; then  # some hosts name the runtime by its full path: the same binary
    python3 - "$RUNTIME_PATH" <<'EOF'
import json, sys
config = json.load(open("/etc/docker/daemon.json"))
config["runtimes"]["nvidia"]["path"] = sys.argv[1]
open("/etc/docker/daemon.json", "w").write(json.dumps(config, indent=4, sort_keys=True))
EOF
fi
systemctl restart docker

if [ -n "$OWNER_IMAGE" ]; then  # a container sparkfleet does not own, restarted by Docker after a dockerd restart
    docker run -d --name owner-webui --restart unless-stopped --network host --entrypoint python3 \
        "$OWNER_IMAGE" -m http.server 3000 >/dev/null
fi
mkdir -p /var/lib/sparkfleet-lab && echo stock > /var/lib/sparkfleet-lab/profile
