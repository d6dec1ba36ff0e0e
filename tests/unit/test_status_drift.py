"""`sparkfleet status` and `drift` without a lab: the host reporter, and every parser on captured outputs."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkfleet import drift, generations, manifest, runner, status
from sparkfleet.config import SparkConfig
from sparkfleet.deploys.health import CONFIG
from sparkfleet.endpoint import (
    CONTAINER,
    DAEMON_JSON,
    ENV_FILE,
    LOADED_WEIGHTS,
    UNIT,
    UNIT_FILE,
    Endpoint,
    resolve,
)
from sparkfleet.fleet import with_weights
from sparkfleet.remote import status as reporter
from tests.unit.resolved import resolved

REPO = Path(__file__).resolve().parents[2]

# /metrics of a vLLM 0.28 engine with MTP (prometheus_client adds the `_created` samples).
METRICS = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen3.6"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen3.6"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen3.6"} 0.125
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="qwen3.6"} 300.0
# HELP vllm:spec_decode_num_draft_tokens_created Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_created gauge
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="qwen3.6"} 1.764e+09
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="qwen3.6"} 246.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen3.6",position="0"} 99.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="qwen3.6"} 7.0
"""

SYSTEMCTL_ACTIVE = """\
ActiveState=active
SubState=running
NRestarts=2
ActiveEnterTimestamp=Sat 2025-11-29 17:57:00 UTC
ExecMainStartTimestamp=Sat 2025-11-29 17:57:00 UTC
ActiveEnterTimestampMonotonic=1000000000
ExecMainStartTimestampMonotonic=1000000000
NeedDaemonReload=no
"""

SYSTEMCTL_STOPPED = """\
ActiveState=inactive
SubState=dead
NRestarts=0
ActiveEnterTimestamp=
ExecMainStartTimestamp=
ActiveEnterTimestampMonotonic=0
ExecMainStartTimestampMonotonic=0
NeedDaemonReload=yes
"""

# `pyinfra --dry --json --limit spark-01 --limit spark-arm64-01 inventory/lab.py deploy.py` on the converged lab
# after spark-01's daemon.json lost the nvidia runtime: 5 of its 23 operations, as printed.
CAPTURED_OPS = [
    '{"op_hash": "36881256f4f10c306dffc7e51a005d4c14be28fb", "name": "Check the host before changing it | Refuse the '
    'host if its preflight found a problem (GPU, Docker, disk, memory, port, drop-ins)", "names": ["Check the host '
    'before changing it | Refuse the host if its preflight found a problem (GPU, Docker, disk, memory, port, '
    'drop-ins)"], "args": [], "hosts_with_change": [], "hosts_with_conditional_change": []}',
    '{"op_hash": "2dab006a95456c966d2436b54293a78fe55e68dd", "name": "Register the nvidia runtime with Docker | '
    'Register the nvidia runtime in daemon.json, keeping every other key", "names": ["Register the nvidia runtime '
    'with Docker | Register the nvidia runtime in daemon.json, keeping every other key"], "args": [], '
    '"hosts_with_change": ["spark-01"], "hosts_with_conditional_change": []}',
    '{"op_hash": "5e20f1fa953237742db54cc8d4c7284ac83746d2", "name": "Register the nvidia runtime with Docker | '
    'Restart dockerd to load the new daemon.json", "names": ["Register the nvidia runtime with Docker | Restart '
    'dockerd to load the new daemon.json"], "args": [], "hosts_with_change": [], "hosts_with_conditional_change": '
    '["spark-01"]}',
    '{"op_hash": "7e3235e86b4a05d83eac611e24d9852fbfa67fda", "name": "Register the nvidia runtime with Docker | Check '
    'that dockerd came back with the nvidia runtime", "names": ["Register the nvidia runtime with Docker | Check that '
    'dockerd came back with the nvidia runtime"], "args": [], "hosts_with_change": [], '
    '"hosts_with_conditional_change": ["spark-01"]}',
    '{"op_hash": "7bf675c2af782a955e79e84813072ff6f08fd371", "name": "Install the vLLM endpoint service | Render the '
    'sparkfleet-vllm unit from the qwen3.6-35b-a3b-nvfp4 recipe", "names": ["Install the vLLM endpoint service | '
    'Render the sparkfleet-vllm unit from the qwen3.6-35b-a3b-nvfp4 recipe"], "args": [], "hosts_with_change": [], '
    '"hosts_with_conditional_change": []}',
]
# Not captured: hosts wording one operation differently (spark-03 pinned to another image).
TWO_WORDINGS = {"op_hash": "d4", "name": "Install the vLLM endpoint service | Pull vllm/vllm-openai:v0.28.0 now, "
                "never on boot", "names": ["Install the vLLM endpoint service | Pull vllm/vllm-openai:v0.28.0 now, "
                                           "never on boot", "Install the vLLM endpoint service | Pull "
                                           "vllm/vllm-openai:v0.29.0 now, never on boot"],
                "args": [], "hosts_with_change": ["spark-03"], "hosts_with_conditional_change": []}
DRY_RUN_STDOUT = json.dumps({"plan": [*map(json.loads, CAPTURED_OPS), TWO_WORDINGS], "results": None})

DRY_RUN_UNREACHABLE = """\
--> Loading config...
--> Loading inventory...
--> Connecting to hosts...
    Failed to load host keys from /root/.ssh/known_hosts: [Errno 2] No such file or directory
    [spark-02] Connected
    [dead-01] Could not connect ([Errno None] Unable to connect to port 1 on 127.0.0.1)

--> Preparing operation files...
    Loading: deploy.py
"""

DRY_RUN_BAD_INVENTORY = """\
--> Loading config...
--> Loading inventory...
--> Connecting to hosts...
    [spark-01] Connected

--> Preparing operation files...
    Loading: deploy.py

--> Disconnecting from hosts...
--> pyinfra error in /work/main/sparkfleet/fleet.py line 57: bad inventory, nothing was changed on any host:
  spark-01: `vllm_api_key` refers to the environment variable NOPE, which is not set: export it before running.
"""


def _spark(**data: object) -> Endpoint:
    return resolve("spark-01", SparkConfig(**data))


# --- the host reporter ---------------------------------------------------------------------------------


def test_unit_uptime_counts_from_the_main_process_start() -> None:
    unit = reporter.parse_unit(SYSTEMCTL_ACTIVE, now_monotonic=1000.0 + 3725.5)
    assert unit == {"state": "active", "sub_state": "running", "restarts": 2, "since": "Sat 2025-11-29 17:57:00 UTC",
                    "uptime_seconds": 3725.5, "need_daemon_reload": False}


def test_stopped_or_unknown_unit_has_no_uptime() -> None:
    stopped = reporter.parse_unit(SYSTEMCTL_STOPPED, now_monotonic=5000.0)
    assert (stopped["state"], stopped["uptime_seconds"], stopped["since"]) == ("inactive", None, None)
    assert stopped["need_daemon_reload"] is True
    assert reporter.parse_unit(None, 5000.0) == {"state": None, "sub_state": None, "restarts": None, "since": None,
                                                 "uptime_seconds": None, "need_daemon_reload": None}


def test_container_image_and_model_from_docker_inspect() -> None:
    text = json.dumps({"image": "vllm/vllm-openai:v0.28.0", "image_id": "sha256:" + "a" * 64,
                       "cmd": ["/models/nvidia--Qwen3.6-35B-A3B-NVFP4", "--host", "0.0.0.0"]})
    assert reporter.parse_container(text) == {"image": "vllm/vllm-openai:v0.28.0", "image_id": "sha256:" + "a" * 64,
                                              "model": "nvidia/Qwen3.6-35B-A3B-NVFP4"}
    assert reporter.parse_container(None) == {"image": None, "image_id": None, "model": None}
    assert reporter.model_name("--host") is None


def test_metrics_pick_vllm_samples_and_ignore_look_alikes() -> None:
    metrics = reporter.parse_metrics(METRICS)
    assert metrics == {"requests_running": 2.0, "requests_waiting": 1.0, "kv_cache_usage": 0.125,
                       "draft_tokens": 300.0, "accepted_tokens": 246.0}
    assert reporter.acceptance(metrics) == 0.82


def test_metrics_sum_engines_but_kv_cache_is_the_fullest() -> None:
    text = ('vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 3\n'
            'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.7\n')
    assert reporter.parse_metrics(text) == {"requests_running": 5.0, "kv_cache_usage": 0.7}


def test_acceptance_is_null_without_drafts() -> None:
    assert reporter.acceptance({}) is None
    assert reporter.acceptance({"draft_tokens": 0.0, "accepted_tokens": 0.0}) is None


@pytest.fixture
def metrics_url() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = METRICS.encode() if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def layout_args(root: Path) -> list[str]:
    """The reporter's arguments with every file under `root`, as the controller would pass them."""
    files = {"unit-file": "vllm.service", "env-file": "vllm.env", "daemon-json": "daemon.json",
             "health-config": "health.json", "loaded-weights": "loaded-weights.json"}
    return ["--unit", "sparkfleet-vllm.service", "--container", "sparkfleet-vllm",
            *(f"--{flag}={root / name}" for flag, name in files.items())]


def layout(root: Path) -> reporter.Layout:
    args = reporter.parse_args(layout_args(root))
    return reporter.Layout(args.unit, args.container, args.unit_file, args.env_file, args.daemon_json,
                           args.health_config, args.loaded_weights)


@pytest.fixture
def host_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The reporter's files under tmp_path, and no real systemctl, docker or dpkg-query."""
    monkeypatch.setattr(reporter, "STAGE_WEIGHTS", tmp_path / "stage_weights.py")
    monkeypatch.setattr(reporter, "run", lambda argv, timeout: None)
    return tmp_path


def test_reporter_reads_every_source(host_files: Path, metrics_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {"systemctl": SYSTEMCTL_ACTIVE, "dpkg-query": "ii |1.17.8-1",
               "docker": json.dumps({"image": "img:1", "image_id": "sha256:1", "cmd": ["/models/org--m"]})}
    monkeypatch.setattr(reporter, "run", lambda argv, timeout: answers.get(argv[0]) if argv[1] != "info" else
                        json.dumps({"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}))
    state_dir = host_files / "health"
    state_dir.mkdir()
    (state_dir / "state.json").write_text(json.dumps({
        "last_result": {"state": "healthy", "checked_at": "2025-11-29T18:00:00+00:00"},
        "last_alert": {"time": "2025-11-29T17:00:00+00:00", "cause": "crashloop/cutlass"}}))
    (host_files / "health.json").write_text(json.dumps({"served_model_name": "qwen3.6", "url": metrics_url,
                                                        "state_dir": str(state_dir)}))
    (host_files / "daemon.json").write_text(json.dumps({"runtimes": {"nvidia": {"path": "x"}}}))
    (host_files / "vllm.env").write_text("VLLM_API_KEY=secret\n")
    report = reporter.collect(layout(host_files))
    assert report["state"] == "active" and report["restarts"] == 2
    assert (report["image"], report["model"], report["served_name"]) == ("img:1", "org/m", "qwen3.6")
    assert (report["requests_running"], report["requests_waiting"], report["kv_cache_usage"]) == (2, 1, 0.125)
    assert report["mtp_acceptance"] == 0.82
    assert report["last_result"]["state"] == "healthy"
    assert report["last_alert"]["cause"] == "crashloop/cutlass"
    assert report["toolkit_version"] == "1.17.8-1"
    assert report["runtime_in_daemon_json"] is True and report["runtime_in_dockerd"] is True
    assert report["env_sha256"] == hashlib.sha256(b"VLLM_API_KEY=secret\n").hexdigest()
    assert report["unit_sha256"] is None


def test_reporter_on_a_bare_host_reports_nulls(host_files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The arm64 lab host never starts the endpoint; a fresh host has nothing at all: nulls, never a crash."""
    weights = "--weights-check=--dest /nowhere --digest " + "a" * 64
    assert reporter.main([*layout_args(host_files), "--image", "img:1", weights]) == 0
    line = capsys.readouterr().out
    assert line.startswith(reporter.MARKER) and line.endswith("\n")
    report = json.loads(line[len(reporter.MARKER):])
    for key in ("state", "uptime_seconds", "image", "model", "served_name", "requests_running", "kv_cache_usage",
                "mtp_acceptance", "last_result", "last_alert", "toolkit_version", "runtime_in_dockerd",
                "unit_sha256", "wanted_image_id"):
        assert report[key] is None, key
    assert report["metrics"] is False
    assert report["runtime_in_daemon_json"] is False
    assert report["weights"] == {"state": "absent"}


def test_reporter_runs_as_installed_beside_common(tmp_path: Path) -> None:
    """The deploy installs the scripts together in one directory: `import common` finds its sibling there."""
    lib, empty = tmp_path / "lib", tmp_path / "bin"
    lib.mkdir()
    empty.mkdir()
    for name in ("status.py", "common.py"):
        shutil.copy(REPO / "sparkfleet" / "remote" / name, lib / name)
    done = subprocess.run([sys.executable, str(lib / "status.py"), *layout_args(tmp_path)], capture_output=True,
                          text=True, env={"PATH": str(empty)}, timeout=60)  # no systemctl, docker or dpkg here
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.removeprefix(reporter.MARKER))["state"] is None


def test_reporter_runs_the_weights_check_fast(host_files: Path, tmp_path: Path) -> None:
    (host_files / "stage_weights.py").write_text((REPO / "sparkfleet/remote/stage_weights.py").read_text())
    assert reporter.weights_check(["--dest", str(tmp_path / "model"), "--digest", "a" * 64]) == {"state": "absent"}
    failed = reporter.weights_check(["--dest", str(tmp_path / "model"), "--digest", "not-hex"])
    assert failed["state"] == "error" and "digest" in failed["message"]


# --- the controller's side -----------------------------------------------------------------------------


def test_marker_line_is_found_among_login_noise() -> None:
    report = {"state": "active", "restarts": 0}
    lines = ["Welcome to DGX OS", "SPARKFLEET-STATUS {not json", reporter.MARKER + json.dumps(report), "bye"]
    assert status.extract(lines) == report
    assert status.extract(["no marker here"]) is None
    assert status.extract([reporter.MARKER + "{broken"]) is None
    assert status.MARKER == reporter.MARKER


def test_fact_reports_a_host_without_the_reporter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(status, "SCRIPT", str(tmp_path / "status.py"))
    command = status.EndpointStatus().command(args="--image img:1")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    assert status.EndpointStatus().process(out.splitlines()) == status.NOT_INSTALLED
    (tmp_path / "status.py").write_text("import json, sys; print('SPARKFLEET-STATUS', json.dumps(sys.argv[1:]))")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    assert out == f'SPARKFLEET-STATUS {json.dumps([*shlex.split(status.LAYOUT), "--image", "img:1"])}\n'
    assert status.extract(out.splitlines()) is None  # the reporter's answer is an object, never a list


def test_the_reporter_is_told_where_the_endpoints_files_are() -> None:
    """It keeps no copy of them: the controller passes the paths the deploy wrote to, on every call."""
    args = reporter.parse_args(shlex.split(status.LAYOUT))
    assert (args.unit, args.container) == (f"{UNIT}.service", CONTAINER)
    assert [str(path) for path in (args.unit_file, args.env_file, args.daemon_json, args.health_config,
                                   args.loaded_weights)] == [UNIT_FILE, ENV_FILE, DAEMON_JSON, CONFIG, LOADED_WEIGHTS]
    with pytest.raises(SystemExit):
        reporter.parse_args(["--image", "img:1"])  # without them it refuses to guess


def test_status_rows_and_exit_code() -> None:
    ok = status.Answer("spark-01", {"state": "active", "sub_state": "running", "uptime_seconds": 3725,
                                    "restarts": 1, "model": "org/m", "served_name": "m", "requests_running": 2,
                                    "requests_waiting": 0, "kv_cache_usage": 0.125, "mtp_acceptance": 0.8234,
                                    "last_result": {"state": "healthy"},
                                    "last_alert": {"time": "2025-11-29T17:00:00+00:00", "cause": "down"},
                                    "weights_generation": "4f1c2b3a5d6e7f8091a2b3c4d5e6f708192a3b4c"})
    bare = status.Answer("spark-arm64-01", {"state": "inactive", "sub_state": "dead"})
    lost = status.Answer("spark-03", error="unreachable: cannot connect over SSH (timeout)")
    assert status.row(ok) == ["spark-01", "[green]active/running[/]", "[green]healthy[/]", "1h 02m", "1", "m",
                              "4f1c2b3a5d6e", "-", "12.5%", "82.3%", "2", "0", "m", "2025-11-29T17:00:00+00:00 down"]
    assert status.row(bare)[2:] == ["-"] * 12
    assert status.row(lost)[1] == "[bold red]no answer[/]"
    assert status.exit_code([ok, bare]) == 0
    assert status.exit_code([ok, lost]) == 1
    assert status.exit_code([]) == 1
    assert lost.as_dict() == {"host": "spark-03", "error": "unreachable: cannot connect over SSH (timeout)"}


@pytest.mark.parametrize(("seconds", "text"), [(None, "-"), (42.9, "42s"), (303, "5m 03s"), (11520, "3h 12m"),
                                                (187200, "2d 04h")])
def test_durations(seconds: float | None, text: str) -> None:
    assert status.duration(seconds) == text


def test_plan_names_each_hosts_changes_without_the_deploy_prefix() -> None:
    plan = drift.parse_plan(runner.read_report("some noise\n" + DRY_RUN_STDOUT + "\n"))
    assert plan is not None
    assert plan.changes == {
        "spark-01": ["Register the nvidia runtime in daemon.json, keeping every other key"],
        "spark-03": ["Pull vllm/vllm-openai:v0.28.0 now, never on boot / Pull vllm/vllm-openai:v0.29.0 now, "
                     "never on boot"],
    }
    assert plan.follow_ups == {"spark-01": ["Restart dockerd to load the new daemon.json",
                                            "Check that dockerd came back with the nvidia runtime"]}
    assert drift.parse_plan(runner.read_report("")) is None
    assert drift.parse_plan(runner.read_report('[1, 2]\n{"other": 1}')) is None


def _dry_run(stderr: str, returncode: int = 1) -> runner.DeployRun:
    return runner.DeployRun(["spark-01", "spark-02", "dead-01"], True, returncode, None, stderr)


def test_a_failed_dry_run_keeps_host_errors_and_the_final_error() -> None:
    assert _dry_run(DRY_RUN_UNREACHABLE).message() == [
        "[dead-01] Could not connect ([Errno None] Unable to connect to port 1 on 127.0.0.1)"]
    message = _dry_run(DRY_RUN_BAD_INVENTORY).message()
    assert message[0].startswith("--> pyinfra error in") and "bad inventory" in message[0]
    assert "NOPE, which is not set" in message[1]
    assert _dry_run("--> Loading config...\nsomething odd\n").message() == ["--> Loading config...",
                                                                           "something odd"]


def test_a_dry_run_is_ok_only_with_exit_0_and_a_plan() -> None:
    report = runner.read_report(DRY_RUN_STDOUT)
    assert runner.DeployRun(["spark-01"], True, 0, report, "").ok
    assert not runner.DeployRun(["spark-01"], True, 1, report, DRY_RUN_UNREACHABLE).ok
    assert not runner.DeployRun(["spark-01"], True, 0, None, "").ok


def test_file_operations_are_named_as_the_facts_expect() -> None:
    """`unit_file.would_change` and `env_file.would_change` find their operations by name."""
    source = (REPO / "sparkfleet/deploys/service.py").read_text()
    assert 'name=f"Render the {UNIT} unit from' in source
    assert 'name="Write the endpoint\'s secrets to a root-only env file"' in source
    assert drift.FILE_OPS["unit_file"] == "Render the sparkfleet-vllm unit"


def test_weights_check_arguments_name_the_resolved_generation(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every source is checked by the digest of its generation's SHA256SUMS, in the generation's directory, and
    by size and mtime even with weights_verify=full (drift runs from cron)."""
    spark = resolved(_spark(model_source="http://mirror.lan/models/m/", weights_verify="full"))
    assert spark.weights is not None
    assert drift.weights_args(spark) == ["--dest", spark.weights_dir, "--digest", spark.weights.digest]
    assert spark.weights_dir.endswith(f"/{spark.weights.id}")
    monkeypatch.setattr(manifest, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(generations, "_resolved", {})
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.safetensors").write_bytes(b"weights")
    local = with_weights(_spark(model_source=str(tmp_path / "m")))
    digest = manifest.controller_sums(tmp_path / "m")[1]
    assert drift.weights_args(local) == ["--dest", f"{local.model_root}/sha256-{digest[:16]}", "--digest", digest]
    args = drift.reporter_args(local)
    assert args.startswith(f"--image {local.image} '--weights-check=--dest ")


HEALTHY = {"state": "active", "image": "IMG", "image_id": "sha256:new", "wanted_image_id": "sha256:new",
           "runtime_in_daemon_json": True, "runtime_in_dockerd": True, "need_daemon_reload": False,
           "last_result": {"state": "healthy"}}


def test_a_converged_host_has_no_fact_drift() -> None:
    spark = _spark(vllm_image="IMG")
    assert drift.fact_drift(spark, HEALTHY) == []
    assert drift.fact_drift(spark, {}) == []  # nothing known is nothing to report


@pytest.mark.parametrize(("change", "item"), [
    ({"runtime_in_dockerd": False}, "dockerd runs without the nvidia runtime its daemon.json registers"),
    ({"need_daemon_reload": True}, "systemd holds an older sparkfleet-vllm unit than the file on disk"),
    ({"image": "OTHER"}, "runs image OTHER, the inventory wants IMG"),
    ({"image_id": "sha256:old"}, "runs an older pull of IMG (sha256:old, the host has sha256:new)"),
    ({"last_result": {"state": "unhealthy", "diagnosis": "the engine died"}},
     "last health check unhealthy: the engine died"),
])
def test_fact_drift_names_what_a_deploy_leaves_alone(change: dict, item: str) -> None:
    items = drift.fact_drift(_spark(vllm_image="IMG"), HEALTHY | change)
    assert len(items) == 1 and items[0].startswith(item)


def test_a_stopped_by_design_host_is_not_judged_on_image_or_health() -> None:
    report = HEALTHY | {"image": None, "last_result": None, "state": "inactive"}
    assert drift.fact_drift(_spark(vllm_image="IMG", vllm_start=False), report | {"image": "OTHER"}) == []


def test_facts_pair_each_value_with_the_wanted_one() -> None:
    spark = resolved(_spark(vllm_image="IMG"))
    assert spark.weights is not None
    report = HEALTHY | {"toolkit_version": "1.0", "unit_sha256": "u", "env_sha256": "e", "weights": {"state": "ok"},
                        "weights_generation": "sha256-0123456789abcdef"}
    facts = drift.facts(spark, report, ["Render the sparkfleet-vllm unit from the r recipe"])
    assert facts["toolkit_version"] == {"installed": "1.0", "wanted": spark.config.nvidia_toolkit_version}
    assert facts["unit_file"] == {"sha256": "u", "would_change": True, "need_daemon_reload": False}
    assert facts["env_file"] == {"sha256": "e", "would_change": False}
    assert facts["image"]["wanted"] == "IMG"
    assert facts["weights"] == {"check": {"state": "ok"}, "serving": "sha256-0123456789abcdef",
                                "wanted": spark.weights.label}
    assert drift.facts(_spark(), {}, [])["weights"] == {"check": None, "serving": None, "wanted": None}


def test_the_reporter_names_the_generation_the_unit_mounts(tmp_path: Path) -> None:
    unit = tmp_path / "sparkfleet-vllm.service"
    assert reporter.mounted_generation(unit) is None  # no unit yet
    unit.write_text("ExecStart=/usr/bin/docker run --volume /run/sparkfleet:/run/sparkfleet \\\n"
                    "    --volume /var/lib/sparkfleet/models/org--m/sha256-0123456789abcdef:/models/org--m:ro img\n")
    assert reporter.mounted_generation(unit) == "sha256-0123456789abcdef"
    unit.write_text("ExecStart=/usr/bin/docker run --volume /var/lib/sparkfleet/models/org--m:/models/org--m:ro\n")
    assert reporter.mounted_generation(unit) == "org--m"  # the flat layout from before generations


def _report(*hosts: drift.HostDrift, errors: list[str] | None = None) -> drift.Report:
    return drift.Report(list(hosts), errors or [])


def test_exit_codes_and_cron_output() -> None:
    clean = drift.HostDrift("spark-01")
    changed = drift.HostDrift("spark-02", changes=["Register the nvidia runtime in daemon.json, keeping every "
                                                   "other key"], drift=["runs image OTHER, the inventory wants IMG"])
    out, err = io.StringIO(), io.StringIO()
    drift.render(_report(clean, clean), out, err)
    assert (out.getvalue(), err.getvalue()) == ("converged: 2 hosts\n", "")
    report = _report(clean, changed)
    assert report.exit_code == 2 and report.as_dict()["status"] == "drifted"
    out = io.StringIO()
    drift.render(report, out, err)
    assert out.getvalue().splitlines() == [
        "spark-02: would change: Register the nvidia runtime in daemon.json, keeping every other key",
        "spark-02: runs image OTHER, the inventory wants IMG"]
    assert _report(clean, drift.HostDrift("spark-03", error="unreachable")).exit_code == 1
    assert _report(clean, errors=["--> pyinfra error: No hosts remaining!"]).exit_code == 1
    assert _report().exit_code == 1
    failed = _report(clean, drift.HostDrift("spark-03", error="unreachable: no route"), errors=["pyinfra said"])
    out, err = io.StringIO(), io.StringIO()
    drift.render(failed, out, err)
    assert out.getvalue() == "" and err.getvalue() == "pyinfra said\nspark-03: error: unreachable: no route\n"


def test_host_drift_combines_plan_and_facts() -> None:
    spark = _spark(vllm_image="IMG")
    plan = drift.parse_plan(runner.read_report(DRY_RUN_STDOUT))
    assert plan is not None
    result = drift.host_drift(spark, status.Answer("spark-01", HEALTHY | {"runtime_in_dockerd": False}), plan)
    assert result.lines() == [
        "spark-01: would change: Register the nvidia runtime in daemon.json, keeping every other key",
        "spark-01: dockerd runs without the nvidia runtime its daemon.json registers (restart docker)"]
    assert result.follow_ups == plan.follow_ups["spark-01"]
    unreachable = drift.host_drift(spark, status.Answer("spark-01", error="unreachable"), plan)
    assert unreachable.error == "unreachable" and unreachable.facts == {}
    older = drift.host_drift(spark, status.Answer("spark-01", error="not installed", deployed=False), plan)
    assert older.error is None and older.facts == {} and older.changes == plan.changes["spark-01"]


def test_a_pair_is_one_row_served_by_its_head_with_both_hosts_named() -> None:
    pair = {"name": "pair-a", "head": "pair-01", "interface": "enp1s0f0np0", "master_addr": "192.168.100.10"}
    data = {"spark-01": {}, "pair-01": {"pair": pair}, "pair-02": {"pair": pair}}
    serving = {"state": "active", "sub_state": "running", "model": "org/m", "served_name": "m",
               "last_result": {"state": "healthy"}}
    worker = status.Answer("pair-02", {"state": "active", "sub_state": "running", "last_result": {"state": "healthy"}})
    answers = [status.Answer("spark-01", serving), worker, status.Answer("pair-01", serving)]
    joined = status.join_pairs(answers, data)
    assert [answer.host for answer in joined] == ["spark-01", "pair-01"]
    cells = status.row(joined[1])
    assert cells[:3] == ["pair-a: pair-01 + pair-02", "[green]active/running[/]", "[green]healthy[/]"]
    assert joined[1].as_dict()["pair"] == {"name": "pair-a", "head": "pair-01", "worker": worker.as_dict()}
    assert status.exit_code(joined) == 0
    worker.status = {"state": "failed", "sub_state": "failed", "last_result": {"state": "unhealthy"}}
    cells = status.row(joined[1])
    assert cells[1] == "[green]active/running[/], worker [bold red]failed/failed[/]"
    assert cells[2] == "[green]healthy[/], worker [bold red]unhealthy[/]"
    worker.status, worker.error = None, "unreachable: cannot connect over SSH (timeout)"
    assert status.exit_code(joined) == 1


def test_drift_names_both_hosts_of_a_pair() -> None:
    pair = {"name": "pair-a", "head": "pair-01"}
    data = {"spark-01": {}, "pair-01": {"pair": pair}, "pair-02": {"pair": pair}}
    hosts = [drift.HostDrift("spark-01"), drift.HostDrift("pair-01"),
             drift.HostDrift("pair-02", changes=["Render the sparkfleet-vllm unit from the recipe"])]
    drift.pair_drift(hosts, data)
    assert hosts[1].lines() == ["pair-01: its pair pair-a restarts with pair-02, which would change: a deploy that "
                                "restarts either host restarts both"]
    assert hosts[0].lines() == [] and len(hosts[2].lines()) == 1
