"""Composition: Hydra grammar works, every bad override is reported at once, team recipe trees plug in."""

from __future__ import annotations

import pytest

from recipekit.base.errors import RecipeError
from recipekit.base.paths import GROUPS
from recipekit.recipe.compose import compose, group_options


def problems_of(overrides: list[str], **kwargs) -> list[str]:
    with pytest.raises(RecipeError) as info:
        compose(overrides, **kwargs)
    return [str(p) for p in info.value.problems]


def test_preset_picks_groups_and_command_line_wins() -> None:
    composed = compose(["recipe=qwen2.5_14b_sft", "hw=a100_80g", "train.micro_batch_size=4"])
    assert composed.choices["model"] == "qwen2.5_14b"
    assert composed.choices["hw"] == "a100_80g"
    assert composed.raw["train"]["micro_batch_size"] == 4
    assert composed.raw["cluster"]["nodes"] == 2


def test_group_override_beats_the_presets_choice() -> None:
    assert compose(["recipe=qwen2.5_14b_sft", "model=llama3_8b"]).choices["model"] == "llama3_8b"


def test_name_defaults_to_model_and_mode() -> None:
    assert compose(["model=qwen2.5_7b", "mode=lora"]).raw["name"] == "qwen2.5_7b_lora"


def test_add_and_delete_keys_with_hydra_grammar() -> None:
    raw = compose(["+train.extra=3", "~cluster.pvc_claim"]).raw
    assert raw["train"]["extra"] == 3
    assert "pvc_claim" not in raw["cluster"]


def test_all_problems_reported_together_with_close_matches() -> None:
    from recipekit.bundle.build import resolve

    with pytest.raises(RecipeError) as info:
        resolve(["model=llama3_8", "hw=ascend910", "train.micro_bach_size=2", "train.lr=1"])
    problems = [str(p) for p in info.value.problems]
    assert any(p.startswith("model: unknown option 'llama3_8'") and "llama3_8b" in p for p in problems)
    assert any(p.startswith("hw: unknown option 'ascend910'") and "ascend910b" in p for p in problems)
    typos = [p for p in problems if p.startswith("train.")]
    assert [p.split(":")[0] for p in typos] == ["train.micro_bach_size", "train.lr"]
    assert "did you mean 'micro_batch_size'" in typos[0] and "allowed: " in typos[1]


def test_malformed_override_is_a_problem_not_a_traceback() -> None:
    assert problems_of(["train.micro_batch_size=="])[0].startswith("override:")


def test_team_recipe_tree_adds_options(tmp_path) -> None:
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "team_lora.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /mode: lora\nname: team_lora\n"
    )
    composed = compose(["recipe=team_lora"], extra_dirs=[tmp_path])
    assert composed.raw["name"] == "team_lora" and composed.choices["mode"] == "lora"
    assert "team_lora" in group_options("recipe", [tmp_path])


def test_missing_team_tree_is_reported(tmp_path) -> None:
    assert "not a directory" in problems_of([], extra_dirs=[tmp_path / "nope"])[0]


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_has_options_on_disk(group: str) -> None:
    assert group_options(group), f"recipes/{group}/ has no options"
