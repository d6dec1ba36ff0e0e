#!/bin/sh
# The lab's shared services (stand-ins for Docker Hub, NVIDIA's download host and the Hugging Face Hub):
# a registry that lab hosts use as their Docker Hub mirror, an HTTP server for /srv/www, which holds the
# stand-in NVIDIA apt repository (/libnvidia-container/...) and the model mirror (/models/...), and the Hub
# stand-in (lab-hub, port 8080), serving the repositories /srv/www/hub/repos.json describes.
set -e
docker-registry serve /etc/docker/registry/config.yml &
lab-hub --root /srv/www --manifest /srv/www/hub/repos.json --port 8080 &
cd /srv/www
exec python3 -m http.server 80
