"""Start, stop and describe the lab: a network, a services container, the simulated Sparks, and a second network
(the fabric) that links the two hosts of each pair the way a Spark's ConnectX-7 port links two Sparks."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.lab import LAB_DIR, STATE_FILE, images, log, run
from tests.lab.standins import hub, model, nvidia_repo

NETWORK = "sparkfleet-lab"
LABEL = "sparkfleet-lab=1"
PREFIX = "sparkfleet-lab-"
SERVICES = f"{PREFIX}services"
SERVICE_ALIASES = ("registry.lab", "nvidia.lab", "mirror.lab", "hub.lab")
WWW = LAB_DIR / "www"
SSH_KEY = LAB_DIR / "ssh" / "id_ed25519"
MODEL_NAME = "qwen3.6-35b-a3b-standin"
MODEL_BYTES = int(os.environ.get("SPARKFLEET_LAB_MODEL_BYTES", str(1 << 30)))
BOOT_TIMEOUT = 240
# The Hub stand-in (standins/hub.py; lab_services.sh starts it on HUB_PORT): the default recipe's model with
# branches `main` and `next`, and a gated copy that only HUB_TOKEN may download.
HUB_PORT = 8080
HUB_MANIFEST = WWW / "hub" / "repos.json"
HUB_GATED_REPO = "lab/gated-model"
HUB_TOKEN = "hf_lab_gated_token"
HF_TOKEN_FILE = LAB_DIR / "secrets" / "hf_token"
# The pairs' fabric: fixed addresses (a pair's master_addr is its head's), and inside each host the interface
# named as a Spark names its first ConnectX-7 port, so NCCL_SOCKET_IFNAME and friends name what a Spark has.
FABRIC = f"{PREFIX}fabric"
FABRIC_SUBNET = ipaddress.ip_network("192.168.100.0/24")
FABRIC_INTERFACE = "enp1s0f0np0"
FIRST_FABRIC_HOST = 10  # pair-01 is 192.168.100.10, pair-02 .11, ...


# The toolkit version a stock Spark ships with (DGX OS 7, 2026), preinstalled from NVIDIA's repository.
STOCK_TOOLKIT = "1.19.0-1"
STANDINS = Path(__file__).parent / "standins"
# The scripts that shape a new host of each profile, run in order (blank hosts are left as the image made them).
PROFILE_SCRIPTS = {"stock": (STANDINS / "sudo_user.sh", STANDINS / "stock_spark.sh"),
                   "pair": (STANDINS / "sudo_user.sh", STANDINS / "stock_spark.sh"),
                   "gateway": (STANDINS / "sudo_user.sh", STANDINS / "gateway_host.sh")}
OWNER_IMAGE = "lab/owner-webui:1"  # in the lab registry: a container sparkfleet does not own


@dataclass
class LabHost:
    """One lab host. `stock`: a simulated Spark shaped like a DGX OS Spark, reached as `admin` with sudo; `pair`:
    a stock Spark cabled to another one (an address on the fabric); `blank`: a bare Debian host reached as root
    (the from-scratch path); `gateway`: a plain Debian server for the fleet's gateway (no GPU stand-in in use),
    reached as `admin` with sudo, with Debian's archive as its apt source."""

    name: str
    arch: str
    container: str
    ssh_port: int
    profile: str = "stock"
    address: str = ""  # on the lab network, where its endpoint listens (host network in the host); "" in old state
    fabric_address: str = ""  # a pair host's address on the fabric, on FABRIC_INTERFACE inside the host

    @property
    def user(self) -> str:
        return "root" if self.profile == "blank" else "admin"

    def stock_settings(self) -> dict[str, str]:
        """How this stock host's owner set it up: hosts differ the way real Sparks do."""
        first = self.name in ("spark-01", "spark-arm64-01")
        return {
            "TOOLKIT_VERSION": STOCK_TOOLKIT,
            "SET_AS_DEFAULT": "yes" if first else "no",
            "RUNTIME_PATH": "/usr/bin/nvidia-container-runtime" if self.name == "spark-02" else "",
            # Containers do not start on emulated arm64 hosts.
            "OWNER_IMAGE": f"registry.lab:5000/{OWNER_IMAGE}" if first and self.arch == "amd64" else "",
        }


@dataclass
class LabState:
    """What `up` started, as inventory/lab.py and the tests read it."""

    hosts: list[LabHost] = field(default_factory=list)  # the standalone simulated Sparks
    pairs: list[LabHost] = field(default_factory=list)  # Sparks cabled in twos, head first (pair-01 and pair-02, ...)
    fabric_interface: str = FABRIC_INTERFACE
    gateways: list[LabHost] = field(default_factory=list)  # the fleet's gateway hosts (group `gateways`)
    ssh_key: str = str(SSH_KEY)
    registry_port: int = 0
    vllm_tags: list[str] = field(default_factory=list)
    nvidia_repo_url: str = "http://nvidia.lab/libnvidia-container/stable/deb/$(ARCH)"
    nvidia_key_url: str = "http://nvidia.lab/libnvidia-container/gpgkey"
    nvidia_key_fingerprint: str = ""
    # The mirror, like the Hub, at the services' address: the controller reads its SHA256SUMS, the Sparks its files.
    model_mirror_url: str = ""
    model_local_dir: str = str(WWW / "models" / MODEL_NAME)
    # The Hub stand-in at its address on the lab network, which lab hosts and this machine both reach: the
    # controller resolves revisions with the same `hf_endpoint` the Sparks download from.
    hf_endpoint: str = ""
    hub_url: str = ""  # the same, as this machine reaches it (a port published on 127.0.0.1)
    hub_model_repo: str = ""  # the default recipe's model id; branches `main` and `next`
    hub_gated_repo: str = HUB_GATED_REPO
    hf_token_file: str = str(HF_TOKEN_FILE)  # the token the gated repository accepts

    def host(self, name: str) -> LabHost:
        """The host called `name`: tests name the host they change."""
        for host in self.every:
            if host.name == name:
                return host
        names = ", ".join(h.name for h in self.every)
        raise LookupError(f"the lab has no host {name} (it has {names})")

    @property
    def every(self) -> list[LabHost]:
        return [*self.hosts, *self.pairs, *self.gateways]

    def save(self) -> None:
        STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
        STATE_FILE.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls) -> LabState | None:
        if not STATE_FILE.exists():
            return None
        data = json.loads(STATE_FILE.read_text())
        data["hosts"] = [LabHost(**host) for host in data["hosts"]]
        data["pairs"] = [LabHost(**host) for host in data.get("pairs", [])]
        data["gateways"] = [LabHost(**host) for host in data.get("gateways", [])]
        return cls(**data)


def require_tools(arm64: bool) -> None:
    """Fail with what to install, rather than with a traceback from deep inside a build."""
    needed = {"docker": "docker.io", "debootstrap": "debootstrap", "ssh-keygen": "openssh-client",
              "dpkg-deb": "dpkg", "gpg": "gnupg", "rsync": "rsync"}
    if arm64:
        needed["qemu-aarch64-static"] = "qemu-user-static binfmt-support"
    missing = sorted({pkg for tool, pkg in needed.items() if shutil.which(tool) is None})
    if missing:
        raise SystemExit(f"lab: missing system tools; install them with: apt-get install -y {' '.join(missing)}")
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        raise SystemExit("lab: the Docker engine does not answer; start it: dockerd >/var/log/dockerd.log 2>&1 &")
    if arm64 and not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        raise SystemExit(
            "lab: arm64 emulation is not registered; run `mount -t binfmt_misc binfmt_misc "
            "/proc/sys/fs/binfmt_misc; update-binfmts --enable qemu-aarch64`"
        )


def _container_state(name: str) -> tuple[str, str] | None:
    """(status, config label) of a container, or None when it does not exist."""
    result = subprocess.run(
        ["docker", "inspect", "-f", '{{.State.Status}} {{index .Config.Labels "sparkfleet-lab.config"}}', name],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        return None
    status, _, config = result.stdout.strip().partition(" ")
    return status, config


def _ensure_container(name: str, image: str, args: list[str], extra: str = "") -> None:
    """Start `name` unless it already runs with this image and these arguments (`up` is idempotent).

    `extra` is more of what the container is made from (a host's provisioning): a change recreates it,
    its Docker volume included, so a re-provisioned host starts as new.
    """
    config = hashlib.sha256(json.dumps([image, args, extra]).encode()).hexdigest()[:16]
    state = _container_state(name)
    if state == ("running", config):
        return
    if state is not None and state[1] == config:
        run(["docker", "start", name], quiet=True)
        return
    if state is not None:
        _remove(name)
    log(f"starting {name}")
    run(["docker", "run", "-d", "--name", name, "--label", LABEL, "--label", f"sparkfleet-lab.config={config}",
         *args, image], quiet=True)


def _address(container: str) -> str:
    """The container's IP address on the lab network, which this machine reaches directly (a Docker bridge)."""
    template = f'{{{{(index .NetworkSettings.Networks "{NETWORK}").IPAddress}}}}'
    return run(["docker", "inspect", "-f", template, container], quiet=True).stdout.decode().strip()


def _published_port(container: str, port: int) -> int:
    out = run(["docker", "port", container, f"{port}/tcp"], quiet=True).stdout.decode()
    return int(out.splitlines()[0].rsplit(":", 1)[1])


def _prepare_www() -> str:
    """Lay out the stand-in NVIDIA repository, the model mirror and the Hub's repositories; returns the key's
    fingerprint."""
    repo_dir = WWW / "libnvidia-container"
    stamp = repo_dir / ".lab-inputs"
    inputs = images.tree_hash(nvidia_repo.STANDINS_DIR, Path(nvidia_repo.__file__))
    if not stamp.exists() or stamp.read_text() != inputs:
        log("building the stand-in NVIDIA apt repository")
        nvidia_repo.build_repo(repo_dir, LAB_DIR / "gnupg")
        stamp.write_text(inputs)
    model_dir = WWW / "models" / MODEL_NAME
    stamp = model_dir / ".lab-generated"
    if not stamp.exists() or stamp.read_text() != str(MODEL_BYTES):
        log(f"generating the model stand-in ({MODEL_BYTES >> 20} MiB)")
        shutil.rmtree(model_dir, ignore_errors=True)
        model.generate_checkpoint(model_dir, total_bytes=MODEL_BYTES)
        model.write_sha256sums(model_dir)
        stamp.write_text(str(MODEL_BYTES))
    _prepare_hub(model_dir)
    return nvidia_repo.ensure_signing_key(LAB_DIR / "gnupg")


def hub_model_repo() -> str:
    """The model id of the default recipe: what a host with the default `model_source` downloads."""
    from sparkfleet.config import SparkConfig
    from sparkfleet.recipes import load_recipes

    return load_recipes()[SparkConfig.model_fields["vllm_recipe"].default].model.id


def _prepare_hub(model_dir: Path) -> None:
    """Describe the Hub stand-in's repositories (hashes of the model's files, computed once per model)."""
    inputs = json.dumps([images.tree_hash(Path(hub.__file__)), MODEL_BYTES, hub_model_repo(), HUB_GATED_REPO,
                         HUB_TOKEN])
    stamp = HUB_MANIFEST.with_name(".lab-inputs")
    if not HUB_MANIFEST.exists() or not stamp.exists() or stamp.read_text() != inputs:
        log("describing the Hub stand-in's repositories")
        repos = hub.lab_repos(WWW, model_dir, hub_model_repo(), HUB_GATED_REPO)
        hub.write_manifest(WWW, repos, HUB_MANIFEST, hub_model_repo(), [HUB_TOKEN])
        stamp.write_text(inputs)
    if not HF_TOKEN_FILE.exists() or HF_TOKEN_FILE.read_text().strip() != HUB_TOKEN:
        HF_TOKEN_FILE.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        HF_TOKEN_FILE.write_text(HUB_TOKEN + "\n")
        HF_TOKEN_FILE.chmod(0o600)


def _api_key() -> None:
    """The lab's endpoints always require a key, so the authenticated path is what the tests exercise."""
    path = LAB_DIR / "secrets" / "vllm_api_key"
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(24) + "\n")
        path.chmod(0o600)


def _ssh_key() -> None:
    if not SSH_KEY.exists():
        SSH_KEY.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparkfleet-lab", "-f", str(SSH_KEY)])


def _start_services(state: LabState, vllm_base: str) -> None:
    """Run the registry + HTTP + Hub container and push the vLLM stand-in under its production names.

    The Hub stand-in reads its manifest once, at start: a new manifest recreates the container.
    """
    aliases = [arg for alias in SERVICE_ALIASES for arg in ("--network-alias", alias)]
    _ensure_container(
        SERVICES, images.build(images.service_spec()),
        ["--network", NETWORK, *aliases, "-p", "127.0.0.1::5000", "-p", f"127.0.0.1::{HUB_PORT}",
         "-v", f"{WWW}:/srv/www:ro"],
        extra=hashlib.sha256(HUB_MANIFEST.read_bytes()).hexdigest(),
    )
    state.registry_port = _published_port(SERVICES, 5000)
    state.hub_url = f"http://127.0.0.1:{_published_port(SERVICES, HUB_PORT)}"
    state.hub_model_repo = hub_model_repo()
    services = _address(SERVICES)
    state.hf_endpoint = f"http://{services}:{HUB_PORT}"
    state.model_mirror_url = f"http://{services}/models/{MODEL_NAME}"
    _wait_hub(state.hub_url)
    for tag in state.vllm_tags:
        source = images.vllm_variant(vllm_base, images.VLLM_MODES[_suffix(tag)]) if _suffix(tag) else vllm_base
        remote = f"localhost:{state.registry_port}/vllm/vllm-openai:{tag}"
        run(["docker", "tag", source, remote], quiet=True)
        _retry(lambda remote=remote: run(["docker", "push", remote], quiet=True), "registry push")
    # The owner's own app on stock hosts: any small image does; the vLLM stand-in's base has python3.
    remote = f"localhost:{state.registry_port}/{OWNER_IMAGE}"
    run(["docker", "tag", vllm_base, remote], quiet=True)
    _retry(lambda: run(["docker", "push", remote], quiet=True), "registry push")


def _wait_hub(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_lab/stats", timeout=5):
                return
        except OSError as error:
            if time.monotonic() > deadline:
                logs = run(["docker", "logs", "--tail", "20", SERVICES], quiet=True, check=False)
                raise SystemExit(f"lab: the Hub stand-in does not answer at {url} ({error}):\n"
                                 f"{(logs.stdout + logs.stderr).decode(errors='replace')}") from error
            time.sleep(0.5)


def _suffix(tag: str) -> str:
    return next((suffix for suffix in images.VLLM_MODES if suffix and tag.endswith(suffix)), "")


def _retry(action, what: str, attempts: int = 30, delay: float = 1.0):  # noqa: ANN001, ANN202
    for attempt in range(attempts):
        try:
            return action()
        except RuntimeError:
            if attempt == attempts - 1:
                raise
            time.sleep(delay)
    raise AssertionError(what)


# A DGX Spark's 128 GB of unified memory as /proc/meminfo shows it (the lab VM has far less). runc lets
# exactly this file be bind-mounted over /proc (it is one of the files lxcfs virtualises).
MEMINFO = """MemTotal:       125829120 kB
MemFree:        118489088 kB
MemAvailable:   121634816 kB
Buffers:          262144 kB
Cached:          2097152 kB
SwapCached:            0 kB
SwapTotal:             0 kB
SwapFree:              0 kB
"""


def _meminfo(host: LabHost) -> Path:
    path = LAB_DIR / "hosts" / host.name / "meminfo"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(MEMINFO)
    return path


def _provisioning(host: LabHost) -> str:
    """What a host's profile is made from, for its container's config hash."""
    scripts = [path.read_text() for path in PROFILE_SCRIPTS.get(host.profile, ())]
    if host.profile == "pair":
        return json.dumps([host.profile, host.stock_settings(), scripts, host.fabric_address])
    if host.profile != "stock":
        return json.dumps([host.profile, scripts]) if scripts else host.profile
    return json.dumps([host.stock_settings(), scripts])


def _start_host(host: LabHost, image: str) -> None:
    root_key = ["-v", f"{SSH_KEY}.pub:/root/.ssh/authorized_keys:ro"] if host.profile == "blank" else []
    _ensure_container(
        host.container, image,
        [
            "--hostname", host.name, "--network", NETWORK, "--network-alias", host.name,
            "--cap-add=ALL", "--cap-drop=SYS_RESOURCE",
            "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
            "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock",
            "-v", f"{host.container}-docker:/var/lib/docker",
            *root_key,
            "-v", f"{_meminfo(host)}:/proc/meminfo:ro",
            "-p", "127.0.0.1::22",
        ],
        extra=_provisioning(host),
    )
    host.ssh_port = _published_port(host.container, 22)
    host.address = _address(host.container)
    if host.fabric_address:
        _join_fabric(host)


def _join_fabric(host: LabHost) -> None:
    """Cable a pair host: the fabric at its fixed address, the interface renamed as on a Spark. Docker names it
    ethN again whenever the container starts, so every `up` checks."""
    networks = run(["docker", "inspect", "-f", "{{json .NetworkSettings.Networks}}", host.container], quiet=True)
    if FABRIC not in json.loads(networks.stdout):
        run(["docker", "network", "connect", "--ip", host.fabric_address, FABRIC, host.container], quiet=True)
    rename = (f"dev=$(ip -o -4 addr show to {host.fabric_address}/32 | awk '{{print $2}}'); "
              f'[ -n "$dev" ] || {{ echo "no interface holds {host.fabric_address}" >&2; exit 1; }}; '
              f'[ "$dev" = {FABRIC_INTERFACE} ] || {{ ip link set dev "$dev" down && '
              f'ip link set dev "$dev" name {FABRIC_INTERFACE} && ip link set dev {FABRIC_INTERFACE} up; }}')
    run(["docker", "exec", host.container, "sh", "-c", rename], quiet=True)


def _wait_ready(host: LabHost) -> None:
    """Wait until systemd finished booting and the host's own dockerd answers."""
    deadline = time.monotonic() + BOOT_TIMEOUT
    while time.monotonic() < deadline:
        boot = subprocess.run(
            ["docker", "exec", host.container, "systemctl", "is-system-running"], capture_output=True, text=True
        ).stdout.strip()
        docker = subprocess.run(["docker", "exec", host.container, "docker", "info"], capture_output=True)
        if boot in ("running", "degraded") and docker.returncode == 0:
            return
        time.sleep(1)
    raise SystemExit(f"lab: {host.name} did not boot within {BOOT_TIMEOUT} s (systemd: {boot})")


def _provision(host: LabHost) -> None:
    """Shape a freshly started host like its profile says (a stock Spark as its owner left it, a gateway's
    server), once per container."""
    if host.profile not in PROFILE_SCRIPTS or subprocess.run(
            ["docker", "exec", host.container, "test", "-f", "/var/lib/sparkfleet-lab/profile"]).returncode == 0:
        return
    log(f"shaping {host.name} like {'a gateway server' if host.profile == 'gateway' else 'a stock DGX OS Spark'}")
    env = {**host.stock_settings(), "NVIDIA_BASE": "http://nvidia.lab/libnvidia-container"}
    script = "\n".join(path.read_text() for path in PROFILE_SCRIPTS[host.profile])
    run(["docker", "exec", "-i", *(f"--env={key}={value}" for key, value in env.items()), host.container,
         "sh", "-c", script], quiet=True, input=Path(f"{SSH_KEY}.pub").read_bytes())


def plan_hosts(amd64: int, arm64: int, blank: int = 0) -> list[LabHost]:
    hosts = [LabHost(f"spark-{i:02d}", "amd64", f"{PREFIX}spark-{i:02d}", 0) for i in range(1, amd64 + 1)]
    hosts += [
        LabHost(f"spark-arm64-{i:02d}", "arm64", f"{PREFIX}spark-arm64-{i:02d}", 0) for i in range(1, arm64 + 1)
    ]
    hosts += [
        LabHost(f"spark-blank-{i:02d}", "amd64", f"{PREFIX}spark-blank-{i:02d}", 0, "blank")
        for i in range(1, blank + 1)
    ]
    return hosts


def plan_pairs(count: int) -> list[LabHost]:
    """`count` pairs of stock-shaped amd64 Sparks, head then worker, each with its fixed fabric address."""
    return [
        LabHost(f"pair-{i:02d}", "amd64", f"{PREFIX}pair-{i:02d}", 0, "pair",
                fabric_address=str(FABRIC_SUBNET.network_address + FIRST_FABRIC_HOST + i - 1))
        for i in range(1, 2 * count + 1)
    ]


def plan_gateways(count: int) -> list[LabHost]:
    return [LabHost(f"gateway-{i:02d}", "amd64", f"{PREFIX}gateway-{i:02d}", 0, "gateway") for i in range(1, count + 1)]


def up(amd64: int = 3, arm64: int = 1, vllm_tags: list[str] | None = None, blank: int = 0,
       gateways: int = 1, pairs: int = 1) -> LabState:
    """Bring the lab to the wanted shape; reuses images, containers and generated data that exist.

    The default fleet is stock-shaped Sparks, one pair of them cabled by the fabric, and one gateway host; `blank`
    adds bare Debian hosts for the from-scratch path. Pair hosts run the standalone hosts' image.
    """
    require_tools(arm64 > 0)
    _ssh_key()
    state = LabState(hosts=plan_hosts(amd64, arm64, blank), pairs=plan_pairs(pairs),
                     gateways=plan_gateways(gateways), vllm_tags=vllm_tags or default_vllm_tags())
    state.nvidia_key_fingerprint = _prepare_www()
    _api_key()
    if subprocess.run(["docker", "network", "inspect", NETWORK], capture_output=True).returncode != 0:
        run(["docker", "network", "create", "--label", LABEL, NETWORK], quiet=True)
    if state.pairs and subprocess.run(["docker", "network", "inspect", FABRIC], capture_output=True).returncode != 0:
        run(["docker", "network", "create", "--label", LABEL, "--subnet", str(FABRIC_SUBNET), FABRIC], quiet=True)
    # Two build lanes: emulated arm64 builds are slow and CPU-bound, so they overlap the amd64 ones.
    with ThreadPoolExecutor(max_workers=2) as pool:
        foreign = {arch: pool.submit(images.build, images.host_spec(arch))
                   for arch in {h.arch for h in state.hosts} if arch != "amd64"}
        _start_services(state, images.build(images.vllm_spec()))
        host_images = {"amd64": images.build(images.host_spec("amd64"))}
        host_images |= {arch: future.result() for arch, future in foreign.items()}
    every = state.every
    for host in every:
        _start_host(host, host_images[host.arch])
    _remove_unplanned(state)
    for host in every:
        _wait_ready(host)
    with ThreadPoolExecutor(max_workers=len(every) or 1) as pool:
        list(pool.map(_provision, every))
    state.save()
    return state


def reset(names: list[str]) -> LabState:
    """Give these hosts back as new (a fresh container and Docker volume), the rest of the lab untouched."""
    current = LabState.load()
    assert current is not None, "the lab is not up"
    for host in current.every:
        if host.name in names:
            _remove(host.container)
    counts = {profile: [h for h in current.hosts if h.profile == profile] for profile in ("stock", "blank")}
    arm64 = sum(h.arch == "arm64" for h in counts["stock"])
    return up(len(counts["stock"]) - arm64, arm64, current.vllm_tags, len(counts["blank"]), len(current.gateways),
              len(current.pairs) // 2)


def _remove(container: str) -> None:
    run(["docker", "rm", "-f", "-v", container], quiet=True)
    run(["docker", "volume", "rm", "-f", f"{container}-docker"], quiet=True, check=False)


def _lab_containers() -> list[str]:
    out = run(["docker", "ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}"], quiet=True)
    return out.stdout.decode().split()


def _remove_unplanned(state: LabState) -> None:
    """A lab resized to fewer hosts drops the extra ones, so the inventory matches what runs."""
    planned = {host.container for host in state.every} | {SERVICES}
    for name in _lab_containers():
        if name not in planned:
            _remove(name)


def down() -> None:
    """Remove every container, volume and network the lab started, and nothing else."""
    for name in _lab_containers():
        _remove(name)
    for network in (NETWORK, FABRIC):
        run(["docker", "network", "rm", network], quiet=True, check=False)
    STATE_FILE.unlink(missing_ok=True)


def default_vllm_tags() -> list[str]:
    """Every image tag the shipped recipes name, plus the failure-mode variants of each."""
    from sparkfleet.recipes import load_recipes

    tags = sorted({recipe.image.split(":", 1)[1] for recipe in load_recipes().values()})
    return [tag + suffix for tag in tags for suffix in images.VLLM_MODES]
