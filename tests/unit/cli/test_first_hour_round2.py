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
        [sys.executable, "-m", "recipekit.cli", "list"], capture_output=True, text=True, env=env, check=True
    ).stdout
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 80
    names = {cell.strip().removesuffix(" *") for line in lines for cell in line.strip("│").split("│")[1:2]}
    for row in option_rows(GROUPS, []):
        assert row.option in names, row.option
