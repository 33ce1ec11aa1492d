"""A non-finite loss under ``ops.nonfinite_loss``: the key's values, the batch a ``skip`` leaves out of the resumed
order (every other position kept, every epoch its length), the record of it, and what `runs history` says."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import build
from recipekit.cli import main
from recipekit.runtime.boundary import exitcodes, metricslog
from recipekit.runtime.data.sampler import ResumableSampler, step_positions
from recipekit.runtime.volume import attemptends, recovery

pytest.importorskip("torch")


def test_the_key_names_its_values_and_refuses_skip_under_streaming(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as info:
        build(["recipe=tiny_sft", "ops.nonfinite_loss=terminate"], tmp_path / "a")
    (problem,) = info.value.problems
    assert problem.key == "ops.nonfinite_loss" and "'stop', 'skip', 'warn'" in problem.message
    with pytest.raises(RecipeError) as info:
        build(
            ["recipe=tiny_sft", "ops.nonfinite_loss=skip", "data.streaming=true", "train.max_steps=9"], tmp_path / "b"
        )
    assert [p.key for p in info.value.problems] == ["ops.nonfinite_loss"]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_step_is_placed_in_its_epoch_by_the_trainers_arithmetic() -> None:
    assert step_positions(1, 5, 8, 40) == (0, 0, 8)
    assert step_positions(6, 5, 8, 40) == (1, 0, 8)  # the first step of the second epoch
    assert step_positions(9, 5, 8, 37) == (1, 24, 32)
    assert step_positions(10, 5, 8, 37) == (1, 32, 37)  # a short last step


@pytest.mark.parametrize("skipped", [(0, 8, 16), (0, 0, 8), (0, 32, 40)])
def test_a_skipped_batch_is_left_out_and_the_epoch_keeps_its_length(skipped: tuple[int, int, int]) -> None:
    plain, skipping = ResumableSampler(40, 7), ResumableSampler(40, 7, (skipped,))
    before, after = list(plain), list(skipping)
    bad = set(before[skipped[1] : skipped[2]])
    assert len(after) == len(before) == 40 and not bad & set(after)
    assert after[: skipped[1]] == before[: skipped[1]]  # the steps before it are replayed as they were
    assert after[skipped[1] : 32] == [r for r in before if r not in bad][skipped[1] : 32]  # the rest move up a step
    assert np.array_equal(skipping.order(3, 29), np.array(after[3:29], dtype=np.uint64))  # the ledger's view agrees
    plain.set_epoch(1), skipping.set_epoch(1)
    assert list(plain) == list(skipping)  # another epoch is untouched


def test_two_skips_in_one_epoch_compose_in_the_order_they_were_made() -> None:
    first = ResumableSampler(40, 3, ((0, 8, 16),))
    once = list(first)
    twice = list(ResumableSampler(40, 3, ((0, 8, 16), (0, 16, 24))))
    assert twice[:16] == once[:16] and not set(once[16:24]) & set(twice)


def _record(out: Path, record: dict) -> None:
    metricslog.append_record(out / recovery.RECOVERY_FILE, record)


def test_the_skip_is_recorded_the_resume_reads_it_and_runs_history_says_so(tmp_path: Path) -> None:
    log = recovery.RecoveryLog(tmp_path, enabled=True, clock=lambda: 100.0, environ={})
    log.started(None, None, 2)
    log.step(5)
    log.skipped(6, 0, 40, 48)
    _record(tmp_path, {"event": "skip", "step": 7, "epoch": True, "start": 1, "stop": 2})  # refused: not typed
    attemptends.watch(tmp_path)
    attemptends.stepped(5)
    attemptends.record_end(exitcodes.EXIT_NONFINITE, {"RANK": "0", "GROUP_RANK": "0"})
    assert recovery.skipped_batches(tmp_path) == ((0, 40, 48),)
    later = recovery.RecoveryLog(tmp_path, enabled=True, clock=lambda: 1e10, environ={})
    later.started(4, "checkpoint-4", 2)
    assert recovery.read(tmp_path)[-1]["skipped_steps"] == [6]
    text = CliRunner().invoke(main, ["runs", "history", str(tmp_path)]).output
    assert "exit 5 nonfinite after step 5" in " ".join(text.split())
    assert "the Job: RestartJob (ops.nonfinite_loss: skip), the resume skips step 6's batch" in " ".join(text.split())


def test_a_nonfinite_end_without_a_restart_says_the_job_ended_with_the_batch_kept(tmp_path: Path) -> None:
    recovery.RecoveryLog(tmp_path, enabled=True, clock=lambda: 100.0, environ={}).started(None, None, 1)
    attemptends.watch(tmp_path)
    attemptends.stepped(5)
    attemptends.record_end(exitcodes.EXIT_NONFINITE, {"RANK": "0", "GROUP_RANK": "0"})
    data = json.loads(CliRunner().invoke(main, ["runs", "history", str(tmp_path), "--json"]).output)
    why = data["attempts"][0]["why"]
    assert "exit 5 nonfinite" in why and "the Job: TerminateJob (ops.nonfinite_loss: stop), no retry" in why
    assert "batch and a report are kept in nonfinite-step-5/" in why  # the directory the guard wrote at step 5
