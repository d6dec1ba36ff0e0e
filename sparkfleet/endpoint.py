"""One Spark's endpoint: a recipe with the host's overrides applied, everything the templates need."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from sparkfleet.config import ModelSource, SparkConfig
from sparkfleet.generations import Generation
from sparkfleet.recipes import FlagValue, Recipe, load_recipes
from sparkfleet.vllm_flags import normalize

# Where the endpoint lives on a Spark: the one home of these names, passed to the scripts that run there.
UNIT = "sparkfleet-vllm"
UNIT_FILE = f"/etc/systemd/system/{UNIT}.service"
CONTAINER = "sparkfleet-vllm"
DAEMON_JSON = "/etc/docker/daemon.json"  # dockerd's configuration, where the nvidia runtime is registered
ETC = "/etc/sparkfleet"
ENV_FILE = f"{ETC}/vllm.env"
MODEL_MOUNT = "/models"
MANIFEST = ".sparkfleet-manifest.json"  # written by stage_weights.py once every file is verified
LOADED_WEIGHTS = "/run/sparkfleet/loaded-weights.json"  # the manifest the running endpoint started with
KNOWN_GOOD = "/var/lib/sparkfleet/known-good"  # rollout's copy of the last healthy unit (its weights stay)


@dataclass(frozen=True)
class Endpoint:
    """What runs on one Spark, resolved from its inventory variables."""

    host: str
    config: SparkConfig
    recipe: Recipe
    args: dict[str, FlagValue]  # effective vLLM flags, names normalised, recipe first
    weights: Generation | None = None  # the source resolved (fleet.resolve_weights) before weights_dir is read
    peer: str | None = None  # the other host of its pair (fleet.load_inventory finds it), None when standalone

    @property
    def role(self) -> str | None:
        """`head` (serves the endpoint, node rank 0) or `worker` (node rank 1, headless) in a pair; else None."""
        pair = self.config.pair
        if pair is None:
            return None
        return "head" if pair.head == self.host else "worker"

    @property
    def serves(self) -> bool:
        """Whether this host serves the OpenAI API: a standalone Spark or a pair's head, when started at all."""
        return self.config.vllm_start and self.role != "worker"

    @property
    def image(self) -> str:
        return self.config.vllm_image or self.recipe.image

    @property
    def served_name(self) -> str:
        return self.config.vllm_served_model_name or self.recipe.model.id

    @property
    def model_slug(self) -> str:
        """Directory name of the weights: the repository id with `/` made safe (org--name)."""
        return self.recipe.model.id.replace("/", "--")

    @property
    def model_root(self) -> str:
        """The model's directory: one subdirectory per generation of its weights."""
        return str(PurePosixPath(self.config.model_dir) / self.model_slug)

    @property
    def weights_dir(self) -> str:
        """The generation this Spark serves: model_dir/<model>/<commit or sha256-digest>."""
        if self.weights is None:
            raise RuntimeError(f"{self.host}: the model source was not resolved (fleet.resolve_weights)")
        return f"{self.model_root}/{self.weights.id}"

    @property
    def container_model_path(self) -> str:
        return f"{MODEL_MOUNT}/{self.model_slug}"

    @property
    def model_revision(self) -> str:
        """The recipe's pinned revision of the model, `org/name@revision`."""
        return f"{self.recipe.model.id}@{self.recipe.model.revision}"

    @property
    def source(self) -> ModelSource:
        """model_source, else the recipe's model on the Hub at its pinned revision."""
        model = self.recipe.model
        return self.config.model_source or ModelSource("hub", repo=model.id, revision=model.revision)


PAIR_TENSOR_PARALLEL = 2  # a pair: one GPU on each of its two Sparks


def resolve(host: str, config: SparkConfig) -> Endpoint:
    """Recipe flags, then the host's `vllm_args` on top (None removes a flag). A pair's hosts split the model
    across their two GPUs: tensor parallel 2 unless vllm_args says otherwise (the rules judge what it says)."""
    recipe = load_recipes()[config.vllm_recipe]
    args: dict[str, FlagValue] = {normalize(name): value for name, value in recipe.args.items()}
    if config.pair is not None:
        args["tensor-parallel-size"] = PAIR_TENSOR_PARALLEL
    for name, value in config.vllm_args.items():
        key = normalize(name)
        if value is None:
            args.pop(key, None)
        else:
            args[key] = value
    return Endpoint(host=host, config=config, recipe=recipe, args=args)


def endpoint_url(spark: Endpoint, ssh_hostname: str | None) -> str:
    """Where clients (`sparkfleet bench`, a gateway) reach the endpoint: `vllm_url`, else the host the controller
    reaches over SSH, on the endpoint's port."""
    if spark.config.vllm_url:
        return spark.config.vllm_url.rstrip("/")
    name = ssh_hostname or spark.host
    return f"http://{f'[{name}]' if ':' in name else name}:{spark.config.vllm_port}"
