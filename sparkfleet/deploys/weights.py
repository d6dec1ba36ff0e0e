"""Step 3: model weights on the Spark's local NVMe, verified, resumable, never fetched twice."""

from __future__ import annotations

import io
from pathlib import Path

from pyinfra.api import deploy
from pyinfra.operations import files

from sparkfleet.deploys.context import LIB, REMOTE, restart_triggers
from sparkfleet.endpoint import Endpoint
from sparkfleet.manifest import controller_sums
from sparkfleet.operations import weights_staged

SCRIPT = f"{LIB}/stage_weights.py"
SUMS_DIR = "/var/lib/sparkfleet/weights"


@deploy("Stage the model weights")
def stage_weights(spark: Endpoint) -> None:
    files.put(
        name="Install the weight staging script",
        src=str(REMOTE / "stage_weights.py"), dest=SCRIPT, mode="755", create_remote_dir=True,
    )
    source = spark.model_source
    sums_file = digest = ""
    if source.startswith("/"):
        # A controller directory: its SHA256SUMS is computed here once (cached by size and mtime).
        text, digest = controller_sums(Path(source))
        sums_file = f"{SUMS_DIR}/{spark.model_slug}.SHA256SUMS"
        files.put(
            name="Upload the weights manifest computed on the controller",
            src=io.StringIO(text), dest=sums_file, mode="644", create_remote_dir=True,
        )
    staged = weights_staged(
        name=f"Stage {spark.recipe.model.id} into {spark.weights_dir} and verify every file",
        script=SCRIPT, dest=spark.weights_dir, source=source, verify=spark.config.weights_verify,
        sums_file=sums_file, digest=digest,
    )
    restart_triggers[spark.host].append(staged)
