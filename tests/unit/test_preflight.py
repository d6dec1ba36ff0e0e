"""Host preflight and `sparkfleet doctor`: each host rule at its boundaries, the fact script, the report."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from sparkfleet import doctor, generations, manifest
from sparkfleet.config import ModelSource, SparkConfig
from sparkfleet.endpoint import Endpoint, resolve
from sparkfleet.fleet import with_weights
from sparkfleet.memory import budget
from sparkfleet.preflight import (
    HOST_CHECKS,
    HOST_FACTS_SCRIPT,
    VLLM_FREE_GAP,
    SparkFacts,
    checkpoint_size,
    disk_needed,
    dockerd_flags,
    flag_key,
    host_findings,
    preflight_query,
)
from sparkfleet.rules import Finding
from tests.unit.resolved import generation, offline_sources, resolved

GB = 10**9
NVFP4_BYTES = 23 * GB


def endpoint(**config: object) -> Endpoint:
    return resolved(resolve("spark-01", SparkConfig(**config)))


def facts(**changes: object) -> dict:
    """A healthy DGX Spark, with `changes` applied."""
    healthy = {
        "probe_errors": {}, "arch": "arm64",
        "os": {"pretty_name": "Ubuntu 24.04.3 LTS", "id": "ubuntu", "version_id": "24.04"},
        "docker": {"server": "28.3.3", "error": None},
        "gpu": {"exit_code": 0, "error": None, "name": "NVIDIA GB10", "driver_version": "580.95.05",
                "power_limit": None, "temperature": 42.0},
        "mem_total": 128 * GB, "mem_available": 120 * GB,
        "disk": {"path": "/var/lib/sparkfleet/models", "mount": "/", "free": 500 * GB, "staged": 0},
        "port_listener": None, "port_ours": False, "endpoint_state": "inactive", "dropins": {}, "daemon_json_keys": [],
        "daemon_json_error": None,
    }
    return healthy | changes


def gpu(**changes: object) -> dict:
    return facts()["gpu"] | changes


def findings(rule: str, host_facts: dict, spark: Endpoint | None = None) -> list[Finding]:
    return [f for f in host_findings(spark or endpoint(), host_facts) if f.rule == rule]


def only(rule: str, host_facts: dict, spark: Endpoint | None = None) -> Finding:
    (finding,) = findings(rule, host_facts, spark)
    return finding


def test_a_healthy_spark_has_no_findings() -> None:
    assert host_findings(endpoint(), facts()) == []


# --- platform -------------------------------------------------------------------------------------------


def test_arch_must_be_one_the_image_is_built_for() -> None:
    spark = endpoint()
    arm_only = replace(spark, recipe=spark.recipe.model_copy(update={"image_architectures": ["arm64"]}))
    finding = only("host.arch", facts(arch="amd64"), arm_only)
    assert (finding.severity, finding.field) == ("error", "vllm_image")
    assert "this host is amd64" in finding.message and "built for arm64" in finding.message
    assert findings("host.arch", facts(arch="arm64"), arm_only) == []


@pytest.mark.parametrize(("release", "warned"), [
    ({"pretty_name": "Rocky Linux 9.4", "id": "rocky", "id_like": "rhel centos fedora"}, True),
    ({"pretty_name": "Debian GNU/Linux 12 (bookworm)", "id": "debian"}, False),
    ({"pretty_name": "Linux Mint 22", "id": "linuxmint", "id_like": "ubuntu debian"}, False),
])
def test_os_other_than_ubuntu_or_debian_is_a_warning(release: dict, warned: bool) -> None:
    found = findings("host.os", facts(os=release))
    assert [f.severity for f in found] == (["warning"] if warned else [])


def test_missing_docker_names_the_packages() -> None:
    finding = only("host.docker", facts(docker=None))
    assert finding.severity == "error"
    assert "DGX OS ships Docker; install docker.io or docker-ce" in finding.message


def test_docker_without_a_daemon_quotes_its_error() -> None:
    error = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    finding = only("host.docker", facts(docker={"server": None, "error": error}))
    assert error in finding.message and "systemctl start docker" in finding.message


def test_broken_daemon_json_is_an_error() -> None:
    finding = only("host.daemon-json", facts(daemon_json_error="Expecting value at line 3"))
    assert finding.severity == "error" and "Expecting value at line 3" in finding.message


# --- GPU ------------------------------------------------------------------------------------------------


def test_no_nvidia_smi_is_an_error() -> None:
    finding = only("host.gpu", facts(gpu=None))
    assert finding.severity == "error" and "nvidia-smi is not installed" in finding.message


def test_failing_nvidia_smi_is_quoted() -> None:
    error = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    finding = only("host.gpu", facts(gpu={"exit_code": 9, "error": error}))
    assert finding.severity == "error"
    assert finding.message == (f"no GPU driver answers: {error.rstrip('.')}; check the driver / reboot after a "
                               "driver update")


def test_a_gpu_that_is_not_a_gb10_is_a_warning() -> None:
    finding = only("host.gpu", facts(gpu=gpu(name="NVIDIA RTX 6000 Ada Generation")))
    assert finding.severity == "warning" and "not a DGX Spark" in finding.message


@pytest.mark.parametrize(("driver", "refused"), [
    ("580.0", False), ("580.0.1", False), ("580.95.05", False), ("581", False),
    ("579.99", True), ("550.54.15", True),
])
def test_driver_at_the_minimum_passes_and_below_is_an_error(driver: str, refused: bool) -> None:
    found = findings("host.gpu", facts(gpu=gpu(driver_version=driver)))
    assert [f.severity for f in found] == (["error"] if refused else [])
    if refused:
        assert f"driver {driver} is older than 580.0" in found[0].message


@pytest.mark.parametrize(("temperature", "warned"), [(84.9, False), (85.0, True), (None, False)])
def test_hot_gpu_is_a_warning(temperature: float | None, warned: bool) -> None:
    assert len(findings("host.temperature", facts(gpu=gpu(temperature=temperature)))) == warned


@pytest.mark.parametrize(("limit", "warned"), [(None, False), (140.0, False), (100.0, False), (60.0, True)])
def test_power_cap_is_a_warning_only_when_low(limit: float | None, warned: bool) -> None:
    found = findings("host.power", facts(gpu=gpu(power_limit=limit)))
    assert [f.severity for f in found] == (["warning"] if warned else [])


# --- memory ---------------------------------------------------------------------------------------------


def test_memory_rule_uses_the_hosts_memtotal() -> None:
    total = budget(endpoint()).total
    over = int(total / 0.7) - 10**6
    finding = only("host.memory", facts(mem_total=over, mem_available=over))
    assert (finding.severity, finding.field) == ("error", "vllm_args.max-num-seqs")
    assert finding.message.startswith(f"this host has {over / GB:.1f} GB (MemTotal): at max-model-len 262144 only ")
    assert "lower max-num-seqs to 3" in finding.message
    assert not any(f.rule.startswith("capacity.") for f in host_findings(endpoint(), facts(mem_total=over)))


def test_tight_memory_is_a_warning() -> None:
    total = int(budget(endpoint()).total / 0.7 / 0.97)
    finding = only("host.memory", facts(mem_total=total, mem_available=total))
    assert finding.severity == "warning" and "profiling can overshoot" in finding.message


def test_low_memavailable_is_a_warning_with_the_drop_caches_fix() -> None:
    # vLLM 0.28 reads free memory about 2.7 GiB below MemAvailable on GB10: the preflight keeps that margin.
    wanted = budget(endpoint(), 128 * GB).available + VLLM_FREE_GAP
    assert VLLM_FREE_GAP == int(2.7 * 2**30)
    assert findings("host.memory", facts(mem_available=wanted)) == []
    finding = only("host.memory", facts(mem_available=wanted - 1))
    assert finding.severity == "warning"
    assert "sync; echo 3 > /proc/sys/vm/drop_caches" in finding.message and "vllm #48140" in finding.message


def test_low_memavailable_is_expected_while_our_endpoint_runs() -> None:
    assert findings("host.memory", facts(mem_available=10 * GB, endpoint_state="active")) == []


# --- disk -----------------------------------------------------------------------------------------------


def test_disk_margin_is_ten_percent_but_at_least_5_gb() -> None:
    assert disk_needed(NVFP4_BYTES) == NVFP4_BYTES + 5 * GB
    assert disk_needed(100 * GB) == 110 * GB


@pytest.mark.parametrize(("free", "staged", "refused"), [
    (28 * GB, 0, False),               # exactly at the limit
    (28 * GB - 1, 0, True),            # one byte under
    (20 * GB, 8 * GB, False),          # already-staged weights count
    (20 * GB, 8 * GB - 1, True),
])
def test_disk_needs_checkpoint_plus_margin(free: int, staged: int, refused: bool) -> None:
    disk = {"path": "/srv", "mount": "/srv", "free": free, "staged": staged}
    found = findings("host.disk", facts(disk=disk))
    assert len(found) == refused
    if refused:
        assert (found[0].severity, found[0].field) == ("error", "model_dir")
        assert "not enough space on /srv" in found[0].message and "need 28.0 GB" in found[0].message
        assert "point model_dir at a larger local NVMe" in found[0].message


def test_disk_uses_the_checkpoint_size_given() -> None:
    disk = {"path": "/mnt/small", "mount": "/mnt/small", "free": 6 * GB, "staged": 0}
    assert host_findings(endpoint(), facts(disk=disk), checkpoint_bytes=GB) == []
    assert [f.rule for f in host_findings(endpoint(), facts(disk=disk))] == ["host.disk"]


def test_checkpoint_size_is_what_the_source_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(generations, "_resolved", {})
    weights = tmp_path / "weights"
    (weights / "sub").mkdir(parents=True)
    (weights / "model-00001.safetensors").write_bytes(b"x" * 1000)
    (weights / "sub" / "config.json").write_bytes(b"{}")
    (weights / "SHA256SUMS").write_text("ignored\n")
    (weights / ".lab-generated").write_text("ignored")
    local = resolve("spark-01", SparkConfig(model_source=str(weights)))
    assert checkpoint_size(with_weights(local)) == 1002
    hub = generation(ModelSource.parse("hf://org/m@main"), total=5 * GB)
    assert checkpoint_size(replace(endpoint(), weights=hub)) == 5 * GB
    # A mirror's SHA256SUMS has no sizes, and an unresolved source none at all: the recipe's figure.
    assert checkpoint_size(endpoint(model_source="http://mirror.lan/models/x")) == NVFP4_BYTES
    assert checkpoint_size(resolve("spark-01", SparkConfig())) == NVFP4_BYTES


# --- port -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("listener", "ours", "state", "refused"), [
    (None, False, "inactive", False),
    ("vllm", True, "active", False),            # our endpoint's container
    ("python3", False, "active", True),         # ours runs, but on another port: this one is someone else's
    ("nginx", False, "inactive", True),
    ("unknown", None, "activating", False),     # the listener could not be named: the unit's state decides
    ("unknown", None, "failed", True),
])
def test_port_is_free_or_ours(listener: str | None, ours: bool | None, state: str, refused: bool) -> None:
    found = findings("host.port", facts(port_listener=listener, port_ours=ours, endpoint_state=state))
    assert len(found) == refused
    if refused:
        assert (found[0].severity, found[0].field) == ("error", "vllm_port")
        assert f"port 8000 is already held by {listener} (not sparkfleet-vllm)" in found[0].message


# --- docker.service.d drop-ins --------------------------------------------------------------------------

MIRROR_DROPIN = "[Service]\nExecStart=\nExecStart=/usr/bin/dockerd --registry-mirror=http://m:5000 -H fd://\n"


def test_dropin_flags_are_read_as_systemd_applies_them() -> None:
    dropins = {
        "/etc/systemd/system/docker.service.d/10-old.conf": "[Service]\nExecStart=/usr/bin/dockerd --bip=10.1.0.1/16\n",
        "/etc/systemd/system/docker.service.d/20-mirror.conf": MIRROR_DROPIN,
        "/etc/systemd/system/docker.service.d/30-env.conf": "[Service]\nEnvironment=HTTP_PROXY=x\n"
        "ExecStartPost=/bin/true\n# ExecStart=/usr/bin/dockerd --debug\n",
        "/etc/systemd/system/docker.service.d/40-more.conf": "[Service]\nExecStart=-/usr/sbin/dockerd \\\n"
        "    --default-runtime nvidia --log-level=warn\nExecStart=/usr/bin/containerd --log-level=debug\n",
    }
    assert dockerd_flags(dropins) == {
        "/etc/systemd/system/docker.service.d/20-mirror.conf": ["--registry-mirror", "-H"],
        "/etc/systemd/system/docker.service.d/40-more.conf": ["--default-runtime", "--log-level"],
    }


@pytest.mark.parametrize(("flag", "key"), [
    ("--add-runtime", "runtimes"), ("--default-runtime", "default-runtime"), ("--registry-mirror", "registry-mirrors"),
    ("--insecure-registry", "insecure-registries"), ("-H", "hosts"), ("--host", "hosts"), ("-s", "storage-driver"),
    ("--storage-driver", "storage-driver"), ("--exec-opt", "exec-opts"), ("--live-restore", "live-restore"),
    ("--log-level", "log-level"),
])
def test_flags_map_to_daemon_json_keys(flag: str, key: str) -> None:
    assert flag_key(flag) == key


def test_dropin_flag_with_a_daemon_json_key_is_an_error() -> None:
    path = "/etc/systemd/system/docker.service.d/10-mirror.conf"
    conflict = facts(dropins={path: ["--registry-mirror"]}, daemon_json_keys=["registry-mirrors", "runtimes"])
    finding = only("host.dropin", conflict)
    assert finding.severity == "error"
    assert finding.message.startswith(f"dockerd refuses to start when a key is set both as a flag ({path}: "
                                      "--registry-mirror) and in daemon.json (deepops #305)")
    assert findings("host.dropin", facts(dropins={path: ["--registry-mirror"]}, daemon_json_keys=["runtimes"])) == []


def test_dropin_flag_for_a_key_sparkfleet_writes_is_an_error() -> None:
    path = "/etc/systemd/system/docker.service.d/10-runtime.conf"
    runtime = facts(dropins={path: ["--default-runtime"]})
    assert findings("host.dropin", runtime) == []  # nvidia_default_runtime is off: daemon.json gets no such key
    assert "sparkfleet writes" in only("host.dropin", runtime, endpoint(nvidia_default_runtime=True)).message
    assert len(findings("host.dropin", facts(dropins={path: ["--add-runtime"]}))) == 1
    assert len(findings("host.dropin", facts(dropins={path: ["--feature"]}), endpoint(nvidia_cdi=True))) == 1


def test_probe_errors_are_warnings() -> None:
    broken = facts(probe_errors={"disk": "PermissionError: [Errno 13]"})
    del broken["disk"]
    assert [(f.rule, f.severity) for f in host_findings(endpoint(), broken)] == [("host.facts", "warning")]


# --- the fact -------------------------------------------------------------------------------------------


def test_fact_sends_the_script_with_its_query() -> None:
    query = json.dumps(preflight_query(endpoint()))
    command = SparkFacts().command(query=query).get_raw_value()
    assert command.startswith("python3 -c '") and command.endswith(" " + shlex.quote(query))
    assert json.loads(query) == {"weights_dir": endpoint().weights_dir, "port": 8000, "unit": "sparkfleet-vllm.service",
                                 "container": "sparkfleet-vllm", "daemon_json": "/etc/docker/daemon.json"}


def test_fact_parses_the_json_and_the_dropins() -> None:
    line = json.dumps({"arch": "arm64", "dropin_texts": {"/etc/x/10-m.conf": MIRROR_DROPIN}})
    parsed = SparkFacts().process([line])
    assert parsed == {"arch": "arm64", "dropins": {"/etc/x/10-m.conf": ["--registry-mirror", "-H"]}}


def _query(weights: Path, port: int, container: str) -> str:
    return json.dumps({"weights_dir": str(weights), "port": port, "unit": "x.service", "container": container,
                       "daemon_json": str(weights / "no-daemon.json")})


def test_fact_script_reads_this_machine(tmp_path: Path) -> None:
    """The script runs for real here: staged bytes, free space, and a listener on a port it must name."""
    weights = tmp_path / "models" / "org--name"
    weights.mkdir(parents=True)
    (weights / "a.safetensors").write_bytes(b"x" * 3000)
    (weights / "link").symlink_to(weights / "a.safetensors")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        out = subprocess.run([sys.executable, "-c", HOST_FACTS_SCRIPT.read_text(), _query(weights, port, "x")],
                             capture_output=True, text=True, check=True).stdout
    result = SparkFacts().process(out.splitlines())
    assert result["probe_errors"] == {}
    assert result["disk"]["staged"] == 3000 and result["disk"]["free"] > 0
    assert Path(result["disk"]["mount"]).is_dir()
    assert result["port_listener"] is not None and result["port_ours"] is not True
    assert result["arch"] in ("amd64", "arm64")
    assert result["mem_total"] >= result["mem_available"] > 0
    missing = subprocess.run([sys.executable, "-c", HOST_FACTS_SCRIPT.read_text(),
                              _query(tmp_path / "no" / "dir", port, "x")], capture_output=True, text=True,
                             check=True).stdout
    disk = json.loads(missing)["disk"]
    assert (disk["path"], disk["staged"]) == (str(tmp_path), 0)


# --- doctor ---------------------------------------------------------------------------------------------


def test_doctor_rows_for_bad_inventory_need_no_endpoint() -> None:
    spark, rows = doctor.recipe_rows("spark-01", {"vllm_recipe": "nope"})
    assert spark is None
    assert [(r.rule, r.status) for r in rows] == [("inventory", "error")]
    assert "is not a shipped recipe" in rows[0].message and not rows[0].message.startswith("spark-01")


def test_doctor_names_a_source_that_cannot_be_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host checks need the generation's directory: without it doctor says why, and checks no host."""
    def unreachable(source: ModelSource, hf_endpoint: str | None = None, hf_token: str | None = None) -> None:
        raise generations.SourceError(f"`model_source` {source}: the Hub at huggingface.co cannot be reached")

    monkeypatch.setattr(generations, "resolve", unreachable)
    spark, rows = doctor.recipe_rows("spark-01", {})
    assert spark is None
    assert [(r.rule, r.status, r.field) for r in rows] == [("source.resolve", "error", "model_source")]
    assert rows[0].message == ("`model_source` hf://nvidia/Qwen3.6-35B-A3B-NVFP4@main: the Hub at huggingface.co "
                               "cannot be reached")


def test_doctor_rows_for_recipe_findings_and_a_clean_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    offline_sources(monkeypatch)
    mirror = {"model_source": "http://mirror.lan/models/qwen3.6-nvfp4"}
    _, rows = doctor.recipe_rows("spark-01", mirror | {"vllm_args": {"tool-call-parser": "qwen"}})
    assert [(r.rule, r.status, r.field) for r in rows] == [("flag.choice", "error", "vllm_args.tool-call-parser")]
    _, clean = doctor.recipe_rows("spark-01", mirror)
    assert [(r.rule, r.status) for r in clean] == [("recipe", "ok")]


def test_doctor_host_rows_show_every_check() -> None:
    rows = doctor.host_rows(endpoint(), facts(gpu={"exit_code": 9, "error": "no driver"}))
    assert [r.rule for r in rows] == list(HOST_CHECKS)
    assert {r.rule: r.status for r in rows}["host.gpu"] == "error"
    assert {r.status for r in rows if r.rule != "host.gpu"} == {"ok"}


def test_doctor_report_render_json_and_exit_code() -> None:
    spark = endpoint()
    good = doctor.HostReport("spark-01", doctor.host_rows(spark, facts()), spark, facts())
    bad = doctor.HostReport("spark-02", [doctor.Row("host.unreachable", "error", "ssh_hostname", "cannot connect")],
                            spark)
    assert (good.status, bad.status) == ("ok", "error")
    assert doctor.exit_code([good]) == 0 and doctor.exit_code([good, bad]) == 1
    console = Console(record=True, width=200)
    doctor.render([good, bad], console, explain_budget=True)
    text = console.export_text()
    assert "spark-01: ok" in text and "spark-02: error" in text and "host.unreachable" in text
    assert "10 KiB/token" in text and "memory budget on MemTotal" in text
    assert text.rstrip().endswith("doctor: 1 of 2 hosts would be refused: spark-02")
    data = json.loads(json.dumps([good.as_dict(True), bad.as_dict(False)]))
    assert data[0]["status"] == "ok" and "kv_cache" in data[0]["budget"] and "budget" not in data[1]
