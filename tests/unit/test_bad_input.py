"""Bad input, round two: each case ends in one message naming host, variable or argument and the fix, with no
traceback and before anything could change a host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkfleet import cli, operations, rollout, runner, secrets
from sparkfleet.config import InventoryError, ModelSource, SparkConfig
from sparkfleet.fleet import FleetError, load_fleet
from sparkfleet.host_state import HostState
from sparkfleet.preflight import SparkFacts

REPO = Path(__file__).resolve().parents[2]
MIRROR = "http://mirror.lan/models/qwen"
SOURCE = ModelSource.parse(MIRROR)
GOOD = {"model_source": MIRROR, "ssh_user": "admin"}


def _fleet_error(**data: object) -> str:
    with pytest.raises(FleetError) as error:
        load_fleet({"spark-07": GOOD | data})
    message = str(error.value)
    assert message.startswith("bad inventory, nothing was changed on any host:")
    return message


# --- the CLI: one paragraph, exit 1, no traceback ---------------------------------------------------------


def _sparkfleet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command in its own process (pyinfra_cli monkey-patches the interpreter with gevent)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "sparkfleet", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    """Two hosts nobody can reach: any SSH attempt would show up as a connection error, and none may happen."""
    path = tmp_path / "fleet.py"
    path.write_text('sparks = [("spark-a.invalid", {"model_source": "http://mirror.lan/m"}),\n'
                    '          ("spark-b.invalid", {"model_source": "http://mirror.lan/m"})]\n')
    return path


@pytest.mark.parametrize("command", ["doctor", "status", "drift", "rollout", "bench"])
def test_a_limit_that_matches_nothing_is_one_message(tmp_path: Path, inventory: Path, command: str) -> None:
    result = _sparkfleet(tmp_path, command, inventory.name, "--limit", "spark-z*")
    assert result.returncode == 1
    assert result.stderr == (
        f"sparkfleet {command}: --limit spark-z* matches no host in fleet.py (hosts: spark-a.invalid, "
        "spark-b.invalid; groups: fleet, sparks): give a host name, group or glob from it; nothing was changed on "
        "any host\n")
    assert result.stdout == ""


def test_an_inventory_without_hosts_is_one_message(tmp_path: Path) -> None:
    (tmp_path / "empty.py").write_text("sparks = []\n")
    result = _sparkfleet(tmp_path, "status", "empty.py")
    assert result.returncode == 1
    assert result.stderr.startswith("sparkfleet status: empty.py defines no hosts:")
    assert "Traceback" not in result.stderr


def test_a_broken_inventory_file_is_one_message(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("sparks = [\n")
    result = _sparkfleet(tmp_path, "doctor", "broken.py")
    assert result.returncode == 1
    assert result.stderr.startswith("sparkfleet doctor: broken.py is not a usable pyinfra inventory (SyntaxError: ")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("option", "value"), [("--canary", "0"), ("--batch", "-2"), ("--canary", "two")])
def test_rollout_refuses_an_empty_batch_before_reading_anything(
        capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["rollout", "missing-inventory.py", option, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"sparkfleet rollout: error: argument {option}: " in err
    assert "give 1 or more" in err and "Traceback" not in err


def test_rollout_plan_names_the_option() -> None:
    with pytest.raises(ValueError, match=r"^--canary 0: a batch needs at least 1 host; give --canary 1 or more$"):
        rollout.plan_batches(["a", "b"], 0, 1)
    with pytest.raises(ValueError, match=r"^--batch 0: "):
        rollout.plan_batches(["a", "b"], 1, 0)


def test_no_target_message_lists_what_exists() -> None:
    hosts = [f"spark-{n:02d}" for n in range(12)]
    message = runner.no_target("inv.py", ["x", "y*"], hosts, ["sparks"])
    assert message == ("--limit x,y* matches no host in inv.py (hosts: spark-00, spark-01, spark-02, spark-03, "
                       "spark-04, spark-05, spark-06, spark-07 and 4 more; groups: sparks): give a host name, group "
                       "or glob from it; nothing was changed on any host")


@pytest.mark.parametrize(("error", "expected"), [
    (InventoryError("spark-01: `vllm_port` = 0: give 1-65535."), "sparkfleet doctor: spark-01: `vllm_port` = 0: "
                                                                 "give 1-65535.\n"),
    (FleetError("bad inventory, nothing was changed on any host:\n  a: x"),
     "sparkfleet doctor: bad inventory, nothing was changed on any host:\n  a: x\n"),
    (secrets.SecretError("refers to /k, which cannot be read"), "sparkfleet doctor: refers to /k, which cannot be "
                                                                "read\n"),
    (runner.TargetError("--limit x matches no host"), "sparkfleet doctor: --limit x matches no host\n"),
    (PermissionError(13, "Permission denied", "/home/op/.cache/sparkfleet/sums/x.json"),
     "sparkfleet doctor: /home/op/.cache/sparkfleet/sums/x.json: Permission denied on this controller: check the "
     "path and its permissions; nothing was changed on any host\n"),
])
def test_the_cli_prints_expected_errors_as_one_paragraph(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: Exception, expected: str) -> None:
    def fail(args: object) -> int:
        raise error

    monkeypatch.setattr(cli, "_doctor", fail)
    assert cli.main(["doctor", "inventory.py"]) == 1
    captured = capsys.readouterr()
    assert captured.err == expected and captured.out == ""


def test_the_cli_keeps_tracebacks_for_bugs(monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(args: object) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(cli, "_status", bug)
    with pytest.raises(KeyError):
        cli.main(["status", "inventory.py"])


# --- facts whose output is not JSON ---------------------------------------------------------------------


def test_spark_facts_that_are_not_json_are_a_fact_error() -> None:
    with pytest.raises(FactProcessError) as error:
        SparkFacts().process(["Welcome to DGX OS!", '{"arch": "arm64"}'])
    assert str(error.value).startswith("the host preflight (sparkfleet/remote/host_facts.py) printed 'Welcome to "
                                       "DGX OS!' where one JSON object was expected: check that `python3 --version` "
                                       "works on the host")
    assert error.value.__cause__ is None
    assert SparkFacts().process(['{"arch": "arm64", "dropin_texts": {}}']) == {"arch": "arm64", "dropins": {}}


def test_a_weights_check_without_a_verdict_stops_the_step_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    verdict = {"state": "error", "error": "it printed 'Traceback', not one JSON object"}
    state = HostState({"state": {"weights": verdict}})
    monkeypatch.setattr(operations, "current", lambda: state)
    (command,) = operations.weights_staged._inner(script="/s.py", dest="/var/lib/m", sums_file="/m.SHA256SUMS",
                                                  verify="fast", fetch=operations.Fetch(SOURCE))
    assert str(command).startswith("echo 'the weights check in /var/lib/m gave no verdict (it printed '")
    assert "python3 /s.py check --help" in str(command) and str(command).endswith("nothing was staged' >&2; exit 1")


# --- secrets -------------------------------------------------------------------------------------------


def test_a_secret_file_that_is_not_text_names_host_field_and_fix(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"\xff\xfe\x00sk-\x9c")
    message = _fleet_error(vllm_api_key=f"file:{key}")
    assert (f"spark-07: `vllm_api_key` refers to {key}, which is not UTF-8 text (a binary file, or another "
            "encoding): store the bare value as text, e.g. `printf %s VALUE > FILE`.") in message
    assert "\\x9c" not in message and "0xff" not in message  # never a byte of the secret


def test_a_secret_path_that_is_a_directory_is_a_message(tmp_path: Path) -> None:
    assert f"refers to {tmp_path}, which cannot be read (Is a directory)" in _fleet_error(
        hf_token=f"file:{tmp_path}")


# --- a controller model_source --------------------------------------------------------------------------


def test_a_missing_controller_directory_is_found_by_validation(tmp_path: Path) -> None:
    """Found with the rest of the inventory, before step 1 (the weights step comes after steps 1-2)."""
    missing = tmp_path / "qwen"
    message = _fleet_error(model_source=str(missing))
    assert (f"spark-07: `model_source`: {missing} does not exist on this controller (the machine running "
            "sparkfleet): copy the checkpoint there, or point model_source at the directory that holds it "
            "[source.missing]") in message


def test_an_empty_or_wrong_controller_source_is_refused(tmp_path: Path) -> None:
    assert f"{tmp_path} holds no files to stage" in _fleet_error(model_source=str(tmp_path))
    (tmp_path / ".hidden").write_text("x")
    (tmp_path / "SHA256SUMS").write_text("x")
    assert f"{tmp_path} holds no files to stage" in _fleet_error(model_source=str(tmp_path))
    file = tmp_path / "config.json"
    file.write_text("{}")
    assert f"{file} is not a directory on this controller" in _fleet_error(model_source=str(file))
    endpoints, _ = load_fleet({"spark-07": GOOD | {"model_source": str(tmp_path)}})
    assert endpoints["spark-07"].source == ModelSource("controller", path=str(tmp_path))


def test_an_unreadable_controller_source_is_a_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as a user without read access sees it
    assert (f"`model_source`: {tmp_path} cannot be read on this controller (Permission denied): fix its "
            "permissions for the user running sparkfleet [source.missing]") in _fleet_error(model_source=str(tmp_path))


# --- URLs and the shell -----------------------------------------------------------------------------------


def test_url_variables_keep_their_defaults_examples_and_arch() -> None:
    config = SparkConfig(nvidia_repo_url="http://apt-mirror.lan/libnvidia-container/stable/deb/$(ARCH)",
                         nvidia_key_url="https://apt-mirror.lan:8443/libnvidia-container/gpgkey?v=1")
    assert config.nvidia_repo_url == "http://apt-mirror.lan/libnvidia-container/stable/deb/$(ARCH)"
    assert type(config.nvidia_repo_url) is str and type(config.nvidia_key_url) is str
    defaults = SparkConfig.model_validate({name: SparkConfig.model_fields[name].default
                                           for name in ("nvidia_repo_url", "nvidia_key_url")})
    assert defaults.nvidia_repo_url.endswith("/deb/$(ARCH)")


@pytest.mark.parametrize(("field", "url", "expected"), [
    ("nvidia_key_url", "ftp://mirror.lan/gpgkey", "not an http(s) URL with a host; give e.g. https://mirror.lan/path"),
    ("nvidia_key_url", "file:///etc/passwd", "not an http(s) URL with a host"),
    ("nvidia_repo_url", "https:///deb", "not an http(s) URL with a host"),
    ("nvidia_key_url", "https://x.lan/k$(touch /tmp/pwned)", "' ' cannot stand in a URL as written; percent-encode it"),
    ("nvidia_key_url", "https://x.lan/k;reboot", None),  # `;` is a URL character: quoted where it meets a shell
    ("nvidia_key_url", "https://x.lan/`id`", "'`' cannot stand in a URL as written"),
    ("nvidia_repo_url", "https://x.lan/a'b", "\"'\" cannot stand in a URL as written"),
    ("nvidia_repo_url", "https://x.lan/deb/$(id)", "a `$(...)` variable here is never expanded: only $(ARCH) is "
                                                   "expanded (by apt)"),
    ("nvidia_key_url", "https://x.lan/$(ARCH)/gpgkey", "a `$(...)` variable here is never expanded: it is fetched "
                                                       "as written (no $(ARCH) here)"),
])
def test_url_variables_are_urls(field: str, url: str, expected: str | None) -> None:
    if expected is None:
        load_fleet({"spark-07": GOOD | {field: url}})
        return
    assert f"spark-07: `{field}` = {url!r}: {expected}" in _fleet_error(**{field: url})


def test_other_config_fields_are_untouched_by_url_typing() -> None:
    assert SparkConfig.model_fields["health_webhook_url"].annotation == SparkConfig.model_fields[
        "vllm_api_key"].annotation


def _fake_tools(bin_dir: Path, fingerprint: str) -> None:
    """curl writes a key, gpg reports `fingerprint` for it: enough to reach the refusal branch."""
    bin_dir.mkdir()
    tools = {
        "curl": 'while [ "$#" -gt 0 ]; do if [ "$1" = -o ]; then echo KEY > "$2"; shift; fi; shift; done',
        "gpg": f'echo "pub:u:4096:1:X:1:::-:::scESC::::::23::0:"; echo "fpr:::::::::{fingerprint}:"',
    }
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)


def test_the_keyring_command_quotes_every_value_even_in_its_message(tmp_path: Path) -> None:
    """Inventory values reach a root shell: a URL with shell syntax must stay a string, in the message too."""
    hostile = "https://x.lan/k$(touch M1)`touch M2`\"; touch M3; echo \"'; touch M4; '"
    _fake_tools(tmp_path / "bin", "AAAA")
    command = operations.keyring_command(hostile, "C95B321B61E88C1809C4F759DDCAE044F796ECB0", str(tmp_path / "ring"))
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    result = subprocess.run(["sh", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == (f"the key at {hostile} has fingerprint AAAA, not C95B321B61E88C1809C4F759DDCAE044F796ECB0"
                             ": refusing it (a rotated key needs a new nvidia_key_fingerprint)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]  # no M1..M4, no keyring
