"""The flag data directory baked into the vLLM stand-in image, written from sparkfleet's own copy.

sparkfleet/data/vllm/ is the one source of truth for vLLM 0.28.0's flags. The stand-in runs on a bare python3
without pyyaml, so the choices file goes into the image as JSON; the two flag lists are copied unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sparkfleet.vllm_flags import DATA, flag_set
from tests.lab.standins.vllm_standin import BOOL_FLAGS_FILE, CHOICES_FILE, FLAGS_FILE, VERSION


def write_image_data(dest_dir: Path) -> None:
    """Write the stand-in's VLLM_STANDIN_DATA directory (in the image: /usr/share/vllm-standin)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    for name in (FLAGS_FILE, BOOL_FLAGS_FILE):
        shutil.copyfile(DATA / name, dest_dir / name)
    choices = {flag: list(values) for flag, values in flag_set(VERSION).choices.items()}
    (dest_dir / CHOICES_FILE).write_text(json.dumps(choices, indent=2) + "\n")
