"""Every example preset in examples/recipes builds, through the same --recipes path a team's repo uses."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main
from recipekit.recipe.compose import group_options

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "recipes"
PRESETS = sorted(set(group_options("recipe", [EXAMPLES])) - set(group_options("recipe")))


def test_examples_exist() -> None:
    assert len(PRESETS) >= 4


@pytest.mark.parametrize("preset", PRESETS)
def test_example_builds(preset: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["build", "--recipes", str(EXAMPLES), f"recipe={preset}", "-o", str(tmp_path / preset)]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / preset / "volcano-job.yaml").exists()
