"""Weight staging throughput on a lab host against a plain local copy of the same bytes, in one run.

    .venv/bin/python -m benchmarks.weights_staging

Two staging paths, the two that move a fleet's bytes, each ending with the files verified and in place:
- from a peer: one Spark copies a generation another Spark holds, through the product's share server (HTTP with
  sendfile) and staging script (parallel streams, sha256 on the way, fsync, rename, manifest); in a fleet of N
  Sparks, N-1 stage this way;
- from the Hub: huggingface_hub's `hf download` inside the pulled vLLM image, then the staging script's sha256 of
  every file against the Hub's metadata (the first Spark of a fleet).
The plain copy is `cp -r` of the staged directory on the same host, then `sync`. The last line is the ratio.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

from sparkfleet.config import ModelSource
from sparkfleet.generations import resolve
from tests.lab import fleet

SCRATCH = "/var/tmp/sparkfleet-bench"
IMAGE = "vllm/vllm-openai:v0.28.0"
REPO_ID = "nvidia/Qwen3.6-35B-A3B-NVFP4"
SHARE_PORT = 9931
REMOTE = Path(__file__).resolve().parents[1] / "sparkfleet" / "remote"


def _sh(container: str, command: str) -> float:
    """Run a command in a lab host; returns its wall time."""
    started = time.monotonic()
    subprocess.run(["docker", "exec", container, "sh", "-c", command], check=True, capture_output=True)
    return time.monotonic() - started


def _install_scripts(container: str) -> None:
    _sh(container, f"rm -rf {SCRATCH} && mkdir -p {SCRATCH}/root/model")
    for script in ("stage_weights.py", "share_weights.py"):
        subprocess.run(["docker", "cp", str(REMOTE / script), f"{container}:{SCRATCH}/{script}"], check=True)


def main() -> None:
    state = fleet.up()
    source, peer = [h for h in state.hosts if h.arch == "amd64" and h.profile == "stock"][:2]
    generation = resolve(ModelSource("hub", repo=REPO_ID, revision="main"), state.hf_endpoint)
    mib = (generation.total_bytes or 0) / (1 << 20)
    sums = shlex.quote(generation.sums)
    for host in (source, peer):
        _install_scripts(host.container)
        _sh(host.container, f"printf %s {sums} > {SCRATCH}/SHA256SUMS")
    staged = f"{SCRATCH}/root/model/{generation.id}"
    _sh(source.container, f"docker image inspect {IMAGE} >/dev/null 2>&1 || docker pull -q {IMAGE}; "
                          f"mkdir -p {staged}/.staging")
    hub = _sh(source.container, f"docker run --rm --network host -e HF_ENDPOINT={state.hf_endpoint} --volume "
                                f"{staged}/.staging:/stage --entrypoint hf {IMAGE} download {REPO_ID} --revision "
                                f"{generation.commit} --local-dir /stage --quiet && python3 {SCRATCH}/stage_weights.py "
                                f"stage --dest {staged} --sums-file {SCRATCH}/SHA256SUMS --staged {staged}/.staging")
    _sh(source.container, f"(setsid python3 {SCRATCH}/share_weights.py --root {SCRATCH}/root --port {SHARE_PORT} "
                          f">/dev/null 2>&1 &) ; sync; sleep 1")
    try:
        from_peer = _sh(peer.container, f"python3 {SCRATCH}/stage_weights.py stage --dest {SCRATCH}/peer "
                                        f"--sums-file {SCRATCH}/SHA256SUMS --base-url "
                                        f"http://{source.address}:{SHARE_PORT}/model/{generation.id}")
        copy = _sh(peer.container, f"sync; cp -r {SCRATCH}/peer {SCRATCH}/copy && sync")
    finally:
        _sh(source.container, f"pkill -f share_weight[s].py; rm -rf {SCRATCH}")
        _sh(peer.container, f"rm -rf {SCRATCH}")
    print(f"model bytes      {mib:8.0f} MiB, {peer.name} staging from {source.name} and {source.name} from the Hub")
    print(f"from a peer      {from_peer:8.1f} s  {mib / from_peer:7.0f} MiB/s (share server, 4 streams, sha256, "
          "fsync, rename)")
    print(f"from the Hub     {hub:8.1f} s  {mib / hub:7.0f} MiB/s (hf download in the image, then sha256)")
    print(f"plain local copy {copy:8.1f} s  {mib / copy:7.0f} MiB/s (cp -r, sync)")
    print(f"throughput ratio staging / copy: {copy / from_peer:.2f} from a peer, {copy / hub:.2f} from the Hub "
          "(goal >= 0.8)")


if __name__ == "__main__":
    main()
