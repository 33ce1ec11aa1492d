"""bundle.planview at the width a piped terminal gets (80 columns): overrides and the image tag stay whole, so what
`plan --advise` and `show` print can be pasted back."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))

from recipekit.bundle.planview import advice_lines, render_advice, render_summary  # noqa: E402
from recipekit.image.matrix import load_images  # noqa: E402
from recipekit.memory import advise  # noqa: E402
from recipekit.plan.plan import make_plan  # noqa: E402
from recipekit.recipe.compose import compose  # noqa: E402
from recipekit.recipe.paralleloptions import load_parallel_options  # noqa: E402
from recipekit.recipe.sections import parse_recipe  # noqa: E402

WIDTH = 80
IMAGES = load_images()


@functools.cache
def recipe_of(*overrides: str):
    return parse_recipe(compose(list(overrides)).raw)


def shown(renderable) -> list[str]:
    from rich.console import Console

    console = Console(width=WIDTH, record=True, color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def whole_on_one_line(word: str, lines: list[str]) -> bool:
    return any(word in line for line in lines)


@pytest.mark.parametrize(
    "base, search_pp",
    [
        (("recipe=qwen2.5_14b_sft",), False),
        (("recipe=llama3_70b_sft", "parallel.pipeline_parallel=2"), True),  # the longest overrides: TP, PP, ...
    ],
    ids=["zero", "tp-pp"],
)
def test_advice_keeps_each_override_whole_at_80_columns(base, search_pp):
    advices = advise(recipe_of(*base), IMAGES, parallel_options=load_parallel_options(), search_pp=search_pp)
    assert advices
    lines = shown(render_advice(advices))
    assert all(len(line.rstrip()) <= WIDTH for line in lines)
    pasted = advice_lines(advices)
    for rank, advice in enumerate(advices, 1):
        line = " ".join(advice.overrides)
        assert line  # something to paste
        # one complete line per layout: beside its number where it fits 80 columns, else on its own line
        assert f"{rank} {line}" in pasted if len(f"{rank} {line}") <= WIDTH else line in pasted


def test_show_prints_the_image_tag_whole_at_80_columns():
    plan = make_plan(recipe_of("recipe=llama3_8b_sft"), IMAGES)
    lines = shown(render_summary(plan.summary()))
    assert whole_on_one_line(plan.image, lines), lines
    assert not any("…" in line for line in lines)
    assert whole_on_one_line(plan.output_dir, lines)


def test_show_command_at_80_columns():
    from click.testing import CliRunner

    from recipekit.cli import main

    result = CliRunner().invoke(main, ["show", "recipe=llama3_8b_sft"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    image = make_plan(recipe_of("recipe=llama3_8b_sft"), IMAGES).image
    assert whole_on_one_line(image, result.output.splitlines()), result.output
