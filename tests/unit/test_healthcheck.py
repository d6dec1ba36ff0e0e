"""sparkfleet/remote/healthcheck.py, run as the Spark runs it: a subprocess against a fake vLLM server.

The HTTP server is switchable (healthy, 401, 503, wrong model list, hangs); systemctl, docker and journalctl
are shell stand-ins selected through SPARKFLEET_* and fed from files each test writes.
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
MINIMAL = {"endpoint": "e", "unit": "u", "container": "c", "url": "http://h", "served_model_name": "m"}

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

CUTLASS_TRACE = """INFO Capturing CUDA graphs
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/vllm/_custom_ops.py", line 812, in cutlass_scaled_mm
RuntimeError: Error Internal
"""


@dataclass
class Backend:
    """What the fake vLLM answers, and everything it was asked."""

    health: str = "ok"
    models: str = "ok"
    completion: str = "ok"
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
    ) -> None:
        entered = int((time.monotonic() - started_ago) * 1e6)
        (self.tmp / "fake" / "systemctl.out").write_text(
            f"LoadState=loaded\nActiveState={active}\nSubState={sub}\nResult={result}\nNRestarts={restarts}\n"
            f"ActiveEnterTimestampMonotonic={entered}\nExecMainStatus=0\n"
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

    def journal(self, text: str) -> None:
        (self.tmp / "fake" / "journalctl.out").write_text(text)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--config", str(self.tmp / "health.json"), *args],
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
    env.update(FAKE_DIR=str(fake), VLLM_API_KEY=API_KEY)
    for tool in ("systemctl", "docker", "journalctl"):
        script = fake / tool
        script.write_text(FAKE_TOOL.format(name=tool))
        script.chmod(0o755)
        env[f"SPARKFLEET_{tool.upper()}"] = str(script)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    config = {
        "endpoint": "sparkfleet-vllm",
        "unit": UNIT,
        "container": "sparkfleet-vllm",
        "url": url,
        "served_model_name": MODEL,
        "load_window_seconds": 900,
        "interval_seconds": 30,
        "deep_every": 10,
        "timeout_seconds": TIMEOUT,
        "deep_timeout_seconds": TIMEOUT,
        "alert_after": 3,
        "textfile_dir": str(tmp_path / "node_exporter" / "textfile_collector"),
        "state_dir": str(tmp_path / "state"),
        "log_lines": 50,
    }
    h = Harness(tmp_path, backend, url, config, env)
    h.configure()
    h.unit()
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
    assert "check VLLM_API_KEY in /etc/sparkfleet/vllm.env" in done.stdout
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
    assert "use a newer cu130 image pinned by tag or digest" in done.stdout
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
    assert harness.backend.calls[-3:-1] == ["/health", "/v1/models"]
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
    assert "docker logs --tail 50 sparkfleet-vllm" in harness.calls()
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
    "config_text",
    [
        None,
        "{not json",
        json.dumps({"endpoint": "x"}),
        json.dumps({**MINIMAL, "alert_afer": 3}),
        json.dumps({**MINIMAL, "alert_after": "3"}),
        json.dumps({**MINIMAL, "url": "127.0.0.1:8000"}),
    ],
    ids=["missing", "not-json", "missing-keys", "unknown-key", "wrong-type", "bad-url"],
)
def test_bad_config_exits_2(harness: Harness, config_text: str | None) -> None:
    config = harness.tmp / "health.json"
    if config_text is None:
        config.unlink()
    else:
        config.write_text(config_text)
    done = harness.run()
    assert done.returncode == 2
    assert done.stderr.startswith("<3>sparkfleet health: bad config: ")
    assert not harness.state_dir.exists()
