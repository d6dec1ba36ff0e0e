"""Fixtures shared by the vLLM stand-in's tests (one node and a pair): the image's flag data and a small model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab.standins.model import generate_checkpoint
from tests.lab.standins.vllm_data import write_image_data


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("standin-data")
    write_image_data(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "Qwen3.6-35B-A3B"
    generate_checkpoint(path, total_bytes=64 << 10, shards=2)
    return path
