"""sparkfleet's pyinfra facts, as pyinfra's tests/test_facts.py tests its own: the command a fact sends (quoted
as the shell will split it) and what it makes of real output, including output that is not what it expects."""

from __future__ import annotations

import json
import shlex

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkfleet import status
from sparkfleet.facts import AptVersions
from sparkfleet.preflight import HOST_FACTS_SCRIPT, SparkFacts

HOSTILE = "it's $(reboot) `id`\n; rm -rf / #"  # every character a shell treats specially

# `apt-cache madison nvidia-container-toolkit` on a flat repository laid out like NVIDIA's (`deb [...]
# .../stable/deb/$(ARCH) /`, here served from file:), as apt 2.6 prints it: newest first.
MADISON_FLAT = """\
nvidia-container-toolkit |   1.19.0-1 | file:/tmp/flatrepo/repo/amd64  Packages
nvidia-container-toolkit |   1.18.2-1 | file:/tmp/flatrepo/repo/amd64  Packages
nvidia-container-toolkit |   1.17.8-1 | file:/tmp/flatrepo/repo/amd64  Packages
"""
# `apt-cache madison openssl` on Debian 12 with its security and updates suites: padded names, several suites.
MADISON_SUITES = """\
   openssl | 3.0.22-1~deb12u2 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
   openssl | 3.0.20-1~deb12u2 | http://deb.debian.org/debian bookworm/main amd64 Packages
   openssl | 3.0.17-1~deb12u2 | http://deb.debian.org/debian bookworm-updates/main amd64 Packages
"""


# --- SparkFacts: the one host-side script that answers the preflight and every operation -----------------


def test_spark_facts_sends_the_script_and_its_query_as_two_shell_words() -> None:
    query = json.dumps({"weights_dir": "/srv/models/" + HOSTILE, "port": 8000})
    command = SparkFacts().command(query=query).get_raw_value()
    assert shlex.split(command) == ["python3", "-c", HOST_FACTS_SCRIPT.read_text(), query]


@pytest.mark.parametrize(("output", "facts"), [
    # the drop-ins' texts become the dockerd flags each sets, as systemd applies them
    ([json.dumps({"arch": "arm64", "dropin_texts": {
        "/etc/systemd/system/docker.service.d/10-mirror.conf":
            "[Service]\nExecStart=\nExecStart=/usr/bin/dockerd -H fd:// --registry-mirror=http://m.lan\n"}})],
     {"arch": "arm64",
      "dropins": {"/etc/systemd/system/docker.service.d/10-mirror.conf": ["-H", "--registry-mirror"]}}),
    ([json.dumps({"arch": "arm64", "dropin_texts": {"/etc/x.conf": "[Service]\nLimitNOFILE=1048576\n"}})],
     {"arch": "arm64", "dropins": {}}),
    # the script could not list them (a probe error): no drop-ins, and the error stays where the preflight reads it
    ([json.dumps({"arch": "arm64", "probe_errors": {"dropin_texts": "PermissionError: [Errno 13]"}})],
     {"arch": "arm64", "probe_errors": {"dropin_texts": "PermissionError: [Errno 13]"}, "dropins": {}}),
    # pretty-printed over several lines is still one object
    (['{"arch": "arm64",', ' "state": {"image_id": null}}'],
     {"arch": "arm64", "state": {"image_id": None}, "dropins": {}}),
])
def test_spark_facts_reads_one_json_object(output: list[str], facts: dict) -> None:
    assert SparkFacts().process(output) == facts


@pytest.mark.parametrize(("output", "printed"), [
    (["Welcome to DGX OS!", '{"arch": "arm64"}'], "Welcome to DGX OS!"),  # a login banner on a non-interactive shell
    (['["arm64"]'], '["arm64"]'),  # JSON, but not one object
    (['{"arch": "arm'], '{"arch": "arm'),  # cut short
    ([], "nothing"),
    (["", "   "], "nothing"),
])
def test_spark_facts_that_are_not_one_json_object_are_the_hosts_problem(output: list[str], printed: str) -> None:
    """FactProcessError is what pyinfra reports as the host's error (anything else is a traceback)."""
    with pytest.raises(FactProcessError) as error:
        SparkFacts().process(output)
    assert str(error.value) == (
        f"the host preflight (sparkfleet/remote/host_facts.py) printed {printed!r} where one JSON object was "
        "expected: check that `python3 --version` works on the host and that nothing else prints on its "
        "non-interactive shell (an echo in ~/.bashrc); nothing was changed on it")
    assert error.value.__cause__ is None  # pyinfra would print the JSONDecodeError instead of the message


# --- AptVersions: which toolkit versions apt could install ------------------------------------------------


@pytest.mark.parametrize(("package", "command"), [
    ("nvidia-container-toolkit", "apt-cache madison nvidia-container-toolkit 2>/dev/null || true"),
    (HOSTILE, f"apt-cache madison {shlex.quote(HOSTILE)} 2>/dev/null || true"),
])
def test_apt_versions_command(package: str, command: str) -> None:
    assert AptVersions().command(package=package).get_raw_value() == command


@pytest.mark.parametrize(("output", "versions"), [
    (MADISON_FLAT, ["1.19.0-1", "1.18.2-1", "1.17.8-1"]),
    (MADISON_SUITES, ["3.0.22-1~deb12u2", "3.0.20-1~deb12u2", "3.0.17-1~deb12u2"]),
    ("", []),  # a package apt has never heard of: no output, exit 0
])
def test_apt_versions_reads_madison(output: str, versions: list[str]) -> None:
    assert AptVersions().process(output.splitlines()) == versions


def test_apt_versions_default_is_none_installable() -> None:
    assert AptVersions().default() == []


# --- EndpointStatus: the status reporter's report, for `sparkfleet status` and `drift` ---------------------


def test_endpoint_status_command_runs_the_installed_reporter_or_says_it_is_missing() -> None:
    """The controller passes the reporter every path it reads (status.LAYOUT): none is copied into the script."""
    assert status.EndpointStatus().command(args="--image vllm/vllm-openai:v0.28.0") == (
        "if [ -f /usr/local/lib/sparkfleet/status.py ]; then python3 /usr/local/lib/sparkfleet/status.py "
        "--unit sparkfleet-vllm.service --container sparkfleet-vllm --unit-file "
        "/etc/systemd/system/sparkfleet-vllm.service --env-file /etc/sparkfleet/vllm.env --daemon-json "
        "/etc/docker/daemon.json --health-config /etc/sparkfleet/health.json --loaded-weights "
        "/run/sparkfleet/loaded-weights.json --image vllm/vllm-openai:v0.28.0; else echo 'SPARKFLEET-STATUS "
        "{\"installed\": false}'; fi")


@pytest.mark.parametrize(("output", "report"), [
    (["Welcome to DGX OS", 'SPARKFLEET-STATUS {"state": "active", "restarts": 0}'], {"state": "active", "restarts": 0}),
    (['SPARKFLEET-STATUS {"installed": false}'], status.NOT_INSTALLED),
    (['SPARKFLEET-STATUS {"state": "failed"}', 'SPARKFLEET-STATUS {"state": "active"}'], {"state": "active"}),
    (["Traceback (most recent call last):", "  ...", "ValueError: boom"], None),
    (["SPARKFLEET-STATUS {broken"], None),
    (['SPARKFLEET-STATUS ["active"]'], None),
    ([], None),
])
def test_endpoint_status_reads_the_marked_line(output: list[str], report: dict | None) -> None:
    assert status.EndpointStatus().process(output) == report
