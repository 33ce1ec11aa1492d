"""The floor plan holds: imports point down the stage order and inside the rooms of the runtime and of validate, the
runtime imports nothing of recipekit, the build side sees only the runtime's boundary, Hydra stays in the compose
module (pyproject's [tool.importlinter] contracts) — and the check fails when an import runs back up. No package
holds an import circle among its modules, no folder holds more than 15 modules, no function is over 80 lines and no
module over 600."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (the test extra)")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_tree_keeps_every_contract() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_stage_contract(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    # the plan stage reaching up into the bundle stage
    layout = copy / "src" / "recipekit" / "plan" / "layout.py"
    layout.write_text(layout.read_text() + "\nfrom recipekit.bundle import render  # noqa: E402,F401\n")
    result = lint(copy)
    assert result.returncode != 0
    assert "recipekit.plan is not allowed to import recipekit.bundle" in result.stdout
    assert "recipekit.plan.layout -> recipekit.bundle.render" in result.stdout


def copied_with(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the source tree with ``line`` appended to ``module`` (a path under src/recipekit)."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    target = copy / "src" / "recipekit" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa: E402,F401\n")
    return copy


def test_the_runtime_may_not_import_recipekit(tmp_path: Path) -> None:
    result = lint(copied_with(tmp_path, "runtime/boundary/exitcodes.py", "from recipekit.base import errors"))
    assert result.returncode != 0
    assert "recipekit.runtime.boundary.exitcodes -> recipekit.base.errors" in result.stdout


def test_an_upward_import_inside_the_runtime_breaks_its_contract(tmp_path: Path) -> None:
    # the data family reaching up into the operations layer
    result = lint(copied_with(tmp_path, "runtime/data/samples.py", "from ..ops import guard"))
    assert result.returncode != 0
    assert "recipekit.runtime.data is not allowed to import recipekit.runtime.ops" in result.stdout


def test_an_upward_import_inside_validate_breaks_its_contract(tmp_path: Path) -> None:
    # a static check reaching up into the dry run
    result = lint(copied_with(tmp_path, "validate/static/consistency.py", "from recipekit.validate.dryrun import run"))
    assert result.returncode != 0
    assert "recipekit.validate.static is not allowed to import recipekit.validate.dryrun" in result.stdout


def test_the_build_side_sees_only_the_runtime_boundary(tmp_path: Path) -> None:
    result = lint(copied_with(tmp_path, "plan/layout.py", "from recipekit.runtime.session import session"))
    assert result.returncode != 0
    assert "recipekit.plan.layout -> recipekit.runtime.session.session" in result.stdout
