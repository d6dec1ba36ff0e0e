"""The Spark lab (`python -m tests.lab up`) as a pyinfra inventory, with the groups of sparks.py.

Groups: `sparks` (every simulated Spark, the pairs' included), `lab_amd64` (the standalone Sparks that serve),
`lab_arm64` (emulated, stage only), `lab_blank` (bare Debian hosts reached as root, present only while a test adds
them), `lab_pair` (pair-01, the head, and pair-02, its worker: one endpoint served with tensor parallel across the
two, linked by the lab's fabric network; both carry the same `pair` variable) and `gateways` (the fleet's gateway:
HAProxy in front of the serving Sparks, a plain Debian host in none of the other groups).

Reads the state file the lab writes; the lab's values replace the stand-ins' production URLs.
"""

import json
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
_STATE = _REPO / ".lab" / "state.json"
if not _STATE.exists():
    raise SystemExit("inventory/lab.py: the lab is not up; run `python -m tests.lab up` first")
_lab = json.loads(_STATE.read_text())
# Per-host overrides for experiments and tests, e.g. {"spark-02": {"vllm_args": {"max-num-seqs": 2}}}.
_OVERRIDES = _REPO / ".lab" / "host_data.json"
_overrides = json.loads(_OVERRIDES.read_text()) if _OVERRIDES.exists() else {}


def _source(lab_host: dict, arm64: bool) -> dict:
    if arm64:
        return {"model_source": _lab["model_local_dir"]}
    if lab_host["name"] in ("spark-01", "spark-02") or lab_host.get("profile") == "pair":
        return {}
    return {"model_source": _lab["model_mirror_url"]}


def _host(lab_host: dict) -> tuple[str, dict]:
    arm64 = lab_host["arch"] == "arm64"
    # Endpoints listen on each host container's own address (the unit runs vLLM on the host's network), which
    # this machine reaches on the lab's Docker network; SSH goes through a published port instead.
    port = _overrides.get(lab_host["name"], {}).get("vllm_port", 8000)
    url = {"vllm_url": f"http://{lab_host['address']}:{port}"} if lab_host.get("address") else {}
    # Stock-shaped hosts (pairs too) are reached as a Spark is: the owner's sudo user (root does not log in over SSH).
    stock = lab_host.get("profile", "stock") in ("stock", "pair")
    return lab_host["name"], {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": lab_host["ssh_port"],
        "ssh_user": "admin" if stock else "root",
        "_sudo": stock,
        "ssh_key": _lab["ssh_key"],
        "ssh_known_hosts_file": "/dev/null",
        "ssh_strict_host_key_checking": "no",
        "lab_container": lab_host["container"],
        "nvidia_repo_url": _lab["nvidia_repo_url"],
        "nvidia_key_url": _lab["nvidia_key_url"],
        "nvidia_key_fingerprint": _lab["nvidia_key_fingerprint"],
        # The first two amd64 hosts and the pairs take the default source, the recipe's model on the Hub (the
        # lab's stand-in, through the real huggingface_hub client); spark-03 and blank hosts a mirror, the arm64
        # host (which cannot start containers, so cannot run the Hub download) the controller: every source is
        # staged on every deploy.
        **_source(lab_host, arm64),
        "hf_endpoint": _lab["hf_endpoint"],
        "vllm_api_key": "file:" + str(_REPO / ".lab" / "secrets" / "vllm_api_key"),
        # Containers cannot start under qemu-user emulation: stage everything, start nothing.
        "vllm_start": not arm64,
        "health_textfile_dir": "/var/lib/node_exporter/textfile_collector",
    } | url | _overrides.get(lab_host["name"], {})


def _gateway(lab_host: dict) -> tuple[str, dict]:
    return lab_host["name"], {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": lab_host["ssh_port"],
        "ssh_user": "admin",
        "_sudo": True,
        "ssh_key": _lab["ssh_key"],
        "ssh_known_hosts_file": "/dev/null",
        "ssh_strict_host_key_checking": "no",
        "lab_container": lab_host["container"],
        # Not an endpoint's port, so a client reaching the gateway is never mistaken for one reaching a Spark.
        "gateway_port": 8080,
        # Quick enough to see a Spark come and go within a lab test's patience.
        "gateway_check_interval_seconds": 2,
    } | _overrides.get(lab_host["name"], {})


def _pairs(lab_hosts: list[dict]) -> list[tuple[str, dict]]:
    """Each two pair hosts, head first, as one `pair`: the fabric interface and the head's address on it. Both take
    the default model source, like spark-01 and spark-02 (one model, one weights generation for the two)."""
    hosts = []
    for k, head in enumerate(lab_hosts[::2]):
        pair = {"name": "lab-pair" if k == 0 else f"lab-pair-{k + 1}", "head": head["name"],
                "interface": _lab["fabric_interface"], "master_addr": head["fabric_address"], "master_port": 29500}
        for lab_host in lab_hosts[2 * k:2 * k + 2]:
            name, data = _host(lab_host)
            hosts.append((name, data | {"pair": pair} | _overrides.get(name, {})))
    return hosts


_hosts = [_host(h) for h in _lab["hosts"]]
_pair_hosts = _pairs(_lab.get("pairs", []))
sparks = _hosts + _pair_hosts
gateways = [_gateway(h) for h in _lab.get("gateways", [])]
lab_amd64 = [name for name, data in _hosts if data["vllm_start"]]
lab_arm64 = [name for name, data in _hosts if not data["vllm_start"]]
lab_blank = [name for name, data in _hosts if data["ssh_user"] == "root"]
lab_pair = [name for name, _ in _pair_hosts[:2]]
