"""The one typed object the vLLM unit template receives, and systemd's quoting rules."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkfleet.endpoint import CONTAINER, ENV_FILE, LOADED_WEIGHTS, MANIFEST, Endpoint
from sparkfleet.vllm_flags import flag_set, to_argv

SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """Quote one ExecStart word: systemd expands % specifiers and $VARS, and splits on spaces."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if SAFE.match(arg) and "%" not in arg:
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class UnitView:
    """Everything `templates/vllm/sparkfleet-vllm.service.j2` prints, already quoted."""

    description: str
    container: str
    image: str
    env_file: str
    weights_dir: str
    model_path: str
    port: int
    served_name: str
    vllm_args: list[str]  # one quoted `--flag [value]` per line
    load_timeout: int
    manifest: str
    loaded_weights: str

    @classmethod
    def of(cls, spark: Endpoint) -> UnitView:
        argv = to_argv(spark.args, flag_set(spark.recipe.vllm_version))
        return cls(
            description=f"vLLM endpoint {spark.served_name} ({spark.recipe.name})",
            container=CONTAINER, image=systemd_quote(spark.image), env_file=ENV_FILE,
            weights_dir=systemd_quote(spark.weights_dir), model_path=systemd_quote(spark.container_model_path),
            port=spark.config.vllm_port, served_name=systemd_quote(spark.served_name),
            vllm_args=_lines(argv), load_timeout=spark.recipe.load_timeout_seconds,
            manifest=systemd_quote(f"{spark.weights_dir}/{MANIFEST}"), loaded_weights=LOADED_WEIGHTS,
        )


def _lines(argv: list[str]) -> list[str]:
    """One flag and its value per line, so the unit reads like the recipe."""
    lines: list[str] = []
    for arg in argv:
        if arg.startswith("--") or not lines:
            lines.append(systemd_quote(arg))
        else:
            lines[-1] += " " + systemd_quote(arg)
    return lines
