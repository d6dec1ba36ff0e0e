"""The lab's NVIDIA stand-ins behave like the real tools in what sparkfleet relies on.

nvidia-ctk's daemon.json merge, nvidia-smi's query forms and no-driver failure, and the signed apt repository
that replaces nvidia.github.io/libnvidia-container, proven consumable by apt itself.
"""

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.lab.standins.nvidia_repo import (
    NVIDIA_SMI,
    PACKAGE_NAMES,
    STANDINS_DIR,
    build_repo,
    ensure_signing_key,
)

CTK = STANDINS_DIR / "nvidia-ctk"
CLI = STANDINS_DIR / "nvidia-container-cli"
VERSIONS = ("1.19.0", "1.19.1")
ARCHES = ("amd64", "arm64")
NVIDIA_RUNTIME = {"path": "nvidia-container-runtime", "args": []}
FOREIGN = {
    "registry-mirrors": ["http://registry.lab:5000"],
    "insecure-registries": ["registry.lab:5000"],
    "log-driver": "journald",
    "runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--platform=ptrace"]}},
}

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs Debian tooling")


def run(*argv: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a stand-in as the hosts do: the executable itself, via its shebang."""
    return subprocess.run([str(arg) for arg in argv], check=False, capture_output=True, text=True, env=env,
                          timeout=30)


def ctk_configure(config: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run(CTK, "runtime", "configure", "--runtime=docker", "--config", config, *flags)


# --- nvidia-ctk ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("initial", [None, "", "\n"], ids=["missing", "empty", "blank"])
def test_ctk_creates_runtime_from_nothing(tmp_path: Path, initial: str | None) -> None:
    config = tmp_path / "docker" / "daemon.json"
    if initial is not None:
        config.parent.mkdir()
        config.write_text(initial)
    result = ctk_configure(config)
    assert result.returncode == 0, result.stderr
    assert json.loads(config.read_text()) == {"runtimes": {"nvidia": NVIDIA_RUNTIME}}
    assert f"Wrote updated config to {config}" in result.stderr
    assert "It is recommended that docker daemon be restarted." in result.stderr


def test_ctk_keeps_foreign_keys_and_runtimes(tmp_path: Path) -> None:
    config = tmp_path / "daemon.json"
    config.write_text(json.dumps(FOREIGN))
    result = ctk_configure(config)
    assert result.returncode == 0, result.stderr
    assert f"Loading config from {config}" in result.stderr
    written = json.loads(config.read_text())
    assert written == {**FOREIGN, "runtimes": {**FOREIGN["runtimes"], "nvidia": NVIDIA_RUNTIME}}
    assert "default-runtime" not in written and "features" not in written


def test_ctk_set_as_default(tmp_path: Path) -> None:
    config = tmp_path / "daemon.json"
    config.write_text(json.dumps({"default-runtime": "runc", **FOREIGN}))
    assert ctk_configure(config).returncode == 0
    assert json.loads(config.read_text())["default-runtime"] == "runc"
    assert ctk_configure(config, "--set-as-default").returncode == 0
    assert json.loads(config.read_text())["default-runtime"] == "nvidia"


def test_ctk_cdi_merges_into_existing_features(tmp_path: Path) -> None:
    config = tmp_path / "daemon.json"
    config.write_text(json.dumps({"features": {"buildkit": True}, **FOREIGN}))
    assert ctk_configure(config, "--cdi.enabled").returncode == 0
    written = json.loads(config.read_text())
    assert written["features"] == {"buildkit": True, "cdi": True}
    assert written["registry-mirrors"] == FOREIGN["registry-mirrors"]


def test_ctk_is_idempotent_and_indents_four_spaces(tmp_path: Path) -> None:
    config = tmp_path / "daemon.json"
    config.write_text(json.dumps(FOREIGN))
    flags = ("--set-as-default", "--cdi.enabled")
    assert ctk_configure(config, *flags).returncode == 0
    first = config.read_bytes()
    assert ctk_configure(config, *flags).returncode == 0
    assert config.read_bytes() == first
    text = first.decode()
    assert text == json.dumps(json.loads(text), indent=4, sort_keys=True)
    assert '\n    "default-runtime": "nvidia",\n' in text


def test_ctk_dry_run_prints_and_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "daemon.json"
    original = json.dumps(FOREIGN).encode()
    config.write_bytes(original)
    result = ctk_configure(config, "--dry-run", "--set-as-default")
    assert result.returncode == 0, result.stderr
    assert config.read_bytes() == original
    assert json.loads(result.stdout)["default-runtime"] == "nvidia"
    assert "Wrote updated config" not in result.stderr
    missing = tmp_path / "absent.json"
    assert ctk_configure(missing, "--dry-run").returncode == 0
    assert not missing.exists()


def test_ctk_rejects_invalid_json(tmp_path: Path) -> None:
    config = tmp_path / "daemon.json"
    config.write_text('{"log-driver": ')
    result = ctk_configure(config)
    assert result.returncode != 0
    assert "ERRO" in result.stderr
    assert config.read_text() == '{"log-driver": '


@pytest.mark.parametrize(
    "argv",
    [("cdi", "generate"), ("runtime",), (), ("runtime", "configure", "--runtime=podman")],
    ids=["unknown-command", "missing-subcommand", "no-command", "unknown-runtime"],
)
def test_ctk_usage_errors_fail(tmp_path: Path, argv: tuple[str, ...]) -> None:
    result = run(CTK, *argv, *(("--config", tmp_path / "d.json") if "configure" in argv else ()))
    assert result.returncode != 0
    assert "usage" in result.stderr.lower() or "unrecognized runtime" in result.stderr
    assert not (tmp_path / "d.json").exists()


def test_ctk_config_set_changes_one_key_in_place(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    shutil.copy(STANDINS_DIR / "config.toml", config)
    before = config.read_text()
    result = run(CTK, "config", "--config-file", config, "--in-place", "--set", "nvidia-container-runtime.mode=legacy")
    assert result.returncode == 0, result.stderr
    after = config.read_text()
    assert tomllib.loads(after)["nvidia-container-runtime"]["mode"] == "legacy"
    assert tomllib.loads(before)["nvidia-container-runtime"]["mode"] == "auto"
    assert [line for line in after.splitlines() if "mode" not in line] == [
        line for line in before.splitlines() if "mode" not in line]
    printed = run(CTK, "config", "--config-file", config, "--set", "nvidia-container-runtime.log-level=debug")
    assert tomllib.loads(printed.stdout)["nvidia-container-runtime"]["log-level"] == "debug"
    assert config.read_text() == after  # without --in-place nothing is written


# --- nvidia-smi and nvidia-container-cli -------------------------------------------------------------


@pytest.fixture
def lab_env(tmp_path: Path) -> dict[str, str]:
    """Point the per-host switches at an empty temporary directory."""
    (tmp_path / "lab-etc").mkdir()
    return {**os.environ, "SPARKFLEET_LAB_ETC": str(tmp_path / "lab-etc")}


def smi(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return run(NVIDIA_SMI, *argv, env=env)


def test_smi_preflight_query_answers_like_gb10(lab_env: dict[str, str]) -> None:
    fields = "name,driver_version,memory.total,power.limit,temperature.gpu"
    result = smi(lab_env, f"--query-gpu={fields}", "--format=csv,noheader,nounits")
    assert result.returncode == 0, result.stdout
    name, driver, memory, _power, temperature = result.stdout.strip().split(", ")
    assert name == "NVIDIA GB10"
    assert driver.startswith("580.")
    assert memory == "[N/A]"
    assert temperature.isdigit()


def test_smi_memory_is_not_available_on_unified_memory(lab_env: dict[str, str]) -> None:
    result = smi(lab_env, "--query-gpu=memory.total,memory.used,memory.free", "--format=csv")
    header, values = result.stdout.strip().splitlines()
    assert header == "memory.total [MiB], memory.used [MiB], memory.free [MiB]"
    assert values == "[N/A], [N/A], [N/A]"


def test_smi_field_order_units_and_extra_fields(lab_env: dict[str, str]) -> None:
    result = smi(lab_env, "--query-gpu=compute_cap,count,power.draw,name", "--format=csv,noheader")
    assert result.stdout.strip().split(", ")[:2] == ["12.1", "1"]
    assert result.stdout.strip().split(", ")[2].endswith(" W")
    nounits = smi(lab_env, "--query-gpu=power.draw", "--format=csv,noheader,nounits").stdout.strip()
    assert float(nounits) > 0


def test_smi_list_and_default_table(lab_env: dict[str, str]) -> None:
    assert smi(lab_env, "-L").stdout.startswith("GPU 0: NVIDIA GB10 (UUID: GPU-")
    table = smi(lab_env).stdout
    assert "NVIDIA GB10" in table
    assert "Driver Version: 580.95.05" in table and "CUDA Version: 13.0" in table
    assert "Not Supported" in table


def test_smi_rejects_unknown_field(lab_env: dict[str, str]) -> None:
    result = smi(lab_env, "--query-gpu=name,vram", "--format=csv")
    assert result.returncode != 0
    assert '"vram" is not a valid field' in result.stdout


@pytest.mark.parametrize("argv", [("--query-gpu=name", "--format=csv,noheader"), ("-L",), ()])
def test_smi_without_driver_fails_like_real(lab_env: dict[str, str], argv: tuple[str, ...]) -> None:
    (Path(lab_env["SPARKFLEET_LAB_ETC"]) / "no-gpu").touch()
    result = smi(lab_env, *argv)
    assert result.returncode == 9
    assert result.stdout.strip() == (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )


def test_smi_gpu_json_overrides_driver(lab_env: dict[str, str]) -> None:
    override = {"driver_version": "550.54.15", "cuda_version": "12.4"}
    (Path(lab_env["SPARKFLEET_LAB_ETC"]) / "gpu.json").write_text(json.dumps(override))
    result = smi(lab_env, "--query-gpu=name,driver_version", "--format=csv,noheader")
    assert result.stdout.strip() == "NVIDIA GB10, 550.54.15"
    assert "CUDA Version: 12.4" in smi(lab_env).stdout


def test_container_cli_info_and_no_driver(lab_env: dict[str, str]) -> None:
    info = run(CLI, "info", env=lab_env)
    assert info.returncode == 0
    assert "Model:          NVIDIA GB10" in info.stdout
    (Path(lab_env["SPARKFLEET_LAB_ETC"]) / "no-gpu").touch()
    assert run(CLI, "info", env=lab_env).returncode != 0


# --- the signed apt repository ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """Build once for the module: (repository root, dearmored keyring, fingerprint)."""
    base = tmp_path_factory.mktemp("nvidia-repo")
    fingerprint = build_repo(base / "repo", base / "gnupg", VERSIONS, ARCHES)
    keyring = base / "nvidia-container-toolkit-keyring.gpg"
    subprocess.run(["gpg", "--dearmor", "--output", str(keyring), str(base / "repo" / "gpgkey")], check=True)
    return base / "repo", keyring, fingerprint


def stanzas(text: str) -> list[dict[str, str]]:
    """Parse deb822 (Packages) into dicts; continuation lines are dropped, values need only the first."""
    parsed = []
    for block in text.strip().split("\n\n"):
        lines = [line for line in block.splitlines() if not line.startswith(" ")]
        parsed.append(dict(line.split(": ", 1) for line in lines))
    return parsed


def expected_depends(name: str, version: str) -> str | None:
    """NVIDIA's dependency chain, which pinning all four packages together relies on."""
    deb = f"{version}-1"
    return {
        "libnvidia-container-tools": f"libnvidia-container1 (>= {deb})",
        "nvidia-container-toolkit": f"nvidia-container-toolkit-base (= {deb}), "
        f"libnvidia-container-tools (>= {deb}), libnvidia-container-tools (<< 2.0.0)",
    }.get(name)


@pytest.mark.parametrize("arch", ARCHES)
def test_repo_packages_index(repo: tuple[Path, Path, str], arch: str) -> None:
    arch_dir = repo[0] / "stable" / "deb" / arch
    packages = (arch_dir / "Packages").read_bytes()
    assert gzip.decompress((arch_dir / "Packages.gz").read_bytes()) == packages
    entries = stanzas(packages.decode())
    assert {(e["Package"], e["Version"]) for e in entries} == {
        (name, f"{version}-1") for name in PACKAGE_NAMES for version in VERSIONS
    }
    for entry in entries:
        assert entry["Architecture"] == arch
        assert entry.get("Depends") == expected_depends(entry["Package"], entry["Version"][:-2])
        deb = (arch_dir / entry["Filename"]).read_bytes()
        assert entry["SHA256"] == hashlib.sha256(deb).hexdigest() and int(entry["Size"]) == len(deb)


@pytest.mark.parametrize("arch", ARCHES)
def test_repo_release_is_signed_and_lists_indexes(repo: tuple[Path, Path, str], arch: str) -> None:
    root, keyring, fingerprint = repo
    arch_dir = root / "stable" / "deb" / arch
    release = (arch_dir / "Release").read_text()
    assert hashlib.sha256((arch_dir / "Packages").read_bytes()).hexdigest() in release
    assert (root / "gpgkey").read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    inline = run("gpgv", "--keyring", keyring, arch_dir / "InRelease")
    assert inline.returncode == 0, inline.stderr
    assert fingerprint[-16:] in inline.stderr
    assert run("gpgv", "--keyring", keyring, arch_dir / "Release.gpg", arch_dir / "Release").returncode == 0
    tampered = arch_dir.parent / f"{arch}-Release.tampered"
    tampered.write_text(release.replace("Packages.gz", "Packages.xz"))
    assert run("gpgv", "--keyring", keyring, arch_dir / "Release.gpg", tampered).returncode != 0


def test_repo_debs_carry_fields_payload_and_version(repo: tuple[Path, Path, str], tmp_path: Path) -> None:
    deb = repo[0] / "stable" / "deb" / "arm64" / "nvidia-container-toolkit-base_1.19.1-1_arm64.deb"
    info = run("dpkg-deb", "-I", deb).stdout
    assert "Package: nvidia-container-toolkit-base" in info and "Version: 1.19.1-1" in info
    assert "Architecture: arm64" in info
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    version = run(tmp_path / "usr" / "bin" / "nvidia-ctk", "--version").stdout
    assert version.startswith("NVIDIA Container Toolkit CLI version 1.19.1\n")
    assert os.access(tmp_path / "usr" / "bin" / "nvidia-container-runtime", os.X_OK)
    lib = repo[0] / "stable" / "deb" / "arm64" / "libnvidia-container1_1.19.0-1_arm64.deb"
    assert "./usr/lib/aarch64-linux-gnu/libnvidia-container.so.1 ->" in run("dpkg-deb", "-c", lib).stdout


def test_repo_rebuild_reuses_key_and_is_byte_identical(repo: tuple[Path, Path, str], tmp_path: Path) -> None:
    root, _keyring, fingerprint = repo
    gnupg = root.parent / "gnupg"
    assert build_repo(tmp_path / "again", gnupg, ("1.19.0",), ("amd64",)) == fingerprint
    name = "nvidia-container-toolkit_1.19.0-1_amd64.deb"
    rebuilt = tmp_path / "again" / "stable" / "deb" / "amd64" / name
    assert rebuilt.read_bytes() == (root / "stable" / "deb" / "amd64" / name).read_bytes()


def apt(root: Path, arch: str, keyring: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """apt confined to a scratch root (APT_CONFIG), with NVIDIA's own source line shape."""
    apt_root = root.parent / f"apt-{arch}-{keyring.stem}"
    for sub in ("etc/apt/apt.conf.d", "etc/apt/preferences.d", "etc/apt/sources.list.d",
                "var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "var/lib/dpkg"):
        (apt_root / sub).mkdir(parents=True, exist_ok=True)
    (apt_root / "var/lib/dpkg/status").touch()
    (apt_root / "etc/apt/sources.list").write_text(
        f"deb [signed-by={keyring}] file:{root}/stable/deb/$(ARCH) /\n")
    (apt_root / "apt.conf").write_text(
        f'Dir "{apt_root}/";\nDir::State::status "{apt_root}/var/lib/dpkg/status";\n'
        f'APT::Architecture "{arch}";\nAPT::Architectures {{ "{arch}"; }};\nAPT::Sandbox::User "root";\n')
    return run(*argv, env={**os.environ, "APT_CONFIG": str(apt_root / "apt.conf")})


@pytest.mark.parametrize("arch", ARCHES)
def test_apt_consumes_repo_like_nvidias(repo: tuple[Path, Path, str], arch: str) -> None:
    root, keyring, _fingerprint = repo
    update = apt(root, arch, keyring, "apt-get", "update")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "W:" not in update.stderr and "E:" not in update.stderr
    policy = apt(root, arch, keyring, "apt-cache", "policy", "nvidia-container-toolkit").stdout
    assert "Candidate: 1.19.1-1" in policy and " 1.19.0-1 500" in policy
    pinned = apt(root, arch, keyring, "apt-get", "-s", "install", "nvidia-container-toolkit=1.19.0-1",
                 "nvidia-container-toolkit-base=1.19.0-1", "libnvidia-container-tools=1.19.0-1",
                 "libnvidia-container1=1.19.0-1")
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    installs = [line for line in pinned.stdout.splitlines() if line.startswith("Inst ")]
    assert len(installs) == 4 and all("(1.19.0-1 " in line for line in installs)


def test_apt_rejects_repo_signed_by_another_key(repo: tuple[Path, Path, str], tmp_path: Path) -> None:
    root, _keyring, _fingerprint = repo
    gnupg, other = tmp_path / "gnupg", tmp_path / "other.gpg"
    ensure_signing_key(gnupg)
    subprocess.run(["gpg", "--homedir", str(gnupg), "--batch", "--output", str(other), "--export"], check=True)
    subprocess.run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"], check=False)
    update = apt(root, "amd64", other, "apt-get", "update")
    assert "NO_PUBKEY" in update.stdout + update.stderr
    policy = apt(root, "amd64", other, "apt-cache", "policy", "nvidia-container-toolkit").stdout
    assert "1.19.0-1" not in policy
