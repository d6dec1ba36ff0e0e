"""Builds a signed apt repository that stands in for NVIDIA's libnvidia-container repository.

Same layout as `https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /` (a flat repository per
architecture) plus the ASCII-armored key NVIDIA serves at `/libnvidia-container/gpgkey`, so the production apt
path (key, source line, update, install of pinned versions) runs unchanged against the lab. The packages carry
NVIDIA's names, Debian versions and Depends; their payload is the lab stand-in scripts in `nvidia/`.
Indexes are written here rather than by apt-ftparchive, so neither this machine nor CI needs apt-utils.
"""

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise, repeat
from pathlib import Path

STANDINS_DIR = Path(__file__).resolve().parent / "nvidia"
# The driver's nvidia-smi is baked into the host image, not shipped by the repository packages.
NVIDIA_SMI = STANDINS_DIR / "nvidia-smi"
PACKAGE_NAMES = (
    "libnvidia-container1",
    "libnvidia-container-tools",
    "nvidia-container-toolkit-base",
    "nvidia-container-toolkit",
)
TRIPLETS = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
KEY_UID = "NVIDIA CORPORATION (sparkfleet lab stand-in) <cudatools@nvidia.com>"
MAINTAINER = "NVIDIA CORPORATION <cudatools@nvidia.com>"
HOMEPAGE = "https://github.com/NVIDIA/nvidia-container-toolkit"
# Fixed file times make rebuilds with the same inputs byte-identical (reproducible-builds convention).
SOURCE_DATE_EPOCH = 1735689600
RELEASE_HASHES = (("MD5Sum", hashlib.md5), ("SHA1", hashlib.sha1), ("SHA256", hashlib.sha256),
                  ("SHA512", hashlib.sha512))


@dataclass(frozen=True)
class PackageSpec:
    """One binary package: control fields and payload (install path -> file content)."""

    name: str
    depends: str
    summary: str
    files: dict[str, str]
    symlinks: dict[str, str]


def debian_version(version: str) -> str:
    """NVIDIA publishes upstream version X as Debian version X-1."""
    return f"{version}-1"


def standin(name: str, version: str) -> str:
    """A stand-in script with the package version substituted in, as a real build stamps it."""
    return (STANDINS_DIR / name).read_text().replace("@VERSION@", version)


def package_specs(version: str, arch: str) -> list[PackageSpec]:
    """The four packages NVIDIA's install guide pins together, with their real dependency chain."""
    deb_version = debian_version(version)
    lib_dir = f"/usr/lib/{TRIPLETS[arch]}"
    return [
        PackageSpec(
            "libnvidia-container1", "", "NVIDIA container runtime library",
            {f"{lib_dir}/libnvidia-container.so.{version}": "sparkfleet lab stand-in: no library code\n"},
            {f"{lib_dir}/libnvidia-container.so.1": f"libnvidia-container.so.{version}"},
        ),
        PackageSpec(
            "libnvidia-container-tools", f"libnvidia-container1 (>= {deb_version})",
            "NVIDIA container runtime library (command-line tools)",
            {"/usr/bin/nvidia-container-cli": standin("nvidia-container-cli", version)}, {},
        ),
        PackageSpec(
            "nvidia-container-toolkit-base", "", "NVIDIA Container Toolkit Base",
            {"/usr/bin/nvidia-ctk": standin("nvidia-ctk", version),
             "/usr/bin/nvidia-container-runtime": standin("nvidia-container-runtime", version),
             "/etc/nvidia-container-runtime/config.toml": standin("config.toml", version)}, {},
        ),
        PackageSpec(
            "nvidia-container-toolkit",
            f"nvidia-container-toolkit-base (= {deb_version}), libnvidia-container-tools (>= {deb_version}),"
            " libnvidia-container-tools (<< 2.0.0)",
            "NVIDIA Container toolkit",
            {"/usr/bin/nvidia-container-runtime-hook": standin("nvidia-container-runtime-hook", version)}, {},
        ),
    ]


def control_text(spec: PackageSpec, version: str, arch: str, installed_kib: int) -> str:
    """The DEBIAN/control stanza, fields as in NVIDIA's packages."""
    fields = [
        ("Package", spec.name),
        ("Version", debian_version(version)),
        ("Architecture", arch),
        ("Maintainer", MAINTAINER),
        ("Installed-Size", str(installed_kib)),
        ("Depends", spec.depends),
        ("Section", "utils"),
        ("Priority", "optional"),
        ("Homepage", HOMEPAGE),
        ("Description", f"{spec.summary}\n Lab stand-in built for the sparkfleet tests: it drives no GPU."),
    ]
    return "".join(f"{key}: {value}\n" for key, value in fields if value)


def stage_package(spec: PackageSpec, version: str, arch: str, root: Path) -> str:
    """Write the package tree under root with fixed modes and times; return its control text."""
    for install_path, content in spec.files.items():
        target = root / install_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(0o755 if content.startswith("#!") else 0o644)
    for link, points_to in spec.symlinks.items():
        (root / link.lstrip("/")).symlink_to(points_to)
    installed_kib = sum(-(-len(content.encode()) // 1024) for content in spec.files.values())
    control = control_text(spec, version, arch, installed_kib)
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN" / "control").write_text(control)
    conffiles = [path for path in spec.files if path.startswith("/etc/")]
    if conffiles:  # dpkg keeps an edited conffile across upgrades, as it does the real package's settings
        (root / "DEBIAN" / "conffiles").write_text("".join(f"{path}\n" for path in conffiles))
    for path in [root, *root.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
    return control


def build_deb(spec: PackageSpec, version: str, arch: str, arch_dir: Path) -> str:
    """Build one .deb into arch_dir; return its Packages stanza (control plus file fields)."""
    deb = arch_dir / f"{spec.name}_{debian_version(version)}_{arch}.deb"
    with tempfile.TemporaryDirectory(prefix=f"{spec.name}-") as work:
        root = Path(work) / "root"
        root.mkdir()
        control = stage_package(spec, version, arch, root)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)],
                       check=True, capture_output=True, env=env)
    data = deb.read_bytes()
    file_fields = (f"Filename: ./{deb.name}\nSize: {len(data)}\nMD5sum: {hashlib.md5(data).hexdigest()}\n"
                   f"SHA1: {hashlib.sha1(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n")
    return control + file_fields


def release_text(indexes: dict[str, bytes]) -> str:
    """A flat-repository Release file listing the index files with their sizes and hashes."""
    lines = [
        "Origin: sparkfleet-lab nvidia-container-toolkit stand-in",
        "Label: sparkfleet-lab nvidia-container-toolkit stand-in",
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}",
    ]
    for field, algorithm in RELEASE_HASHES:
        lines.append(f"{field}:")
        lines += [f" {algorithm(data).hexdigest()} {len(data):>16} {name}" for name, data in indexes.items()]
    return "\n".join(lines) + "\n"


def gpg(gnupg_home: Path, *args: str) -> str:
    """Run gpg non-interactively against the repository's own keyring."""
    result = subprocess.run(["gpg", "--homedir", str(gnupg_home), "--batch", "--yes", *args],
                            check=True, capture_output=True, text=True)
    return result.stdout


def ensure_signing_key(gnupg_home: Path) -> str:
    """Reuse the secret key in gnupg_home, or create an unprotected ed25519 signing key; return its fingerprint."""
    gnupg_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    gnupg_home.chmod(0o700)
    if not secret_fingerprints(gnupg_home):
        gpg(gnupg_home, "--pinentry-mode", "loopback", "--passphrase", "",
            "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
    return secret_fingerprints(gnupg_home)[0]


def secret_fingerprints(gnupg_home: Path) -> list[str]:
    """Fingerprints of the primary secret keys, from gpg's machine-readable listing."""
    listing = gpg(gnupg_home, "--with-colons", "--list-secret-keys").splitlines()
    return [nxt.split(":")[9] for line, nxt in pairwise(listing)
            if line.startswith("sec:") and nxt.startswith("fpr:")]


def write_arch_repo(arch_dir: Path, stanzas: list[str], sign: Callable[[Path], None]) -> None:
    """Packages, Packages.gz and the signed Release/InRelease/Release.gpg of one architecture."""
    packages = "\n".join(stanzas).encode()
    indexes = {"Packages": packages, "Packages.gz": gzip.compress(packages, mtime=0)}
    for name, data in indexes.items():
        (arch_dir / name).write_bytes(data)
    (arch_dir / "Release").write_text(release_text(indexes))
    sign(arch_dir)


def signer(gnupg_home: Path, fingerprint: str) -> Callable[[Path], None]:
    """Sign a Release both ways apt accepts: inline (InRelease) and detached (Release.gpg)."""
    def sign(arch_dir: Path) -> None:
        release = str(arch_dir / "Release")
        common = ("--local-user", fingerprint, "--digest-algo", "SHA512")
        gpg(gnupg_home, *common, "--clearsign", "--output", str(arch_dir / "InRelease"), release)
        gpg(gnupg_home, *common, "--armor", "--detach-sign", "--output", str(arch_dir / "Release.gpg"), release)
    return sign


def build_repo(
    out_dir: Path,
    gnupg_home: Path,
    versions: tuple[str, ...] = ("1.19.0", "1.19.1"),
    arches: tuple[str, ...] = ("amd64", "arm64"),
) -> str:
    """Build `out_dir/stable/deb/<arch>/` and `out_dir/gpgkey`; return the signing key's fingerprint.

    Each architecture directory is rebuilt from scratch, so stale packages never linger.
    """
    fingerprint = ensure_signing_key(gnupg_home)
    sign = signer(gnupg_home, fingerprint)
    try:
        for arch in arches:
            arch_dir = out_dir / "stable" / "deb" / arch
            shutil.rmtree(arch_dir, ignore_errors=True)
            arch_dir.mkdir(parents=True)
            jobs = [(spec, version) for version in versions for spec in package_specs(version, arch)]
            with ThreadPoolExecutor() as pool:
                stanzas = list(pool.map(build_deb, *zip(*jobs, strict=True), repeat(arch), repeat(arch_dir)))
            write_arch_repo(arch_dir, stanzas, sign)
        (out_dir / "gpgkey").write_text(gpg(gnupg_home, "--armor", "--export", fingerprint))
    finally:
        # gpg spawned an agent for this home; do not leave it running after the build.
        subprocess.run(["gpgconf", "--homedir", str(gnupg_home), "--kill", "gpg-agent"], check=False)
    return fingerprint
