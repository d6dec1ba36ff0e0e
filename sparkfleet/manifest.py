"""SHA256SUMS of a weights directory on the controller, hashed once and cached by size and mtime."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparkfleet" / "sums"
SKIP = {"SHA256SUMS", ".sparkfleet-manifest.json"}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def weight_files(root: Path) -> list[Path]:
    """The files a controller directory stages: nothing hidden, nor inside a hidden directory (the
    .cache/huggingface/ that `hf download --local-dir` leaves), which the rsync's --exclude=.* never sends."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name not in SKIP
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def controller_sums(root: Path) -> tuple[str, str]:
    """(SHA256SUMS text, its sha256) for `root`; unchanged files are not re-hashed on later runs."""
    cache_file = CACHE / (hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:24] + ".json")
    try:
        cached = json.loads(cache_file.read_text())
    except (OSError, json.JSONDecodeError):
        cached = {}
    entries = {}
    for path in weight_files(root):
        rel = path.relative_to(root).as_posix()
        stat = path.stat()
        key = [stat.st_size, stat.st_mtime_ns]
        hit = cached.get(rel)
        entries[rel] = hit if hit and hit[:2] == key else [*key, _sha256(path)]
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text(json.dumps(entries))
    text = "".join(f"{entries[rel][2]}  {rel}\n" for rel in sorted(entries))
    return text, hashlib.sha256(text.encode()).hexdigest()
