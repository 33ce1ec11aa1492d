"""The first hour, round 2 (issue 32, point 9): the smaller things a new user met, each held to what it should be."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from recipekit.cli import main


def test_ctrl_c_exits_130_from_any_command(monkeypatch) -> None:
    """The reference says 130 for Ctrl-C: every command, not only validate (click's own answer is 1, "Aborted!")."""
    import recipekit.bundle.build

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(recipekit.bundle.build, "resolve", interrupted)
    result = CliRunner().invoke(main, ["show", "recipe=tiny_sft"])
    assert result.exit_code == 130 and "interrupted" in result.output and "Aborted" not in result.output


ROOT = Path(__file__).resolve().parents[3]
#: The tour's case as stated (ZeRO-2): 74.5 GiB per 64 GiB device.
DOES_NOT_FIT = [
    "recipe=qwen2.5_14b_sft", "hw=ascend910b", "cluster.nodes=2", "parallel=zero2", "train.micro_batch_size=4",
    "train.gradient_accumulation_steps=2", "train.global_batch_size=null",
]  # fmt: skip


@pytest.mark.parametrize("page", ["docs/tour.md", "README.md"])
def test_the_venv_is_activated_before_the_first_bare_recipekit(page: str) -> None:
    """The pages' commands are bare `recipekit`: a step before the first one puts the venv's on PATH."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    commands = "|".join(main.list_commands(click.Context(main)))
    first = next(i for i, line in enumerate(lines) if re.match(rf"^(\$ )?recipekit ({commands})\b", line))
    assert any(".venv/bin/activate" in line for line in lines[:first]), page


def test_plan_exits_1_when_the_recipe_does_not_fit() -> None:
    runner = CliRunner()
    fits = runner.invoke(main, ["plan", "recipe=tiny_sft"])
    assert fits.exit_code == 0, fits.output
    too_big = runner.invoke(main, ["plan", *DOES_NOT_FIT])
    assert too_big.exit_code == 1 and "DOES NOT FIT" in too_big.output, too_big.output
    as_json = runner.invoke(main, ["plan", *DOES_NOT_FIT, "--json"])
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["estimate"]["memory_gib"]["fits"] is False


def test_the_refused_out_of_memory_build_names_allow_oom(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["build", *DOES_NOT_FIT, "-o", str(tmp_path / "b")])
    assert result.exit_code == 2 and "parallel=zero3" in result.output and "--allow-oom" in result.output
    assert not (tmp_path / "b").exists()


def test_model_import_describes_the_option_by_its_name(tmp_path: Path) -> None:
    """--name my_model: the description `recipekit list model` shows starts with my_model, not the directory."""
    pytest.importorskip("transformers")
    config = ROOT / "tests" / "data" / "model_configs" / "llama3_8b" / "config.json"
    target = tmp_path / "my_model.yaml"
    result = CliRunner().invoke(main, ["model", "import", str(config), "-o", str(target), "--name", "my_model"])
    assert result.exit_code == 0, result.output
    option = yaml.safe_load(target.read_text())
    assert option["name"] == "my_model" and option["description"].startswith("my_model ("), option["description"]
    assert option["name_or_path"].endswith("/models/llama3_8b")  # the weights keep the directory's name


def test_list_shows_every_option_name_whole_in_80_columns() -> None:
    """`recipekit list` cut `deepseek_r1_distill_qwen_7b` to `deepseek_r1_distill_qwen…` at 80 columns."""
    import os
    import subprocess
    import sys

    from recipekit.base.paths import GROUPS
    from recipekit.cli.listing import option_rows

    env = {**os.environ, "COLUMNS": "80"}
    env.pop("RECIPEKIT_RECIPES", None)
    shown = subprocess.run(
        [sys.executable, "-m", "recipekit.cli", "list", "--all"], capture_output=True, text=True, env=env, check=True
    ).stdout
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 80
    names = {cell.strip().removesuffix(" *") for line in lines for cell in line.strip("│").split("│")[0:1]}
    for row in option_rows(GROUPS, []):
        assert row.option in names, row.option


def _killed_run(path: Path) -> Path:
    """A run killed after step 6 and resumed at 4 (metrics), with the runtime's recovery.jsonl: the last step before
    the kill at t=1006, the first step after the restart at t=1039.14 (MTTR 33.14 s)."""
    from tests.unit.runfixtures import losses, write_run

    write_run(path, losses(), kill_after=6, resume_step=4, downtime=30.0)
    records = [
        {"event": "start", "time": 1000.0, "resume_step": 0, "interrupted": None},
        {"event": "first_step", "step": 1, "time": 1001.0},
        {"event": "start", "time": 1036.0, "resume_step": 4, "interrupted": {"step": 6, "time": 1006.0}},
        {"event": "first_step", "step": 5, "time": 1039.14},
    ]
    (path / "recovery.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_one_recovery_is_told_one_way_by_report_and_runs_history(tmp_path: Path) -> None:
    """Issue 32: MTTR 33.14 s (runs history), 34.0 s (report), 33.97: the report states the runtime's MTTR."""
    pytest.importorskip("matplotlib")
    run = _killed_run(tmp_path / "out")
    history = CliRunner().invoke(main, ["runs", "history", str(run)])
    report = CliRunner().invoke(main, ["report", str(run), "-o", str(tmp_path / "r")])
    assert history.exit_code == 0 and report.exit_code == 0, history.output + report.output
    assert "MTTR 33.14 s" in history.output and "MTTR 33.14 s" in report.output, report.output
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["restarts"][0]["mttr_s"] == 33.14
    assert "<td>33.14</td>" in (tmp_path / "r" / "report.html").read_text().replace(' class="num"', "")


def test_runs_history_takes_a_dry_runs_work_directory(tmp_path: Path) -> None:
    """As report and compare do: the work directory's output directory is found through its bundle."""
    from recipekit.bundle.build import build
    from recipekit.runs.runlog import DRYRUN_MARKER

    workdir = tmp_path / "work"
    shared = workdir / "shared"
    overrides = ["recipe=tiny_sft", f"cluster.mount_path={shared}", f"cluster.output_dir={shared}/out"]
    bundle = build([*overrides, f"data.path={shared}/data/tiny.jsonl"], workdir / "bundle").path
    (workdir / DRYRUN_MARKER).write_text("")
    output = yaml.safe_load((bundle / "recipe.yaml").read_text())["training_arguments"]["output_dir"]
    _killed_run(Path(output))
    result = CliRunner().invoke(main, ["runs", "history", str(workdir)])
    assert result.exit_code == 0, result.output
    assert "1 recovery(ies)" in result.output and "MTTR 33.14 s" in result.output
    missing = CliRunner().invoke(main, ["runs", "history", str(tmp_path)])
    assert missing.exit_code == 2 and "not a run's output directory" in missing.output
