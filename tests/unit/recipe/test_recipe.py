"""The typed Recipe rejects what it cannot use, naming the key, the problem and what is allowed."""

from __future__ import annotations

import pytest

from recipekit.base.errors import RecipeError
from recipekit.recipe.compose import compose
from recipekit.recipe.schema import field_names
from recipekit.recipe.sections import Recipe, TrainSpec, parse_recipe


def problems(overrides: list[str]) -> dict[str, str]:
    with pytest.raises(RecipeError) as info:
        parse_recipe(compose(overrides).raw)
    return {p.key: f"{p.message} {p.hint}" for p in info.value.problems}


def test_presets_parse() -> None:
    recipe = parse_recipe(compose(["recipe=llama3_8b_lora"]).raw)
    assert isinstance(recipe, Recipe)
    assert recipe.mode.kind == "lora" and recipe.mode.lora.r == 16


def test_every_error_collected_with_its_key() -> None:
    found = problems(
        [
            "train.micro_batch_size=0",
            "train.learning_rate=abc",
            "+cluster.nodez=2",
            "cluster.master_port=80",
            "mode.lora.r=-1",
            "mode=lora",
        ]
    )
    assert set(found) == {
        "train.micro_batch_size",
        "train.learning_rate",
        "cluster.nodez",
        "cluster.master_port",
        "mode.lora.r",
    }
    assert "greater than 0" in found["train.micro_batch_size"]
    assert "did you mean 'nodes'" in found["cluster.nodez"]


def test_unknown_key_names_allowed_keys() -> None:
    found = problems(["+train.learning_rat=1e-4"])
    assert "did you mean 'learning_rate'" in found["train.learning_rat"]
    assert "allowed:" in found["train.learning_rat"]


def test_wrong_enum_value_lists_allowed() -> None:
    found = problems(["train.precision=fp4"])
    assert "'auto'" in found["train.precision"] and "fp4" in found["train.precision"]


def test_model_architecture_must_be_consistent() -> None:
    found = problems(["model.num_kv_heads=5"])
    assert "divisible by num_kv_heads" in found["model"]


def test_every_train_key_is_set_without_a_plus() -> None:
    """`train.KEY=VALUE` works for every field although the root config spells none (their defaults are the
    record's); the recorded overrides stay as written."""
    overrides = [f"train.{name}={_value_for(name)}" for name in field_names(TrainSpec)]
    composed = compose(overrides)
    assert set(composed.raw["train"]) == set(field_names(TrainSpec))
    assert composed.overrides == overrides
    parse_recipe(composed.raw)


def _value_for(name: str) -> str:
    defaults = TrainSpec()
    value = getattr(defaults, name)
    if hasattr(value, "__dataclass_fields__"):  # a nested section (train.tracking): an empty mapping, its defaults
        return "{}"
    return "null" if value is None else "[tensorboard]" if isinstance(value, list) else str(value)


def test_override_typos_are_caught_against_the_schema_before_composing() -> None:
    from recipekit.base.paths import GROUPS
    from recipekit.recipe.overrides import unknown_override_keys

    overrides = [
        "train.micro_bach_size=2",
        "mode.lora.rr=3",
        "mode.lora.r=8",
        "hw.node_selector.zone=a",
        "model=llama3_8b",
        "+train.extra=1",
        "cluster.nodes=2",
    ]
    found = {problem.key: problem.hint for _, problem in unknown_override_keys(overrides, GROUPS)}
    assert set(found) == {"train.micro_bach_size", "mode.lora.rr"}
    assert "did you mean 'micro_batch_size'" in found["train.micro_bach_size"]
    assert "did you mean 'r'" in found["mode.lora.rr"]


def test_every_field_of_every_section_is_documented() -> None:
    """Field descriptions are the recipe's reference documentation: none may be missing."""
    import dataclasses

    from recipekit.recipe import sections as module
    from recipekit.recipe.schema import Section

    sections = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, Section) and v is not Section]
    assert len(sections) >= 12
    undocumented = [
        f"{section.__name__}.{field.name}"
        for section in sections
        for field in dataclasses.fields(section)
        if not field.metadata.get("description")
    ]
    assert undocumented == []
