"""The data's size in the plan: rows and tokens per epoch (exact once prepared, estimated before), the schedule the
Trainer will have, the time figures, and ``recipekit plan --data`` / ``recipekit data prepare`` at the command line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit import memory
from recipekit.bundle.build import resolve
from recipekit.cli import main
from recipekit.plan.datasize import data_size, steps_per_epoch
from recipekit.plan.layout import Layout
from recipekit.runtime.volume import manifest


def plan_of(*overrides: str):
    return resolve(list(overrides)).plan


def trainer_steps(rows: int, micro: int, accum: int, world: int) -> int:
    """The Trainer's count (transformers 5 set_initial_training_values over Accelerate's BatchSamplerShard)."""
    batches = math.ceil(rows / micro)
    per_rank = batches // world + (1 if batches % world else 0)  # even_batches: every rank as many as the busiest
    return max(per_rank // accum + int(per_rank % accum > 0), 1)


@pytest.mark.parametrize("rows", [1, 7, 64, 1000, 52_002])
@pytest.mark.parametrize("micro, accum, world", [(1, 1, 1), (2, 8, 8), (3, 5, 16), (4, 1, 3)])
def test_steps_per_epoch_are_the_trainers(rows, micro, accum, world):
    layout = Layout(nodes=world, devices_per_pod=1, micro_batch_size=micro, gradient_accumulation_steps=accum)
    assert steps_per_epoch(rows, layout) == trainer_steps(rows, micro, accum, world)


def test_rows_and_tokens_come_from_the_most_exact_number_the_recipe_has():
    base = resolve(["recipe=qwen2.5_7b_pretrain"]).recipe.data  # text, max_len 4096, num_samples = blocks
    from dataclasses import replace

    estimated = data_size(base)
    assert (estimated.rows, estimated.rows_from) == (base.num_samples, "data.num_samples")
    assert estimated.tokens == base.num_samples * base.max_len and not estimated.exact
    by_tokens = data_size(replace(base, num_tokens=10_000_000))
    assert by_tokens.rows == math.ceil(10_000_000 / 4096) and by_tokens.rows_from == "data.num_tokens / data.max_len"
    exact = data_size(replace(base, num_rows=2441, num_tokens=9_998_000))
    assert (exact.rows, exact.tokens, exact.exact) == (2441, 9_998_000, True)
    sft = resolve(["recipe=llama3_8b_sft", "data.eval_fraction=0.1"]).recipe.data
    assert data_size(sft).rows == math.floor(52002 * 0.9)
    assert data_size(replace(sft, num_tokens=5_000_000)).rows == math.floor(52002 * 0.9)  # unpacked: rows = samples


def test_exact_counts_set_the_schedule_and_the_time_figures():
    before = plan_of("recipe=llama3_8b_sft")
    after = plan_of("recipe=llama3_8b_sft", "data.num_rows=40000", "data.num_tokens=12000000")
    assert after.steps_per_epoch == steps_per_epoch(40000, after.layout) < before.steps_per_epoch
    assert after.summary()["data"] == {
        "rows": 40000,
        "tokens": 12_000_000,
        "rows_from": "data.num_rows",
        "tokens_from": "data.num_tokens",
    }
    recipe = resolve(["recipe=llama3_8b_sft", "data.num_rows=40000", "data.num_tokens=12000000"]).recipe
    estimate = memory.estimate(recipe, after)
    assert estimate.compute.tokens_per_step == after.layout.global_batch_size * 300  # the mean row: 300 tokens
    assert any("300 per row" in note for note in estimate.notes)


def test_prepared_dir_defaults_beside_the_runs_and_must_be_on_the_volume():
    assert plan_of("recipe=llama3_8b_sft").prepared_dir == "/mnt/shared/runs/prepared"
    assert plan_of("recipe=llama3_8b_sft", "data.prepared_dir=/mnt/shared/cache/").prepared_dir == "/mnt/shared/cache"
    from recipekit.base.errors import RecipeError

    with pytest.raises(RecipeError, match="data.prepared_dir: /scratch/x is not under the shared volume /mnt/shared"):
        plan_of("recipe=llama3_8b_sft", "data.prepared_dir=/scratch/x")


# ------------------------------------------------------------------------------------------------------ the CLI
def _manifest(tmp_path: Path, **settings) -> Path:
    """A manifest as the prepare step writes it (only what recipekit reads is filled in)."""
    made = {"format": "alpaca", "max_len": 2048, "packing": False, "eval_fraction": 0.0, "chunk_bytes": 64 << 20}
    document = {
        "format": manifest.FORMAT,
        "version": manifest.VERSION,
        "fingerprint": "0" * 20,
        "inputs": {"settings": {**made, **settings}},
        "splits": {"train": {"rows": 50_000, "tokens": 15_000_000}, "eval": {"rows": 0, "tokens": 0}},
    }
    path = tmp_path / "prepared" / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(manifest.dumps(document))
    return path


def test_plan_data_uses_a_manifests_exact_counts(tmp_path):
    path = _manifest(tmp_path)
    result = CliRunner().invoke(main, ["plan", "recipe=llama3_8b_sft", "--data", str(path.parent), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["estimate"]["data"] == {
        "rows": 50_000,
        "tokens": 15_000_000,
        "rows_from": "data.num_rows",
        "tokens_from": "data.num_tokens",
    }
    text = CliRunner().invoke(main, ["plan", "recipe=llama3_8b_sft", "--data", str(path)], terminal_width=200)
    assert "data per epoch" in text.stdout and "50,000 rows (data.num_rows)" in " ".join(text.stdout.split())


def test_plan_data_refuses_a_manifest_made_for_other_rows(tmp_path):
    path = _manifest(tmp_path, max_len=4096, packing=True)
    result = CliRunner().invoke(main, ["plan", "recipe=llama3_8b_sft", "--data", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "data.max_len: " in result.stderr and "was prepared with max_len=4096, the recipe has 2048" in result.stderr
    assert "data.packing: " in result.stderr
    path.write_text("{}")
    result = CliRunner().invoke(main, ["plan", "recipe=llama3_8b_sft", "--data", str(path)])
    assert result.exit_code == 2 and "is not a recipekit prepared-data manifest" in result.stderr
    result = CliRunner().invoke(main, ["plan", "recipe=llama3_8b_sft", "--data", str(tmp_path / "nothing.json")])
    assert result.exit_code == 2 and "--data: cannot read" in result.stderr


def test_data_prepare_refuses_what_is_not_a_bundle(tmp_path):
    result = CliRunner().invoke(main, ["data", "prepare", str(tmp_path)])
    assert result.exit_code == 2 and "is not a recipekit bundle" in result.stderr
    (tmp_path / "recipe.yaml").write_text("recipe: {}\n")
    result = CliRunner().invoke(main, ["data", "prepare", str(tmp_path)])
    assert result.exit_code == 2 and "without a prepare step: rebuild it" in result.stderr
