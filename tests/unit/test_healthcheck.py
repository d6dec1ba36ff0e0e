"""sparkfleet/remote/healthcheck.py, run as the Spark runs it: a subprocess against a fake vLLM server.

The HTTP server is switchable (healthy, 401, 503, wrong model list, hangs, /metrics of a busy or stuck engine);
systemctl and docker are shell stand-ins first on PATH, fed from files each test writes; journalctl is a small
Python stand-in that filters a fake journal by invocation id and time, as the real one does. /proc/meminfo is a
file too: a two-line launcher sets the checker's MEMINFO before running its main (nothing in the checker reads a
test hook from the environment). Time-driven behaviour (re-notify, a crash loop closing) is tested by ageing the
timestamps in state.json between runs.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "sparkfleet" / "remote" / "healthcheck.py"
API_KEY = "test-key-0123"
HOOK_PATH = "/hook/t0ken-s3cret"
MODEL = "qwen3.6-35b"
UNIT = "sparkfleet-vllm.service"
TIMEOUT = 0.5
HANG = TIMEOUT * 3
# The checker run as its own process, as systemd runs it, but with /proc/meminfo swapped for the test's file.
LAUNCH = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import healthcheck; "
          "healthcheck.MEMINFO = sys.argv.pop(1); sys.exit(healthcheck.main(sys.argv[1:]))")
INVOCATION = "4f1c0d2e9a8b47c6a1b2c3d4e5f60718"
GIB = 2**30
SAMPLE = 0.2  # busy_sample_seconds in tests

FAKE_TOOL = """#!/bin/sh
echo "{name} $*" >> "$FAKE_DIR/calls.log"
case "$1" in
  logs) file="$FAKE_DIR/docker.logs" ;;
  inspect) file="$FAKE_DIR/docker.inspect" ;;
  *) file="$FAKE_DIR/{name}.out" ;;
esac
[ -f "$file" ] || {{ echo "Error: No such object" >&2; exit 1; }}
cat "$file"
"""

# journalctl's matching as the checker uses it: FIELD=value matches of one field are ORed; --since @unix.
FAKE_JOURNALCTL = """#!PYTHON
import json, os, sys

args = sys.argv[1:]
fake = os.environ["FAKE_DIR"]
with open(os.path.join(fake, "calls.log"), "a") as log:
    log.write("journalctl " + " ".join(args) + "\\n")
path = os.path.join(fake, "journal.jsonl")
if not os.path.exists(path):
    sys.exit(1)
ids = [a.split("=", 1)[1] for a in args if a.startswith("_SYSTEMD_INVOCATION_ID=")]
since = float(args[args.index("--since") + 1].lstrip("@")) if "--since" in args else None
for line in open(path):
    entry = json.loads(line)
    if ids and entry["inv"] not in ids:
        continue
    if since is not None and entry["t"] < since:
        continue
    print(entry["msg"])
"""

CUTLASS_TRACE = """INFO Capturing CUDA graphs
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/vllm/_custom_ops.py", line 812, in cutlass_scaled_mm
RuntimeError: Error Internal
"""
# What the lab's crash-after-load stand-in prints: no known signature, so the diagnosis is the crash loop itself.
RUNTIME_CRASH = """Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 701, in run_engine_core
torch.AcceleratorError: CUDA error: an illegal memory access was encountered
"""


@dataclass
class Backend:
    """What the fake vLLM answers, and everything it was asked."""

    health: str = "ok"
    models: str = "ok"
    completion: str = "ok"
    metrics: str = "idle"  # idle | busy (requests running, tokens advance) | stuck (running, no tokens) | none
    tokens: int = 1000
    calls: list[str] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    webhooks: list[dict[str, Any]] = field(default_factory=list)


class FakeVllm(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        return

    def _reply(self, status: int, payload: object = None) -> None:
        body = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        backend = self.server.backend
        backend.calls.append(self.path)
        if self.path == "/health":
            if backend.health == "hang":
                time.sleep(HANG)
            self._reply({"ok": 200, "503": 503}.get(backend.health, 200))
        elif self.path == "/metrics" and backend.metrics != "none":
            if backend.metrics == "busy":
                backend.tokens += 7
            running, waiting = {"idle": (0, 0), "busy": (2, 1), "stuck": (1, 0)}[backend.metrics]
            labels = f'{{engine="0",model_name="{MODEL}"}}'
            body = "".join(
                f"# TYPE {name} {kind}\n{name}{labels} {float(value)}\n"
                for name, kind, value in (
                    ("vllm:num_requests_running", "gauge", running),
                    ("vllm:num_requests_waiting", "gauge", waiting),
                    ("vllm:prompt_tokens_total", "counter", 500),
                    ("vllm:generation_tokens_total", "counter", backend.tokens),
                )
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/v1/models":
            backend.auth.append(self.headers.get("Authorization"))
            if backend.models == "401":
                self._reply(401, {"error": "Unauthorized"})
            else:
                model_id = MODEL if backend.models == "ok" else "Qwen/Qwen3.6-35B-A3B-FP8"
                self._reply(200, {"object": "list", "data": [{"id": model_id, "object": "model"}]})
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        backend = self.server.backend
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        backend.calls.append(self.path)
        if self.path == HOOK_PATH:
            backend.webhooks.append(json.loads(body))
            self._reply(204)
        elif self.path == "/v1/completions":
            if backend.completion == "hang":
                time.sleep(HANG)
            choices = [] if backend.completion == "nochoices" else [{"text": "!", "index": 0}]
            self._reply(200, {"id": "cmpl-1", "choices": choices})
        else:
            self._reply(404, {"error": "not found"})


class Server(ThreadingHTTPServer):
    daemon_threads = True
    backend: Backend

    def handle_error(self, request: object, client_address: object) -> None:
        """A hung handler writes to a socket the client already closed: expected, not news."""


def free_port() -> int:
    """A localhost port with nothing listening on it (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Harness:
    tmp: Path
    backend: Backend
    url: str
    config: dict[str, Any]
    env: dict[str, str]
    outputs: list[str] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        return Path(self.config["state_dir"])

    def configure(self, **overrides: Any) -> None:
        self.config.update(overrides)
        (self.tmp / "health.json").write_text(json.dumps(self.config))

    def unit(
        self,
        active: str = "active",
        sub: str = "running",
        result: str = "success",
        restarts: int = 0,
        started_ago: float = 30.0,
        invocation: str = INVOCATION,
    ) -> None:
        entered = int((time.monotonic() - started_ago) * 1e6)
        (self.tmp / "fake" / "systemctl.out").write_text(
            f"LoadState=loaded\nActiveState={active}\nSubState={sub}\nResult={result}\nNRestarts={restarts}\n"
            f"ActiveEnterTimestampMonotonic={entered}\nExecMainStatus=0\nInvocationID={invocation}\n"
            f"ExecMainStartTimestampMonotonic={entered}\n"
        )

    def docker_logs(self, text: str | None) -> None:
        """Container output; None removes the container, as --rm does when it exits."""
        logs, inspect = self.tmp / "fake" / "docker.logs", self.tmp / "fake" / "docker.inspect"
        if text is None:
            logs.unlink(missing_ok=True)
            inspect.unlink(missing_ok=True)
        else:
            logs.write_text(text)
            inspect.write_text("running 0\n")

    def journal(self, text: str, invocation: str = INVOCATION, ago: float = 1.0, append: bool = False) -> None:
        """Lines the unit logged `ago` seconds back, stamped with the start (invocation id) that logged them."""
        now = time.time() - ago
        lines = [
            json.dumps({"inv": invocation, "t": now + k * 1e-3, "msg": line})
            for k, line in enumerate(text.splitlines())
        ]
        with (self.tmp / "fake" / "journal.jsonl").open("a" if append else "w") as out:
            out.write("".join(line + "\n" for line in lines))

    def memory(self, available_gib: float) -> None:
        (self.tmp / "fake" / "meminfo").write_text(
            f"MemTotal:       127535112 kB\nMemFree:         1234567 kB\n"
            f"MemAvailable:   {int(available_gib * 2**20)} kB\nBuffers:           12345 kB\n"
        )

    def age_state(self, key: str, seconds: float) -> None:
        """Move one timestamp of state.json into the past, as if the runs in between took that long."""
        state = self.state()
        stamp = datetime.fromisoformat(state[key]) - timedelta(seconds=seconds)
        state[key] = stamp.isoformat(timespec="seconds")
        (self.state_dir / "state.json").write_text(json.dumps(state))

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-c", LAUNCH, str(SCRIPT.parent), str(self.tmp / "fake" / "meminfo"),
             "--config", str(self.tmp / "health.json"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        self.outputs += [done.stdout, done.stderr]
        return done

    def state(self) -> dict[str, Any]:
        return json.loads((self.state_dir / "state.json").read_text())

    def calls(self) -> str:
        path = self.tmp / "fake" / "calls.log"
        return path.read_text() if path.exists() else ""


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    backend = Backend()
    server = Server(("127.0.0.1", 0), FakeVllm)
    server.backend = backend
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    fake = tmp_path / "fake"
    fake.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(FAKE_DIR=str(fake), VLLM_API_KEY=API_KEY, PATH=os.pathsep.join([str(fake), os.environ["PATH"]]))
    for tool in ("systemctl", "docker", "journalctl"):
        script = fake / tool
        if tool == "journalctl":
            script.write_text(FAKE_JOURNALCTL.replace("PYTHON", sys.executable, 1))
        else:
            script.write_text(FAKE_TOOL.format(name=tool))
        script.chmod(0o755)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    config = {
        "endpoint": "sparkfleet-vllm",
        "unit": UNIT,
        "container": "sparkfleet-vllm",
        "url": url,
        "served_model_name": MODEL,
        "env_file": "/etc/sparkfleet-test/vllm.env",
        "load_window_seconds": 900,
        "interval_seconds": 30,
        "deep_every": 10,
        "timeout_seconds": TIMEOUT,
        "deep_timeout_seconds": TIMEOUT,
        "alert_after": 3,
        "textfile_dir": str(tmp_path / "node_exporter" / "textfile_collector"),
        "state_dir": str(tmp_path / "state"),
        "log_lines": 50,
        "renotify_minutes": 60,
        "min_mem_available_gib": 4.0,
        "busy_sample_seconds": SAMPLE,
        "pair": None,
    }
    h = Harness(tmp_path, backend, url, config, env)
    h.configure()
    h.unit()
    h.memory(100)
    h.docker_logs("INFO Application startup complete.\n")
    h.journal("INFO Application startup complete.\n")
    yield h
    server.shutdown()
    server.server_close()


def test_healthy_first_run_sends_a_completion_and_exits_0(harness: Harness) -> None:
    done = harness.run()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<6>sparkfleet-vllm healthy: ")
    assert "1-token completion answered" in done.stdout
    assert harness.backend.calls == ["/health", "/v1/models", "/v1/completions"]
    assert harness.backend.auth == [f"Bearer {API_KEY}"]
    state = harness.state()
    assert state["runs"] == 1 and state["consecutive_failures"] == 0 and state["alerted"] is False
    assert state["last_result"]["state"] == "healthy" and state["last_result"]["http_status"] == 200
    assert stat.S_IMODE((harness.state_dir / "state.json").stat().st_mode) == 0o600
    assert API_KEY not in done.stdout + done.stderr


def test_refused_within_load_window_is_starting(harness: Harness) -> None:
    harness.configure(url=f"http://127.0.0.1:{free_port()}")
    harness.unit(started_ago=10)
    done = harness.run()
    assert done.returncode == 0
    assert done.stdout.startswith("<6>sparkfleet-vllm starting: loading: nothing listens")
    assert harness.state()["consecutive_failures"] == 0
    assert harness.state()["last_result"]["state"] == "starting"


def test_refused_after_load_window_is_unhealthy(harness: Harness) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    harness.configure(url=url, load_window_seconds=1)
    harness.unit(started_ago=5)
    done = harness.run()
    assert done.returncode == 1
    assert done.stdout.startswith("<4>sparkfleet-vllm unhealthy (1/3 before alerting): ")
    assert f"nothing listens on {url} after the load window" in done.stdout
    assert "check --host/--port" in done.stdout
    assert harness.state()["consecutive_failures"] == 1


def test_401_names_the_api_key(harness: Harness) -> None:
    harness.backend.models = "401"
    done = harness.run()
    assert done.returncode == 1
    assert "refused our API key" in done.stdout
    assert "check VLLM_API_KEY in /etc/sparkfleet-test/vllm.env" in done.stdout  # the env_file it was given
    assert harness.state()["last_result"]["http_status"] == 401


def test_missing_served_name_names_what_is_served(harness: Harness) -> None:
    harness.backend.models = "wrong"
    done = harness.run()
    assert done.returncode == 1
    assert f"serves Qwen/Qwen3.6-35B-A3B-FP8, not {MODEL}: check vllm_served_model_name" in done.stdout


def test_cutlass_crash_in_container_logs(harness: Harness) -> None:
    harness.backend.health = "503"
    harness.docker_logs(CUTLASS_TRACE)
    done = harness.run()
    assert done.returncode == 1
    assert "FP8 kernels crash on GB10 with this image (cutlass_scaled_mm: Error Internal)" in done.stdout
    assert "use an image validated on a GB10, pinned by digest" in done.stdout
    assert "/health answered HTTP 503" in done.stdout
    assert harness.state()["last_result"]["cause"] == "engine_dead/cutlass"


def test_unrecognized_argument_found_in_journal_of_a_removed_container(harness: Harness) -> None:
    harness.configure(url=f"http://127.0.0.1:{free_port()}", load_window_seconds=1)
    harness.unit(started_ago=5)
    harness.docker_logs(None)
    harness.journal("usage: vllm serve\nvllm serve: error: unrecognized arguments: --disable-log-requests\n")
    done = harness.run()
    assert done.returncode == 1
    assert "this vLLM no longer accepts --disable-log-requests: remove it from vllm_args" in done.stdout
    assert "no container named sparkfleet-vllm" in done.stdout


@pytest.mark.parametrize(
    ("log_line", "expected"),
    [
        ("KeyError: 'invalid tool call parser: qwen (chose from { qwen3_xml })'", "qwen3_xml or qwen3_coder"),
        ("KeyError: 'invalid reasoning parser: qwen (chose from { qwen3 })'", "use qwen3 for Qwen3.6"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "drop_caches"),
        ("FileNotFoundError: [Errno 2] No such file or directory: '/models/x/config.json'", "stage them"),
    ],
)
def test_log_signatures_become_diagnoses(harness: Harness, log_line: str, expected: str) -> None:
    harness.backend.health = "503"
    harness.docker_logs(f"INFO loading\n{log_line}\n")
    done = harness.run()
    assert done.returncode == 1
    assert expected in done.stdout


def test_crash_loop_is_diagnosed_from_systemd_without_probing(harness: Harness) -> None:
    harness.unit(active="failed", sub="failed", result="start-limit-hit", restarts=5)
    harness.docker_logs(None)
    done = harness.run()
    assert done.returncode == 1
    assert "crash loop: systemd gave up after 5 restarts" in done.stdout
    assert f"`systemctl reset-failed {UNIT} && systemctl start {UNIT}`" in done.stdout
    assert harness.backend.calls == []
    assert harness.state()["last_result"]["cause"] == "crashloop"


def test_stopped_unit_is_down(harness: Harness) -> None:
    harness.unit(active="inactive", sub="dead", result="exit-code")
    done = harness.run()
    assert done.returncode == 1
    assert f"{UNIT} is inactive (exit-code, exit status 0)" in done.stdout


def test_health_timeout_is_a_hang(harness: Harness) -> None:
    harness.backend.health = "hang"
    done = harness.run()
    assert done.returncode == 1
    assert f"the engine is hung: /health timed out after {TIMEOUT:g} s" in done.stdout


def test_deep_check_every_nth_run_catches_a_hung_completion(harness: Harness) -> None:
    harness.configure(deep_every=3)
    assert harness.run().returncode == 0  # run 1: first run, always deep
    harness.backend.completion = "hang"
    assert harness.run().returncode == 0  # run 2: /health and /v1/models only
    assert harness.backend.calls.count("/v1/completions") == 1
    done = harness.run("--json")  # run 3: deep
    result = json.loads(done.stdout)
    assert done.returncode == 1
    assert harness.backend.calls.count("/v1/completions") == 2
    last_run = harness.backend.calls[len(harness.backend.calls) - harness.backend.calls[::-1].index("/health") - 1 :]
    assert last_run == ["/health", "/v1/models", "/v1/completions", "/metrics", "/metrics"]
    assert result["state"] == "unhealthy" and result["deep_check"] is True
    assert result["diagnosis"].startswith(
        f"the engine is hung: a 1-token completion timed out after {TIMEOUT:g} s"
    )


def test_completion_without_choices_is_unhealthy(harness: Harness) -> None:
    harness.backend.completion = "nochoices"
    done = harness.run()
    assert done.returncode == 1
    assert "a 1-token completion returned no choices (HTTP 200" in done.stdout


def test_alert_only_on_third_failure_and_only_once(harness: Harness) -> None:
    harness.env["SPARKFLEET_HEALTH_WEBHOOK"] = harness.url + HOOK_PATH
    harness.backend.health = "503"
    harness.docker_logs("MARKER-first-stack-trace\n")
    evidence_dir = harness.state_dir / "evidence"
    for run in (1, 2):
        done = harness.run()
        assert done.returncode == 1
        assert done.stdout.startswith(f"<4>sparkfleet-vllm unhealthy ({run}/3 before alerting)")
        assert harness.backend.webhooks == []
        assert not evidence_dir.exists()

    done = harness.run()
    assert done.returncode == 1
    assert done.stdout.startswith("<3>sparkfleet-vllm ALERT: unhealthy for 3 checks in a row (~90 s): ")
    [evidence] = list(evidence_dir.iterdir())
    assert f"evidence: {evidence}" in done.stdout
    assert stat.S_IMODE(evidence.stat().st_mode) == 0o600
    assert stat.S_IMODE(evidence_dir.stat().st_mode) == 0o700
    assert "MARKER-first-stack-trace" in evidence.read_text()
    assert "docker logs --since " in harness.calls() and " --tail 50 sparkfleet-vllm" in harness.calls()
    [hook] = harness.backend.webhooks
    assert hook["host"] == socket.gethostname()
    assert hook["endpoint"] == "sparkfleet-vllm" and hook["state"] == "unhealthy"
    assert hook["consecutive_failures"] == 3 and hook["evidence"] == str(evidence)
    assert "HTTP 503" in hook["diagnosis"]
    assert harness.state()["alerted"] is True
    assert harness.state()["last_alert"]["evidence"] == str(evidence)

    done = harness.run()
    assert done.stdout.startswith("<4>sparkfleet-vllm still unhealthy (4 in a row, alert already sent)")
    assert len(harness.backend.webhooks) == 1
    assert len(list(evidence_dir.iterdir())) == 1
    assert not any(HOOK_PATH in output for output in harness.outputs)


def test_a_new_cause_alerts_again(harness: Harness) -> None:
    harness.configure(alert_after=1)
    harness.env["SPARKFLEET_HEALTH_WEBHOOK"] = harness.url + HOOK_PATH
    harness.backend.health = "503"
    assert harness.run().stdout.startswith("<3>")
    assert harness.run().stdout.startswith("<4>")
    harness.docker_logs(CUTLASS_TRACE)
    assert harness.run().stdout.startswith("<3>")
    assert [hook["event"] for hook in harness.backend.webhooks] == ["alert", "alert"]
    evidence = sorted(str(p) for p in (harness.state_dir / "evidence").iterdir())
    assert len(evidence) == 2  # same second, still two files
    assert sorted(hook["evidence"] for hook in harness.backend.webhooks) == evidence
    assert "cutlass_scaled_mm" in Path(harness.backend.webhooks[1]["evidence"]).read_text()


def test_recovery_resets_the_counter_and_reports_once(harness: Harness) -> None:
    harness.configure(alert_after=1)
    harness.env["SPARKFLEET_HEALTH_WEBHOOK"] = harness.url + HOOK_PATH
    harness.backend.health = "503"
    assert harness.run().stdout.startswith("<3>")
    harness.backend.health = "ok"
    done = harness.run()
    assert done.returncode == 0
    assert done.stdout.startswith("<5>sparkfleet-vllm recovered")
    assert harness.backend.calls[-2:] == ["/v1/completions", HOOK_PATH]  # deep after a failure
    state = harness.state()
    assert state["consecutive_failures"] == 0 and state["alerted"] is False
    assert [hook["event"] for hook in harness.backend.webhooks] == ["alert", "recovered"]
    assert harness.run().stdout.startswith("<6>sparkfleet-vllm healthy")
    harness.backend.health = "503"
    assert harness.run().stdout.startswith("<3>")  # a new incident alerts again
    assert harness.state()["consecutive_failures"] == 1


def test_failing_webhook_is_a_warning_and_never_echoes_its_url(harness: Harness) -> None:
    harness.configure(alert_after=1)
    harness.env["SPARKFLEET_HEALTH_WEBHOOK"] = f"http://127.0.0.1:{free_port()}{HOOK_PATH}"
    harness.backend.health = "503"
    done = harness.run()
    assert done.returncode == 1
    assert "<4>sparkfleet-vllm: webhook POST failed (" in done.stdout
    assert "<3>sparkfleet-vllm ALERT" in done.stdout
    assert HOOK_PATH not in done.stdout + done.stderr
    assert "127.0.0.1:" not in done.stdout.split("webhook POST failed")[1]


def test_textfile_for_node_exporter(harness: Harness) -> None:
    harness.backend.health = "503"
    assert harness.run().returncode == 1
    directory = Path(harness.config["textfile_dir"])
    assert [p.name for p in directory.iterdir()] == ["sparkfleet_health.prom"]
    text = (directory / "sparkfleet_health.prom").read_text()
    ep = 'endpoint="sparkfleet-vllm"'
    for line in (
        f"sparkfleet_health_up{{{ep}}} 0",
        f'sparkfleet_health_state{{{ep},state="healthy"}} 0',
        f'sparkfleet_health_state{{{ep},state="starting"}} 0',
        f'sparkfleet_health_state{{{ep},state="unhealthy"}} 1',
        f"sparkfleet_health_consecutive_failures{{{ep}}} 1",
        f"sparkfleet_health_alerting{{{ep}}} 0",
    ):
        assert line in text.splitlines()
    samples = {line.split("{")[0]: line for line in text.splitlines() if not line.startswith("#")}
    checked = float(samples["sparkfleet_health_last_check_timestamp_seconds"].split()[-1])
    assert abs(checked - time.time()) < 60
    assert 0 <= float(samples["sparkfleet_health_check_duration_seconds"].split()[-1]) < 10
    for metric in samples:
        assert f"# HELP {metric} " in text and f"# TYPE {metric} gauge" in text
    harness.backend.health = "ok"
    assert harness.run().returncode == 0
    assert f"sparkfleet_health_up{{{ep}}} 1" in (directory / "sparkfleet_health.prom").read_text()


def test_json_output_is_the_result_object(harness: Harness) -> None:
    harness.configure(textfile_dir=None)
    done = harness.run("--json")
    assert done.returncode == 0
    result = json.loads(done.stdout)
    assert result["endpoint"] == "sparkfleet-vllm" and result["state"] == "healthy"
    assert result["http_status"] == 200 and result["consecutive_failures"] == 0
    assert result["unit"] == "active/running" and result["alerting"] is False
    assert result["checked_at"].endswith("+00:00")
    assert done.stderr.startswith("<6>sparkfleet-vllm healthy")
    assert not (harness.tmp / "node_exporter").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (None, "cannot read"),
        ("{not json", "cannot read"),
        ({"endpoint": "x"}, "missing keys ['alert_after', "),
        ({"alert_afer": 3}, "unknown keys ['alert_afer'], missing keys []"),
        ({"alert_after": "3"}, "alert_after must be a whole number above 0, not '3'"),
        ({"alert_after": True}, "alert_after must be a whole number above 0, not True"),
        ({"deep_every": 0}, "deep_every must be a whole number above 0, not 0"),
        ({"served_model_name": " "}, "served_model_name must be a non-empty string, not ' '"),
        ({"textfile_dir": 7}, "textfile_dir must be a non-empty string or null, not 7"),
        ({"url": "127.0.0.1:8000"}, "url must start with http:// or https://"),
    ],
    ids=["missing", "not-json", "missing-keys", "unknown-key", "wrong-type", "bool", "zero", "blank", "not-a-path",
         "bad-url"],
)
def test_bad_config_exits_2(harness: Harness, change: str | dict[str, Any] | None, message: str) -> None:
    config = harness.tmp / "health.json"
    if change is None:
        config.unlink()
    elif isinstance(change, str):
        config.write_text(change)
    elif "endpoint" in change:
        config.write_text(json.dumps(change))
    else:
        config.write_text(json.dumps({**harness.config, **change}))
    done = harness.run()
    assert done.returncode == 2
    assert done.stderr.startswith("<3>sparkfleet health: bad config: ") and message in done.stderr
    assert not harness.state_dir.exists()


# --- restarts: a crash loop alerts while systemd still restarts it ---------------------------------------


def _crash(harness: Harness, restarts: int, invocation: str) -> None:
    """The engine of this start exited: its trace is in the journal and systemd waits RestartSec."""
    harness.unit(active="activating", sub="auto-restart", restarts=restarts, invocation=invocation)
    harness.journal(RUNTIME_CRASH, invocation=invocation, append=True)


def _loading(harness: Harness, restarts: int, invocation: str, started_ago: float = 5) -> None:
    """systemd started the unit again: the port refuses while the weights load."""
    harness.unit(restarts=restarts, started_ago=started_ago, invocation=invocation)
    harness.journal("INFO Loading safetensors checkpoint shards:  50% Completed\n", invocation=invocation,
                    append=True)


def test_slow_crash_loop_alerts_before_the_start_limit(harness: Harness) -> None:
    """Each start loads for many minutes; loading no longer resets the count, so the alert comes at restart 2."""
    harness.env["SPARKFLEET_HEALTH_WEBHOOK"] = harness.url + HOOK_PATH
    harness.configure(url=f"http://127.0.0.1:{free_port()}", load_window_seconds=1800)
    harness.docker_logs(None)
    _loading(harness, restarts=0, invocation="start-0", started_ago=30)
    assert harness.run().stdout.startswith("<6>sparkfleet-vllm starting: loading")

    _crash(harness, restarts=0, invocation="start-0")
    done = harness.run()
    assert done.stdout.startswith("<4>sparkfleet-vllm unhealthy (1/3 before alerting): crash loop: ")

    _loading(harness, restarts=1, invocation="start-1")
    done = harness.run()
    assert done.returncode == 1  # the restart itself is the failure, though the new start is only loading
    assert done.stdout.startswith("<4>sparkfleet-vllm unhealthy (2/3 before alerting): crash loop: ")
    assert harness.state()["crash_restarts"] == 1
    for started_ago in (60, 600, 1200):  # a 20-minute load: "starting" all along, and the count stays
        _loading(harness, restarts=1, invocation="start-1", started_ago=started_ago)
        done = harness.run()
        assert done.returncode == 0, done.stdout
        assert done.stdout.startswith("<4>sparkfleet-vllm starting: loading: ")
        assert "crash loop still open (1 restart seen, 2/3 failures" in done.stdout
    assert harness.state()["consecutive_failures"] == 2
    assert harness.backend.webhooks == []

    _crash(harness, restarts=1, invocation="start-1")
    done = harness.run("--json")
    result = json.loads(done.stdout)
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"<3>sparkfleet-vllm ALERT: crash loop: the engine exited and systemd keeps restarting {UNIT} "
        "(1 restart so far) until its start limit stops it; read "
    )
    assert result["unit"] == "activating/auto-restart"  # systemd is still restarting it: no start-limit-hit
    assert result["restarts"] == 1 and result["crash_restarts"] == 1 and result["cause"] == "crashing"
    [hook] = harness.backend.webhooks
    assert hook["event"] == "alert" and "crash loop" in hook["diagnosis"] and hook["restarts"] == 1
    evidence = Path(hook["evidence"]).read_text()
    assert "illegal memory access" in evidence


def test_restarts_missed_between_checks_count_each(harness: Harness) -> None:
    """Restarts faster than the timer are still all counted: three at once reach the alert threshold."""
    assert harness.run().returncode == 0
    harness.unit(restarts=3, started_ago=2, invocation="start-3")
    harness.configure(url=f"http://127.0.0.1:{free_port()}")
    done = harness.run()
    assert done.returncode == 1
    assert done.stdout.startswith(f"<3>sparkfleet-vllm ALERT: crash loop: the engine exited and systemd keeps "
                                  f"restarting {UNIT} (3 restarts so far)")
    assert harness.state()["consecutive_failures"] == 3


def test_a_restart_seen_while_serving_is_a_failure(harness: Harness) -> None:
    assert harness.run().returncode == 0
    harness.unit(restarts=1, started_ago=2, invocation="start-1")
    done = harness.run()
    assert done.returncode == 1
    assert "crash loop: the engine exited and systemd keeps restarting" in done.stdout
    state = harness.state()
    assert state["restarts"] == 1 and state["crash_restarts"] == 1
    assert state["last_result"]["http_status"] == 200  # the probes did pass; the restart decides


def test_a_manual_restart_starts_afresh(harness: Harness) -> None:
    """NRestarts goes back to 0 on `systemctl restart` (a deploy): the crash loop it ends is not counted on."""
    assert harness.run().returncode == 0
    harness.unit(restarts=2, started_ago=2, invocation="start-2")
    assert harness.run().returncode == 1
    harness.configure(url=f"http://127.0.0.1:{free_port()}")
    harness.unit(restarts=0, started_ago=5, invocation="deployed")
    done = harness.run()
    assert done.returncode == 0
    assert done.stdout.startswith("<6>sparkfleet-vllm starting: loading")
    state = harness.state()
    assert state["consecutive_failures"] == 0 and state["crash_restarts"] == 0


def test_crash_loop_closes_after_an_hour_of_health(harness: Harness) -> None:
    harness.configure(alert_after=1)
    harness.env["SPARKFLEET_HEALTH_WEBHOOK"] = harness.url + HOOK_PATH
    assert harness.run().returncode == 0
    harness.unit(restarts=1, started_ago=2, invocation="start-1")
    assert harness.run().stdout.startswith("<3>sparkfleet-vllm ALERT: crash loop")
    done = harness.run()  # serving again, briefly: no recovery yet, the loop may go on
    assert done.stdout.startswith("<4>sparkfleet-vllm healthy: ")
    assert "crash loop still open" in done.stdout
    assert harness.state()["alerted"] is True
    assert harness.run().stdout.startswith("<4>sparkfleet-vllm healthy: ")
    harness.age_state("healthy_since", 3601)
    done = harness.run()
    assert done.stdout.startswith("<5>sparkfleet-vllm recovered")
    state = harness.state()
    assert state["crash_restarts"] == 0 and state["consecutive_failures"] == 0 and state["alerted"] is False
    assert [hook["event"] for hook in harness.backend.webhooks] == ["alert", "recovered"]


def test_start_limit_hit_is_still_the_crashloop_verdict(harness: Harness) -> None:
    assert harness.run().returncode == 0
    harness.unit(active="failed", sub="failed", result="start-limit-hit", restarts=4)
    done = harness.run()
    assert done.returncode == 1
    assert "crash loop: systemd gave up after 4 restarts" in done.stdout
    assert harness.state()["last_result"]["cause"] == "crashloop"


# --- re-notify while the incident stays open ---------------------------------------------------------------


def test_renotify_repeats_the_alert_every_n_minutes(harness: Harness) -> None:
    harness.configure(alert_after=1, renotify_minutes=30)
    harness.env["SPARKFLEET_HEALTH_WEBHOOK"] = harness.url + HOOK_PATH
    harness.backend.health = "503"
    assert harness.run().stdout.startswith("<3>sparkfleet-vllm ALERT")
    first = harness.state()["last_alert"]["time"]
    harness.age_state("notified_at", 29 * 60)
    assert harness.run().stdout.startswith("<4>sparkfleet-vllm still unhealthy")
    assert len(harness.backend.webhooks) == 1

    harness.age_state("notified_at", 60)  # 30 minutes since the alert now
    done = harness.run()
    assert done.returncode == 1
    assert done.stdout.startswith(
        f"<3>sparkfleet-vllm ALERT repeated (still unhealthy, alerted at {first}, 3 failures; every 30 min until "
        "it recovers): "
    )
    alert, repeat = harness.backend.webhooks
    assert alert["repeat"] is False and repeat["repeat"] is True and repeat["event"] == "alert"
    assert repeat["evidence"] == alert["evidence"]  # no new evidence file for a reminder
    assert len(list((harness.state_dir / "evidence").iterdir())) == 1
    assert harness.state()["notified_at"] == harness.state()["last_result"]["checked_at"]
    assert harness.run().stdout.startswith("<4>sparkfleet-vllm still unhealthy")  # the clock starts again
    assert len(harness.backend.webhooks) == 2


def test_renotify_zero_alerts_once(harness: Harness) -> None:
    harness.configure(alert_after=1, renotify_minutes=0)
    harness.env["SPARKFLEET_HEALTH_WEBHOOK"] = harness.url + HOOK_PATH
    harness.backend.health = "503"
    assert harness.run().stdout.startswith("<3>")
    harness.age_state("notified_at", 24 * 3600)
    assert harness.run().stdout.startswith("<4>sparkfleet-vllm still unhealthy")
    assert len(harness.backend.webhooks) == 1


def test_no_renotify_once_recovered(harness: Harness) -> None:
    harness.configure(alert_after=1, renotify_minutes=1)
    harness.backend.health = "503"
    assert harness.run().stdout.startswith("<3>")
    harness.backend.health = "ok"
    assert harness.run().stdout.startswith("<5>sparkfleet-vllm recovered")
    assert harness.state()["notified_at"] is None


# --- busy or hung: /metrics decides when the deep probe times out ----------------------------------------


def test_deep_timeout_behind_progressing_requests_is_busy(harness: Harness) -> None:
    harness.backend.completion = "hang"
    harness.backend.metrics = "busy"
    done = harness.run("--json")
    result = json.loads(done.stdout)
    assert done.returncode == 0
    assert done.stderr.startswith("<5>sparkfleet-vllm busy: not hung: a 1-token completion waited over 0.5 s "
                                  "behind 2 running and 1 waiting requests, 7 tokens processed in ")
    assert result["state"] == "healthy" and result["busy"] is True and result["deep_check"] is True
    assert "not hung" in result["diagnosis"]
    assert harness.backend.calls.count("/metrics") == 2
    assert harness.state()["consecutive_failures"] == 0
    text = (Path(harness.config["textfile_dir"]) / "sparkfleet_health.prom").read_text()
    assert 'sparkfleet_health_busy{endpoint="sparkfleet-vllm"} 1' in text.splitlines()


@pytest.mark.parametrize(
    ("metrics", "load"),
    [
        ("stuck", "1 running and 0 waiting requests, no token processed in "),
        ("idle", "0 running and 0 waiting requests, no token processed in "),
        ("none", "/metrics did not answer either"),
    ],
)
def test_deep_timeout_without_progress_is_hung(harness: Harness, metrics: str, load: str) -> None:
    harness.backend.completion = "hang"
    harness.backend.metrics = metrics
    done = harness.run("--json")
    result = json.loads(done.stdout)
    assert done.returncode == 1
    assert result["state"] == "unhealthy" and result["busy"] is False and result["cause"] == "hung"
    assert result["diagnosis"].startswith(
        f"the engine is hung: a 1-token completion timed out after {TIMEOUT:g} s ({load}"
    )


# --- host memory ------------------------------------------------------------------------------------------


def test_mem_available_is_exported(harness: Harness) -> None:
    harness.memory(37.5)
    done = harness.run("--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["mem_available_gib"] == 37.5
    text = (Path(harness.config["textfile_dir"]) / "sparkfleet_health.prom").read_text()
    assert f'sparkfleet_health_mem_available_bytes{{endpoint="sparkfleet-vllm"}} {int(37.5 * GIB)}' in text
    assert "# TYPE sparkfleet_health_mem_available_bytes gauge" in text
    assert harness.state()["last_result"]["mem_available_gib"] == 37.5


def test_low_memory_alerts(harness: Harness) -> None:
    harness.configure(alert_after=1, min_mem_available_gib=4)
    harness.memory(2.5)
    done = harness.run()
    assert done.returncode == 1
    assert done.stdout.startswith("<3>sparkfleet-vllm ALERT: unhealthy for 1 check in a row (~30 s): host memory "
                                  "low: 2.5 GiB available, below 4 GiB; unified memory is shared by CPU and GPU")
    assert harness.state()["last_result"]["cause"] == "memory_low"
    harness.memory(8)
    assert harness.run().stdout.startswith("<5>sparkfleet-vllm recovered")


def test_low_memory_beside_an_engine_failure_is_mentioned(harness: Harness) -> None:
    harness.configure(min_mem_available_gib=4)
    harness.memory(1)
    harness.backend.health = "503"
    done = harness.run()
    assert "the engine is dead: /health answered HTTP 503" in done.stdout
    assert "; host memory is low too: 1.0 GiB available, below 4 GiB" in done.stdout
    assert harness.state()["last_result"]["cause"] == "engine_dead"


def test_memory_floor_zero_disables_the_check(harness: Harness) -> None:
    harness.configure(min_mem_available_gib=0)
    harness.memory(0.5)
    assert harness.run().returncode == 0


def test_unreadable_meminfo_is_no_failure(harness: Harness) -> None:
    (harness.tmp / "fake" / "meminfo").unlink()
    done = harness.run("--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["mem_available_gib"] is None


# --- diagnoses read only what the current start logged ------------------------------------------------------


def test_diagnosis_ignores_an_earlier_incident_in_the_journal(harness: Harness) -> None:
    """Issue 10: a ValueError now, a cutlass crash from an earlier start in the same unit's journal."""
    harness.configure(url=f"http://127.0.0.1:{free_port()}", load_window_seconds=1, alert_after=1)
    harness.journal(CUTLASS_TRACE, invocation="last-week", ago=7 * 86400)
    harness.journal("ValueError: max_num_seqs must be positive, got -1\n", append=True)
    harness.unit(started_ago=5)
    harness.docker_logs(None)
    done = harness.run()
    assert done.returncode == 1
    assert "cutlass" not in done.stdout and "FP8" not in done.stdout
    assert harness.state()["last_result"]["cause"] == "refused"
    assert f"journalctl _SYSTEMD_INVOCATION_ID={INVOCATION} -n 50" in harness.calls()
    evidence = Path(harness.state()["last_alert"]["evidence"]).read_text()
    this_start, earlier = evidence.split("===== journal of the unit, earlier starts included")
    assert "max_num_seqs must be positive" in this_start and "cutlass_scaled_mm" not in this_start
    assert "(not used for the diagnosis)" in earlier and "cutlass_scaled_mm" in earlier


def test_journal_without_invocation_ids_is_read_since_the_start(harness: Harness) -> None:
    """Some journalds (containers) do not stamp invocation ids: fall back to the lines since this start."""
    harness.configure(url=f"http://127.0.0.1:{free_port()}", load_window_seconds=1)
    harness.journal(CUTLASS_TRACE, invocation="", ago=3600)
    harness.journal("usage: vllm serve\nvllm serve: error: unrecognized arguments: --bogus\n", invocation="",
                    append=True)
    harness.unit(started_ago=5)
    harness.docker_logs(None)
    done = harness.run()
    assert "this vLLM no longer accepts --bogus" in done.stdout
    assert "FP8" not in done.stdout
    assert f"journalctl -u {UNIT} --since @" in harness.calls()


def test_docker_logs_are_read_since_this_start(harness: Harness) -> None:
    harness.backend.health = "503"
    harness.unit(started_ago=100)
    harness.run()
    since = float(harness.calls().split("docker logs --since ")[1].split()[0])
    assert abs(since - (time.time() - 100)) < 5


def test_crash_seen_while_the_next_start_loads_reads_the_crashed_start(harness: Harness) -> None:
    """The crash's trace is in the start the last check saw; older starts stay out of the diagnosis."""
    harness.journal("vllm serve: error: unrecognized arguments: --old-flag\n", invocation="start-0", ago=7200)
    harness.unit(restarts=0, started_ago=60, invocation="start-1")
    harness.journal("INFO Application startup complete.\n", invocation="start-1", ago=50, append=True)
    assert harness.run().returncode == 0
    harness.journal(CUTLASS_TRACE, invocation="start-1", ago=10, append=True)
    _loading(harness, restarts=1, invocation="start-2")
    harness.configure(url=f"http://127.0.0.1:{free_port()}")
    harness.docker_logs(None)
    done = harness.run()
    assert done.returncode == 1
    assert "FP8 kernels crash on GB10" in done.stdout and "; crash loop: systemd keeps restarting" in done.stdout
    assert "--old-flag" not in done.stdout
    assert harness.state()["last_result"]["cause"] == "crashing/cutlass"
    assert "_SYSTEMD_INVOCATION_ID=start-1 _SYSTEMD_INVOCATION_ID=start-2" in harness.calls()


# --- configuration ------------------------------------------------------------------------------------------


def test_a_key_the_deploy_did_not_write_is_named_and_no_default_stands_in(harness: Harness) -> None:
    """Every value comes from the controller (deploys/health.py): the checker has no copies to fall back on."""
    config = {k: v for k, v in harness.config.items() if k not in ("busy_sample_seconds", "env_file")}
    (harness.tmp / "health.json").write_text(json.dumps(config))
    done = harness.run()
    assert done.returncode == 2
    assert "missing keys ['busy_sample_seconds', 'env_file']; the deploy writes this file, re-run it" in done.stderr


@pytest.mark.parametrize(
    "extra",
    [
        {"renotify_minutes": -1},
        {"renotify_minutes": 1.5},
        {"min_mem_available_gib": -0.5},
        {"min_mem_available_gib": "4"},
        {"busy_sample_seconds": 0},
    ],
    ids=["negative-renotify", "fractional-renotify", "negative-memory", "string-memory", "zero-sample"],
)
def test_bad_new_keys_exit_2(harness: Harness, extra: dict[str, Any]) -> None:
    (harness.tmp / "health.json").write_text(json.dumps({**harness.config, **extra}))
    done = harness.run()
    assert done.returncode == 2
    assert done.stderr.startswith("<3>sparkfleet health: bad config: ")


def test_the_checker_runs_as_installed_beside_common(tmp_path: Path) -> None:
    """As systemd runs it (`python3 healthcheck.py --config ...`), it imports common.py from its own directory."""
    for name in ("healthcheck.py", "common.py"):
        (tmp_path / name).write_text((SCRIPT.parent / name).read_text())
    done = subprocess.run([sys.executable, str(tmp_path / "healthcheck.py"), "--config", str(tmp_path / "none.json")],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and done.stderr.startswith("<3>sparkfleet health: bad config: cannot read ")
    (tmp_path / "common.py").unlink()
    done = subprocess.run([sys.executable, str(tmp_path / "healthcheck.py"), "--config", str(tmp_path / "none.json")],
                          capture_output=True, text=True, timeout=30, check=False)
    assert "No module named 'common'" in done.stderr  # what a host without it would say: the deploy installs it


def test_the_deploys_config_carries_the_new_keys_and_loads(tmp_path: Path) -> None:
    from sparkfleet.config import SparkConfig
    from sparkfleet.deploys.health import health_config
    from sparkfleet.endpoint import resolve
    from sparkfleet.remote import healthcheck

    spark = resolve("spark-01", SparkConfig(health_renotify_minutes=15, health_min_mem_available_gib=6.5))
    config = health_config(spark)
    assert config["renotify_minutes"] == 15 and config["min_mem_available_gib"] == 6.5
    path = tmp_path / "health.json"
    path.write_text(json.dumps(config))
    loaded = healthcheck.load_config(str(path))
    assert loaded.renotify_minutes == 15 and loaded.min_mem_available_gib == 6.5
    defaults = health_config(resolve("spark-01", SparkConfig()))
    assert (defaults["renotify_minutes"], defaults["min_mem_available_gib"]) == (60, 4.0)


def test_busy_lab_standin_is_reported_busy_and_its_hang_mode_hung(harness: Harness) -> None:
    """The checker against the lab's vLLM stand-in itself: its busy mode is busy, its hang-engine mode hung."""
    from tests.lab.standins.model import generate_checkpoint
    from tests.lab.standins.vllm_data import write_image_data

    standin = Path(__file__).parents[1] / "lab" / "standins" / "vllm_standin.py"
    write_image_data(harness.tmp / "data")
    generate_checkpoint(harness.tmp / "model", total_bytes=4096, shards=1)
    verdicts = {}
    for mode in ("busy", "hang-engine"):
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_"))}
        env.update(VLLM_STANDIN_DATA=str(harness.tmp / "data"), VLLM_STANDIN_LOAD_SECONDS="0",
                   VLLM_STANDIN_MODE=mode, VLLM_STANDIN_BUSY_SECONDS="5")
        argv = [sys.executable, "-I", "-S", str(standin), "serve", str(harness.tmp / "model"),
                "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port)]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                with socket.socket() as sock:
                    if sock.connect_ex(("127.0.0.1", port)) == 0:
                        break
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
            harness.configure(url=f"http://127.0.0.1:{port}", state_dir=str(harness.tmp / mode),
                              busy_sample_seconds=0.5)
            verdicts[mode] = json.loads(harness.run("--json").stdout)
        finally:
            proc.kill()
            proc.wait()
    assert verdicts["busy"]["state"] == "healthy" and verdicts["busy"]["busy"] is True
    assert "not hung" in verdicts["busy"]["diagnosis"]
    assert verdicts["hang-engine"]["state"] == "unhealthy" and verdicts["hang-engine"]["cause"] == "hung"
    assert "1 running and 0 waiting requests, no token processed" in verdicts["hang-engine"]["diagnosis"]
