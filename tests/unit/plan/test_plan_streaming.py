"""``data.streaming`` in the recipe and the plan: the rules, collected with the recipe's other problems, what the
Trainer's arguments say for it, and the commands that have nothing to do for a streaming bundle."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import resolve
from recipekit.cli import main
from tests.conftest import documents_of

STREAM = ("recipe=tiny_sft", "data.streaming=true")


def problems_of(*overrides: str) -> dict[str, str]:
    with pytest.raises(RecipeError) as info:
        resolve(list(overrides))
    return {p.key: f"{p.message} ({p.hint})" for p in info.value.problems}


def test_streaming_is_off_by_default_and_changes_nothing_then() -> None:
    plain = resolve(["recipe=tiny_sft"])
    assert plain.recipe.data.streaming is False
    assert resolve(["recipe=tiny_sft", "data.streaming=false"]).plan.run_id == plain.plan.run_id
    assert "accelerator_config" not in documents_of(plain).engine.recipe_sections["training_arguments"]


def test_a_streaming_run_reads_in_the_training_process_and_skips_no_data_on_resume() -> None:
    resolved = resolve([*STREAM, "~train.max_steps"])  # steps from data.num_samples
    args, plan = documents_of(resolved).engine.recipe_sections["training_arguments"], resolved.plan
    assert args["max_steps"] == plan.total_steps and "num_train_epochs" not in args
    assert args["accelerator_config"] == {"dispatch_batches": False}
    assert args["dataloader_num_workers"] == 0 and args["ignore_data_skip"] is True
    assert plan.run_id != resolve(["recipe=tiny_sft", "~train.max_steps"]).plan.run_id  # another row order
    assert (
        documents_of(resolve([*STREAM, "train.max_steps=5"])).engine.recipe_sections["training_arguments"]["max_steps"]
        == 5
    )


def test_streaming_needs_a_step_count_and_no_eval_split_and_all_problems_come_together() -> None:
    found = problems_of(*STREAM, "~train.max_steps", "~data.num_samples", "data.eval_fraction=0.1")
    assert "needs its step count up front" in found["data.streaming"]
    assert "train.max_steps, or data.num_samples" in found["data.streaming"]
    assert "no split can be held out without preparing" in found["data.eval_fraction"]


def test_streaming_with_tensor_parallelism_is_refused() -> None:
    found = problems_of("recipe=llama3_8b_sft", "parallel=zero2", "parallel.tensor_parallel=2", "data.streaming=true")
    assert "the ranks of a TP group must train on the same rows" in found["data.streaming"]


def test_the_cli_names_the_key_and_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["build", *STREAM, "data.eval_fraction=0.2", "-o", str(tmp_path / "b")])
    assert result.exit_code == 2, result.output
    assert "data.eval_fraction: 0.2 with data.streaming" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "b").exists()


def test_data_prepare_refuses_a_streaming_bundle_in_the_cli_and_in_the_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    built = CliRunner().invoke(main, ["build", *STREAM, "-o", str(bundle)])
    assert built.exit_code == 0, built.output
    result = CliRunner().invoke(main, ["data", "prepare", str(bundle)])
    assert result.exit_code == 2
    assert "streaming bundles tokenise while training and do not prepare" in result.output
    pytest.importorskip("transformers")
    from recipekit.runtime import dataprep
    from recipekit.runtime.boundary import common

    with pytest.raises(common.RunError, match="streams its data"):
        dataprep.prepare_ahead(dataprep.parse_args(["--recipe", str(bundle / "recipe.yaml")]), print)
