"""The first hour, round 3 (issue 41): did-you-mean for paths, commands and file kinds; the show, list and plan a
new user reads; the pod's requests and where they come from."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main


def run(*args: str) -> object:
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("paths")
    result = run("build", "recipe=tiny_sft", "-o", str(root / "bundles" / "phi4_lora"))
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def bundles(built: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(built)
    return built / "bundles"


@pytest.mark.parametrize(
    "command",
    [
        ["validate", "bundles/phi4-lora"],
        ["validate", "bundles/Phi4_Lora"],
        ["pack", "bundles/phi4-lora"],
        ["report", "bundles/phi4-lora"],
        ["image", "build", "bundles/phi4-lora"],
    ],
)
def test_a_mistyped_bundle_path_says_which_was_meant(bundles: Path, command: list[str]) -> None:
    result = run(*command)
    assert result.exit_code == 2 and "did you mean bundles/phi4_lora?" in result.output, result.output
    assert "Traceback" not in result.output


def test_a_file_where_a_bundle_belongs_says_what_to_do_with_it(bundles: Path) -> None:
    (bundles.parent / "x.tar.gz").write_bytes(b"")
    package = run("validate", "x.tar.gz")
    assert package.exit_code == 2 and "recipekit verify x.tar.gz" in package.output, package.output
    inside = run("validate", "bundles/phi4_lora/manifest.json")
    assert inside.exit_code == 2 and "recipekit validate bundles/phi4_lora" in inside.output, inside.output


def test_a_mistyped_command_says_which_was_meant() -> None:
    """`bulid` is close to `build`, a command imported only when invoked (click suggested only loaded ones)."""
    result = run("bulid")
    assert result.exit_code == 2 and "Did you mean 'build'?" in result.output, result.output
