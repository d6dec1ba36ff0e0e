"""daemon.json merging on hosts that already have a runtime setup: adopt what runs the same binary, leave
default-runtime and CDI alone unless asked, and tell a reload from a restart."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sparkfleet.operations import RUNTIME, restart_keys, same_runtime, wanted_daemon_json
from sparkfleet.preflight import HOST_FACTS_SCRIPT
from tests.lab.standins.nvidia_repo import STANDINS_DIR

RESOLVED = {RUNTIME: "/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime":
            "/usr/bin/nvidia-container-runtime", "/opt/other/runtime": "/opt/other/runtime"}
FOREIGN = {"registry-mirrors": ["http://registry.lab:5000"], "log-level": "warn",
           "runtimes": {"runsc": {"path": "/usr/bin/runsc"}}}


def stock(**extra: object) -> dict:
    """daemon.json as `nvidia-ctk runtime configure` leaves it on a stock Spark."""
    return {**FOREIGN, "runtimes": {**FOREIGN["runtimes"], "nvidia": {"path": RUNTIME, "args": []}}, **extra}


def test_a_stock_configuration_is_adopted_unchanged() -> None:
    current = stock(**{"default-runtime": "nvidia", "features": {"cdi": True}})
    assert wanted_daemon_json(current, RESOLVED, None, None) == current


def test_a_full_path_to_the_same_binary_is_the_same_runtime() -> None:
    current = stock()
    current["runtimes"]["nvidia"] = {"path": "/usr/bin/nvidia-container-runtime"}  # no args key: same as []
    assert same_runtime(current["runtimes"]["nvidia"], RESOLVED)
    assert wanted_daemon_json(current, RESOLVED, None, None) == current


@pytest.mark.parametrize("entry", [{"path": "/opt/other/runtime", "args": []},
                                   {"path": RUNTIME, "args": ["--debug"]}, "nvidia-container-runtime", None])
def test_another_binary_or_args_is_replaced_by_nvidias_entry(entry: object) -> None:
    current = stock()
    current["runtimes"]["nvidia"] = entry
    wanted = wanted_daemon_json(current, RESOLVED, None, None)
    assert wanted["runtimes"] == {"runsc": {"path": "/usr/bin/runsc"}, "nvidia": {"path": RUNTIME, "args": []}}
    assert {k: v for k, v in wanted.items() if k != "runtimes"} == {k: v for k, v in FOREIGN.items() if k != "runtimes"}


def test_a_missing_runtime_is_added_and_foreign_keys_survive() -> None:
    wanted = wanted_daemon_json(dict(FOREIGN), RESOLVED, None, None)
    assert wanted == stock()
    assert restart_keys(FOREIGN, wanted) == []  # runtimes reload on SIGHUP


@pytest.mark.parametrize(("host_has", "asked", "expected"), [
    ("nvidia", None, "nvidia"), (None, None, None), ("runc", None, "runc"),
    ("nvidia", False, None), ("runc", False, "runc"), (None, True, "nvidia"), ("runc", True, "nvidia"),
])
def test_default_runtime_is_left_alone_unless_the_inventory_manages_it(host_has: str | None, asked: bool | None,
                                                                      expected: str | None) -> None:
    current = stock(**({"default-runtime": host_has} if host_has else {}))
    wanted = wanted_daemon_json(current, RESOLVED, None, asked)
    assert wanted.get("default-runtime") == expected
    assert restart_keys(current, wanted) == []  # default-runtime reloads on SIGHUP


@pytest.mark.parametrize(("host_has", "asked", "expected"), [
    ({"cdi": True}, None, {"cdi": True}), (None, None, None), ({"cdi": True}, False, {"cdi": False}),
    (None, False, {"cdi": False}), ({"buildkit": True}, True, {"buildkit": True, "cdi": True}),
])
def test_cdi_off_is_explicit_and_needs_a_restart(host_has: dict | None, asked: bool | None,
                                                 expected: dict | None) -> None:
    current = stock(**({"features": host_has} if host_has else {}))
    wanted = wanted_daemon_json(current, RESOLVED, asked, None)
    assert wanted.get("features") == expected
    assert restart_keys(current, wanted) == (["features"] if expected != host_has else [])


def test_nvidia_ctk_output_is_what_the_merge_adopts(tmp_path: Path) -> None:
    """What the (stand-in) `nvidia-ctk runtime configure --set-as-default` writes needs no change from us."""
    config = tmp_path / "daemon.json"
    config.write_text(json.dumps(FOREIGN))
    result = subprocess.run([str(STANDINS_DIR / "nvidia-ctk"), "runtime", "configure", "--runtime=docker",
                             "--config", str(config), "--set-as-default"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    current = json.loads(config.read_text())
    assert wanted_daemon_json(current, RESOLVED, None, None) == current
    assert wanted_daemon_json(current, RESOLVED, None, True) == current


def _fact(path: Path, runtime: str = RUNTIME) -> dict:
    """daemon.json as the host-side script reads it (run for real here, as on a host)."""
    script = HOST_FACTS_SCRIPT.read_text() + "\nprint(json.dumps(daemon_json(sys.argv[1], sys.argv[2])))\n"
    out = subprocess.run(["python3", "-c", script.replace('if __name__ == "__main__":', "if False:"), str(path),
                          runtime], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_fact_resolves_runtime_paths_through_symlinks(tmp_path: Path) -> None:
    binary = tmp_path / "bin" / "runtime-1.19"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "runtime").symlink_to(binary)
    daemon = tmp_path / "daemon.json"
    daemon.write_text(json.dumps({"runtimes": {"nvidia": {"path": str(tmp_path / "bin" / "runtime")}}}))
    fact = _fact(daemon, str(binary))
    assert fact["error"] is None and fact["config"]["runtimes"]["nvidia"]["path"].endswith("/bin/runtime")
    assert fact["resolved"] == {str(binary): str(binary), str(tmp_path / "bin" / "runtime"): str(binary)}
    assert same_runtime(fact["config"]["runtimes"]["nvidia"], {**fact["resolved"], RUNTIME: str(binary)})


@pytest.mark.parametrize(("text", "config", "error"), [
    (None, None, None), ("", None, None), ("{", None, "Expecting"), ("[1]", None, "not a JSON object"),
])
def test_fact_reports_missing_and_broken_files(tmp_path: Path, text: str | None, config: object,
                                               error: str | None) -> None:
    daemon = tmp_path / "daemon.json"
    if text is not None:
        daemon.write_text(text)
    fact = _fact(daemon)
    assert fact["config"] == config
    assert (fact["error"] is None) if error is None else (error in fact["error"])
