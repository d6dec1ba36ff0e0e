"""Inventory variables: the one home of their defaults, types and documentation.

Every variable sparkfleet reads is a field of `SparkConfig` (a Spark) or `GatewayConfig` (a host in the
`gateways` group); README's table is generated from both (`python -m sparkfleet vars`) and a test keeps it equal.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, ValidationError

from sparkfleet.recipes import FlagValue, load_recipes

PREFIXES = ("vllm_", "model_", "nvidia_", "health_", "weights_", "hf_")
NAMES = ("pair",)  # a Spark's variables without one of the prefixes
GATEWAY_PREFIXES = ("gateway_",)


def _secret_ref(value: str) -> str:
    """Secrets are referenced, never written into inventory: `env:NAME` or `file:/path`."""
    kind, _, rest = value.partition(":")
    if kind not in ("env", "file") or not rest:
        raise ValueError(
            "secrets are never written into inventory; give `env:VARIABLE` (read from the controller's "
            "environment) or `file:/path/outside/git`"
        )
    return value


def _absolute(value: str) -> str:
    if not PurePosixPath(value).is_absolute():
        raise ValueError(f"{value!r} is relative; give an absolute path on the Spark's local NVMe, e.g. "
                         "/var/lib/sparkfleet/models/qwen3.6")
    return value


# What RFC 3986 lets a URL hold as written (anything else is percent-encoded), less the single quote.
_URL_TEXT = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]*")
ARCH = "$(ARCH)"  # apt expands it in a repository URL (and nothing else)


def _web_url(value: str, expands: str = "") -> str:
    """An http(s) URL with a host, holding only characters a URL may hold; `expands` is a variable left for
    the consumer (apt's $(ARCH)). Values stay plain strings: the deploy quotes them wherever they meet a shell."""
    try:
        parts = urlsplit(value)
        scheme, host = parts.scheme, parts.hostname
    except ValueError:
        scheme = host = None
    if scheme not in ("http", "https") or not host:
        raise ValueError("not an http(s) URL with a host; give e.g. https://mirror.lan/path")
    text = value.replace(expands, "") if expands else value
    if not _URL_TEXT.fullmatch(text):
        shown = next(char for char in text if not _URL_TEXT.fullmatch(char))
        raise ValueError(f"{shown!r} cannot stand in a URL as written; percent-encode it")
    if "$(" in text:
        where = f"only {expands} is expanded (by apt)" if expands else "it is fetched as written (no $(ARCH) here)"
        raise ValueError(f"a `$(...)` variable here is never expanded: {where}")
    return value


def _apt_repo_url(value: str) -> str:
    return _web_url(value, expands=ARCH)


_HUB_REPO = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # `name` or `org/name`, as the Hub spells them


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from, parsed once from `model_source`; each consumer asks its kind, not its text.

    mirror: an http(s) base URL whose SHA256SUMS lists every file; controller: a directory on the machine
    running sparkfleet, rsynced over SSH; hub: `hf://org/name@revision`, downloaded by huggingface_hub.
    """

    kind: Literal["mirror", "controller", "hub"]
    url: str | None = None  # mirror; each part is None for the other kinds, so a misread fails loudly
    path: str | None = None  # controller
    repo: str | None = None  # hub: org/name
    revision: str | None = None  # hub: branch, tag or commit

    @classmethod
    def parse(cls, text: str) -> ModelSource:
        """The source `text` names; ValueError, saying which forms exist, for anything else."""
        if text.startswith(("http://", "https://")):
            return cls("mirror", url=_web_url(text))
        if text.startswith("hf://"):
            repo, at, revision = text.removeprefix("hf://").rpartition("@")
            if not (at and _HUB_REPO.fullmatch(repo) and revision and not any(c.isspace() for c in revision)):
                raise ValueError(f"{text!r} does not name a Hub repository and revision; give "
                                 "hf://org/name@revision (a branch, tag or commit)")
            return cls("hub", repo=repo, revision=revision)
        if PurePosixPath(text).is_absolute():
            return cls("controller", path=text)
        raise ValueError(f"{text!r} is not a model source; use hf://org/name@revision, an http(s) mirror URL "
                         "or an absolute directory on the controller")

    @property
    def sums_url(self) -> str:
        """A mirror's SHA256SUMS: every file of the checkpoint with its sha256."""
        if self.url is None:
            raise ValueError(f"{self} is not a mirror: it has no SHA256SUMS")
        return self.url.rstrip("/") + "/SHA256SUMS"

    def __str__(self) -> str:
        return f"hf://{self.repo}@{self.revision}" if self.kind == "hub" else str(self.url or self.path)


def _model_source(value: object) -> ModelSource | None:
    if value is None or isinstance(value, ModelSource):
        return value
    if not isinstance(value, str):
        raise ValueError("give the source as a string: hf://org/name@revision, an http(s) mirror URL or an "
                         "absolute directory on the controller")
    return ModelSource.parse(value)


def _ip_address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address; give the head's address on the fabric interface, "
                         "e.g. 192.168.100.10 (vLLM's --master-addr)") from None


class Pair(BaseModel):
    """Two Sparks serving one model with tensor parallel across them (vLLM's --nnodes 2 without Ray): both hosts
    carry this same mapping, normally set once as group data for the pair's group."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                      description="Names the pair: its endpoint in `sparkfleet status` and rollouts.")
    head: str = Field(min_length=1, description="Inventory name of the head: it serves the endpoint (node rank 0).")
    interface: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,14}$",
                           description="Fabric interface (ConnectX-7) NCCL, Gloo and vLLM's sockets are pinned to.")
    master_addr: Annotated[str, AfterValidator(_ip_address)] = Field(
        description="The head's address on that interface (--master-addr).")
    master_port: int = Field(29500, ge=1024, le=65535, description="The head's rendezvous port (--master-port).")
    ib_hca: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")]] = Field(
        default_factory=list, description="RoCE devices of the port (NCCL_IB_HCA, both of them); empty leaves it "
        "unset.")


SecretRef = Annotated[str, AfterValidator(_secret_ref)]
AbsolutePath = Annotated[str, AfterValidator(_absolute)]
WebUrl = Annotated[str, AfterValidator(_web_url)]  # http(s), as curl fetches it
AptRepoUrl = Annotated[str, AfterValidator(_apt_repo_url)]  # http(s), $(ARCH) left for apt


class SparkConfig(BaseModel):
    """The inventory variables of one Spark, after host, group and `--data` values are merged."""

    model_config = ConfigDict(extra="forbid")

    vllm_recipe: str = Field(
        "qwen3.6-35b-a3b-nvfp4", description="Serving recipe (image, model, flags) to start from.",
        examples=["qwen3.6-35b-a3b-fp8"])
    vllm_args: dict[str, FlagValue | None] = Field(
        default_factory=dict, description="vLLM flags overriding the recipe's, without leading dashes; "
        "`_` and `-` are the same; null removes a recipe flag.", examples=[{"max-num-seqs": 8}])
    vllm_image: str | None = Field(
        None, description="Image overriding the recipe's, by tag or digest.",
        examples=["vllm/vllm-openai:v0.28.0@sha256:…"])
    vllm_validated_images: list[str] = Field(
        default_factory=list, description="Images (tag or @sha256 digest) your GB10 canary served this recipe with; "
        "an image in neither this list nor the recipe's gets a warning, a recipe's known-bad image an error.",
        examples=[["vllm/vllm-openai@sha256:…"]])
    vllm_port: int = Field(8000, ge=1, le=65535, description="Port the endpoint serves on (host network).",
                           examples=[8001])
    vllm_url: WebUrl | None = Field(
        None, description="URL clients (and `sparkfleet bench`) use to reach this endpoint; default "
        "`http://<ssh_hostname or host name>:<vllm_port>`.", examples=["http://spark-01.lan:8000"])
    vllm_served_model_name: str | None = Field(
        None, description="Model name clients send; defaults to the recipe's model id.", examples=["qwen"])
    vllm_start: bool = Field(
        True, description="Start the endpoint; false installs and stages everything but starts nothing "
        "(pre-staging a fleet, emulated hosts).", examples=[False])
    vllm_bench_gate: bool = Field(
        False, description="Gate every rollout batch on a bench of this host against its last known-good record, "
        "as `sparkfleet rollout --bench` does: a drop in tokens/s or MTP acceptance rolls the batch back.",
        examples=[True])
    vllm_api_key: SecretRef | None = Field(
        None, description="Where the endpoint's API key comes from; it reaches the Spark only in a root-only "
        "env file.", examples=["env:SPARKFLEET_VLLM_API_KEY"])
    hf_token: SecretRef | None = Field(
        None, description="Where the Hugging Face token comes from (hf:// sources of gated models).",
        examples=["file:~/.config/sparkfleet/hf_token"])
    model_source: Annotated[ModelSource | None, PlainValidator(_model_source)] = Field(
        None, description="Where weights come from: hf://org/name@revision on the Hub (the default: the recipe's "
        "model at its pinned revision; a branch is resolved to a commit at deploy time), an http(s) mirror with "
        "SHA256SUMS, or a directory on the controller.", examples=["hf://nvidia/Qwen3.6-35B-A3B-NVFP4@main"])
    hf_endpoint: WebUrl | None = Field(
        None, description="Hugging Face Hub endpoint (HF_ENDPOINT) for hf:// sources: a mirror or proxy of the "
        "Hub; default https://huggingface.co.", examples=["http://hf-mirror.lan"])
    model_dir: AbsolutePath = Field(
        "/var/lib/sparkfleet/models", description="Directory on the Spark's local NVMe holding one "
        "subdirectory per model.", examples=["/srv/models"])
    weights_keep: int = Field(
        2, ge=1, description="Generations of a model's weights kept on a Spark (the served one, and the one a "
        "rollback goes back to, are kept regardless).", examples=[3])
    weights_fanout: bool = Field(
        True, description="Sparks copy weights from a Spark that already holds them verified (tree-shaped, about "
        "log2(N) rounds) instead of each fetching them from the source; false: each fetches from the source.",
        examples=[False])
    weights_share_port: int = Field(
        8790, ge=1, le=65535, description="Port on which each Spark serves its verified weights, read-only, to "
        "the other Sparks of the fleet (fan-out).", examples=[18790])
    peer_address: str | None = Field(
        None, pattern=r"^[A-Za-z0-9.:\[\]-]+$", description="Address the other Sparks reach this one at for "
        "fan-out (the Spark-to-Spark network); default the host of vllm_url, else ssh_hostname.",
        examples=["10.0.0.11"])
    weights_verify: Literal["fast", "full"] = Field(
        "fast", description="`fast` checks presence, sizes and mtimes against the staging manifest; `full` "
        "re-hashes every file and repairs what differs.", examples=["full"])
    nvidia_repo_url: AptRepoUrl = Field(
        "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)",
        description="NVIDIA Container Toolkit apt repository; apt expands $(ARCH).",
        examples=["http://apt-mirror.lan/libnvidia-container/stable/deb/$(ARCH)"])
    nvidia_key_url: WebUrl = Field(
        "https://nvidia.github.io/libnvidia-container/gpgkey", description="Signing key of that repository.",
        examples=["http://apt-mirror.lan/libnvidia-container/gpgkey"])
    nvidia_key_fingerprint: str = Field(
        "C95B321B61E88C1809C4F759DDCAE044F796ECB0", pattern=r"^[0-9A-F]{40}$",
        description="Fingerprint the downloaded key must have; a rotated or swapped key stops the run.",
        examples=["C95B321B61E88C1809C4F759DDCAE044F796ECB0"])
    nvidia_toolkit_version: str = Field(
        "1.19.0-1", pattern=r"^[0-9][0-9A-Za-z.+~-]*$", description="Debian version all four toolkit packages "
        "are pinned to and held at (a GB10 freeze was reported with 1.19.1 and CDI, cause not isolated: toolkit "
        "#1910).", examples=["1.19.1-1"])
    nvidia_cdi: bool | None = Field(
        None, description="CDI in dockerd (`features.cdi`): null leaves the host's setting alone; false turns it "
        "off for real (`features.cdi: false` and the runtime's legacy mode); true turns it on. A change restarts "
        "dockerd.", examples=[False])
    nvidia_default_runtime: bool | None = Field(
        None, description="`nvidia` as dockerd's default runtime: null leaves the host's setting alone (a stock "
        "Spark may have it on, and its other containers rely on it).", examples=[True])
    nvidia_docker_restart: bool = Field(
        False, description="Allow a dockerd restart (needed only for a CDI change or a first toolkit install) "
        "while containers sparkfleet does not own are running; it stops and restarts them.", examples=[True])
    pair: Pair | None = Field(
        None, description="Two Sparks serving one model with tensor parallel 2 across them: both carry this same "
        "mapping (`name`, `head`, fabric `interface`, the head's `master_addr` on it; `master_port` 29500, "
        "`ib_hca` [] by default); the head serves the endpoint. See Pairs.",
        examples=[{"name": "pair-a", "head": "spark-05", "interface": "enp1s0f0np0",
                   "master_addr": "192.168.100.10"}])
    health_interval_seconds: int = Field(30, ge=5, description="How often the health timer probes.",
                                         examples=[60])
    health_alert_after: int = Field(3, ge=1, description="Consecutive failures before an alert.", examples=[5])
    health_deep_every: int = Field(
        10, ge=1, description="Every Nth probe also sends a 1-token completion (catches a hung engine).",
        examples=[4])
    health_renotify_minutes: int = Field(
        60, ge=0, description="Repeat an open alert (journal and webhook) this often while the endpoint stays "
        "unhealthy; 0 alerts once per incident.", examples=[240])
    health_min_mem_available_gib: float = Field(
        4.0, ge=0, description="Alert when the host's MemAvailable falls below this many GiB (CPU and GPU share "
        "unified memory; hosts wedge when it runs out); 0 disables.", examples=[8])
    health_webhook_url: SecretRef | None = Field(
        None, description="Where the alert webhook URL comes from (it often embeds a token).",
        examples=["env:SPARKFLEET_WEBHOOK"])
    health_textfile_dir: AbsolutePath | None = Field(
        "/var/lib/node_exporter/textfile_collector",
        description="node_exporter textfile directory for health metrics; null disables.",
        examples=["/var/lib/prometheus/node-exporter"])


class GatewayConfig(BaseModel):
    """The inventory variables of one gateway (a host in the `gateways` group): HAProxy in front of the Sparks."""

    model_config = ConfigDict(extra="forbid")

    gateway_port: int = Field(
        8000, ge=1, le=65535, description="Port the gateway serves the fleet's OpenAI API on (every address of the "
        "host); the default is an endpoint's, so a client moves from one Spark to the fleet by its host name alone.",
        examples=[8080])
    gateway_balance: Literal["leastconn", "hash"] = Field(
        "leastconn", description="`leastconn` sends each request to the Spark with the fewest in flight; `hash` "
        "picks the Spark by a consistent hash of `gateway_hash_header`, so an agent's requests keep hitting the "
        "Spark that holds its prefix cache (requests without the header are spread round-robin).",
        examples=["hash"])
    gateway_hash_header: str = Field(
        "X-Session-Id", pattern=r"^[A-Za-z0-9-]+$",
        description="Request header whose value picks the Spark when `gateway_balance` is `hash`.",
        examples=["X-Agent-Session"])
    gateway_check_interval_seconds: int = Field(
        5, ge=1, description="Seconds between the gateway's health checks of each Spark (GET /v1/models with the "
        "API key: 200 only once the model is loaded and the key accepted).", examples=[2])
    gateway_check_fall: int = Field(
        3, ge=1, description="Consecutive failed checks before the gateway stops sending a Spark requests.",
        examples=[2])
    gateway_check_rise: int = Field(
        2, ge=1, description="Consecutive passed checks before a Spark that was down gets requests again.",
        examples=[3])
    gateway_slowstart_seconds: int = Field(
        60, ge=0, description="A Spark back from down gets a share of new requests that grows from none to full "
        "over this many seconds (its first requests compile kernels); 0 gives it its full share at once.",
        examples=[120])
    gateway_drain_timeout_seconds: int = Field(
        300, ge=0, description="How long a rollout waits for a drained Spark's in-flight requests to finish at "
        "every gateway before it restarts the Spark anyway (vLLM's own graceful stop then gives them "
        "`--shutdown-timeout` more).", examples=[900])
    gateway_timeout_seconds: int = Field(
        600, ge=1, description="Longest silence the gateway allows from a Spark or a client within a request (a "
        "non-streaming completion sends nothing until it ends).", examples=[1800])
    gateway_metrics_port: int | None = Field(
        8405, ge=1, le=65535, description="Port of HAProxy's Prometheus exporter (`/metrics`: each Spark's state, "
        "sessions, queue and response times as the gateway sees them); null disables.", examples=[9101])


class InventoryError(Exception):
    """Bad inventory data: one paragraph per problem, each naming host, variable and fix."""


def variable_names(model: type[BaseModel] = SparkConfig) -> list[str]:
    return list(model.model_fields)


def _suggest(name: str, model: type[BaseModel]) -> str:
    close = difflib.get_close_matches(name, variable_names(model), n=1, cutoff=0.6)
    return f" Did you mean `{close[0]}`?" if close else ""


def _describe(error: dict, model: type[BaseModel] = SparkConfig) -> str:
    field = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"`{field}` is not a sparkfleet variable.{_suggest(field, model)}"
    if error["type"] == "missing":
        return f"`{field}` is required and not set: give it (README: Configuration)."
    message = error["msg"].removeprefix("Value error, ")
    return f"`{field}` = {error.get('input')!r}: {message}."


def parse_host(host: str, data: dict[str, object]) -> SparkConfig:
    """Validate one host's sparkfleet variables; other keys (ssh_*, _sudo, …) belong to pyinfra."""
    ours = {key: value for key, value in data.items() if key.startswith(PREFIXES) or key in NAMES}
    try:
        config = SparkConfig(**ours)
    except ValidationError as error:
        raise InventoryError("\n".join(f"{host}: {_describe(e)}" for e in error.errors())) from None
    if config.vllm_recipe not in load_recipes():
        known = ", ".join(load_recipes())
        raise InventoryError(f"{host}: `vllm_recipe` = {config.vllm_recipe!r} is not a shipped recipe; "
                             f"use one of: {known}.{_suggest_recipe(config.vllm_recipe)}")
    return config


def parse_gateway(host: str, data: dict[str, object]) -> GatewayConfig:
    """Validate one gateway's variables. A Spark's (`vllm_*`, ... often set for every host in group_data/all.py)
    are not a gateway's and are left alone; the Sparks' own values reach the gateway through fleet.py."""
    ours = {key: value for key, value in data.items() if key.startswith(GATEWAY_PREFIXES)}
    try:
        return GatewayConfig(**ours)
    except ValidationError as error:
        raise InventoryError("\n".join(f"{host}: {_describe(e, GatewayConfig)}" for e in error.errors())) from None


def _suggest_recipe(name: str) -> str:
    close = difflib.get_close_matches(name, list(load_recipes()), n=1, cutoff=0.5)
    return f" Did you mean `{close[0]}`?" if close else ""
