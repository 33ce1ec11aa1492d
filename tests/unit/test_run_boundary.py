"""recipe.yaml's plan is one contract: the keys the runtime reads (runtime/contract.RunPlan) are keys recipekit's plan
writes, with the types the runtime expects, for every preset."""

from __future__ import annotations

from dataclasses import fields

import pytest
import yaml

from recipekit.bundle.build import resolve
from recipekit.bundlefiles import RECIPE
from recipekit.runtime import contract
from tests.conftest import render_files
from tests.golden.cases import cases


@pytest.mark.parametrize("name", ["tiny_sft", "llama3_8b_lora"])
def test_the_plan_recipekit_writes_is_the_plan_the_runtime_reads(name: str) -> None:
    overrides = cases()[name]
    summary = resolve(overrides).plan.summary()
    assert {f.name for f in fields(contract.RunPlan)} <= set(summary)
    assert {f.name for f in fields(contract.PlanFlops)} <= set(summary["flops"])
    written = yaml.safe_load(render_files(overrides)[RECIPE])["plan"]
    plan = contract.RunPlan.from_dict(written)
    assert plan.run_id == summary["run_id"] and plan.flops.peak_tflops == summary["flops"]["peak_tflops"]
    for field in fields(contract.RunPlan):
        if field.name != "flops":
            assert type(getattr(plan, field.name)).__name__ == field.type, field.name


def test_plan_keys_name_every_field() -> None:
    keys = contract.plan_keys()
    assert "plan.run_id" in keys and "plan.flops.model_per_token" in keys and "plan.flops" not in keys
