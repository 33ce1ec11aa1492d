"""``recipekit validate`` of a matrix root (validate/sweep.py, cli/sweeps/validate.py): every bundle of the sweep, one
after another, one table; a bundle with a failed check fails the whole (exit 1) and its finding is printed. The
dry runs of a 4-run sweep: tests/integration/test_sweep_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.bundle.files import matrix_bundles
from recipekit.cli import main
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.sweep import validate_sweep


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("m") / "sweep"
    built = CliRunner().invoke(main, ["build", "-m", "recipe=tiny_sft", "train.seed=1,2", "-o", str(root)])
    assert built.exit_code == 0, built.output
    return root


def test_a_matrix_root_is_its_bundles_and_a_bundle_is_none(root: Path, tmp_path: Path) -> None:
    bundles = matrix_bundles(root)
    assert [b.name for b in bundles or []] == ["tiny_sft@train.seed=1", "tiny_sft@train.seed=2"]
    assert bundles and matrix_bundles(bundles[0]) is None
    assert matrix_bundles(tmp_path) is None  # holds no bundle: validated (and refused) as one


def test_each_bundle_is_validated_and_one_table_says_so(root: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(root)])
    assert result.exit_code == 0, result.output
    assert "2 of 2 bundles OK" in result.output and "tiny_sft@train.seed=2" in result.output
    assert all(len(line) <= 80 for line in result.output.splitlines())


def test_a_broken_bundle_fails_the_sweep_with_its_finding(root: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "sweep"
    shutil.copytree(root, copy)
    (copy / "tiny_sft@train.seed=2" / "run.sh").write_text("echo edited\n")
    result = CliRunner().invoke(main, ["validate", str(copy)])
    assert result.exit_code == 1
    assert "tiny_sft@train.seed=2: files.manifest:" in result.output and "1 of 2 bundles OK" in result.output


def test_each_dry_run_gets_its_own_work_directory(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr("recipekit.validate.validate", lambda path, dry_run, progress: seen.append(dry_run.workdir))
    validate_sweep(matrix_bundles(root) or [], dry_run=DryRunOptions(workdir=tmp_path / "w"))
    assert seen == [tmp_path / "w" / "tiny_sft@train.seed=1", tmp_path / "w" / "tiny_sft@train.seed=2"]
