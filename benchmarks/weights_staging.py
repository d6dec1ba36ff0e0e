"""Weight staging throughput on a lab host against a plain local copy of the same bytes.

    .venv/bin/python -m benchmarks.weights_staging

Stages the lab's model from the Hub stand-in into a scratch directory the way the deploy does: huggingface_hub's
`hf download` inside the pulled vLLM image, then the staging script (sha256 of every file against the Hub's
metadata, rename into place, manifest); then copies the staged bytes once more with `cp`, both on the same host
in the same run. Goal: staging throughput at least 0.8 of the plain copy. The last line is the ratio.
"""

from __future__ import annotations

import shlex
import subprocess
import time

from sparkfleet.config import ModelSource
from sparkfleet.generations import resolve
from tests.lab import fleet

SCRATCH = "/var/tmp/sparkfleet-bench"
IMAGE = "vllm/vllm-openai:v0.28.0"
REPO_ID = "nvidia/Qwen3.6-35B-A3B-NVFP4"


def _timed(container: str, command: str) -> float:
    started = time.monotonic()
    subprocess.run(["docker", "exec", container, "sh", "-c", command], check=True, capture_output=True)
    return time.monotonic() - started


def main() -> None:
    state = fleet.up()
    host = next(h for h in state.hosts if h.arch == "amd64")
    generation = resolve(ModelSource("hub", repo=REPO_ID, revision="main"), state.hf_endpoint)
    size = generation.total_bytes or 0
    _timed(host.container, f"rm -rf {SCRATCH} && mkdir -p {SCRATCH}/staged/.staging && "
                           f"printf %s {shlex.quote(generation.sums)} > {SCRATCH}/SHA256SUMS && "
                           f"docker image inspect {IMAGE} >/dev/null 2>&1 || docker pull -q {IMAGE}")
    download = (f"docker run --rm --network host -e HF_ENDPOINT={state.hf_endpoint} --volume "
                f"{SCRATCH}/staged/.staging:/stage --entrypoint hf {IMAGE} download {REPO_ID} --revision "
                f"{generation.commit} --local-dir /stage --quiet")
    stage = _timed(host.container, f"{download} && python3 /usr/local/lib/sparkfleet/stage_weights.py stage "
                                   f"--dest {SCRATCH}/staged --sums-file {SCRATCH}/SHA256SUMS "
                                   f"--staged {SCRATCH}/staged/.staging")
    copy = _timed(host.container, f"cp -r {SCRATCH}/staged {SCRATCH}/copy && sync")
    _timed(host.container, f"rm -rf {SCRATCH}")
    mib = size / (1 << 20)
    print(f"model bytes     {mib:8.0f} MiB")
    print(f"staging         {stage:8.1f} s  {mib / stage:7.0f} MiB/s (hf download in the image, sha256, rename, "
          "manifest)")
    print(f"plain copy      {copy:8.1f} s  {mib / copy:7.0f} MiB/s")
    print(f"throughput ratio staging / copy: {copy / stage:.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
