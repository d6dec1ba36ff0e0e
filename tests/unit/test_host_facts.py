"""The host-side probes (sparkfleet/remote/host_facts.py) the deploy's operations compare against: each fed the
output its command really prints (through a fake `run`), or real files in a temporary directory."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest

from sparkfleet import doctor
from sparkfleet.config import SparkConfig
from sparkfleet.deploys.context import TEMPLATES
from sparkfleet.deploys.state import state_query
from sparkfleet.endpoint import resolve
from sparkfleet.host_state import HostState
from sparkfleet.preflight import preflight_query
from sparkfleet.remote import host_facts
from sparkfleet.unit import UnitView
from tests.unit.resolved import resolved

Result = tuple[int | None, str, str] | None

# `systemctl show -p Id,ActiveState,UnitFileState sparkfleet-vllm.service sparkfleet-health.timer` on a host where
# the endpoint runs and the health timer is not installed yet: one block per unit, in the order asked, each in
# systemd's property order (not -p's); a unit systemd does not know is inactive with no unit file state (exit 0).
SYSTEMCTL_SHOW = """\
Id=sparkfleet-vllm.service
ActiveState=active
UnitFileState=enabled

Id=sparkfleet-health.timer
ActiveState=inactive
UnitFileState=
"""

# `gpg --show-keys --with-colons` on a keyring holding Debian 12's archive and security keys (captured on Debian
# 12, gpg 2.2.40): each primary key is followed by revoker (rvk) lines, its fingerprint, a uid and a signing
# subkey with its own fingerprint. NVIDIA's key has the same shape (a primary key and a subkey).
GPG_COLONS = """\
pub:-:4096:1:B7C5D7D6350947F8:1674301461:1926589461::-:::scSC::::::23::0:
rvk:::1::::::80E976F14A508A48E9CA3FE9BC372252CA1CF964:80:
rvk:::1::::::FBFABDB541B5DC955BD9BA6EDB16CF5BB12525C4:80:
rvk:::1::::::8C823DED10AA8041639E12105ACE8D6E0C14A470:80:
rvk:::1::::::309911BEA966D0613053045711B4E5FF15B0FD82:80:
rvk:::1::::::C74F6AC9E933B3067F52F33FA459EC6715B0705F:80:
fpr:::::::::B8B80B5B623EAB6AD8775C45B7C5D7D6350947F8:
uid:-::::1674301461::100567F0EA7B90BC2ED03949BE60B7A6CFD8619F::Debian Archive Automatic Signing Key (12/bookworm) <ftpmaster@debian.org>::::::::::0:
sub:-:4096:1:6ED0E7B82643E131:1674301461:1926589461:::::s::::::23:
fpr:::::::::4CB50190207B4758A3F73A796ED0E7B82643E131:
pub:-:4096:1:254CF3B5AEC0A8F0:1674301533:1926589533::-:::scSC::::::23::0:
rvk:::1::::::80E976F14A508A48E9CA3FE9BC372252CA1CF964:80:
rvk:::1::::::FBFABDB541B5DC955BD9BA6EDB16CF5BB12525C4:80:
rvk:::1::::::8C823DED10AA8041639E12105ACE8D6E0C14A470:80:
rvk:::1::::::309911BEA966D0613053045711B4E5FF15B0FD82:80:
rvk:::1::::::C74F6AC9E933B3067F52F33FA459EC6715B0705F:80:
fpr:::::::::05AB90340C0C5E797F44A8C8254CF3B5AEC0A8F0:
uid:-::::1674301533::EDCF55C841BFBBB870C829A270ED9B746FE39969::Debian Security Archive Automatic Signing Key (12/bookworm) <ftpmaster@debian.org>::::::::::0:
sub:-:4096:1:BDE6D2B9216EC7A8:1674301533:1926589533:::::s::::::23:
fpr:::::::::B0CAB9266E8C3929798B3EEEBDE6D2B9216EC7A8:
"""  # noqa: E501 (gpg's lines, as printed)

# `dpkg-query -W -f='${Package} ${db:Status-Abbrev} ${Version}\n' PACKAGES...`: db:Status-Abbrev is three
# characters (desired, status, error), so `ii ` leaves two spaces; packages come in dpkg's order, and one it has
# never heard of goes to stderr with exit code 1.
DPKG_QUERY = """\
libnvidia-container-tools hi  1.19.0-1
libnvidia-container1 hi  1.19.0-1
nvidia-container-toolkit ii  1.19.0-1
nvidia-container-toolkit-base rc  1.17.8-1
"""


def fake_run(monkeypatch: pytest.MonkeyPatch, answer: Callable[[tuple[str, ...]], Result]) -> list[dict[str, Any]]:
    """Replace the script's command runner; returns the calls it received (argv and keywords)."""
    calls: list[dict[str, Any]] = []

    def run(*argv: str, **keywords: Any) -> Result:
        calls.append({"argv": argv, **keywords})
        return answer(argv)

    monkeypatch.setattr(host_facts, "run", run)
    return calls


# --- files ---------------------------------------------------------------------------------------------


def test_file_state_of_a_file_a_directory_a_link_and_nothing(tmp_path: Path) -> None:
    me, group = pwd.getpwuid(os.getuid()).pw_name, host_facts.grp.getgrgid(os.getgid()).gr_name
    secret = tmp_path / "vllm.env"
    secret.write_text("VLLM_API_KEY=s3cret\n")
    secret.chmod(0o600)
    (tmp_path / "uploads").mkdir(mode=0o700)
    (tmp_path / "uploads").chmod(0o700)
    (tmp_path / "link").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo")
    assert host_facts.file_state(str(secret)) == {
        "type": "file", "mode": "600", "user": me, "group": group,
        "sha1": hashlib.sha1(b"VLLM_API_KEY=s3cret\n").hexdigest()}
    assert host_facts.file_state(str(tmp_path / "uploads")) == {
        "type": "directory", "mode": "700", "user": me, "group": group}
    assert host_facts.file_state(str(tmp_path / "link"))["type"] == "link"  # not followed
    assert host_facts.file_state(str(tmp_path / "fifo"))["type"] == "other"
    assert host_facts.file_state(str(tmp_path / "missing")) is None


def test_file_state_names_an_owner_without_a_name_by_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file unpacked from an archive keeps a uid no account has: reported, not a failed probe."""
    def no_such_user(uid: int) -> Any:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(host_facts.pwd, "getpwuid", no_such_user)
    (tmp_path / "f").write_text("")
    assert host_facts.file_state(str(tmp_path / "f"))["user"] == str(os.getuid())


# --- units, keyring, apt, packages -----------------------------------------------------------------------


def test_unit_files_reads_both_units_from_one_systemctl_show(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_run(monkeypatch, lambda argv: (0, SYSTEMCTL_SHOW, ""))
    assert host_facts.unit_files(["sparkfleet-vllm.service", "sparkfleet-health.timer"]) == {
        "sparkfleet-vllm.service": {"active": "active", "enabled": "enabled"},
        "sparkfleet-health.timer": {"active": "inactive", "enabled": ""},
    }
    assert [call["argv"] for call in calls] == [("systemctl", "show", "-p", "Id,ActiveState,UnitFileState",
                                                 "sparkfleet-vllm.service", "sparkfleet-health.timer")]


@pytest.mark.parametrize("result", [None, (1, "", "Failed to connect to bus: No such file or directory")])
def test_unit_files_without_an_answer_are_empty_strings(monkeypatch: pytest.MonkeyPatch, result: Result) -> None:
    fake_run(monkeypatch, lambda argv: result)
    assert host_facts.unit_files(["a.service", "b.timer"]) == {"a.service": {"active": "", "enabled": ""},
                                                                "b.timer": {"active": "", "enabled": ""}}


def test_keyring_fingerprints_are_the_primary_keys_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a revoker's fingerprint, not a subkey's: those are not what nvidia_key_fingerprint names."""
    keyring = tmp_path / "keyring.gpg"
    keyring.write_bytes(b"\x99\x02\x0d")
    calls = fake_run(monkeypatch, lambda argv: (0, GPG_COLONS, ""))
    assert host_facts.keyring_fingerprints(str(keyring)) == ["B8B80B5B623EAB6AD8775C45B7C5D7D6350947F8",
                                                             "05AB90340C0C5E797F44A8C8254CF3B5AEC0A8F0"]
    assert calls[0]["argv"] == ("gpg", "--show-keys", "--with-colons", str(keyring))


def test_keyring_fingerprints_of_a_missing_or_unreadable_keyring(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_run(monkeypatch, lambda argv: (2, "", "gpg: no valid OpenPGP data found."))
    assert host_facts.keyring_fingerprints(str(tmp_path / "missing.gpg")) == []
    assert calls == []  # gpg is not asked about a file that is not there
    (tmp_path / "garbage.gpg").write_text("not a key")
    assert host_facts.keyring_fingerprints(str(tmp_path / "garbage.gpg")) == []


def test_apt_sources_are_the_files_naming_the_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One-line and deb822 files, with their lines; files about other repositories, backups and files that name it
    only in a comment (a release upgrade's disabled source) are left out."""
    etc = tmp_path / "etc" / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    url = "https://nvidia.github.io/libnvidia-container/stable/deb"
    ours = f"deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] {url}/$(ARCH) /"
    (etc / "sources.list").write_text("deb http://ports.ubuntu.com/ubuntu-ports noble main\n")
    (etc / "sources.list.d" / "nvidia-container-toolkit.list").write_text(f"{ours}\n#deb-src {url}/$(ARCH) /\n")
    (etc / "sources.list.d" / "cuda.sources").write_text(f"Types: deb\nURIs: {url}/$(ARCH)\nSuites: /\n")
    (etc / "sources.list.d" / "ubuntu.sources").write_text("Types: deb\nURIs: http://ports.ubuntu.com/\n")
    (etc / "sources.list.d" / "nvidia-container-toolkit.list.save").write_text(f"{ours}\n")
    (etc / "sources.list.d" / "nvidia-old.list").write_text(f"# {ours} # disabled on upgrade to noble\n")
    real = Path
    monkeypatch.setattr(host_facts, "Path", lambda path: real(f"{tmp_path}{path}") if str(path).startswith("/etc/apt")
                        else real(path))
    found = {path.removeprefix(str(tmp_path)): lines for path, lines in host_facts.apt_sources(url).items()}
    assert found == {
        "/etc/apt/sources.list.d/nvidia-container-toolkit.list": [ours, f"#deb-src {url}/$(ARCH) /"],
        "/etc/apt/sources.list.d/cuda.sources": ["Types: deb", f"URIs: {url}/$(ARCH)", "Suites: /"],
    }


def test_installed_versions_count_held_packages_and_not_removed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """`apt-mark hold` makes `hi`: still installed (pyinfra's own deb fact agrees); `rc` left only its config."""
    packages = ["nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                "libnvidia-container1"]
    calls = fake_run(monkeypatch, lambda argv: (0, DPKG_QUERY, ""))
    assert host_facts.installed_versions(packages) == {
        "libnvidia-container-tools": "1.19.0-1", "libnvidia-container1": "1.19.0-1",
        "nvidia-container-toolkit": "1.19.0-1"}
    assert calls[0]["argv"] == ("dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev} ${Version}\n", *packages)


@pytest.mark.parametrize("result", [None, (1, "", "dpkg-query: no packages found matching nvidia-container-toolkit")])
def test_installed_versions_on_a_host_without_them(monkeypatch: pytest.MonkeyPatch, result: Result) -> None:
    fake_run(monkeypatch, lambda argv: result)
    assert host_facts.installed_versions(["nvidia-container-toolkit"]) == {}


# --- runtime, image ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "mode"), [
    (None, ""),
    ('#accept-nvidia-visible-devices-as-volume-mounts = false\n[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig"\n',
     ""),
    ('[nvidia-container-runtime]\nlog-level = "info"\nmode = "legacy"\n', "legacy"),
])
def test_runtime_mode_from_config_toml(tmp_path: Path, text: str | None, mode: str) -> None:
    config = tmp_path / "config.toml"
    if text is not None:
        config.write_text(text)
    assert host_facts.runtime_mode(str(config)) == mode


@pytest.mark.parametrize(("result", "image_id"), [
    ((0, "sha256:3b2f8e5c\n", ""), "sha256:3b2f8e5c"),
    ((1, "", "Error: No such image: vllm/vllm-openai:v0.28.0"), None),
    (None, None),
])
def test_image_id(monkeypatch: pytest.MonkeyPatch, result: Result, image_id: str | None) -> None:
    calls = fake_run(monkeypatch, lambda argv: result)
    assert host_facts.image_id("vllm/vllm-openai:v0.28.0") == image_id
    assert calls[0]["argv"] == ("docker", "image", "inspect", "-f", "{{.Id}}", "vllm/vllm-openai:v0.28.0")


def test_running_containers(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_run(monkeypatch, lambda argv: (0, "sparkfleet-vllm\nowners-jupyter\n\n", ""))
    assert host_facts.running_containers() == ["owners-jupyter", "sparkfleet-vllm"]
    fake_run(monkeypatch, lambda argv: (1, "", "Cannot connect to the Docker daemon"))
    assert host_facts.running_containers() == []


# --- weights ------------------------------------------------------------------------------------------------


@pytest.fixture
def python3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python3` on PATH is this interpreter (a version manager's shim would cost a second per test)."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")


def _script(tmp_path: Path, body: str) -> str:
    script = tmp_path / "stage_weights.py"
    script.write_text(f"import json, sys\n{body}\n")
    return str(script)


@pytest.mark.parametrize(("body", "verdict"), [
    ("print(json.dumps({'state': 'ok', 'files': 12, 'args': sys.argv[1:]}))",
     {"state": "ok", "files": 12, "args": ["check", "--dest", "/m", "--digest", "ab12"]}),
    ("print('Welcome to DGX OS!')",
     {"state": "error", "error": "it printed 'Welcome to DGX OS!', not one JSON object"}),
    ("print(json.dumps(['ok']))", {"state": "error", "error": "it printed '[\"ok\"]', not one JSON object"}),
    ("print('')", {"state": "error", "error": "it printed '', not one JSON object"}),
    ("sys.exit('stage_weights.py: error: unrecognized arguments: --digest')",
     {"state": "error", "error": "stage_weights.py: error: unrecognized arguments: --digest"}),
])
def test_weights_check_gives_the_scripts_verdict_or_why_there_is_none(tmp_path: Path, body: str, verdict: dict,
                                                                      python3: None) -> None:
    """The installed script runs for real: whatever it prints, the probe answers with an object."""
    assert host_facts.weights_check(_script(tmp_path, body), ["--dest", "/m", "--digest", "ab12"]) == verdict


def test_weights_check_before_the_script_is_installed(tmp_path: Path) -> None:
    assert host_facts.weights_check(str(tmp_path / "stage_weights.py"), ["--dest", "/m"]) == {"state": "absent"}


def test_weights_check_full_is_not_cut_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`check --full` re-hashes every file: tens of seconds at least for a 37 GB checkpoint."""
    calls = fake_run(monkeypatch, lambda argv: (0, '{"state": "ok", "files": 1}', ""))
    script = _script(tmp_path, "")
    host_facts.weights_check(script, ["--dest", "/m", "--digest", "ab12"])
    host_facts.weights_check(script, ["--dest", "/m", "--digest", "ab12", "--full"])
    assert [call["timeout"] for call in calls] == [host_facts.TIMEOUT, None]


def test_a_command_that_does_not_answer_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    assert host_facts.run(sys.executable, "-c", "import time; time.sleep(5)", timeout=0.1) == (
        None, "", f"{sys.executable} did not answer within 0.1 s")


def test_weights_loaded(tmp_path: Path) -> None:
    manifest, loaded = tmp_path / "manifest.json", tmp_path / "loaded-weights.json"
    assert host_facts.weights_loaded(str(manifest), str(loaded)) == "unknown"  # the endpoint never started
    loaded.write_text('{"files": 12}')
    assert host_facts.weights_loaded(str(manifest), str(loaded)) == "differs"  # weights removed since
    manifest.write_text('{"files": 12}')
    assert host_facts.weights_loaded(str(manifest), str(loaded)) == "same"
    manifest.write_text('{"files": 13}')
    assert host_facts.weights_loaded(str(manifest), str(loaded)) == "differs"


def test_generations_lists_the_model_directory_and_the_mounted_ones(tmp_path: Path) -> None:
    root = tmp_path / "models" / "qwen"
    for name in ("sha256-1111111111111111", "sha256-2222222222222222", ".staging"):
        (root / name).mkdir(parents=True)
    os.utime(root / "sha256-1111111111111111", (1000, 1000))
    (root / "config.json").write_text("{}")  # a file is not a generation
    unit, known_good = tmp_path / "sparkfleet-vllm.service", tmp_path / "known-good.service"
    unit.write_text(f"ExecStart=/usr/bin/docker run \\\n"
                    f"    --volume {root}/sha256-2222222222222222:/models/qwen:ro \\\n"
                    "    --volume /run/sparkfleet:/run/sparkfleet \\\n    vllm/vllm-openai:v0.28.0\n")
    known_good.write_text(f"ExecStart=/usr/bin/docker run --volume {root}:/models/qwen:ro image\n")
    found = host_facts.generations(str(root), [str(unit), str(known_good), str(tmp_path / "no-such.service")])
    assert found["dirs"] == {"sha256-1111111111111111": 1000.0,
                             "sha256-2222222222222222": (root / "sha256-2222222222222222").stat().st_mtime}
    assert found["flat"] is False
    assert found["in_use"] == sorted([str(root), f"{root}/sha256-2222222222222222", "/run/sparkfleet"])
    (root / ".sparkfleet-manifest.json").write_text("{}")  # weights of the layout from before generations
    assert host_facts.generations(str(root), [])["flat"] is True
    assert host_facts.generations(str(tmp_path / "none"), [str(unit)])["dirs"] == {}


def test_generations_reads_the_mount_of_the_rendered_unit(tmp_path: Path) -> None:
    """The unit the deploy renders names the generation it serves in the form the probe parses."""
    spark = resolved(resolve("spark-01", SparkConfig(model_dir=str(tmp_path / "models"))))
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    unit = tmp_path / "sparkfleet-vllm.service"
    unit.write_text(env.from_string((TEMPLATES / "vllm" / "sparkfleet-vllm.service.j2").read_text()).render(
        spark=UnitView.of(spark)))
    assert spark.weights_dir in host_facts.generations(spark.model_root, [str(unit)])["in_use"]


def test_login_user_is_the_ssh_user_under_sudo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUDO_USER", "admin")
    assert host_facts.login_user() == "admin"
    monkeypatch.delenv("SUDO_USER")
    assert host_facts.login_user() == pwd.getpwuid(os.getuid()).pw_name


# --- a pair's host ------------------------------------------------------------------------------------------

# `ip -j addr show dev IFACE` (iproute2 6.1), one JSON line each: a cabled ConnectX-7 port with a static address
# (its IPv6 link-local address comes by itself); the same port without its cable (NO-CARRIER, operstate DOWN);
# one never brought up; and one brought up without an address.
IP_CABLED = (
    '[{"ifindex":4,"ifname":"enp1s0f0np0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":9000,'
    '"qdisc":"mq","operstate":"UP","group":"default","txqlen":1000,"link_type":"ether","address":"4c:bb:47:2c:a1:10",'
    '"broadcast":"ff:ff:ff:ff:ff:ff","addr_info":[{"family":"inet","local":"192.168.100.10","prefixlen":24,'
    '"broadcast":"192.168.100.255","scope":"global","label":"enp1s0f0np0","valid_life_time":4294967295,'
    '"preferred_life_time":4294967295},{"family":"inet6","local":"fe80::4ebb:47ff:fe2c:a110","prefixlen":64,'
    '"scope":"link","valid_life_time":4294967295,"preferred_life_time":4294967295}]}]\n')
IP_NO_CARRIER = (
    '[{"ifindex":4,"ifname":"enp1s0f0np0","flags":["NO-CARRIER","BROADCAST","MULTICAST","UP"],"mtu":9000,'
    '"qdisc":"mq","operstate":"DOWN","group":"default","txqlen":1000,"link_type":"ether",'
    '"address":"4c:bb:47:2c:a1:10","broadcast":"ff:ff:ff:ff:ff:ff","addr_info":[{"family":"inet",'
    '"local":"192.168.100.10","prefixlen":24,"broadcast":"192.168.100.255","scope":"global","label":"enp1s0f0np0",'
    '"valid_life_time":4294967295,"preferred_life_time":4294967295}]}]\n')
IP_DOWN = (
    '[{"ifindex":4,"ifname":"enp1s0f0np0","flags":["BROADCAST","MULTICAST"],"mtu":1500,"qdisc":"noop",'
    '"operstate":"DOWN","group":"default","txqlen":1000,"link_type":"ether","address":"4c:bb:47:2c:a1:10",'
    '"broadcast":"ff:ff:ff:ff:ff:ff","addr_info":[]}]\n')
IP_NO_ADDRESS = (
    '[{"ifindex":4,"ifname":"enp1s0f0np0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":9000,'
    '"qdisc":"mq","operstate":"UP","group":"default","txqlen":1000,"link_type":"ether","address":"4c:bb:47:2c:a1:10",'
    '"broadcast":"ff:ff:ff:ff:ff:ff","addr_info":[{"family":"inet6","local":"fe80::4ebb:47ff:fe2c:a110",'
    '"prefixlen":64,"scope":"link","valid_life_time":4294967295,"preferred_life_time":4294967295}]}]\n')
UP = ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"]


@pytest.mark.parametrize(("result", "found"), [
    ((0, IP_CABLED, ""), {"exists": True, "error": None, "flags": UP, "operstate": "UP",
                          "addresses": ["192.168.100.10/24"]}),
    ((0, IP_NO_CARRIER, ""), {"exists": True, "error": None, "flags": ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"],
                              "operstate": "DOWN", "addresses": ["192.168.100.10/24"]}),
    ((0, IP_DOWN, ""), {"exists": True, "error": None, "flags": ["BROADCAST", "MULTICAST"], "operstate": "DOWN",
                        "addresses": []}),
    ((0, IP_NO_ADDRESS, ""), {"exists": True, "error": None, "flags": UP, "operstate": "UP", "addresses": []}),
    ((1, "", 'Device "enp1s0f0np0" does not exist.\n'),
     {"exists": False, "error": 'Device "enp1s0f0np0" does not exist.'}),
    ((255, "", "RTNETLINK answers: Operation not permitted\n"),
     {"exists": None, "error": "RTNETLINK answers: Operation not permitted"}),
    (None, {"exists": None, "error": "ip (iproute2) is not installed"}),
])
def test_fabric_reads_the_interface_and_a_missing_one_is_an_answer(monkeypatch: pytest.MonkeyPatch, result: Result,
                                                                   found: dict[str, Any]) -> None:
    calls = fake_run(monkeypatch, lambda argv: result)
    assert host_facts.fabric("enp1s0f0np0") == found
    assert calls[0]["argv"] == ("ip", "-j", "addr", "show", "dev", "enp1s0f0np0")


def test_fabric_reads_this_machines_loopback() -> None:
    """`ip` for real, where it is installed: the loopback interface and one that is not there."""
    if host_facts.run("ip", "-V") is None:
        pytest.skip("no iproute2 here")
    loopback = host_facts.fabric("lo")
    assert loopback["exists"] is True and "127.0.0.1/8" in loopback["addresses"] and "UP" in loopback["flags"]
    assert host_facts.fabric("sparkfleet0")["exists"] is False


def test_pair_facts_read_the_rendered_units_mount_and_the_staged_manifest(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The generation a pair host's unit mounts, in the form the deploy renders it; staged once the manifest is."""
    pair = {"name": "pair-a", "head": "pair-01", "interface": "enp1s0f0np0", "master_addr": "192.168.100.10"}
    spark = resolved(resolve("pair-02", SparkConfig(model_dir=str(tmp_path / "models"), pair=pair)))
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    unit = tmp_path / "sparkfleet-vllm.service"
    query = {**preflight_query(spark)["pair"], "unit_file": str(unit)}
    fake_run(monkeypatch, lambda argv: (0, IP_CABLED, "") if argv[0] == "ip" else (0, "sha256:3b2f8e5c\n", ""))
    assert host_facts.pair_facts(query) == {"fabric": host_facts.fabric("enp1s0f0np0"), "image_id": "sha256:3b2f8e5c",
                                            "mounted": None, "staged": False}
    unit.write_text(env.from_string((TEMPLATES / "vllm" / "sparkfleet-vllm.service.j2").read_text()).render(
        spark=UnitView.of(spark)))
    Path(spark.weights_dir).mkdir(parents=True)
    Path(query["manifest"]).write_text("{}")
    found = host_facts.pair_facts(query)
    assert (found["mounted"], found["staged"]) == (spark.weights_dir, True)


def test_a_heads_pair_facts_say_who_holds_the_master_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the head is asked (its engine binds the port); a torch job of someone else's holds it here."""
    pair = {"name": "pair-a", "head": "pair-01", "interface": "enp1s0f0np0", "master_addr": "192.168.100.10"}
    head = resolved(resolve("pair-01", SparkConfig(pair=pair)))
    listening = ('LISTEN 0 4096 192.168.100.10:29500 0.0.0.0:* users:(("python3",pid=4242,fd=7))\n')

    def answer(argv: tuple[str, ...]) -> Result:
        if argv[0] in ("ip", "ss"):
            return 0, IP_CABLED if argv[0] == "ip" else listening, ""
        if argv[:2] == ("docker", "inspect"):  # the endpoint's container: not running
            return 1, "", "Error: No such object: sparkfleet-vllm\n"
        return 0, "sha256:3b2f8e5c\n", ""  # docker image inspect

    calls = fake_run(monkeypatch, answer)
    found = host_facts.pair_facts(preflight_query(head)["pair"])
    assert found["master_port"] == {"port_listener": "python3", "port_ours": False}
    assert ("ss", "-Hltnp", "sport", "=", ":29500") in [call["argv"] for call in calls]


def test_reach_says_ok_refused_or_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert host_facts.reach("127.0.0.1", port) == "ok"
    assert host_facts.reach("127.0.0.1", port) == "refused"  # closed now

    def failing(error: OSError) -> Callable[..., socket.socket]:
        def connect(address: tuple[str, int], timeout: float) -> socket.socket:
            assert timeout == host_facts.CONNECT_TIMEOUT == 2.0
            raise error
        return connect

    monkeypatch.setattr(socket, "create_connection", failing(TimeoutError("timed out")))
    assert host_facts.reach("192.168.100.10", 29500) == "timed out"
    monkeypatch.setattr(socket, "create_connection", failing(OSError(113, "No route to host")))
    assert host_facts.reach("192.168.100.10", 29500) == "no route to host"


# --- the whole query ----------------------------------------------------------------------------------------


def test_the_deploys_query_is_answered_and_a_broken_probe_is_named(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The query deploys/state.py builds is the one this script reads: every state probe answers (none fails on a
    key it expected), and one that raises is reported by name, which fails the operations (host_state.problem)."""
    fake_run(monkeypatch, lambda argv: None)  # no systemctl, docker, gpg, dpkg: a bare host
    spark = resolved(resolve("spark-01", SparkConfig(model_source="http://mirror.lan/models/qwen",
                                                     model_dir=str(tmp_path / "models"))))
    query = json.loads(json.dumps({**preflight_query(spark), "state": state_query(spark).as_dict()}))
    facts = host_facts.gather(query)
    assert {key: error for key, error in facts["probe_errors"].items() if key.startswith("state.")} == {}
    assert set(facts["state"]) == set(host_facts.deploy_state({"weights_args": []}))
    assert HostState(facts).problem is None

    def broken(path: str) -> dict:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(host_facts, "file_state", broken)
    facts = host_facts.gather(query)
    assert "files" not in facts["state"] and "units" in facts["state"]
    assert HostState(facts).problem.startswith("could not read files on the host (PermissionError: [Errno 13] "
                                               "Permission denied: ")


def test_a_pair_hosts_query_reads_the_pair_and_only_doctor_tries_the_master_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deploy's query on a pair host asks for the pair probe and never opens a connection; doctor's asks a worker
    to try its head's master port."""
    fake_run(monkeypatch, lambda argv: (1, "", 'Device "enp1s0f0np0" does not exist.\n') if argv[0] == "ip" else None)
    tried: list[tuple[str, int]] = []
    monkeypatch.setattr(host_facts, "reach", lambda address, port: tried.append((address, port)) or "refused")
    pair = {"name": "pair-a", "head": "pair-01", "interface": "enp1s0f0np0", "master_addr": "192.168.100.10"}
    worker = resolved(resolve("pair-02", SparkConfig(model_source="http://mirror.lan/models/qwen",
                                                     model_dir=str(tmp_path / "models"), pair=pair)))
    deploys = json.loads(json.dumps({**preflight_query(worker), "state": state_query(worker).as_dict()}))
    facts = host_facts.gather(deploys)
    assert facts["pair"]["fabric"] == {"exists": False, "error": 'Device "enp1s0f0np0" does not exist.'}
    assert "master_reach" not in facts and tried == []
    assert "pair" not in facts["probe_errors"]
    facts = host_facts.gather(json.loads(json.dumps(preflight_query(worker) | doctor.master_query(worker))))
    assert facts["master_reach"] == "refused" and tried == [("192.168.100.10", 29500)]
