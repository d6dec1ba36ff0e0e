"""A deterministic stand-in for the Qwen3.6-35B-A3B checkpoint, for the lab's weight mirror.

The deploy downloads, checksums and serves a model directory; the lab needs one with the real model's layout
(config.json with the real shape, tokenizer files, sharded safetensors and their index) but at a size a CI
machine can write and move in seconds. Shards hold one U8 tensor of pseudorandom bytes each: valid
safetensors files that the vLLM stand-in can open and check. The same (seed, total_bytes, shards) always gives
the same bytes, so a mirror's SHA256SUMS is stable across runs.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

BLOCK_BYTES = 1 << 20  # one pseudorandom block per shard, written over and over
SUMS_FILE = "SHA256SUMS"
INDEX_FILE = "model.safetensors.index.json"

# Qwen3.6-35B-A3B's config.json (Qwen3.5-35B-A3B's architecture), from public copies of the model's config.
# The vision tower and token ids are plausible values, not checked against the Hub.
TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_moe_text",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_output_gate": True,
    "dtype": "bfloat16",
    "eos_token_id": 248044,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(40)],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "moe_intermediate_size": 512,
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "num_attention_heads": 16,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 40,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "mrope_interleaved": True,
        "mrope_section": [11, 11, 10],
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000,
        "rope_type": "default",
    },
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512,
    "use_cache": True,
    "vocab_size": 248320,
}
CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "tie_word_embeddings": False,
    "transformers_version": "4.57.0.dev0",
    "text_config": TEXT_CONFIG,
    "vision_config": {
        "model_type": "qwen3_5_moe",
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_heads": 16,
        "out_hidden_size": 2048,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_channels": 3,
        "hidden_act": "gelu_pytorch_tanh",
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [],
    },
}
GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": 248044,
    "eos_token_id": [248046, 248044],
    "pad_token_id": 248044,
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "transformers_version": "4.57.0.dev0",
}
SPECIAL_TOKENS = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046}
TOKENIZER: dict[str, Any] = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for t, i in SPECIAL_TOKENS.items()
    ],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": True,
    },
    "post_processor": None,
    "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
    "model": {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": "",
        "end_of_word_suffix": "",
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
        "vocab": {chr(c): c - 33 for c in range(33, 127)},
        "merges": [],
    },
}
TOKENIZER_CONFIG: dict[str, Any] = {
    "tokenizer_class": "Qwen2Tokenizer",
    "model_max_length": 262144,
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "unk_token": None,
    "clean_up_tokenization_spaces": False,
    "split_special_tokens": False,
    "chat_template": (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
}


def shard_name(index: int, shards: int) -> str:
    return f"model-{index:05d}-of-{shards:05d}.safetensors"


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _write_shard(path: Path, tensor: str, size: int, block: bytes) -> None:
    """One safetensors file holding a single U8 tensor of `size` bytes, filled by repeating `block`."""
    header = json.dumps(
        {
            "__metadata__": {"format": "pt"},
            tensor: {"dtype": "U8", "shape": [size], "data_offsets": [0, size]},
        }
    ).encode()
    header += b" " * (-len(header) % 8)  # safetensors pads the header so the data starts 8-byte aligned
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        for _ in range(size // len(block)):
            fh.write(block)
        fh.write(block[: size % len(block)])


def generate_checkpoint(
    dest: Path, total_bytes: int = 1 << 30, shards: int = 4, seed: str = "qwen3.6-standin"
) -> None:
    """Write an HF-layout checkpoint with `total_bytes` of tensor data split over `shards` files."""
    if shards < 1 or total_bytes < shards:
        raise ValueError(f"need 1 <= shards <= total_bytes, got shards={shards}, total_bytes={total_bytes}")
    dest.mkdir(parents=True, exist_ok=True)
    for name, obj in (
        ("config.json", CONFIG),
        ("generation_config.json", GENERATION_CONFIG),
        ("tokenizer.json", TOKENIZER),
        ("tokenizer_config.json", TOKENIZER_CONFIG),
    ):
        _write_json(dest / name, obj)
    weight_map = {}
    for k in range(1, shards + 1):
        size = total_bytes // shards + (total_bytes % shards if k == shards else 0)
        tensor = f"model.language_model.layers.{k - 1}.standin.weight"
        block = hashlib.shake_256(f"{seed}/{k}".encode()).digest(min(BLOCK_BYTES, size))
        _write_shard(dest / shard_name(k, shards), tensor, size, block)
        weight_map[tensor] = shard_name(k, shards)
    _write_json(dest / INDEX_FILE, {"metadata": {"total_size": total_bytes}, "weight_map": weight_map})


def write_sha256sums(model_dir: Path) -> Path:
    """Write SHA256SUMS (sha256sum's format, sorted relative paths) for every file, as a mirror would."""
    sums = model_dir / SUMS_FILE
    names = sorted(
        p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file() and p != sums
    )
    lines = []
    for name in names:
        with (model_dir / name).open("rb") as fh:
            lines.append(f"{hashlib.file_digest(fh, 'sha256').hexdigest()}  {name}\n")
    sums.write_text("".join(lines))
    return sums
