"""The wheel carries recipes, templates and the image matrix, and builds bundles without the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_installed_wheel_builds_a_bundle(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("recipekit-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)],
        check=True,
        capture_output=True,
    )
    code = (
        "import recipekit, recipekit.base.paths as p; from recipekit.cli import main\n"
        "assert p.RECIPES_DIR.is_relative_to(p.Path(recipekit.__file__).parent), p.RECIPES_DIR\n"
        f"main(['build', 'recipe=qwen2.5_14b_sft', '-o', {str(tmp_path / 'bundle')!r}])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )
    assert "built" in result.stdout, result.stdout + result.stderr
    assert (tmp_path / "bundle" / "volcano-job.yaml").exists()
