"""The tour in docs/tour.md works as written: its commands run, in order, in an empty directory, and succeed.

The commands are read from the tour's ```bash block (one `recipekit ...` per line), so the page cannot drift from
what recipekit does: a renamed key, a changed default or a refused override fails here. Static validation only
(seconds, no training stack run), so this is not a slow test.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOUR = ROOT / "docs" / "tour.md"


def _block(language: str, page: Path = TOUR) -> list[str]:
    """The lines of every ```<language> block of a page (the tour by default)."""
    text = page.read_text(encoding="utf-8")
    return [line for body in re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M) for line in body.splitlines()]


def tour_commands() -> list[list[str]]:
    """Each `recipekit ...` line of the tour's bash block as an argument list (shell quoting honoured)."""
    return [shlex.split(line) for line in _block("bash") if line.startswith("recipekit ")]


def _run(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    expanded: list[str] = []
    for argument in arguments[1:]:  # a glob (the package's digest) expands as the shell would
        matches = sorted(glob.glob(argument, root_dir=cwd)) if "*" in argument else []
        expanded.extend(matches or [argument])
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("RECIPEKIT_RECIPES", None)
    return subprocess.run(
        [sys.executable, "-m", "recipekit.cli", *expanded], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_the_tour_covers_the_journey() -> None:
    """The block is the whole journey: plan, build, validate (static), pack, verify."""
    verbs = [command[1] for command in tour_commands()]
    assert verbs == ["plan", "build", "validate", "pack", "verify"], verbs
    assert not any("--dry-run" in command for command in tour_commands())


def test_the_tour_runs_as_written(tmp_path: Path) -> None:
    outputs = {}
    for command in tour_commands():
        result = _run(command, tmp_path)
        shown = f"{shlex.join(command)}\nexit {result.returncode}\n{result.stdout}{result.stderr}"
        assert result.returncode == (1 if command[1] == "plan" else 0), shown  # the case as stated does not fit
        outputs[command[1]] = result.stdout + result.stderr
    # what the tour says each step prints
    said = [line.strip() for line in _block("text")]
    for marker in ("DOES NOT FIT:", "to fit:"):
        line = next(line for line in said if line.startswith(marker))
        assert line in outputs["plan"], f"the tour quotes {line!r}; plan printed:\n{outputs['plan']}"
    assert "global batch 128, bf16, DeepSpeed ZeRO-3" in outputs["build"]
    # the build line the tour quotes is the one build prints (file count and hardware included)
    quoted = next(line for line in _block("text") + [TOUR.read_text()] if "built bundles/" in line)
    said_line = re.search(r"`(built bundles/[^`]+)`", quoted)
    assert said_line and said_line.group(1) in outputs["build"].replace(str(tmp_path) + "/", ""), outputs["build"]
    assert "bundle OK" in outputs["validate"] and " 0 failed" in outputs["validate"]
    assert "verified" in outputs["verify"]
    assert list(tmp_path.glob("handover/qwen2.5_14b_sft-*.tar.gz"))


def test_the_readmes_tour_runs_as_written(tmp_path: Path) -> None:
    """The README's short tour too, but for its dry runs: test_compare_presets runs its first command's as pasted,
    test_dryrun kills a pod of the same bundle."""
    commands = [
        shlex.split(line, comments=True)
        for line in _block("bash", ROOT / "README.md")
        if line.startswith("recipekit ") and "--dry-run" not in line
    ]
    journey = ["build", "validate", "pack", "verify"]
    assert [command[1] for command in commands if command[1] in journey] == journey
    for command in commands:
        result = _run(command, tmp_path)
        assert result.returncode == 0, (
            f"{shlex.join(command)}\nexit {result.returncode}\n{result.stdout}{result.stderr}"
        )


def test_the_case_as_stated_is_refused_with_the_planners_fix(tmp_path: Path) -> None:
    """The tour says build refuses the ZeRO-2 case (exit 2) and advises what plan advises."""
    plan = next(command for command in tour_commands() if command[1] == "plan")
    result = _run(["recipekit", "build", *plan[2:]], tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "parallel=zero3" in result.stderr
    assert not (tmp_path / "bundles").exists()


def test_the_tours_leave_a_fresh_clone_clean(tmp_path: Path) -> None:
    """Issue 41: the tour left untracked handover/, old/ and out/ in the checkout. In a fresh clone of this commit,
    the README's and the full tour's commands (but the dry run: its work directory is under bundles/ too) leave
    `git status` clean: what they write is ignored."""
    import shutil

    if shutil.which("git") is None:
        import pytest

        pytest.skip("git is not installed")
    clone = tmp_path / "clone"
    git = ["git", "-c", "init.defaultBranch=main", "-c", "advice.detachedHead=false"]
    subprocess.run([*git, "init", "-q", str(clone)], check=True)
    subprocess.run([*git, "-C", str(clone), "fetch", "-q", "--depth", "1", f"file://{ROOT}", "HEAD"], check=True)
    subprocess.run([*git, "-C", str(clone), "checkout", "-q", "FETCH_HEAD"], check=True)
    readme = [
        shlex.split(line, comments=True)
        for line in _block("bash", ROOT / "README.md")
        if line.startswith("recipekit ") and "--dry-run" not in line
    ]
    for command in readme + tour_commands():
        result = _run(command, clone)
        assert result.returncode in (0, 1), f"{shlex.join(command)}\n{result.stdout}{result.stderr}"
    status = subprocess.run(
        ["git", "-C", str(clone), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert status == "", status
    assert (clone / "handover").is_dir() and (clone / "bundles").is_dir()  # they ran, and wrote there
