"""The floor plan holds: imports point down the stage order, the runtime imports nothing of recipekit, Hydra stays in
the compose module (pyproject's [tool.importlinter] contracts) — and the check fails when an import runs back up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def test_the_runtime_may_not_import_recipekit(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    contract = copy / "src" / "recipekit" / "runtime" / "contract.py"
    contract.write_text(contract.read_text() + "\nfrom recipekit import errors  # noqa: E402,F401\n")
    result = lint(copy)
    assert result.returncode != 0
    assert "recipekit.runtime.contract -> recipekit.errors" in result.stdout
