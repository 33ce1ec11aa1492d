"""Output a person can copy (issue 41): every command a new user runs, in a real 80-column terminal (tmux), shows no
line wider than the window and no word broken across lines.

Each command runs in a tmux window of 80 × 50 and the test reads back what the terminal shows, wrapped lines
joined (tests/tmux_terminal.py): a line the terminal had to wrap reads as one line over 80 columns. A word is broken
when the 80-column output holds a piece of text that the same command's wide output (piped, 400 columns: nothing
wraps) does not hold as a word: ``DeepSeek-R1-Distill-`` / ``Qwen-7B`` in a table cell folded mid-word. A path
shortened from the middle (``…``) is the one piece allowed. The captures: ``list``, ``show --compact``, ``build``,
``validate``, ``plan``, ``runs history``, ``report`` and every command's ``--help``; a dry run with a kill is a slow
test of its own. (``plan --advise`` is issue 37's: to be added once its output is settled.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from recipekit.cli import main
from tests.tmux_terminal import Capture, Terminal, tmux_available

if not tmux_available():
    pytest.skip("tmux is not installed (Debian's tmux)", allow_module_level=True)

BIN = Path(sys.executable).parent
WIDTH = 80
#: What a terminal draws around words: table borders and rules, the spinner, the bar of the memory table.
_DRAWING = re.compile(r"[\u2500-\u259f\u2800-\u28ff]")


def _env() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RECIPEKIT_RECIPES", None)
    env["DOCKER_HOST"] = "unix:///nonexistent-engine.sock"
    return env


#: Punctuation around a word, which wrapping moves nothing across.
_AROUND = "\"'`.,;:()[]"


def words(lines: list[str]) -> list[str]:
    found = [word.strip(_AROUND) for line in lines for word in _DRAWING.sub(" ", line).split()]
    return [word for word in found if word]


def _cut_short(word: str, reference: set[str]) -> bool:
    """A word click shortened for the list of commands (``reports...``): the start of a word it has."""
    stem = word.removesuffix("...").strip(_AROUND)
    return word.endswith("...") and (not stem or any(w.startswith(stem) for w in reference))


def wide(command: str, cwd: Path) -> set[str]:
    """The words of ``command``'s output where nothing wraps: piped, 400 columns."""
    env = {**_env(), "COLUMNS": "400"}
    result = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return set(words((result.stdout + result.stderr).splitlines()))


def problems(capture: Capture, reference: set[str] | None) -> list[str]:
    """Lines over 80 columns, and (given the wide output's words) pieces of words the 80-column output broke."""
    found = [f"{len(line)} columns: {line}" for line in capture.lines if len(line) > WIDTH]
    if reference is not None:
        broken = [
            w for w in words(capture.lines) if w not in reference and "…" not in w and not _cut_short(w, reference)
        ]
        found += [f"broken word {w!r}" for w in dict.fromkeys(broken)]
    return found


@pytest.fixture(scope="module")
def terminal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Terminal]:
    from tests.integration.test_help_examples import _finished_run

    scratch = tmp_path_factory.mktemp("terminal")
    _finished_run(scratch / "runs" / "tiny-sft-a970ef")
    built = subprocess.run(
        ["recipekit", "build", "recipe=qwen2.5_14b_sft", "cluster.nodes=2", "-o", "bundles/qwen2.5_14b_sft"],
        cwd=scratch,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    term = Terminal(scratch, _env(), columns=WIDTH)
    yield term
    term.close()


#: (command, exit code): what a new user runs in the first hour, each checked as the terminal shows it.
COMMANDS = [
    ("recipekit list", 0),
    ("recipekit list model --all", 0),
    ("recipekit show recipe=qwen2.5_14b_sft --compact", 0),
    ("recipekit build recipe=phi4_lora_demo", 2),
    ("recipekit build model=phi4 mode=lora mode.lora.target_modules=[q_proj,v_proj] cluster.nodes=2", 2),
    ("recipekit build recipe=llama3_8b_sft hw=ascend910b", 0),
    ("recipekit validate bundles/qwen2.5_14b_sft", 0),
    ("recipekit plan recipe=qwen2.5_14b_sft cluster.nodes=2", 0),
    ("recipekit runs history runs/tiny-sft-a970ef", 0),
    ("recipekit report runs/tiny-sft-a970ef -o report-out", 0),
]


@pytest.mark.parametrize(("command", "code"), COMMANDS, ids=[c for c, _ in COMMANDS])
def test_a_first_hour_command_fits_80_columns(terminal: Terminal, command: str, code: int) -> None:
    capture = terminal.run(command)
    shown = "\n".join(capture.lines)
    assert capture.returncode == code, shown
    assert capture.lines, command
    found = problems(capture, wide(command, terminal.cwd))
    assert not found, "\n".join([*found[:10], "--- as shown:", shown[-3000:]])


def _help_commands() -> list[str]:
    found = []

    def walk(command: click.Command, path: list[str]) -> None:
        found.append(" ".join([*path, "--help"]))
        if isinstance(command, click.Group):
            context = click.Context(command)
            for name in command.list_commands(context):
                sub = command.get_command(context, name)
                assert sub is not None
                walk(sub, [*path, name])

    walk(main, ["recipekit"])
    return found


@pytest.mark.parametrize("command", _help_commands())
def test_every_help_fits_80_columns(terminal: Terminal, command: str) -> None:
    capture = terminal.run(command)
    assert capture.returncode == 0, "\n".join(capture.lines)
    found = problems(capture, wide(command, terminal.cwd))
    assert not found, "\n".join([*found[:10], "--- as shown:", *capture.lines])


@pytest.mark.slow
def test_a_dry_run_with_a_kill_fits_80_columns(terminal: Terminal) -> None:
    """The progress lines (a pod's own log lines among them: gloo's ``[/__w/pytorch/...pair.cc:553]`` must show as
    written, never parsed as markup), the verdict table and the substitutions: as shown."""
    if any(__import__("importlib.util").util.find_spec(m) is None for m in ("torch", "transformers", "deepspeed")):
        pytest.skip("the training stack is not installed")
    built = terminal.run("recipekit build recipe=tiny_sft -o bundles/tiny_sft")
    assert built.returncode == 0, built.lines
    command = "recipekit validate bundles/tiny_sft --dry-run --kill-pod 1 --at-step 6"  # validate's help example
    capture = terminal.run(command, timeout=900)
    assert capture.returncode == 0, "\n".join(capture.lines[-60:])
    shown = "\n".join(capture.lines)
    assert "MarkupError" not in shown and "Traceback" not in shown and "bundle OK" in shown, shown[-4000:]
    found = problems(capture, None)
    # the dry run's own paths (its work directory, its logs) whole: a path folded in two names nothing on disk
    scratch = str(terminal.cwd.resolve())
    paths = [w for w in words(capture.lines) if w.startswith((scratch, "bundles/")) and "…" not in w]
    found += [f"broken path {p!r}" for p in paths if not (terminal.cwd / p).exists()]
    assert not found, "\n".join([*found[:10], "--- as shown:", *capture.lines[-80:]])
