"""Every example in every command's ``--help`` runs, as a user would paste it, and does what its text says.

The examples are discovered from the click command tree (every group and command, however deep), not listed here:
a new command's examples are run the day it gets them. Each example line runs in a fresh scratch directory through
``bash`` with the venv's ``recipekit`` on ``PATH``, after the stand-ins the line names are put there:

* ``bundles/<preset>`` (or ``bundles/<preset>@<hw>``): that preset built (for that hardware); ``bundles/our_*``: a
  team preset of ``team-recipes/``, built with ``--recipes``; any other ``bundles/<name>``: the help example that
  builds it with ``-o bundles/<name>``, run first;
* ``team-recipes/`` or ``team-nlp-recipes``: what ``recipekit init`` makes;
* ``runs/<name>``: a finished run's output directory (metrics and one recovery, synthetic);
* ``config.json`` and ``<Model>/config.json``: a Hugging Face config from ``tests/data/model_configs``.

What an example must do is its text's: exit 0; ``# exit N: ...`` exits N; one naming a path under ``/mnt/`` (the
cluster's volume, absent here; ``# cluster`` says so where the path is the bundle's own) exits 2 with one error
naming the ``/mnt`` path; an example of a command whose help
says it "needs a Docker-API engine" (or whose comment does) exits 2 saying none is reachable (when one is, it is
skipped: building the image is test_image_build's); one of a command whose help says it "needs a Kubernetes
cluster" runs with tests/data/cluster/unreachable-kubeconfig.yaml and exits 4 saying the API server cannot be reached
(what it does with a cluster is tests/unit/cluster's). Dry runs (``--dry-run``) are slow tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from recipekit.cli import main
from tests.unit.runfixtures import losses, write_run

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PRESETS = {p.stem for p in (REPO / "recipes" / "recipe").glob("*.yaml")}
HARDWARE = {p.stem for p in (REPO / "recipes" / "hw").glob("*.yaml")}
MODEL_CONFIGS = {"config.json": "llama3_8b", "Mixtral-8x7B-v0.1/config.json": "mixtral_8x7b"}


@dataclass(frozen=True)
class Example:
    command: str  # "recipekit data prepare"
    line: str  # the shell line, comment included
    prose: str  # the command's help text above its examples

    @property
    def comment(self) -> str:
        return self.line.partition("#")[2].strip() if " #" in self.line else ""


def _commands(command: click.Command, path: list[str]) -> list[tuple[str, click.Command]]:
    found = [(" ".join(path), command)]
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            assert sub is not None, name
            found += _commands(sub, [*path, name])
    return found


def discover() -> list[Example]:
    """Every example line of every command's help, each line once (a group repeats its commands' examples)."""
    examples: dict[str, Example] = {}
    for name, command in _commands(main, ["recipekit"]):
        header = ""
        for raw in (command.help or "").splitlines():
            text = raw.strip()
            if text.startswith("Examples"):
                header = text
            elif header and not text:
                header = ""
            elif header and text != "\b":
                prose = (command.help or "").partition("Examples")[0]
                examples.setdefault(text, Example(name, text, prose))
    return list(examples.values())


EXAMPLES = discover()


def _env() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "80"}
    env.pop("RECIPEKIT_RECIPES", None)
    env["DOCKER_HOST"] = env.get("DOCKER_HOST", "unix:///nonexistent-engine.sock")
    env["KUBECONFIG"] = str(REPO / "tests" / "data" / "cluster" / "unreachable-kubeconfig.yaml")
    return env


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600, check=False)


def _team(scratch: Path, name: str = "team-recipes") -> None:
    if not (scratch / name).exists():
        result = _run(["recipekit", "init", name], scratch)
        assert result.returncode == 0, result.stderr


def _bundle(scratch: Path, name: str) -> None:
    if (scratch / "bundles" / name).exists():
        return
    maker = next((e.line for e in EXAMPLES if re.search(rf"-o bundles/{re.escape(name)}(\s|$)", e.line)), None)
    if maker is not None:
        result = _run(["bash", "-c", maker], scratch)
        assert result.returncode == 0, result.stderr
        return
    preset, _, hardware = name.partition("@")
    args = ["recipekit", "build", f"recipe={preset}", "-o", f"bundles/{name}"]
    if hardware in HARDWARE:
        args.append(f"hw={hardware}")
    if preset.startswith("our_"):
        _team(scratch)
        args += ["--recipes", "team-recipes/recipes"]
    else:
        assert preset in PRESETS, f"an example names bundles/{name}: no preset {preset!r} builds it"
    result = _run(args, scratch)
    assert result.returncode == 0, result.stderr


def _finished_run(path: Path) -> None:
    """A run of 200 steps, killed once after step 120 and resumed from its checkpoint at step 120."""
    write_run(path, losses(200, start=6.0, slope=0.01), kill_after=120, resume_step=120)
    recovery = [
        {"event": "start", "time": 1000.0, "launch_time": 999.0, "resume_step": 0, "interrupted": None},
        {"event": "first_step", "step": 1, "time": 1001.0},
        {"event": "start", "time": 1140.0, "launch_time": 1135.0, "resume_step": 120,
         "interrupted": {"step": 120, "time": 1120.0}},
        {"event": "loaded", "time": 1145.0},
        {"event": "first_step", "step": 121, "time": 1150.0},
        {"event": "done", "time": 1230.0},
    ]  # fmt: skip
    (path / "recovery.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recovery))


def stage(scratch: Path, line: str) -> None:
    """Put what ``line`` names into ``scratch`` (see the module's docstring)."""
    for team in ("team-recipes", "team-nlp-recipes"):
        if team in line and f"init {team}" not in line:
            _team(scratch, team)
    for name in re.findall(r"\bbundles/([\w.@-]+)", line):
        if name != ".dryrun" and not line.split(f"bundles/{name}")[0].rstrip().endswith("-o"):
            _bundle(scratch, name)
    for name in re.findall(r"(?<![\w/])(?:\./)?runs/([\w.-]+)", line):
        if not (scratch / "runs" / name).exists():
            _finished_run(scratch / "runs" / name)
    for relative, model in MODEL_CONFIGS.items():
        if re.search(rf"(?<![\w/-])(\./)?{re.escape(relative)}", line):
            (scratch / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / "tests" / "data" / "model_configs" / model / "config.json", scratch / relative)


def run_example(line: str, scratch: Path) -> subprocess.CompletedProcess[str]:
    """``line`` run as a user would paste it, in ``scratch`` after what it names is put there (:func:`stage`)."""
    stage(scratch, line)
    return _run(["bash", "-c", line], scratch)


#: Examples another test runs verbatim, where it sees more than an exit code: the example's line → that test's file
#: (in tests/integration).
#: Run once there, not twice (a dry run is a minute of the suite); test_examples_run_elsewhere_are_run_there checks
#: that the file still holds the line.
RUN_ELSEWHERE = {
    "recipekit validate bundles/tiny_sft --dry-run --kill-pod 1 --at-step 6": "test_terminal_80.py",
    "recipekit validate bundles/tiny_sft --dry-run --restart checkpoint-4,fresh": "test_dryrun_restart.py",
    "recipekit validate bundles/tp2 --dry-run --pods 2 --procs-per-pod 2": "test_dryrun_tp.py",
    "recipekit validate bundles/tiny_sft --dry-run --kill-pod 1 --resume-pods 1": "test_dryrun_rescale.py",
    "recipekit validate bundles/llama3_8b_sft --dry-run": "test_compare_presets.py",
}


def _params() -> list[object]:
    params: list[object] = []
    for example in EXAMPLES:
        if example.line in RUN_ELSEWHERE:
            continue
        marks = [pytest.mark.slow, pytest.mark.longest] if "--dry-run" in example.line else []
        params.append(pytest.param(example, id=f"{example.command}: {example.line[:70]}", marks=marks))
    return params


def test_every_command_with_examples_is_found() -> None:
    """Discovery reaches nested commands (``data prepare``, ``runs history``), not only the top level."""
    commands = {name for name, command in _commands(main, ["recipekit"]) if "Examples" in (command.help or "")}
    assert {"recipekit build", "recipekit data prepare", "recipekit runs history", "recipekit rescale"} <= commands
    assert {example.command for example in EXAMPLES} <= commands and len(EXAMPLES) > 40


def test_examples_run_elsewhere_are_run_there() -> None:
    """Each example left to another test is still a help example, and that test's file runs its very line."""
    lines = {example.line for example in EXAMPLES}
    for line, test_file in RUN_ELSEWHERE.items():
        assert line in lines, f"no longer a help example: {line}"
        text = (Path(__file__).parent / test_file).read_text(encoding="utf-8")
        assert f'"{line}"' in text, f"{test_file} does not run {line}"


@pytest.mark.parametrize("example", _params())
def test_help_example_runs(example: Example, tmp_path: Path) -> None:
    result = run_example(example.line, tmp_path)
    said = f"{example.command}: {example.line}\nexit {result.returncode}\n{result.stdout[-2000:]}{result.stderr}"
    if "needs a Docker-API engine" in example.prose or "needs a Docker-API engine" in example.comment:
        if result.returncode == 0:
            pytest.skip("a Docker-API engine is reachable here: the image build is test_image_build's")
        assert result.returncode == 2 and "no Docker-API engine reachable" in result.stderr, said
        return
    if "Needs a Kubernetes cluster" in example.prose:
        assert result.returncode == 4 and "cannot reach the API server" in result.stderr, said
        return
    on_cluster = example.comment.startswith("cluster") or re.search(r"(?<![\w.])/mnt/", example.line)
    if on_cluster and not Path("/mnt/shared").exists():
        errors = [line for line in result.stderr.splitlines() if "/mnt/" in line]
        assert result.returncode == 2 and errors and "Traceback" not in result.stderr, said
        return
    expected = re.match(r"exit (\d+)", example.comment)
    assert result.returncode == (int(expected.group(1)) if expected else 0), said
