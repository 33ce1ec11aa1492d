"""Judging the row ledger: after a resume, did every step train on exactly the rows an uninterrupted run would?

The ledger (runtime/volume/rowledger.py) says which rows each rank's micro-batches held at each step. Whatever the world
size, step *s* of epoch 0 must consume the positions [(s-1)·G, s·G) of the epoch's order (G the global batch),
each once; the order is computed here by the runtime's own permutation (runtime/boundary/order.py). The run's history is
the first attempt up to the checkpoint it resumed from, then the second attempt: a row seen twice or missing, a
step of another size, or a lost step replayed on other rows fails. Pure: the lines are read by the caller.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from recipekit.runtime.boundary import metricslog
from recipekit.runtime.boundary.order import Permutation
from recipekit.runtime.volume.rowledger import read_ledger
from recipekit.validate.dryrun.cluster.attemptlog import Attempt
from recipekit.validate.shared.results import Result

WHERE = "<dry run>"


def step_rows(lines: list[dict[str, Any]]) -> dict[int, Counter[int]]:
    """The rows of each step, over every rank and micro-batch (a multiset: a row given twice counts twice)."""
    steps: dict[int, Counter[int]] = defaultdict(Counter)
    for line in lines:
        steps[int(line["step"])].update(int(row) for row in line.get("rows") or [])
    return dict(steps)


def expected_rows(step: int, global_batch: int, seed: int, size: int) -> Counter[int]:
    """The rows step ``step`` (epoch 0) takes: positions [(step-1)·G, step·G) of the epoch's order."""
    positions = np.arange((step - 1) * global_batch, step * global_batch, dtype=np.uint64)
    return Counter(int(row) for row in Permutation(size, seed, 0)(positions))


def judge_rows(
    result: Result,
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    resumed_at: int,
    global_batch: int,
) -> None:
    """Fail ``result`` unless the history (``first`` up to step ``resumed_at``, then ``second``) took every row of
    the order once, step by step, and the steps trained twice took the same rows both times."""
    if not first or not second:
        result.fail(WHERE, "rows", "no row ledger from one of the attempts (ops.testing.record_rows)")
        return
    order = {(line.get("seed"), line.get("size")) for line in first + second}
    seed, size = next(iter(order))
    if len(order) != 1 or not isinstance(seed, int) or not isinstance(size, int):
        result.fail(WHERE, "rows", f"the attempts drew rows from different orders (seed, size): {list(order)}")
        return
    later = {int(line["step"]) for line in first + second if line.get("epoch") != 0}
    before = step_rows([line for line in first if line.get("epoch") == 0])
    after = step_rows([line for line in second if line.get("epoch") == 0])
    history = {s: rows for s, rows in before.items() if s <= resumed_at} | after
    whole = size // global_batch  # steps of epoch 0 that take a whole global batch
    checked, problems = [], []
    for step in sorted(history):
        if step > whole:
            continue
        want, got = expected_rows(step, global_batch, seed, size), history[step]
        if got != want:
            extra, missing = sorted((got - want).elements()), sorted((want - got).elements())
            problems.append(
                f"step {step}: {len(extra)} row(s) not in its place of the order {extra[:6]}, "
                f"{len(missing)} missing {missing[:6]}"
            )
        checked.append(step)
    replayed = sorted(s for s in before if s > resumed_at and s in after)
    for step in replayed:
        # the step in flight at the kill may hold only some ranks' micro-batches: those must be among the new ones
        partial = sum(before[step].values()) < global_batch
        if (before[step] - after[step]) if partial else (before[step] != after[step]):
            problems.append(f"step {step}, trained again after the resume, took other rows than the first time")
    repeats = _repeated(history)
    if repeats:
        problems.append(f"rows trained twice in epoch 0: {repeats[:6]}")
    result.details.update(
        rows_checked_steps=checked,
        rows_replayed_steps=replayed,
        rows_per_step=global_batch,
        rows_world_sizes=sorted({int(line.get("world_size") or 0) for line in second}),
        rows_unchecked_steps=sorted(later),  # past epoch 0: its order is another permutation, its tail uneven
    )
    for problem in problems:
        result.fail(WHERE, "rows", problem)
    if not checked and not problems:
        result.fail(WHERE, "rows", f"no step of epoch 0 to check ({size} rows, global batch {global_batch})")


def _repeated(history: dict[int, Counter[int]]) -> list[int]:
    total: Counter[int] = Counter()
    for rows in history.values():
        total.update(rows)
    return sorted(row for row, count in total.items() if count > 1)


def judge_attempts_rows(result: Result, output_dir: Path, attempts: list[Attempt], resumes: list[int]) -> None:
    """The row ledger of ``attempts`` in turn, each one's lines up to the step the next resumed at (``resumes``, one
    per attempt after the first; the last cut is :func:`judge_rows`'s own): every step on its own rows once, the
    steps trained again on the same rows. The global batch is the first attempt's start record's."""
    ledgers = [read_ledger(output_dir, a.ledger_from, a.ledger_to) for a in attempts]
    earlier = [
        line
        for i, ledger in enumerate(ledgers[:-1])
        for line in ledger
        if i == len(ledgers) - 2 or (line.get("step") or 0) <= resumes[i]
    ]
    batch = (attempts[0].last(metricslog.EVENT_START) or {}).get("global_batch_size")
    if isinstance(batch, int):
        judge_rows(result, earlier, ledgers[-1], resumed_at=resumes[-1], global_batch=batch)
    else:
        result.fail(WHERE, "rows", "the first attempt's start record gives no global batch")
