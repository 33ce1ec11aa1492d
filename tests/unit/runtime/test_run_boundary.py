"""recipe.yaml is one contract: the keys the runtime reads (runtime/boundary/recipeview's RunPlan and views) are
keys recipekit writes, with the types the runtime expects, for every preset; a key it lacks is a one-line error."""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from recipekit.bundle.build import resolve
from recipekit.bundle.files import RECIPE
from recipekit.runtime.boundary import recipeview
from recipekit.runtime.boundary.common import RunError
from recipekit.runtime.boundary.config import RunConfig, load_run_config
from recipekit.runtime.boundary.recipeview import OperationsView, RecipeView
from tests.conftest import render_files
from tests.golden.cases import cases


@pytest.mark.parametrize("name", ["tiny_sft", "llama3_8b_lora"])
def test_the_plan_recipekit_writes_is_the_plan_the_runtime_reads(name: str) -> None:
    overrides = cases()[name]
    summary = resolve(overrides).plan.summary()
    required = {f.name for f in fields(recipeview.RunPlan) if f.default is dataclasses.MISSING}
    assert required <= set(summary) and "elastic" not in summary  # written only for an elastic run
    assert {f.name for f in fields(recipeview.PlanFlops)} <= set(summary["flops"])
    written = yaml.safe_load(render_files(overrides)[RECIPE])["plan"]
    plan = recipeview.RunPlan.from_dict(written)
    assert plan.run_id == summary["run_id"] and plan.flops.peak_tflops == summary["flops"]["peak_tflops"]
    for field in fields(recipeview.RunPlan):
        value = getattr(plan, field.name)
        if field.name == "elastic":  # None, or the table of plan/rescale.py's Elastic
            assert value == summary.get("elastic"), value
        elif field.name != "flops":
            assert type(value).__name__ == field.type, field.name


def test_plan_keys_name_every_field() -> None:
    keys = recipeview.plan_keys()
    assert "plan.run_id" in keys and "plan.flops.model_per_token" in keys and "plan.flops" not in keys


# ------------------------------------------------------------------ recipe.yaml's recipe and operations sections
@functools.cache
def _recipe_yaml(name: str) -> dict[str, Any]:
    return yaml.safe_load(render_files(cases()[name])[RECIPE])


def _load(tmp_path: Path, raw: dict[str, Any]) -> RunConfig:
    path = tmp_path / RECIPE
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_run_config(path)


def _load_any(tmp_path: Path, raw: dict[str, Any]) -> Any:
    """A Trainer bundle's recipe.yaml through the Trainer's loader, a Megatron bundle's through the room's own."""
    if "megatron" not in raw:
        return _load(tmp_path, raw)
    from recipekit.runtime.megatron.settings import load_engine_run

    path = tmp_path / RECIPE
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_engine_run(path)


def _required_keys(view: type, where: str) -> list[str]:
    """Every dotted key of ``view`` that recipe.yaml must hold (dataclass sections walked, optional ones skipped)."""
    hints = typing.get_type_hints(view)
    keys = []
    for field in dataclasses.fields(view):
        if field.default is not dataclasses.MISSING:
            continue
        hint, key = hints[field.name], f"{where}.{field.name}"
        keys.append(key)
        if dataclasses.is_dataclass(hint):
            keys += _required_keys(hint, key)
    return keys


@pytest.mark.parametrize("name", sorted(cases()))
def test_every_preset_recipe_yaml_loads_into_the_typed_views(name: str, tmp_path: Path) -> None:
    raw = _recipe_yaml(name)
    run = _load_any(tmp_path, raw)
    assert isinstance(run.recipe, RecipeView) and isinstance(run.operations, OperationsView)
    assert (
        run.recipe.name == raw["recipe"]["name"] and run.recipe.hw.torch_device == raw["recipe"]["hw"]["torch_device"]
    )
    assert run.recipe.data.shard_mib == float(raw["recipe"]["data"]["shard_mib"])
    assert run.operations.metrics.ports == raw["operations"]["metrics"]["ports"]
    assert run.operations.preflight.expected_versions == raw["operations"]["preflight"]["expected_versions"]
    assert (run.recipe.mode.lora is not None) == recipeview.trains_adapter(raw["recipe"]["mode"]["kind"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.recipe.name = "other"  # type: ignore[misc]
    assert not hasattr(run.recipe, "__dict__")  # slotted: no attribute can be added by accident


@pytest.mark.parametrize(
    "key", [*_required_keys(RecipeView, "recipe"), *_required_keys(OperationsView, "operations"), "plan.run_id"]
)
def test_a_recipe_yaml_missing_a_key_the_runtime_reads_fails_with_one_line_naming_it(key: str, tmp_path: Path) -> None:
    raw = copy.deepcopy(_recipe_yaml("tiny_sft"))
    *parents, last = key.split(".")
    node = raw
    for part in parents:
        node = node[part]
    del node[last]
    with pytest.raises(RunError) as caught:
        _load(tmp_path, raw)
    message = str(caught.value)
    assert f"{key} is missing" in message and "\n" not in message and "rebuild the bundle" in message


def test_an_adapter_mode_without_its_lora_settings_is_refused(tmp_path: Path) -> None:
    raw = copy.deepcopy(_recipe_yaml("llama3_8b_lora"))
    del raw["recipe"]["mode"]["lora"]
    with pytest.raises(RunError, match=r"recipe\.mode\.lora is missing"):
        _load(tmp_path, raw)


def test_a_misshapen_value_names_its_key_and_unknown_keys_are_ignored(tmp_path: Path) -> None:
    raw = copy.deepcopy(_recipe_yaml("tiny_sft"))
    raw["recipe"]["hw"]["brand_new_key"] = {"anything": 1}
    raw["recipe"]["data"]["max_len"] = "long"
    with pytest.raises(RunError, match=r"recipe\.data\.max_len is 'long': expected int") as caught:
        _load(tmp_path, raw)
    assert "\n" not in str(caught.value)
    raw["recipe"]["data"]["max_len"] = 128
    assert _load(tmp_path, raw).recipe.data.max_len == 128
