"""What `recipekit list mode` says is what `build` does: every mode option × one hardware option per image family.

The list marks each mode option with the hardware options build refuses it on (``OptionRow.unsupported``); here
every combination is built in memory and the build's verdict must be exactly that mark. The options are discovered
from recipes/, so a new mode, hardware option or image family is covered without editing this file.
"""

from __future__ import annotations

import pytest

from recipekit.base import yamlfile
from recipekit.base.errors import RecipeError
from recipekit.bundle.build import compile_bundle, resolve
from recipekit.cli.listing import option_rows, unsupported_note
from recipekit.recipe.compose import group_options

MODES = {row.option: row for row in option_rows(["mode"], [])}


def _one_hw_per_family() -> dict[str, str]:
    """The first hardware option (by name) of each image family: one build per family is enough."""
    chosen: dict[str, str] = {}
    for option, path in sorted(group_options("hw").items()):
        chosen.setdefault(str(yamlfile.read(path)["image_family"]), option)
    return chosen


HW_BY_FAMILY = _one_hw_per_family()


def test_every_family_and_a_refusal_are_covered() -> None:
    """The matrix below is not vacuous: several families, and at least one combination list marks as refused."""
    assert len(HW_BY_FAMILY) >= 3, HW_BY_FAMILY
    assert any(row.unsupported for row in MODES.values())


def _build(mode: str, hw: str) -> list[str]:
    """The problems build reports for the tiny preset with this mode and hardware (empty: it builds)."""
    data = "text" if yamlfile.read(group_options("mode")[mode])["kind"] == "pretrain" else "alpaca"
    try:
        compile_bundle(resolve(["recipe=tiny_sft", f"mode={mode}", f"hw={hw}", f"data={data}"]), allow_oom=True)
    except RecipeError as err:
        return [str(problem) for problem in err.problems]
    return []


@pytest.mark.parametrize("family", sorted(HW_BY_FAMILY))
@pytest.mark.parametrize("mode", sorted(MODES))
def test_list_says_what_build_does(mode: str, family: str) -> None:
    hw = HW_BY_FAMILY[family]
    refused_by_list = dict(MODES[mode].unsupported)
    problems = _build(mode, hw)
    if hw in refused_by_list:
        assert problems, f"list says mode={mode} is not supported on hw={hw}, but build accepts it"
        assert any(refused_by_list[hw] in problem for problem in problems), (refused_by_list[hw], problems)
        assert hw in unsupported_note(MODES[mode])
    else:
        assert problems == [], f"list offers mode={mode} on hw={hw}, but build refuses it: {problems}"


def test_every_hw_option_of_a_refused_family_is_listed() -> None:
    """The list names every hardware option of a family it refuses, not only the one built above."""
    families = {option: str(yamlfile.read(path)["image_family"]) for option, path in group_options("hw").items()}
    for row in MODES.values():
        refused_families = {families[hw] for hw, _ in row.unsupported}
        expected = sorted(hw for hw, family in families.items() if family in refused_families)
        assert [hw for hw, _ in row.unsupported] == expected


def test_recipekit_list_mode_prints_the_refusals() -> None:
    """The command shows the fact the matrix above checks, for every refused hardware option."""
    from click.testing import CliRunner

    from recipekit.cli import main

    result = CliRunner().invoke(main, ["list", "mode"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    qlora = next(line for line in result.output.splitlines() if " qlora " in line)
    for row in MODES.values():
        for hw, _ in row.unsupported:
            assert hw in result.output
    assert "bitsandbytes-npu-beta" not in result.output
    assert ("not on hw" in qlora) == bool(MODES["qlora"].unsupported)
