"""The row ledger's judge: every step of the history took its place of the order, once; a gap or repeat fails."""

from __future__ import annotations

import numpy as np

from recipekit.runtime.boundary.order import Permutation
from recipekit.validate.dryrun.judges.rows import judge_rows
from recipekit.validate.shared.results import Result

SEED, SIZE, BATCH = 7, 40, 4


def ledger(steps: range, world: int, accumulation: int, skip: int = 0) -> list[dict]:
    """What the ranks write: Accelerate's sharding (micro-batch i to rank i mod world), one row per micro-batch;
    ``skip`` shifts the order by that many rows (a resume that lands on the wrong sample)."""
    order = Permutation(SIZE, SEED, 0)(np.arange(SIZE, dtype=np.uint64)).tolist()
    lines = []
    for step in steps:
        begin = (step - 1) * BATCH + skip
        for micro in range(world * accumulation):
            lines.append(
                {"step": step, "rank": micro % world, "world_size": world, "rows": [order[(begin + micro) % SIZE]]}
                | {"epoch": 0, "seed": SEED, "size": SIZE}
            )
    return lines


def judged(first: list[dict], second: list[dict], resumed_at: int = 4) -> Result:
    result = Result("dryrun.resume", "test")
    judge_rows(result, first, second, resumed_at=resumed_at, global_batch=BATCH)
    return result


def test_a_resume_on_half_the_ranks_that_continues_exactly_passes() -> None:
    result = judged(ledger(range(1, 7), world=4, accumulation=1), ledger(range(5, 9), world=2, accumulation=2))
    assert not result.failed, result.findings
    assert result.details["rows_checked_steps"] == list(range(1, 9))
    assert result.details["rows_replayed_steps"] == [5, 6]


def test_a_resume_that_lands_on_the_wrong_sample_fails() -> None:
    result = judged(ledger(range(1, 7), 4, 1), ledger(range(5, 9), 2, 2, skip=2))
    assert result.failed
    messages = " ".join(f.message for f in result.findings)
    assert "step 5:" in messages and "took other rows than the first time" in messages


def test_a_resume_that_repeats_the_steps_of_the_checkpoint_fails() -> None:
    result = judged(ledger(range(1, 7), 4, 1), ledger(range(1, 5), 2, 2), resumed_at=4)
    result2 = judged(ledger(range(1, 5), 4, 1), ledger(range(5, 9), 2, 2, skip=-BATCH))
    assert not result.failed  # the same rows at the same steps: replaced, not repeated
    assert result2.failed and "rows trained twice in epoch 0" in " ".join(f.message for f in result2.findings)


def test_no_ledger_is_a_failure_not_a_pass() -> None:
    assert judged([], ledger(range(5, 9), 2, 2)).failed


def test_an_attempts_ledger_is_the_lines_between_its_sizes_files_made_later_included(tmp_path) -> None:
    """The second attempt may run more ranks than the first: their files appear only after the first ended."""
    from recipekit.runtime.volume.rowledger import RowLedger, ledger_sizes, read_ledger

    RowLedger(tmp_path, 0, 1).record(1, [3])
    first_end = ledger_sizes(tmp_path)
    RowLedger(tmp_path, 0, 2).record(2, [4])
    RowLedger(tmp_path, 1, 2).record(2, [5])
    assert [line["rows"] for line in read_ledger(tmp_path, {}, first_end)] == [[3]]
    assert sorted(line["rows"][0] for line in read_ledger(tmp_path, first_end, ledger_sizes(tmp_path))) == [4, 5]
