"""Endpoints with their model source resolved, for tests that read weights_dir: a Generation built from a fake
SHA256SUMS, as generations.resolve would return it, without asking the Hub, a mirror or the disk."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from sparkfleet import generations
from sparkfleet.config import ModelSource
from sparkfleet.endpoint import Endpoint
from sparkfleet.generations import Generation

FILES = ("config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
SUMS = "".join(f"{hashlib.sha256(name.encode()).hexdigest()}  {name}\n" for name in FILES)
TOTAL = 20_000_000_000


def generation(source: ModelSource, sums: str = SUMS, total: int | None = TOTAL) -> Generation:
    """What `source` resolves to when it lists `sums`: a hub source by a commit (derived from the sums, so two
    lists give two commits), the others by their list's digest (a mirror's list gives no sizes)."""
    if source.kind == "hub":
        commit = hashlib.sha1(sums.encode()).hexdigest()
        return Generation(commit, sums, total, source, commit=commit)
    digest = hashlib.sha256(sums.encode()).hexdigest()
    return Generation(f"sha256-{digest[:16]}", sums, None if source.kind == "mirror" else total, source)


def resolved(spark: Endpoint, sums: str = SUMS) -> Endpoint:
    """`spark` as fleet.with_weights returns it, its source listing the recipe's checkpoint size."""
    return replace(spark, weights=generation(spark.source, sums, spark.recipe.model.checkpoint_bytes))


def offline_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every source resolves to its fake generation (for code that resolves by itself: doctor, drift)."""
    monkeypatch.setattr(generations, "resolve", lambda source, hf_endpoint=None, hf_token=None: generation(source))
