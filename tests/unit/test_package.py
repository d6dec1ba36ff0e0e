"""Package data: a plain (non-editable) `pip install .` carries every template and host-side script the deploy uses.

templates/ stays at the repository's top level and ships as `sparkfleet.templates` (pyproject.toml lists the
packages by hand for that mapping, so a new subpackage left off the list would be missed: the wheel test says so).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from sparkfleet.deploys.context import REMOTE, TEMPLATES

REPO = Path(__file__).resolve().parents[2]
# Where each source tree lands in the installed package.
TREES = {"sparkfleet": "sparkfleet", "templates": "sparkfleet/templates"}


def _source_files() -> set[str]:
    """Every file of the two trees, named as the wheel names it."""
    return {
        f"{installed}/{path.relative_to(REPO / tree).as_posix()}"
        for tree, installed in TREES.items()
        for path in (REPO / tree).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_wheel_carries_every_package_file(tmp_path: Path) -> None:
    # Built from a copy, so the build leaves no build/ or egg-info behind in the checkout.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for tree in TREES:
        shutil.copytree(REPO / tree, source / tree, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp_path),
                    str(source)], check=True, capture_output=True, timeout=120)
    [wheel] = tmp_path.glob("sparkfleet-*.whl")
    missing = _source_files() - set(zipfile.ZipFile(wheel).namelist())
    assert not missing, f"left out of the wheel (add them to pyproject.toml's packages or package-data): {missing}"


def test_deploy_finds_templates_and_scripts_as_package_resources() -> None:
    templates = {path.relative_to(TEMPLATES).as_posix() for path in TEMPLATES.rglob("*.j2")}
    assert templates == {"vllm/sparkfleet-vllm.service.j2", "health/sparkfleet-health.service.j2",
                         "health/sparkfleet-health.timer.j2", "weights/sparkfleet-weights-share.service.j2",
                         "gateway/haproxy.cfg.j2"}
    for script in ("stage_weights.py", "share_weights.py", "healthcheck.py", "status.py", "haproxy_api.py"):
        assert (REMOTE / script).is_file(), script
