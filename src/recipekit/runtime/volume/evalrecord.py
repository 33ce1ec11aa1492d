"""The evaluation after training's record: the benchmark scores a run's rank 0 wrote, read back typed and bounded.

``eval.enabled`` makes rank 0 run lm-evaluation-harness on the saved model once training is done
(runtime/session/evaluation.py). What it found is one small JSON file in the run's output directory,
:data:`~..boundary.filenames.EVAL_FILE`: the harness and its version, the model evaluated, whether it finished (and
why not), how long it took, the item limit, and one score per task and metric (lm-evaluation-harness's
``results[task]["<metric>,<filter>"]``, its stderr beside it, the items scored and the few-shot count).

Standard library only: it ships in the bundle, and recipekit's ``report``, ``compare`` and the dry run's judge read
the same file with :func:`read_eval`. The file lies on the shared volume, which others can write, so the reader
reads at most :data:`MAX_BYTES` of a regular file inside the output directory, types every field, keeps at most
:data:`MAX_SCORES` scores and makes every text printable; a file it refuses is :class:`EvalUnreadable`, one line
naming the file. The writer goes through :func:`~..boundary.jsonfile.replace` (atomic, no link followed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..boundary import filenames, jsonfile
from .attemptends import printable

#: The most read of the file (a hundred tasks with a few metrics each are about 30 KiB).
MAX_BYTES = 1 << 20
#: The most scores kept (MMLU's 57 subjects with two metrics each fit many times).
MAX_SCORES = 1024
#: The longest text kept from a field (a path, a reason).
MAX_TEXT = 500
#: The largest count taken from a record (items, few-shot examples).
MAX_COUNT = 10**9


class EvalUnreadable(ValueError):
    """The record exists but is not one: the file and why, on one line."""


@dataclass(frozen=True)
class Score:
    """One figure of one task: ``acc`` of ``arc_easy`` under the ``none`` filter, say."""

    task: str
    metric: str
    filter: str
    value: float
    stderr: float | None
    samples: int | None
    n_shot: int | None


@dataclass(frozen=True)
class EvalRecord:
    """What the evaluation after training found (``ok``), or why it did not finish (``reason``)."""

    harness: str
    version: str
    model: str
    ok: bool
    reason: str
    seconds: float | None
    limit: int | None
    scores: tuple[Score, ...]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "scores": [asdict(s) for s in self.scores]}


# ------------------------------------------------------------------------------------------------- from harness
def scores_of(results: Mapping[str, Any]) -> tuple[Score, ...]:
    """The scores in lm-evaluation-harness's result dictionary (``simple_evaluate``'s return): each number of
    ``results[task]`` keyed ``"<metric>,<filter>"`` (its ``_stderr`` twin beside it), in task and metric order."""
    found = []
    samples, shots = results.get("n-samples") or {}, results.get("n-shot") or {}
    for task, figures in sorted((results.get("results") or {}).items()):
        per_task = samples.get(task)
        effective = per_task.get("effective") if isinstance(per_task, dict) else None
        for key, value in sorted(figures.items() if isinstance(figures, dict) else ()):
            metric, comma, filter_ = key.partition(",")
            if not comma or metric.endswith("_stderr") or _number(value) is None:
                continue
            found.append(
                Score(
                    task,
                    metric,
                    filter_,
                    float(value),
                    _number(figures.get(f"{metric}_stderr,{filter_}")),
                    _count(effective),
                    _count(shots.get(task)),
                )
            )
    return tuple(found)


def write_eval(output_dir: Path, record: EvalRecord) -> Path:
    """``record`` as the output directory's eval file, replaced atomically without following a link."""
    path = Path(output_dir) / filenames.EVAL_FILE
    jsonfile.replace(path, (json.dumps(record.to_json(), indent=1, allow_nan=False) + "\n").encode("utf-8"))
    return path


# ------------------------------------------------------------------------------------------------------ reading
def read_eval(output_dir: Path) -> EvalRecord | None:
    """The output directory's eval record; None when the run wrote none, :class:`EvalUnreadable` when the file is
    there but refused (a link out of the directory, too large, not JSON, a field of the wrong type)."""
    path = Path(output_dir) / filenames.EVAL_FILE
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = jsonfile.read(path, max_bytes=MAX_BYTES, max_depth=8, within=Path(output_dir))
        return _typed(data)
    except (OSError, ValueError) as exc:
        said = " ".join(str(exc).split())[:MAX_TEXT]  # jsonfile's refusals name the file already
        raise EvalUnreadable(said if str(path) in said else f"{path}: {said}") from None


def _typed(data: Any) -> EvalRecord:
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    scores = data.get("scores")
    if not isinstance(scores, list):
        raise ValueError("scores: not a list")
    if not isinstance(data.get("ok"), bool):
        raise ValueError("ok: not true or false")
    return EvalRecord(
        harness=_text(data, "harness"),
        version=_text(data, "version"),
        model=_text(data, "model"),
        ok=data["ok"],
        reason=_text(data, "reason"),
        seconds=_number(data.get("seconds")),
        limit=_count(data.get("limit")),
        scores=tuple(_score(item, index) for index, item in enumerate(scores[:MAX_SCORES])),
    )


def _score(item: Any, index: int) -> Score:
    if not isinstance(item, dict):
        raise ValueError(f"scores[{index}]: not a JSON object")
    value = _number(item.get("value"))
    if value is None:
        raise ValueError(f"scores[{index}].value: not a finite number")
    return Score(
        task=_text(item, "task", f"scores[{index}]."),
        metric=_text(item, "metric", f"scores[{index}]."),
        filter=_text(item, "filter", f"scores[{index}]."),
        value=value,
        stderr=_number(item.get("stderr")),
        samples=_count(item.get("samples")),
        n_shot=_count(item.get("n_shot")),
    )


def _text(data: dict[str, Any], key: str, where: str = "") -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}{key}: not text")
    return printable(value, MAX_TEXT)


def _number(value: Any) -> float | None:
    """A finite number (a bool, a string such as lm-evaluation-harness's "N/A", NaN or infinity is none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > MAX_COUNT:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT else None
