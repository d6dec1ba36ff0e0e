#!/bin/sh
# The lab's shared services (stand-ins for Docker Hub and for NVIDIA's and Hugging Face's download hosts):
# a registry that lab hosts use as their Docker Hub mirror, and an HTTP server for /srv/www, which holds
# the stand-in NVIDIA apt repository (/libnvidia-container/...) and the model mirror (/models/...).
set -e
docker-registry serve /etc/docker/registry/config.yml &
cd /srv/www
exec python3 -m http.server 80
