#!/usr/bin/env python3
"""Read-only status of this Spark's vLLM endpoint, for `sparkfleet status`, `drift` and `bench` (`--serving`).

Installed into /usr/local/lib/sparkfleet beside common.py; stdlib only, like the health checker beside it. The
controller passes where the endpoint's files are (`--unit-file` and the like: their home is sparkfleet's code).
Prints one line, MARKER then a JSON object, so the controller finds it among whatever a login shell prints.

It never runs the health checker (a run counts towards its alert threshold): it reads the checker's
state.json. Every source may be missing (an endpoint that never started, a host where docker needs root):
that source reports null and the rest still answer. Every probe gives up after TIMEOUT seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import re
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from .common import DIRECT, run, samples  # imported as sparkfleet.remote.status (the controller's tests)
except ImportError:
    from common import DIRECT, run, samples  # run as a script, beside common.py

MARKER = "SPARKFLEET-STATUS "
TIMEOUT = 3  # seconds, for each command and HTTP request
WEIGHTS_TIMEOUT = 60  # the weights check may fetch SHA256SUMS from a mirror
STAGE_WEIGHTS = Path(__file__).resolve().with_name("stage_weights.py")
UNIT_PROPERTIES = (
    "ActiveState,SubState,NRestarts,ActiveEnterTimestamp,ExecMainStartTimestamp,"
    "ActiveEnterTimestampMonotonic,ExecMainStartTimestampMonotonic,NeedDaemonReload"
)
# One JSON object per container, so no field can be mistaken for another.
INSPECT_FORMAT = '{"image": {{json .Config.Image}}, "image_id": {{json .Image}}, "cmd": {{json .Config.Cmd}}}'
SERVING_FORMAT = ('{"path": {{json .Path}}, "args": {{json .Args}}, "image": {{json .Config.Image}}, '
                  '"image_id": {{json .Image}}}')
DRIVER_TIMEOUT = 20  # seconds: a wedged driver can hang nvidia-smi
METRICS = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
}


@dataclass(frozen=True)
class Layout:
    """The endpoint's unit, container and files on this host, as the controller names them."""

    unit: str  # systemd unit name, e.g. sparkfleet-vllm.service
    container: str
    unit_file: Path
    env_file: Path
    daemon_json: Path
    health_config: Path  # the health checker's health.json: served name, URL, state directory
    loaded_weights: Path  # the manifest the unit copies at each start: the weights it loaded


def read_json(path: Path) -> Any:
    """A JSON file's content, None when it is missing, unreadable (root-only) or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


# --- systemd -------------------------------------------------------------------------------------------


def parse_unit(text: str | None, now_monotonic: float) -> dict[str, Any]:
    """State, restarts and uptime of the unit from `systemctl show` (monotonic stamps in microseconds)."""
    props = dict(line.split("=", 1) for line in (text or "").splitlines() if "=" in line)
    state = props.get("ActiveState") or None
    started = _int(props.get("ExecMainStartTimestampMonotonic")) or _int(props.get("ActiveEnterTimestampMonotonic"))
    uptime = round(now_monotonic - started / 1e6, 1) if state == "active" and started else None
    reload = props.get("NeedDaemonReload")
    return {
        "state": state,
        "sub_state": props.get("SubState") or None,
        "restarts": _int(props.get("NRestarts")) if "NRestarts" in props else None,
        "since": props.get("ActiveEnterTimestamp") or None,
        "uptime_seconds": uptime,
        "need_daemon_reload": None if reload is None else reload == "yes",
    }


def _int(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0


# --- docker --------------------------------------------------------------------------------------------


def parse_container(text: str | None) -> dict[str, Any]:
    """Image reference and id the container runs, and the model it serves (the first word of its command)."""
    try:
        data = json.loads(text or "")
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return {"image": None, "image_id": None, "model": None}
    cmd = data.get("cmd") or []
    return {"image": data.get("image"), "image_id": data.get("image_id"), "model": model_name(cmd[0] if cmd else None)}


def model_name(path: str | None) -> str | None:
    """`/models/org--name` (the unit mounts the weights there) as the repository id `org/name`."""
    if not path or path.startswith("-"):
        return None
    org, sep, name = path.rstrip("/").rsplit("/", 1)[-1].partition("--")
    return f"{org}/{name}" if sep else org


def installed_version(package: str) -> str | None:
    """The installed version of a package; None when it is absent or only its configuration is left."""
    out = run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}|${Version}", package], TIMEOUT) or ""
    status, _, version = out.partition("|")
    return (version or None) if status.strip() == "ii" else None


def runtimes(text: str | None) -> bool | None:
    """Whether dockerd (`docker info` .Runtimes) knows the nvidia runtime; None when docker cannot answer."""
    try:
        return "nvidia" in json.loads(text or "")
    except (ValueError, TypeError):
        return None


def runtime_in_daemon_json(path: Path) -> bool | None:
    if not path.exists():
        return False
    data = read_json(path)
    runtimes = data.get("runtimes") if isinstance(data, dict) else None
    return None if data is None else isinstance(runtimes, dict) and "nvidia" in runtimes


# --- vLLM metrics --------------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    """The METRICS samples of a Prometheus text page, summed over label sets (one set per engine).

    The KV cache usage is the fullest engine's instead: that engine is the one that starts preempting.
    """
    values: dict[str, list[float]] = {}
    for name, value in samples(text):
        if name in METRICS:
            values.setdefault(METRICS[name], []).append(value)
    return {key: max(samples) if key == "kv_cache_usage" else sum(samples) for key, samples in values.items()}


def acceptance(metrics: dict[str, float]) -> float | None:
    """MTP draft acceptance rate, accepted / draft tokens; None before any draft (or without MTP)."""
    drafts = metrics.get("draft_tokens")
    accepted = metrics.get("accepted_tokens")
    if not drafts or accepted is None:
        return None
    return round(accepted / drafts, 4)


def fetch_metrics(url: str) -> str | None:
    """GET /metrics (vLLM serves it without the API key); None when nothing answers."""
    try:
        with DIRECT.open(f"{url.rstrip('/')}/metrics", timeout=TIMEOUT) as response:
            return response.read().decode("utf-8", "replace")
    except (OSError, ValueError, http.client.HTTPException):
        return None


def metrics_status(url: str | None) -> dict[str, Any]:
    text = fetch_metrics(url) if url else None
    metrics = parse_metrics(text) if text is not None else {}
    kv = metrics.get("kv_cache_usage")
    return {
        "metrics": text is not None,
        "requests_running": _whole(metrics.get("requests_running")),
        "requests_waiting": _whole(metrics.get("requests_waiting")),
        "kv_cache_usage": None if kv is None else round(kv, 4),
        "mtp_acceptance": acceptance(metrics),
    }


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


# --- health and weights --------------------------------------------------------------------------------


def health_status(config: Any) -> dict[str, Any]:
    """The checker's configuration and its last verdict and alert, read from its state.json."""
    config = config if isinstance(config, dict) else {}
    state_dir = config.get("state_dir")
    state = read_json(Path(state_dir) / "state.json") if isinstance(state_dir, str) else None
    state = state if isinstance(state, dict) else {}
    return {
        "served_name": config.get("served_model_name"),
        "url": config.get("url"),
        "last_result": state.get("last_result"),
        "last_alert": state.get("last_alert"),
    }


def weights_check(args: list[str]) -> dict[str, Any]:
    """`stage_weights.py check ARGS`: the model directory against the wanted list (stat only, no hashing)."""
    if not STAGE_WEIGHTS.exists():
        return {"state": "absent"}
    try:
        done = subprocess.run([sys.executable, str(STAGE_WEIGHTS), "check", *args], capture_output=True,
                              text=True, timeout=WEIGHTS_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"state": "error", "message": str(exc)}
    try:
        return json.loads(done.stdout)
    except ValueError:
        lines = done.stderr.strip().splitlines()
        return {"state": "error", "message": lines[-1] if lines else f"exit code {done.returncode}"}


# --- what produced a benchmark ------------------------------------------------------------------------


def parse_serving(container: str | None, digests: str | None, loaded: Any, driver: str | None) -> dict[str, Any]:
    """The serving configuration a benchmark result belongs to (seed 004: the config is part of the model).

    `container` is `docker inspect` of the running container (SERVING_FORMAT), `digests` its image's
    RepoDigests as JSON, `loaded` the weights manifest the unit started with, `driver` nvidia-smi's answer.
    The image digest is the registry digest of the image's own repository when docker knows one (the same on
    every host that pulled it), else the local image id.
    """
    try:
        data = json.loads(container or "")
    except ValueError:
        data = None
    data = data if isinstance(data, dict) else {}
    try:
        repo_digests = json.loads(digests or "")
    except ValueError:
        repo_digests = None
    repo_digests = [d for d in repo_digests if isinstance(d, str)] if isinstance(repo_digests, list) else []
    image = data.get("image")
    own = [d for d in repo_digests if d.split("@", 1)[0] == repository(image)]
    argv = [data["path"], *(data.get("args") or [])] if data.get("path") else None
    weights = loaded.get("source_digest") if isinstance(loaded, dict) else None
    version = (driver or "").strip().splitlines()
    return {
        "argv": argv,
        "image": image,
        "image_digest": (own or repo_digests or [data.get("image_id")])[0],
        "weights_digest": weights if isinstance(weights, str) else None,
        "driver": version[0].strip() if version else None,
    }


def repository(image: object) -> str:
    """`registry:5000/org/name:tag@sha256:…` without its tag and digest."""
    name = image.split("@", 1)[0] if isinstance(image, str) else ""
    head, colon, tag = name.rpartition(":")
    return head if colon and "/" not in tag else name


def serving(layout: Layout) -> dict[str, Any]:
    container = run(["docker", "inspect", "-f", SERVING_FORMAT, layout.container], TIMEOUT)
    try:
        image_id = json.loads(container or "").get("image_id")
    except (ValueError, AttributeError):
        image_id = None
    digests = None
    if image_id:
        digests = run(["docker", "image", "inspect", "-f", "{{json .RepoDigests}}", image_id], TIMEOUT)
    driver = run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], DRIVER_TIMEOUT)
    return parse_serving(container, digests, read_json(layout.loaded_weights), driver)


# --- the report ----------------------------------------------------------------------------------------


def mounted_generation(unit_file: Path) -> str | None:
    """The weights generation the unit mounts (its directory's name: a Hub commit or sha256-<digest>)."""
    try:
        text = unit_file.read_text()
    except OSError:
        return None
    found = re.search(r"--volume (\S+?):/models/", text)
    return found.group(1).rstrip("/").rsplit("/", 1)[-1] if found else None


def collect(layout: Layout, image: str | None = None, weights: list[str] | None = None,
            with_serving: bool = False) -> dict[str, Any]:
    """Everything in one object; `image` adds the local id of the wanted image, `weights` the weights check,
    `with_serving` what `sparkfleet bench` records with a result (argv, image digest, weights, driver)."""
    health = health_status(read_json(layout.health_config))
    report: dict[str, Any] = {
        "host": socket.gethostname(),
        **parse_unit(run(["systemctl", "show", layout.unit, "-p", UNIT_PROPERTIES], TIMEOUT), time.monotonic()),
        **parse_container(run(["docker", "inspect", "-f", INSPECT_FORMAT, layout.container], TIMEOUT)),
        **health,
        **metrics_status(health["url"]),
        "toolkit_version": installed_version("nvidia-container-toolkit"),
        "runtime_in_daemon_json": runtime_in_daemon_json(layout.daemon_json),
        "runtime_in_dockerd": runtimes(run(["docker", "info", "--format", "{{json .Runtimes}}"], TIMEOUT)),
        "unit_sha256": sha256(layout.unit_file),
        "env_sha256": sha256(layout.env_file),
        "weights_generation": mounted_generation(layout.unit_file),
    }
    if image:
        wanted = run(["docker", "image", "inspect", "-f", "{{.Id}}", image], TIMEOUT)
        report["wanted_image_id"] = (wanted or "").strip() or None
    if weights is not None:
        report["weights"] = weights_check(weights)
    if with_serving:
        report["serving"] = serving(layout)
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Print this Spark's endpoint status as one JSON line.")
    where = parser.add_argument_group("where the endpoint's files are (sparkfleet passes them)")
    where.add_argument("--unit", required=True, help="the endpoint's systemd unit")
    where.add_argument("--container", required=True, help="the endpoint's container")
    for name in ("unit-file", "env-file", "daemon-json", "health-config", "loaded-weights"):
        where.add_argument(f"--{name}", required=True, type=Path, metavar="PATH")
    parser.add_argument("--image", help="also report the local id of this (wanted) image reference")
    parser.add_argument("--weights-check", metavar="ARGS",
                        help="also run `stage_weights.py check ARGS`: one shell-quoted string, "
                        "given as --weights-check='--dest ...' since it starts with a dash")
    parser.add_argument("--serving", action="store_true",
                        help="also report the running container's argv, image digest, loaded weights and driver")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    layout = Layout(args.unit, args.container, args.unit_file, args.env_file, args.daemon_json, args.health_config,
                    args.loaded_weights)
    weights = shlex.split(args.weights_check) if args.weights_check is not None else None
    sys.stdout.write(MARKER + json.dumps(collect(layout, args.image, weights, args.serving), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
