"""The CLI as a user meets it: exit codes, messages without tracebacks, examples in every help, a frozen surface."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from recipekit.cli import main

#: The frozen command-line surface. New knobs belong in recipes, not flags: extend this list deliberately.
ALLOWED_FLAGS = {
    "build": {"--output", "--force", "--allow-oom", "--multirun", "--recipes", "--help"},
    "show": {"--json", "--compact", "--internals", "--recipes", "--help"},
    "list": {"--all", "--recipes", "--help"},
    "plan": {"--json", "--advise", "--all-layouts", "--price", "--top", "--stage", "--data", "--recipes", "--help"},
    "init": {"--help"},
    "clean": {"--keep", "--help"},
    "pack": {"--output", "--help"},
    "verify": {"--help"},
    "diff": {"--help"},
    "validate": {
        "--dry-run",
        "--pods",
        "--procs-per-pod",
        "--kill-pod",
        "--lose-pod",
        "--return-at-step",
        "--at-step",
        "--resume-pods",
        "--restart",
        "--device",
        "--json",
        "--workdir",
        "--steps",
        "--timeout",
        "--help",
    },
    "image": {"--help"},
    "image build": {"--tag", "--push", "--platform", "--build-arg", "--engine", "--help"},
    "data": {"--help"},
    "data prepare": {"--workers", "--volume", "--json", "--help"},
    "data verify": {"--prepared", "--volume", "--json", "--help"},
    "report": {"--volume", "--plan", "--output", "--margin", "--export-baseline", "--json", "--help"},
    "compare": {
        "--baseline",
        "--volume",
        "--loss-rtol",
        "--window",
        "--grad-norm-rtol",
        "--eval-rtol",
        "--html",
        "--json",
        "--help",
    },
    "model": {"--help"},
    "model import": {"--output", "--name", "--name-or-path", "--description", "--random", "--force", "--help"},
    "runs": {"--help"},
    "runs history": {"--json", "--help"},
    "rescale": {"--nodes", "--output", "--force", "--recipes", "--help"},
    "submit": {"--kubeconfig", "--context", "--namespace", "--help"},
    "status": {"--volume", "--kubeconfig", "--context", "--namespace", "--help"},
    "logs": {"--follow", "--pod", "--kubeconfig", "--context", "--namespace", "--help"},
    "cancel": {"--kubeconfig", "--context", "--namespace", "--help"},
    "cp": {"--to", "--force", "--help"},
    "restart": {"--from", "--fresh", "--output", "--help"},
}


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_build_writes_bundle(tmp_path: Path) -> None:
    result = run("build", "recipe=tiny_sft", "-o", str(tmp_path / "b"))
    assert result.exit_code == 0, result.output
    assert "built" in result.output and (tmp_path / "b" / "manifest.json").exists()


def test_bad_recipe_exits_2_with_every_problem_and_no_traceback(tmp_path: Path) -> None:
    result = run("build", "model=llama3_8", "train.micro_bach_size=2", "-o", str(tmp_path / "b"))
    assert result.exit_code == 2
    assert "2 problems" in result.output
    assert "model: unknown option 'llama3_8'" in result.output and "train.micro_bach_size: unknown key" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "b").exists()


def test_impossible_combination_exits_2_with_arithmetic() -> None:
    result = run("show", "recipe=qwen2.5_14b_sft", "train.global_batch_size=100")
    assert result.exit_code == 2
    assert "not divisible by micro_batch_size (1) × data-parallel size (16) = 16" in result.output


def test_show_json_has_recipe_and_plan() -> None:
    result = run("show", "recipe=llama3_8b_lora", "hw=a100_80g", "--json")
    document = json.loads(result.output)
    assert document["recipe"]["hw"]["name"] == "a100_80g" and document["plan"]["world_size"] == 8


def test_list_shows_options_with_descriptions() -> None:
    result = run("list", "hw")
    assert result.exit_code == 0 and "ascend910b" in result.output and "910B" in result.output
    assert run("list", "nope").exit_code == 2


def _commands() -> dict[str, click.Command]:
    """Every command, subcommands of a group as "group sub"."""
    context = click.Context(main)
    found = {name: main.get_command(context, name) for name in main.list_commands(context)}
    for name, command in list(found.items()):
        if isinstance(command, click.Group):
            sub = click.Context(command)
            found.update({f"{name} {s}": command.get_command(sub, s) for s in command.list_commands(sub)})
    return found


def test_every_command_is_on_the_frozen_surface() -> None:
    assert sorted(set(_commands()) - set(ALLOWED_FLAGS)) == []


@pytest.mark.parametrize("name", sorted(ALLOWED_FLAGS))
def test_cli_surface_is_frozen_and_help_has_examples(name: str) -> None:
    command = _commands().get(name)
    if command is None:
        pytest.skip(f"command {name} not registered yet")
    flags = {opt for p in command.params if isinstance(p, click.Option) for opt in p.opts if opt.startswith("--")}
    flags.add("--help")
    assert flags <= ALLOWED_FLAGS[name], f"new flags on {name}: {flags - ALLOWED_FLAGS[name]} (put knobs in recipes)"
    assert "Examples:" in (command.help or ""), f"{name} --help has no examples"


def test_build_never_imports_the_training_stack(tmp_path: Path) -> None:
    """Nor what would only slow its start (pydantic, rich): build's speed budget is the import of Hydra and Jinja."""
    code = (
        "import sys\n"
        "from recipekit.cli import main\n"
        f"try:\n    main(['build', 'recipe=llama3_8b_sft', '-o', {str(tmp_path / 'b')!r}])\n"
        "except SystemExit:\n    pass\n"
        "heavy = ('torch', 'transformers', 'deepspeed', 'peft', 'pydantic', 'rich', 'prometheus_client',\n"
        "         'matplotlib', 'kubernetes')\n"
        "heavy = sorted(m for m in heavy if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ}, check=True)
    assert "HEAVY=\n" in out.stdout, out.stdout + out.stderr
    assert (tmp_path / "b" / "run.sh").exists()


def test_console_script_exit_codes_and_output(tmp_path: Path) -> None:
    """`python -m recipekit.cli` is the console script's `run()`: same exit codes, output flushed, no traceback."""
    cli = [sys.executable, "-m", "recipekit.cli", "build", "recipe=tiny_sft"]
    good = subprocess.run([*cli, "-o", str(tmp_path / "b")], capture_output=True, text=True)
    assert good.returncode == 0 and good.stdout.startswith("built "), good.stderr
    bad = subprocess.run([*cli, "train.micro_bach_size=2", "-o", str(tmp_path / "c")], capture_output=True, text=True)
    assert bad.returncode == 2 and "train.micro_bach_size: unknown key" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "c").exists()
