"""Serving recipes: a pinned image, model and vLLM flags, shipped as YAML data beside this module."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

RECIPE_DIR = Path(__file__).parent

FlagValue = str | int | float | bool


class ModelShape(BaseModel):
    """What the memory rules need of a checkpoint, read from its config.json and file sizes."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Hugging Face repository id, as vLLM names the model")
    revision: str = Field(description="branch, tag or commit of the repository")
    quantization: Literal["bf16", "fp8", "nvfp4"] = Field(description="how the checkpoint is stored")
    checkpoint_bytes: PositiveInt
    full_attention_layers: PositiveInt
    linear_attention_layers: int = Field(ge=0)
    kv_heads: PositiveInt
    head_dim: PositiveInt
    linear_state_bytes_per_seq: int = Field(ge=0, description="Gated DeltaNet state for one sequence")
    mtp_layers: int = Field(ge=0)
    native_context: PositiveInt


class ImageNote(BaseModel):
    """An image reference (tag or @sha256 digest) with where the claim about it comes from."""

    model_config = ConfigDict(extra="forbid")

    image: str
    source: str = Field(description="public source of the claim: an issue, a playbook, a measurement")


class Expected(BaseModel):
    """Figures a recipe was measured at on a Spark, with their source, so `sparkfleet bench` can say how a
    host compares; each is a floor (a host below it serves worse than the recipe can)."""

    model_config = ConfigDict(extra="forbid")

    mtp_acceptance: float | None = Field(None, gt=0, le=1, description="MTP draft acceptance, accepted / drafted")
    tokens_per_second: PositiveFloat | None = Field(None, description="decode tokens/s of one stream")
    concurrency: PositiveInt = Field(1, description="parallel streams tokens_per_second was measured at")
    source: str = Field(description="where the figures come from, and under which versions and flags")


class Recipe(BaseModel):
    """A known-good way to serve one model: inventory overrides single flags on top of it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    image: str
    image_architectures: list[Literal["amd64", "arm64"]]
    vllm_version: str
    min_driver: str
    load_timeout_seconds: PositiveInt = Field(ge=900, description="model loads take 3-15 min on a Spark")
    model: ModelShape
    args: dict[str, FlagValue]
    # Images shown to serve this recipe on a GB10, and images known to fail on it: whether an image has
    # sm_121 kernels cannot be told from its name (vllm #40758 crashed on a cu130 build).
    validated_images: list[ImageNote] = Field(default_factory=list)
    known_bad_images: list[ImageNote] = Field(default_factory=list)
    expected: Expected | None = None


@cache
def load_recipes() -> dict[str, Recipe]:
    """Every shipped recipe by name (the file name without .yaml)."""
    recipes = {}
    for path in sorted(RECIPE_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        recipes[path.stem] = Recipe(name=path.stem, **data)
    return recipes
