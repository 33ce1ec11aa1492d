"""The evaluation after training of a run, as the report's rows and the comparison's table.

A run with ``eval.enabled`` leaves its benchmark scores in its output directory (runtime/volume/evalrecord.py); the
report states each score (or why the evaluation did not finish), and ``compare`` sets the scores of two runs side
by side with their difference: the accuracy check after moving a model to other hardware. The scores inform; they
do not change compare's verdict, which is about the training curves (a benchmark on a few items is noise).
"""

from __future__ import annotations

from typing import Any

from recipekit.runs.runlog import RunLog
from recipekit.runtime.volume.evalrecord import EvalRecord, EvalUnreadable, read_eval


def run_eval(run: RunLog) -> tuple[EvalRecord | None, str | None]:
    """The run's eval record, or why it could not be read; (None, None) for a run without one (or a baseline)."""
    if run.output_dir is None:
        return None, None
    try:
        return read_eval(run.output_dir), None
    except EvalUnreadable as exc:
        return None, str(exc)


def eval_rows(run: RunLog) -> list[tuple[str, str]]:
    """The report's lines: one per task and metric (value ± stderr, items, shots), or the failure, or nothing."""
    record, problem = run_eval(run)
    if problem is not None:
        return [("evaluation", f"unreadable: {problem}")]
    if record is None:
        return []
    head = f"{record.harness} {record.version} on {record.model}" + (
        f", {record.seconds:.1f} s" if record.seconds is not None else ""
    )
    if not record.ok:
        return [("evaluation", f"failed ({head}): {record.reason}")]
    rows = [("evaluation", head + (f", at most {record.limit} items a task" if record.limit else ""))]
    for s in record.scores:
        spread = f" ± {s.stderr:.4f}" if s.stderr is not None else ""
        counts = ", ".join(
            part
            for part in (
                f"{s.samples} items" if s.samples is not None else "",
                f"{s.n_shot}-shot" if s.n_shot is not None else "",
            )
            if part
        )
        rows.append((f"  {s.task} {s.metric}", f"{s.value:.4f}{spread}" + (f" ({counts})" if counts else "")))
    return rows


def eval_json(run: RunLog) -> dict[str, Any] | None:
    """The record as report.json holds it (None without one)."""
    record, problem = run_eval(run)
    if problem is not None:
        return {"unreadable": problem}
    return record.to_json() if record is not None else None


def compare_scores(a: RunLog, b: RunLog) -> list[dict[str, Any]]:
    """Each task and metric either run scored: A's value, B's, and B − A where both have one."""
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    for side, run in (("a", a), ("b", b)):
        record, _ = run_eval(run)
        for s in record.scores if record is not None and record.ok else ():
            row = found.setdefault((s.task, s.metric, s.filter), {"task": s.task, "metric": s.metric, "a": None})
            row.setdefault("b", None)
            row[side] = s.value
    rows = [found[key] for key in sorted(found)]
    for row in rows:
        row.setdefault("b", None)
        row["difference"] = row["b"] - row["a"] if row["a"] is not None and row["b"] is not None else None
    return rows
