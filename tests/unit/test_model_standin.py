"""The model stand-in: a deterministic, valid HF checkpoint with the real Qwen3.6-35B-A3B shape."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.lab.standins.model import generate_checkpoint, shard_name, write_sha256sums

SIZE = 1 << 20
SHARDS = 4


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    generate_checkpoint(tmp_path / "model", total_bytes=SIZE, shards=SHARDS)
    return tmp_path / "model"


def digests(model_dir: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.iterdir()) if p.is_file()
    }


def read_safetensors(path: Path) -> tuple[dict[str, dict], int, int]:
    """(header, header length, data length) of a safetensors file, parsed by its spec."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), length, len(raw) - 8 - length


def test_same_inputs_give_identical_bytes(checkpoint: Path, tmp_path: Path) -> None:
    generate_checkpoint(tmp_path / "again", total_bytes=SIZE, shards=SHARDS)
    assert digests(tmp_path / "again") == digests(checkpoint)


def test_another_seed_gives_other_weights(checkpoint: Path, tmp_path: Path) -> None:
    generate_checkpoint(tmp_path / "other", total_bytes=SIZE, shards=SHARDS, seed="other")
    ours, theirs = digests(checkpoint), digests(tmp_path / "other")
    assert all(ours[shard_name(k, SHARDS)] != theirs[shard_name(k, SHARDS)] for k in range(1, SHARDS + 1))
    assert ours["config.json"] == theirs["config.json"]


def test_shards_are_valid_safetensors_holding_all_the_bytes(checkpoint: Path) -> None:
    total = 0
    for k in range(1, SHARDS + 1):
        header, length, data = read_safetensors(checkpoint / shard_name(k, SHARDS))
        assert length % 8 == 0
        assert header.pop("__metadata__") == {"format": "pt"}
        ((_, tensor),) = header.items()
        assert tensor["dtype"] == "U8"
        assert tensor["data_offsets"] == [0, data] and tensor["shape"] == [data]
        total += data
    assert total == SIZE
    payload = (checkpoint / shard_name(1, SHARDS)).read_bytes()[-4096:]
    assert len(set(payload)) > 200, "shard data should look random, not constant"


def test_index_maps_every_tensor_to_its_shard(checkpoint: Path) -> None:
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == SIZE
    assert set(index["weight_map"].values()) == {p.name for p in checkpoint.glob("*.safetensors")}
    for tensor, shard in index["weight_map"].items():
        assert tensor in read_safetensors(checkpoint / shard)[0]


def test_config_has_the_qwen36_35b_a3b_shape(checkpoint: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    text = config["text_config"]
    assert config["model_type"] == "qwen3_5_moe"
    assert config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert text["num_hidden_layers"] == len(text["layer_types"]) == 40
    assert [i for i, kind in enumerate(text["layer_types"]) if kind == "full_attention"] == list(
        range(3, 40, 4)
    )
    assert (text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]) == (16, 2, 256)
    assert (text["num_experts"], text["num_experts_per_tok"], text["mtp_num_hidden_layers"]) == (256, 8, 1)
    assert text["max_position_embeddings"] == 262144
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert json.loads((checkpoint / name).read_text())


def test_sha256sums_lists_every_file_with_its_digest(checkpoint: Path) -> None:
    sums = write_sha256sums(checkpoint)
    lines = sums.read_text().splitlines()
    listed = dict(reversed(line.split("  ", 1)) for line in lines)
    assert [line.split("  ", 1)[1] for line in lines] == sorted(listed)
    assert listed == {name: digest for name, digest in digests(checkpoint).items() if name != "SHA256SUMS"}
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=checkpoint, check=True)


def test_sha256sums_uses_relative_paths_for_subdirectories(checkpoint: Path) -> None:
    (checkpoint / "extra").mkdir()
    (checkpoint / "extra" / "notes.txt").write_text("x")
    lines = write_sha256sums(checkpoint).read_text().splitlines()
    assert f"{hashlib.sha256(b'x').hexdigest()}  extra/notes.txt" in lines


def test_rejects_more_shards_than_bytes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shards"):
        generate_checkpoint(tmp_path, total_bytes=3, shards=4)
