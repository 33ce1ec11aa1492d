"""The record checker: every problem of a document at once, each keyed by its dotted path, with what is allowed."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest

from recipekit.base.errors import RecipeError
from recipekit.recipe.schema import Section, Tagged, field_names, spec, to_data, validate


class Inner(Section):
    size: int = spec(gt=0, le=8, description="A bounded integer.")
    ratio: float = spec(0.5, ge=0, lt=1, description="A float in [0, 1).")


class Cat(Section):
    kind: Literal["cat"] = spec(description="Tag.")
    lives: int = spec(9, description="Lives.")


class Dog(Section):
    kind: Literal["dog"] = spec(description="Tag.")
    good: bool = spec(True, description="Always.")


class Outer(Section):
    name: str = spec(pattern=r"^[a-z]+$", description="Lower-case letters.")
    inner: Inner = spec(description="A nested section.")
    pet: Annotated[Cat | Dog, Tagged("kind")] = spec(description="A tagged union.")
    tags: list[str] = spec(default_factory=list, description="Strings.")
    labels: dict[str, str] = spec(default_factory=dict, description="String map.")
    pair: tuple[str, str] | None = spec(None, description="Two strings or null.")
    target: Literal["all"] | list[str] = spec("all", description="'all' or names.")

    def rules(self) -> list[str]:
        return ["name must not be 'bad'"] if self.name == "bad" else []


GOOD = {"name": "ok", "inner": {"size": 2}, "pet": {"kind": "dog"}}


def problems(data: dict) -> dict[str, str]:
    with pytest.raises(RecipeError) as info:
        validate(Outer, data)
    return {p.key: f"{p.message} {p.hint}".strip() for p in info.value.problems}


def test_valid_document_becomes_frozen_records_with_defaults_and_conversions() -> None:
    outer = validate(Outer, {**GOOD, "inner": {"size": 2, "ratio": 0}, "pair": ["a", "b"]})
    assert outer.inner == Inner(size=2, ratio=0.0) and isinstance(outer.inner.ratio, float)
    assert isinstance(outer.pet, Dog) and outer.pet.good is True
    assert outer.pair == ("a", "b") and outer.tags == [] and outer.target == "all"
    with pytest.raises(AttributeError):
        outer.name = "other"  # type: ignore[misc]


def test_every_problem_is_reported_at_once_with_its_path() -> None:
    found = problems(
        {
            "name": "Bad Name",
            "inner": {"size": 9, "ratio": "x", "sise": 1},
            "pet": {"kind": "cat", "lives": True},
            "tags": ["a", 3],
            "labels": {"a": 1},
            "pair": ["a"],
            "target": 5,
            "extra": 1,
        }
    )
    assert found == {
        "name": "must match ^[a-z]+$ (got 'Bad Name')",
        "inner.sise": "unknown key did you mean 'size'? allowed: ratio, size",
        "inner.size": "must be less than or equal to 8 (got 9)",
        "inner.ratio": "must be a number (got 'x')",
        "pet.lives": "must be an integer (got True)",
        "tags[1]": "must be a string (got 3) quote it to keep it as text: tags[1]='3'",
        "labels.a": "must be a string (got 1) quote it to keep it as text: labels.a='1'",
        "pair": "must have 2 items (got 1)",
        "target": "must be 'all' or a list of strings (got 5)",
        "extra": "unknown key allowed: inner, labels, name, pair, pet, tags, target",
    }


def test_missing_keys_and_unknown_tags() -> None:
    found = problems({"pet": {"kind": "fish"}})
    assert found == {
        "name": "required key is missing",
        "inner": "required key is missing",
        "pet.kind": "unknown pet kind 'fish' allowed: cat, dog",
    }


def test_section_rules_run_once_its_fields_are_valid_and_report_at_its_key() -> None:
    assert problems({**GOOD, "name": "bad"}) == {"<root>": "name must not be 'bad'"}
    with pytest.raises(RecipeError) as info:
        validate(Outer, {**GOOD, "name": "bad"}, root="top")
    assert [p.key for p in info.value.problems] == ["top"]


def test_literals_do_not_confuse_bools_with_ints() -> None:
    class Stage(Section):
        stage: Literal[0, 1] = spec(description="Stage.")

    with pytest.raises(RecipeError, match="must be one of 0, 1"):
        validate(Stage, {"stage": True})
    assert validate(Stage, {"stage": 1}).stage == 1


def test_to_data_is_plain_json_ready_data_in_field_order() -> None:
    outer = validate(Outer, {**GOOD, "pair": ["a", "b"]})
    data = to_data(outer)
    assert list(data) == field_names(Outer)
    assert data["pair"] == ["a", "b"] and data["pet"] == {"kind": "dog", "good": True}
    assert validate(Outer, data) == outer


def test_a_section_that_is_not_a_mapping_lists_its_keys() -> None:
    assert problems({**GOOD, "inner": 3}) == {"inner": "must be a mapping (got 3) keys: size, ratio"}
