"""eval.enabled at build: the harness pinned in the images of the recipes that evaluate and no other, the section
in recipe.yaml only when set (so every existing bundle stays as it was), the runtime's reading of it, and the
refusals (an engine that does not evaluate, an image family without the harness)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import resolve
from recipekit.bundle.files import DOCKERFILE, MANIFEST, RECIPE
from recipekit.image.matrix import evaluation_problems
from recipekit.runtime.boundary.recipeview import EvalView, RecipeView, read_section
from recipekit.runtime.session.evaluation import evaluated_model, harness_call
from tests.conftest import render_files

PIN = b"lm_eval==0.4.13"


def test_a_recipe_that_does_not_evaluate_has_no_harness_and_no_eval_section() -> None:
    files = render_files(["recipe=tiny_sft"])
    assert PIN not in files[DOCKERFILE] and "eval" not in yaml.safe_load(files[RECIPE])["recipe"]
    assert "lm_eval" not in json.loads(files[MANIFEST])["versions"]


def test_eval_enabled_pins_the_harness_and_the_runtime_reads_the_section() -> None:
    plain = resolve(["recipe=tiny_sft"]).plan.image
    asked = ["recipe=tiny_sft", "eval.enabled=true", "eval.tasks=[arc_easy,mmlu]", "eval.limit=50"]
    assert resolve(asked).plan.image != plain  # another stack: another image
    files = render_files(asked)
    assert PIN in files[DOCKERFILE]
    assert json.loads(files[MANIFEST])["versions"]["lm_eval"] == "0.4.13"
    recipe = yaml.safe_load(files[RECIPE])["recipe"]
    view = read_section(RecipeView, recipe, "recipe").eval
    assert view == EvalView(True, ["arc_easy", "mmlu"], None, 50, None, 8)


def test_the_harness_is_called_on_what_the_run_saved(tmp_path) -> None:
    out = tmp_path / "out"
    assert evaluated_model(out, "/models/base", None, adapter=False)["pretrained"] == str(out)
    assert evaluated_model(out, "/models/base", None, adapter=True) == {
        "pretrained": "/models/base",
        "peft": str(out),
        "tokenizer": str(out),
    }
    assert evaluated_model(out, "/models/base", out / "merged", adapter=True)["pretrained"] == str(out / "merged")
    call = harness_call(EvalView(True, ["arc_easy"], "/tasks", 10, 0, 4), {"pretrained": "m"}, "npu:0")
    assert call["model"] == "hf" and call["tasks"] == ["arc_easy"] and call["device"] == "npu:0"
    assert (call["limit"], call["num_fewshot"], call["batch_size"], call["log_samples"]) == (10, 0, 4, False)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("eval.tasks=[]", "eval.tasks: empty while eval.enabled"),
        ("eval.tasks=['a b']", "benchmark task"),
        ("eval.task_dir=relative/dir", "absolute"),
        ("eval.limit=0", "eval.limit"),
    ],
)
def test_bad_eval_settings_are_named(override: str, message: str) -> None:
    with pytest.raises(RecipeError) as caught:
        resolve(["recipe=tiny_sft", "eval.enabled=true", override])
    assert message in str(caught.value)


def test_an_image_family_without_the_harness_or_another_engine_is_refused() -> None:
    resolved = resolve(["recipe=tiny_sft", "eval.enabled=true"])
    bare = dataclasses.replace(resolved.plan.family, evaluation=None)
    (problem,) = evaluation_problems("cpu", bare, resolved.recipe)
    assert problem.key == "eval.enabled" and "pins no benchmark harness" in problem.message
    megatron = dataclasses.replace(resolved.recipe, engine=dataclasses.replace(resolved.recipe.engine, kind="megatron"))
    assert "does not evaluate after training" in evaluation_problems("cpu", resolved.plan.family, megatron)[0].message
