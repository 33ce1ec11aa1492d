"""``recipekit diff``: recipe keys first, then files with a short diff; directories and packages alike."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from recipekit.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_diff_names_the_changed_key_then_the_files(tmp_path: Path) -> None:
    assert run("build", "recipe=tiny_sft", "-o", str(tmp_path / "a")).exit_code == 0
    assert run("build", "recipe=tiny_sft", "train.learning_rate=0.002", "-o", str(tmp_path / "b")).exit_code == 0
    result = run("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[:2] == ["recipe keys (1 differ):", "  train.learning_rate: 0.001 → 0.002"]
    assert lines[2].startswith("files (") and "  changed recipe.yaml" in lines and "  changed manifest.json" in lines
    assert any(line.strip().startswith("+") and "0.002" in line for line in lines)


def test_identical_bundles_and_a_package_against_its_directory(tmp_path: Path) -> None:
    assert run("build", "recipe=tiny_sft", "-o", str(tmp_path / "a")).exit_code == 0
    assert run("pack", str(tmp_path / "a"), "-o", str(tmp_path)).exit_code == 0
    (package,) = tmp_path.glob("tiny_sft-*.tar.gz")
    result = run("diff", str(package), str(tmp_path / "a"))
    assert result.exit_code == 0 and result.output.startswith("identical"), result.output


def test_added_and_removed_files_and_bad_input(tmp_path: Path) -> None:
    assert run("build", "recipe=tiny_sft", "-o", str(tmp_path / "a")).exit_code == 0
    assert run("build", "recipe=tiny_sft", "parallel=ddp", "-o", str(tmp_path / "b")).exit_code == 0
    result = run("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.exit_code == 1
    assert "parallel.zero_stage: 2 → 0" in result.output and "  removed ds_config.json" in result.output
    result = run("diff", str(tmp_path / "a"), str(tmp_path / "nope"))
    assert result.exit_code == 2 and "no such bundle directory or package" in result.output


def test_diff_says_two_bundles_of_one_stack_run_the_same_image(tmp_path: Path) -> None:
    """A learning rate and a node count are run files and Job: the image line says no second build is needed; the
    ConfigMap is among the changed files, with the key that changed."""
    assert run("build", "recipe=tiny_sft", "-o", str(tmp_path / "a")).exit_code == 0
    assert (
        run(
            "build", "recipe=tiny_sft", "train.learning_rate=0.002", "cluster.nodes=1", "-o", str(tmp_path / "b")
        ).exit_code
        == 0
    )
    result = run("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    lines = result.output.splitlines()
    assert "  changed run-files.yaml" in lines and "  changed volcano-job.yaml" in lines
    assert "  changed Dockerfile" not in lines
    (image,) = [line for line in lines if line.startswith("image:")]
    assert image.startswith("image: the same (") and "run files and the Job" in image
    assert run("build", "recipe=tiny_sft", "hw=h100", "-o", str(tmp_path / "c")).exit_code == 0
    result = run("diff", str(tmp_path / "a"), str(tmp_path / "c"))
    assert any(line.startswith("image: ") and " → " in line for line in result.output.splitlines()), result.output
