"""benchmarks/bench_device.py, the device check, on a machine without an accelerator: its arguments, the bundle it
asks for (built here, on the CPU: building imports no torch), the summary of a run's metrics and its printed lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from recipekit.bundle.build import build
from tests.scriptmodule import script_module

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_device.py"


@pytest.fixture(scope="module")
def bench():
    with script_module(SCRIPT) as module:
        yield module


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--minutes", "30"], "--minutes must be from 0.5 to 9"),
        (["--minutes", "0.1"], "--minutes must be from 0.5 to 9"),
        (["--seq-len", "8"], "--seq-len must be at least 16"),
        (["--set", "novalue"], "--set takes KEY=VALUE, not 'novalue'"),
        (["--engine", "megatron", "--tp", "3"], "--tp × --pp must divide --devices"),
    ],
)
def test_bad_arguments_are_one_usage_line(bench, argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_the_bundle_it_asks_for_is_one_device_of_a_full_size_model_with_random_weights(bench, tmp_path: Path) -> None:
    options = bench.parse_args(["--set", "train.learning_rate=1e-4"])
    bundle = build(bench.overrides(options, tmp_path, tmp_path / "data.jsonl", 40), output=tmp_path / "b").path
    plan = json.loads((bundle / "plan.json").read_text())
    assert plan["layout"]["world_size"] == 1 and plan["layout"]["seq_len"] == 2048
    assert 1e9 <= plan["compute"]["params_total"] <= 9e9 and plan["compute"]["flops_per_token"] > 0
    assert "init: random" in (bundle / "recipe.yaml").read_text()
    assert bench.MIN_STEPS <= bench.steps_for(plan, 3.0) <= bench.MAX_STEPS


def test_the_megatron_path_builds_one_node_at_tp_x_pp_and_starts_the_rooms_entry(bench, tmp_path: Path) -> None:
    """Issue 39 item 6: the engine's bundle at TP 2 × PP 2 on 8 devices (DP 2), started by torchrun over the node's
    devices with the Megatron room's own entry, its metrics read from the room's output directory."""
    options = bench.parse_args(["--engine", "megatron", "--mode", "sft", "--model", "qwen3_8b"])
    bundle = build(bench.overrides(options, tmp_path, tmp_path / "data.jsonl", 40), output=tmp_path / "b").path
    recipe = yaml.safe_load((bundle / "recipe.yaml").read_text())
    model = recipe["megatron"]["model"]
    assert (model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"]) == (2, 2)
    assert json.loads((bundle / "plan.json").read_text())["layout"]["world_size"] == 8
    out, command = bench.start_command(options, bundle, recipe)
    assert out == Path(recipe["megatron"]["recipekit"]["output_dir"])
    assert "--nproc-per-node=8" in command and command[-6:-4] == ["-m", "runtime.megatron.train"]


def test_steps_follow_the_plans_step_time_within_bounds(bench) -> None:
    assert bench.steps_for({"time": {"step_s": 0.5}}, 3.0) == 360
    assert bench.steps_for({"time": {"step_s": 100.0}}, 1.0) == bench.MIN_STEPS
    assert bench.steps_for({"time": {"step_s": 1e-6}}, 9.0) == bench.MAX_STEPS
    assert bench.steps_for({}, 1.0) == 60


def test_the_summary_leaves_out_warm_up_and_prints_each_figure_beside_the_plans(bench) -> None:
    plan = {"memory_gib": {"total": 98.0, "device": 140.0}, "compute": {"assumed_mfu": 0.4}}
    logs = [
        {
            "loss": 2.0,
            "step": 5 * i,
            "tokens_per_second_per_device": rate,
            "mfu": rate / 20000,
            "peak_device_memory_gib": 80.0 + i,
        }
        for i, rate in enumerate([100.0, 500.0, 4000.0, 4200.0, 3900.0], start=1)
    ]
    records = [{"event": "preflight"}, *logs, {"train_runtime": 60.0}]
    summary = bench.summarise("qwen3_8b", records, plan)
    assert summary.tokens_per_s == 4000.0 and summary.mfu == 0.2 and summary.peak_gib == 85.0 and summary.steps == 25
    lines = bench.report(summary).splitlines()
    assert lines[0].split() == ["model,", "steps", "qwen3_8b,", "25"]
    assert lines[1].endswith(" 4,000")
    assert lines[2].endswith("20.0%   plan assumes 40%")
    assert lines[3].endswith("85.0   plan 98.0 (0.87×), device 140")
    with pytest.raises(SystemExit, match="logged no training step"):
        bench.summarise("qwen3_8b", [{"event": "preflight"}], plan)


def test_without_cuda_it_says_skipped_and_exits_0(bench, capsys, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main([]) == 0
    assert capsys.readouterr().out.strip() == "skipped: no CUDA device"


def test_a_cut_last_line_of_metrics_is_left_out(bench, tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"loss": 1.0}\n[1]\n{"loss": 2.')
    assert bench.read_records(path) == [{"loss": 1.0}]
    assert bench.read_records(tmp_path / "missing.jsonl") == []
