"""Which tiny twin a dry run trains: the recipe's own tiny model, the hand-made twin of its family, else a generic
twin shrunk from the option's own config; where none can be had, one line saying why (exit 2), while plan and build
still work. The option's ``config`` mapping is checked like every recipe value."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import build, resolve
from recipekit.cli.validate import validate_command
from recipekit.recipe.schema import to_data, validate
from recipekit.recipe.sections import ModelSpec
from recipekit.validate.dryrun.options import DryRunOptions, DryRunUsageError
from recipekit.validate.dryrun.workdir import twinmodel
from recipekit.validate.dryrun.workdir.substitutions import substitute


def tiny_llama() -> ModelSpec:
    return resolve(["recipe=tiny_sft"]).recipe.model


def test_the_recipe_s_own_tiny_model_and_a_hand_made_twin_come_first(tmp_path: Path) -> None:
    own = tiny_llama()
    assert twinmodel.choose_twin(own, 1, tmp_path) == (own, "the recipe's own tiny random model")
    full = dataclasses.replace(own, name="big_llama", init="pretrained")
    twin, why = twinmodel.choose_twin(full, 1, tmp_path)
    assert twin.name == "tiny_llama" and "tiny llama twin" in why
    assert not (tmp_path / "full-config.json").exists()  # no generic twin was made


def test_without_a_twin_or_a_config_the_dry_run_says_why_in_one_line(tmp_path: Path) -> None:
    orphan = dataclasses.replace(tiny_llama(), name="orphan", family="gpt_neox", init="pretrained", config=None)
    with pytest.raises(DryRunUsageError) as caught:
        twinmodel.choose_twin(orphan, 1, tmp_path)
    message = str(caught.value)
    assert "no tiny twin of family 'gpt_neox'" in message and "recipekit model import" in message
    assert "\n" not in message


def test_tp_gives_a_hand_made_twin_whole_heads_in_its_numbers_and_its_config(tmp_path: Path) -> None:
    overrides = ["recipe=llama3_8b_sft", "parallel=zero2", "parallel.tensor_parallel=4", "cluster.nodes=2"]
    recipe = resolve(overrides).recipe
    dry, subs = substitute(recipe, DryRunOptions(pods=2, procs_per_pod=2, steps=8, device="cpu"), tmp_path)
    assert dry.model.num_kv_heads == 4 and dry.model.num_attention_heads % 4 == 0
    if dry.model.config is not None:  # what the runtime builds the twin from follows the numbers
        assert dry.model.config["num_key_value_heads"] == 4
        assert dry.model.config["num_attention_heads"] == dry.model.num_attention_heads
    assert any(s.field == "recipe.model.num_kv_heads" and "whole heads" in s.why for s in subs)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"model_type": "llama", "bad key!": 1}, "is not an identifier"),
        ({"model_type": "llama", "act": "silu\n"}, "not a one-line string"),
        ({"model_type": "qwen3"}, "is not the family 'llama'"),
        ({"model_type": "llama", "deep": [[[[[[[1]]]]]]]}, "larger than a config.json"),
    ],
)
def test_an_option_s_config_must_be_json_of_its_own_family(config: dict, words: str) -> None:
    data = {**to_data(tiny_llama()), "config": config}
    with pytest.raises(RecipeError) as caught:
        validate(ModelSpec, data, root="model")
    assert words in str(caught.value) and "model.config" in str(caught.value)


@pytest.mark.slow
def test_where_no_twin_can_be_made_build_works_and_the_dry_run_exits_2_saying_why(tmp_path: Path) -> None:
    """A team's option of an architecture the transformers here does not ship: plan and build need no twin; the dry
    run stops before any pod starts, with the reason in one line."""
    tree = tmp_path / "recipes" / "model"
    tree.mkdir(parents=True)
    option = {**to_data(tiny_llama()), "name": "future_model", "family": "future_arch", "init": "pretrained"}
    option["config"] = {"model_type": "future_arch", "hidden_size": 64}
    (tree / "future_model.yaml").write_text(json.dumps(option), encoding="utf-8")
    overrides = ["recipe=tiny_sft", "model=future_model"]
    bundle = build(overrides, tmp_path / "bundle", extra_dirs=[tmp_path / "recipes"], force=True).path
    result = CliRunner().invoke(validate_command, [str(bundle), "--dry-run", "--workdir", str(tmp_path / "work")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if "future_model" in line]
    assert len(lines) == 1 and "does not know the architecture 'future_arch'" in lines[0], result.output
    assert "Traceback" not in result.output
