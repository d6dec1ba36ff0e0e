"""Build the lab's images from debootstrapped Debian roots, reused by content hash.

Nothing can be pulled on these machines, so every image starts as a `debootstrap` root that
`docker import` turns into an image. Each image's tag is a hash of everything that goes into it
(package list, stand-in files, this module), so a warm `up` only checks that the tags exist.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.lab import log, run
from tests.lab.standins import vllm_data

STANDINS = Path(__file__).parent / "standins"
SUITE = "bookworm"
DEB_CACHE = Path("/var/cache/sparkfleet-lab/debs")
WHEEL_CACHE = Path("/var/cache/sparkfleet-lab/wheels")
# Part of every image's content hash: bump it when `build` changes how a root becomes an image.
BUILD_VERSION = "1"

HOST_PACKAGES = (
    "systemd,systemd-sysv,dbus,openssh-server,python3,iproute2,ca-certificates,gnupg,curl,rsync,"
    "docker.io,sudo,procps,less"
)
SERVICE_PACKAGES = "python3,ca-certificates,docker-registry"
VLLM_PACKAGES = "python3,python3-pip"
# The vLLM image's Hugging Face client, every wheel pinned and hashed for its python3 (bookworm's 3.11).
HUB_CLIENT_REQUIREMENTS = STANDINS / "vllm_image_requirements.txt"
IMAGE_PYTHON = "3.11"
IMAGE_WHEELS = "/tmp/wheels"

# Every failure tag of the vLLM stand-in: a production tag plus a suffix picks the behaviour.
VLLM_MODES = {
    "": "ok",
    "-crash-cutlass": "crash-cutlass",
    "-crash-after-load": "crash-after-load",
    "-hang": "hang",
    "-slow": "slow",
    "-busy": "busy",
}


@dataclass(frozen=True)
class ImageSpec:
    """One lab image: a debootstrap root plus files laid into it."""

    name: str
    arch: str
    packages: str
    files: dict[str, bytes]
    setup: str  # shell run in the chroot after the files are laid
    cmd: list[str]
    entrypoint: list[str] | None = None

    @property
    def tag(self) -> str:
        digest = hashlib.sha256()
        for part in (self.arch, self.packages, self.setup, json.dumps([self.cmd, self.entrypoint])):
            digest.update(part.encode() + b"\0")
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + self.files[path] + b"\0")
        digest.update(BUILD_VERSION.encode())
        return f"sparkfleet-lab/{self.name}:{digest.hexdigest()[:16]}"


def tree_hash(*paths: Path) -> str:
    """Content hash of files and directory trees: what a cached artefact was built from."""
    digest = hashlib.sha256()
    for path in paths:
        for file in sorted([path] if path.is_file() else path.rglob("*")):
            if file.is_file():
                digest.update(str(file.relative_to(path.parent)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def _standin(name: str) -> bytes:
    return (STANDINS / name).read_bytes()


def host_spec(arch: str) -> ImageSpec:
    """A simulated Spark: systemd, sshd, dockerd with the lab's registry mirror, a GPU driver stand-in."""
    daemon: dict[str, object] = {
        "registry-mirrors": ["http://registry.lab:5000"],
        "insecure-registries": ["registry.lab:5000"],
    }
    if arch != "amd64":
        daemon |= {"iptables": False, "ip6tables": False}  # nftables does not work under qemu-user
    files = {
        "/etc/docker/daemon.json": (json.dumps(daemon, indent=4) + "\n").encode(),
        "/usr/bin/nvidia-smi": _standin("nvidia/nvidia-smi"),
        "/etc/ssh/sshd_config.d/lab.conf": b"PermitRootLogin prohibit-password\nPasswordAuthentication no\n",
        # No route to Debian's mirrors from a lab host: apt sees only what the deploy adds.
        "/etc/apt/sources.list": b"",
    }
    setup = "\n".join(
        [
            "chmod 0755 /usr/bin/nvidia-smi",
            "rm -f /etc/ssh/ssh_host_*_key* && ssh-keygen -A",
            "systemctl enable ssh docker",
            # Units that cannot work in a container only make the boot look degraded.
            "systemctl mask systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket"
            " getty@tty1.service console-getty.service systemd-firstboot.service",
            "apt-get clean && rm -rf /var/lib/apt/lists/*",
            "mkdir -p /root/.ssh && chmod 0700 /root/.ssh",
        ]
    )
    return ImageSpec(f"host-{arch}", arch, HOST_PACKAGES, files, setup, ["/sbin/init"])


def service_spec() -> ImageSpec:
    """The lab's shared services: a registry (docker-registry), an HTTP server for apt and models, the Hub."""
    files = {
        "/usr/local/bin/lab-services": _standin("lab_services.sh"),
        "/usr/local/bin/lab-hub": _standin("hub.py"),
        # Debian's default config wants htpasswd auth; the lab registry is open, on the lab network only.
        "/etc/docker/registry/config.yml": b"version: 0.1\nstorage:\n  filesystem:\n"
        b"    rootdirectory: /var/lib/docker-registry\nhttp:\n  addr: :5000\n",
    }
    return ImageSpec(
        "services", "amd64", SERVICE_PACKAGES, files, "chmod 0755 /usr/local/bin/lab-services /usr/local/bin/lab-hub",
        ["/usr/local/bin/lab-services"],
    )


def vllm_spec() -> ImageSpec:
    """The vLLM image stand-in, with the production entrypoint `vllm serve` and the `hf` command the real image
    ships (installed offline from the pinned wheels, with a clean environment so no pip setting of this machine
    leaks into the image)."""
    files = {"/usr/local/bin/vllm": _standin("vllm_standin.py")}
    with tempfile.TemporaryDirectory() as tmp:
        vllm_data.write_image_data(Path(tmp))
        files |= {f"/usr/share/vllm-standin/{p.name}": p.read_bytes() for p in sorted(Path(tmp).iterdir())}
    files |= {f"{IMAGE_WHEELS}/{p.name}": p.read_bytes() for p in hub_client_wheels()}
    requirements = f"{IMAGE_WHEELS}/{HUB_CLIENT_REQUIREMENTS.name}"
    files[requirements] = HUB_CLIENT_REQUIREMENTS.read_bytes()
    setup = "\n".join(
        [
            "chmod 0755 /usr/local/bin/vllm",
            "env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin python3 -m pip install -q --no-index --root-user-action=ignore"
            f" --break-system-packages --find-links {IMAGE_WHEELS} -r {requirements}",
            f"rm -rf {IMAGE_WHEELS}",
            "env -i PATH=/usr/local/bin:/usr/bin:/bin hf version >/dev/null",
        ]
    )
    return ImageSpec("vllm", "amd64", VLLM_PACKAGES, files, setup, [], entrypoint=["vllm", "serve"])


def hub_client_wheels() -> list[Path]:
    """The pinned wheels, downloaded on the controller once per lock content, so image builds stay offline and
    cacheable (and lab containers could not verify PyPI's certificate anyway); pip checks every hash."""
    lock = HUB_CLIENT_REQUIREMENTS.read_bytes()
    cache = WHEEL_CACHE / hashlib.sha256(lock).hexdigest()[:16]
    if not (cache / ".complete").exists():
        log(f"downloading the vLLM image's Hugging Face client wheels into {cache}")
        partial = cache.with_name(cache.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--platform",
             "manylinux_2_17_x86_64", "--python-version", IMAGE_PYTHON, "--require-hashes",
             "-r", str(HUB_CLIENT_REQUIREMENTS), "-d", str(partial)], quiet=True)
        shutil.rmtree(cache, ignore_errors=True)
        partial.rename(cache)
        (cache / ".complete").touch()
    return sorted(cache.glob("*.whl"))


def vllm_variant(base: str, mode: str) -> str:
    """A failure-mode variant of the vLLM stand-in: the base image plus one file naming the mode."""
    tag = f"{base}-{mode}"
    if not image_exists(tag):
        with tempfile.TemporaryDirectory(prefix="sparkfleet-lab-vllm-") as tmp:
            (Path(tmp) / "mode").write_text(mode + "\n")
            (Path(tmp) / "Dockerfile").write_text(f"FROM {base}\nCOPY mode /etc/vllm-standin/mode\n")
            run(["docker", "build", "-q", "-t", tag, tmp], quiet=True)
    return tag


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def build(spec: ImageSpec) -> str:
    """Build `spec` unless an image with its content hash already exists; returns the tag."""
    if image_exists(spec.tag):
        return spec.tag
    log(f"building {spec.tag} ({spec.arch}, debootstrap {SUITE})")
    cache = DEB_CACHE / spec.arch  # one per arch: the two build lanes run at once
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sparkfleet-lab-root-") as tmp:
        root = Path(tmp) / "root"
        run(
            ["debootstrap", "--variant=minbase", f"--arch={spec.arch}", f"--cache-dir={cache}",
             f"--include={spec.packages}", SUITE, str(root)],
            quiet=True,
        )
        for path, data in spec.files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        run(["chroot", str(root), "/bin/sh", "-ec", spec.setup], quiet=True)
        changes = [f"CMD {json.dumps(spec.cmd)}"] if spec.cmd else []
        if spec.entrypoint:
            changes.append(f"ENTRYPOINT {json.dumps(spec.entrypoint)}")
        args = ["docker", "import", f"--platform=linux/{spec.arch}"]
        for change in changes:
            args += ["-c", change]
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        run([*args, "-", spec.tag], stdin=tar.stdout, quiet=True)
        tar.wait()
        shutil.rmtree(root, ignore_errors=True)
    return spec.tag
