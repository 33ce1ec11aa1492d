"""The checkpoints' cold tier (runtime/volume/coldtier.py): the recipe's command, its fields checked at build and
filled in per checkpoint, run without a shell, one copy at a time, a newer checkpoint replacing one still waiting;
a failure is an outcome, never an exception. The copy by a real run is tests/integration/test_train_runs.py's."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import build
from recipekit.runtime.boundary.recipeview import ColdCheckpointsView
from recipekit.runtime.volume import coldtier


def view(*command: str, every: int = 1, timeout_s: int = 60) -> ColdCheckpointsView:
    return ColdCheckpointsView(list(command), every, timeout_s)


@pytest.mark.parametrize(
    "command, problem",
    [
        (["cp", "{checkpoint}", "{bucket}"], "names {bucket}"),
        (["cp", "{step:04d}"], "takes no format or conversion"),
        (["cp", "{name!r}"], "takes no format or conversion"),
        (["cp", "obs://b/{run"], "a literal brace is written twice"),
    ],
)
def test_a_field_that_does_not_render_is_named(command: list[str], problem: str) -> None:
    (found,) = coldtier.unknown_fields(command)
    assert problem in found


def test_the_fields_fill_in_and_doubled_braces_stay_braces() -> None:
    command = ["obsutil", "cp", "-r", "{checkpoint}", "obs://b/{run}/{name}-{step}", "{{literal}}"]
    assert coldtier.unknown_fields(command) == []
    argv = coldtier.render(command, Path("/mnt/shared/runs/r1/checkpoint-40"), 40, "r1")
    assert argv == [
        "obsutil",
        "cp",
        "-r",
        "/mnt/shared/runs/r1/checkpoint-40",
        "obs://b/r1/checkpoint-40-40",
        "{literal}",
    ]


def test_a_path_is_one_argument_never_a_command(tmp_path: Path) -> None:
    """No shell: a checkpoint path with spaces and a semicolon reaches the program as one argument."""
    odd = tmp_path / "a b; touch pwned" / "checkpoint-2"
    odd.mkdir(parents=True)
    script = "import sys, pathlib; pathlib.Path(sys.argv[2]).write_text(sys.argv[1])"
    copied = coldtier.copy_one(view(sys.executable, "-c", script, "{checkpoint}", str(tmp_path / "said")), odd, 2, "r")
    assert copied.ok and (tmp_path / "said").read_text() == str(odd)
    assert not (tmp_path / "pwned").exists()


def test_failures_are_outcomes_with_the_end_of_the_output(tmp_path: Path) -> None:
    failed = coldtier.copy_one(view(sys.executable, "-c", "import sys; sys.exit('bucket not found')"), tmp_path, 4, "r")
    assert failed.code == 1 and "bucket not found" in (failed.error or "")
    missing = coldtier.copy_one(view("no-such-cold-tool-here", "{checkpoint}"), tmp_path, 4, "r")
    assert missing.code is None and "no-such-cold-tool-here" in (missing.error or "")
    slow = coldtier.copy_one(view(sys.executable, "-c", "import time; time.sleep(30)", timeout_s=1), tmp_path, 4, "r")
    assert slow.code is None and "still running after 1 s" in (slow.error or "")


def test_one_copy_at_a_time_the_newest_waiting_and_every_nth(tmp_path: Path) -> None:
    done: list[coldtier.ColdCopy] = []
    gate, started = tmp_path / "gate", tmp_path / "started"
    script = (
        f"import pathlib, sys, time\npathlib.Path({str(started)!r}).write_text(sys.argv[1])\n"
        f"while not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.01)"
    )
    copier = coldtier.ColdCopier(view(sys.executable, "-c", script, "{step}", every=2), "r", done.append)
    assert not copier.submit(tmp_path / "checkpoint-1", 1)  # not an every-2nd step
    assert copier.submit(tmp_path / "checkpoint-2", 2)
    while not started.exists():  # step 2's copy runs, held at the gate
        time.sleep(0.01)
    assert copier.submit(tmp_path / "checkpoint-4", 4)  # waits...
    assert copier.submit(tmp_path / "checkpoint-6", 6)  # ...and is replaced by the newer one
    gate.touch()
    copier.close()
    assert [c.step for c in done] == [2, 6] and all(c.ok for c in done)


def test_only_global_rank_0_copies_and_only_with_a_command() -> None:
    assert coldtier.cold_copier(view("cp"), "r", 1, print) is None
    assert coldtier.cold_copier(view(), "r", 0, print) is None
    assert coldtier.cold_copier(None, "r", 0, print) is None
    assert coldtier.cold_copier(view("cp"), "r", 0, print) is not None


def test_build_refuses_a_command_whose_fields_do_not_render(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as refused:
        build(["recipe=tiny_sft", 'train.cold_checkpoints.command=[aws,s3,sync,"{ckpt}","s3://b/{run}"]'], tmp_path)
    assert "train.cold_checkpoints.command" in str(refused.value) and "names {ckpt}" in str(refused.value)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
