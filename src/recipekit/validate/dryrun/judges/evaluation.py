"""Judging the evaluation after training of a dry run: the benchmark ran on the trained twin and left its scores.

The dry run replaces the recipe's benchmark tasks by a tiny local one (workdir/tinyeval.py); rank 0 scores the saved
twin with lm-evaluation-harness once training is done and writes the output directory's eval record
(runtime/volume/evalrecord.py). The check reads it back with the same reader ``recipekit report`` uses and wants it
finished, with a score for the dry run's task over every item it was given.
"""

from __future__ import annotations

from pathlib import Path

from recipekit.runtime.boundary import filenames
from recipekit.runtime.volume.evalrecord import EvalUnreadable, read_eval
from recipekit.validate.dryrun.workdir.tinyeval import ITEMS, TASK
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Result

WHERE = "<dry run>"


def eval_result(copy: Bundle, results: list[Result]) -> Result | None:
    """The evaluation's result when the work copy evaluates after training, added to ``results``."""
    if copy.recipe is None or not copy.recipe.eval.enabled:
        return None
    result = Result("dryrun.eval", f"dry run: lm-evaluation-harness scored the trained twin on {TASK}")
    results.append(result)
    return result


def judge_eval(result: Result, output_dir: Path) -> None:
    """``result`` failed unless the output directory's eval record holds the tiny task's score over its items."""
    try:
        record = read_eval(output_dir)
    except EvalUnreadable as exc:
        result.fail(WHERE, filenames.EVAL_FILE, str(exc))
        return
    if record is None:
        result.fail(WHERE, filenames.EVAL_FILE, f"rank 0 wrote no {filenames.EVAL_FILE} after training")
        return
    if not record.ok:
        result.fail(WHERE, filenames.EVAL_FILE, f"the evaluation failed: {record.reason}")
        return
    scores = [s for s in record.scores if s.task == TASK]
    if not scores:
        result.fail(WHERE, filenames.EVAL_FILE, f"no score of {TASK} (scores of {len(record.scores)} others)")
        return
    if any(s.samples != ITEMS for s in scores):
        result.fail(WHERE, filenames.EVAL_FILE, f"scored {scores[0].samples} items of {TASK}, expected {ITEMS}")
    result.details.update(
        scores={f"{s.task} {s.metric}": s.value for s in record.scores},
        seconds=record.seconds,
        harness=f"{record.harness} {record.version}",
    )
