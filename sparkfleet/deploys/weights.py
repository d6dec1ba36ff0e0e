"""Step 3: model weights on the Spark's local NVMe, verified, resumable, never fetched twice."""

from __future__ import annotations

import io
from pathlib import Path

from pyinfra.api import deploy

from sparkfleet.deploys.context import LIB, REMOTE, restart_triggers
from sparkfleet.endpoint import Endpoint
from sparkfleet.manifest import controller_sums
from sparkfleet.operations import managed_file, weights_staged

SCRIPT = f"{LIB}/stage_weights.py"
SUMS_DIR = "/var/lib/sparkfleet/weights"


def sums_file(spark: Endpoint) -> str:
    """Where a controller directory's SHA256SUMS goes on the host."""
    return f"{SUMS_DIR}/{spark.model_slug}.SHA256SUMS"


def check_args(spark: Endpoint) -> list[str]:
    """`stage_weights.py check` arguments for the wanted weights (a controller directory's manifest digest is
    computed here, cached by size and mtime); the deploy and `sparkfleet drift` ask the same question."""
    source = spark.source
    wanted = (["--sums-url", source.sums_url] if source.kind == "mirror"
              else ["--digest", controller_sums(Path(source.path))[1]])
    return ["--dest", spark.weights_dir, *wanted, *(["--full"] if spark.config.weights_verify == "full" else [])]


@deploy("Stage the model weights")
def stage_weights(spark: Endpoint) -> None:
    managed_file(name="Install the weight staging script", src=str(REMOTE / "stage_weights.py"), dest=SCRIPT,
                 mode="755")
    source = spark.source
    if source.kind == "controller":
        managed_file(name="Upload the weights manifest computed on the controller",
                     src=io.StringIO(controller_sums(Path(source.path))[0]), dest=sums_file(spark), mode="644")
    staged = weights_staged(
        name=f"Stage {spark.recipe.model.id} into {spark.weights_dir} and verify every file",
        script=SCRIPT, dest=spark.weights_dir, source=source, verify=spark.config.weights_verify,
        sums_file=sums_file(spark),
    )
    restart_triggers[spark.host].append(staged)
