"""``recipekit plan`` for runs of several stages (``--stage``) and ``--advise``'s lines at 80 columns."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from recipekit.cli import main

WIDTH = 80
BASE = ("recipe=qwen2.5_7b_pretrain", "hw=h100", "train.max_steps=1000")
LONG = "data.max_len=32768 parallel=distopt parallel.tensor_parallel=2 parallel.sequence_parallel=true " + (
    "parallel.context_parallel=4 train.max_steps=100"
)


def run(*args: str):
    return CliRunner().invoke(main, list(args), env={"COLUMNS": str(WIDTH)})


def test_a_run_of_two_stages_sums_time_device_hours_and_cost():
    """8K-style pretraining, then a long-context stage with context parallelism: each stage estimated on its own,
    the run's figures their sums."""
    result = run("plan", *BASE, "hw.price_per_device_hour=2", "--stage", LONG, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    first, second = (stage["estimate"] for stage in document["stages"])
    assert (
        document["stages"][0]["overrides"] == [] and "parallel.context_parallel=4" in document["stages"][1]["overrides"]
    )
    assert (first["layout"]["seq_len"], second["layout"]["seq_len"]) == (4096, 32768)
    assert second["layout"]["context_parallel"] == 4 and second["time"]["total_steps"] == 100
    total = document["total"]
    for key, part in (("time_s", "total_s"), ("device_hours", "device_hours"), ("cost", "cost")):
        assert total[key] == pytest.approx(first["time"][part] + second["time"][part], rel=1e-3)
    text = run("plan", *BASE, "--stage", LONG)
    assert text.exit_code == 0, text.output
    assert "Stage 2: data.max_len=32768" in text.output and "Stages of the run" in text.output


def test_a_stage_that_does_not_fit_fails_the_run():
    result = run("plan", *BASE, "--stage", "data.max_len=32768 parallel=ddp parallel.gradient_checkpointing=false")
    assert result.exit_code == 1, result.output
    assert "DOES NOT FIT" in result.output


def test_advise_prints_each_layout_as_one_complete_line():
    """Issue 41: every line fits 80 columns but a layout's overrides, which stand whole on one line (beside their
    number where that fits, else on a line of their own) so that copying the line copies all of them."""
    result = run("plan", "recipe=qwen2.5_14b_sft", "--advise", "--json")
    advices = json.loads(result.output)["advice"]
    output = run("plan", "recipe=qwen2.5_14b_sft", "--advise").output.splitlines()
    shown = output[next(i for i, s in enumerate(output) if s.startswith("Layouts that fit")) :]
    whole = [" ".join(a["overrides"]) for a in advices]
    for rank, line in enumerate(whole, 1):
        assert f"{rank} {line}" in shown or line in shown, (line, shown)
    others = [s for s in shown if not any(w in s for w in whole) and not s.startswith("paste: ")]
    assert all(len(s) <= WIDTH for s in others), [s for s in others if len(s) > WIDTH]
    assert any(s.startswith("1 is first:") for s in shown)
