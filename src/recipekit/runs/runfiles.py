"""The files of a run, read bounded and typed: what ``report``, ``compare`` and ``runs history`` read but did not write.

A run's output directory sits on a shared volume, and a baseline or a plan.json may come from anyone. So each file
is opened through the runtime's JSON reader (runtime/boundary/jsonfile.py: a regular file checked on the opened
descriptor, read a MiB at a time up to a bound, nested at most 64 levels, never a link out of the run's directory),
JSON lines are read one by one with bounds on their number and length, and every field the report computes with is
typed before it is used: a string where a number belongs is one line naming the file, the field and the expected
type, and a number is finite and within :data:`MAX_FIGURE` (a step of 10⁴⁰⁰ must not reach a plot).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from recipekit.base.errors import Problem, RecipeError
from recipekit.runtime.boundary import jsonfile

#: JSON side files (plan.json, manifest.json, cluster-check.json, recipekit-run.json, a baseline) up to this size.
MAX_FILE_BYTES = 16 * 1024 * 1024
#: The largest magnitude a figure may have (a FLOP count per token is ~10¹²; a step, a byte count, a time below).
MAX_FIGURE = 1e18
#: The largest step read (a run of a billion steps is far off).
MAX_STEP = 10**12

#: What a field must be, by name: the check, and the words a refusal uses.
NUMBER = (lambda v: figure(v) is not None, "a finite number")
INTEGER = (lambda v: step(v) is not None, f"a whole number from 0 to {MAX_STEP:,}")
TEXT = (lambda v: isinstance(v, str), "text")
FLAG = (lambda v: isinstance(v, bool), "true or false")
LIST = (lambda v: isinstance(v, list), "a list")
MAPPING = (lambda v: isinstance(v, dict), "a mapping")

#: The fields of plan.json the report computes with (bundle/planview.estimate_dict writes them).
PLAN_FIELDS = {
    "time": MAPPING,
    "time.step_s": NUMBER,
    "time.total_steps": INTEGER,
    "compute": MAPPING,
    "compute.tokens_per_step": NUMBER,
    "compute.flops_per_token": NUMBER,
    "compute.peak_tflops": NUMBER,
    "compute.recompute_factor": NUMBER,
    "layout": MAPPING,
    "layout.world_size": INTEGER,
    "layout.tensor_parallel": INTEGER,
    "layout.zero_stage": INTEGER,
    "memory_gib": MAPPING,
    "memory_gib.total": NUMBER,
}
#: The fields of a bundle's manifest.json the report reads (bundle/render.manifest writes them).
MANIFEST_FIELDS = {
    "name": TEXT,
    "recipekit_version": TEXT,
    "choices": MAPPING,
    "overrides": LIST,
    "versions": MAPPING,
    "recipe": MAPPING,
    "files": MAPPING,
}
#: cluster-check.json (runtime/ops/preflight.py).
PREFLIGHT_FIELDS = {"ok": FLAG, "reason": TEXT, "checks": LIST}
#: One all-reduce result of the preflight's bandwidth check.
BANDWIDTH_FIELDS = {"size_mb": NUMBER, "algbw_gbps": NUMBER, "busbw_gbps": NUMBER}
#: The start record of metrics.jsonl (runtime/session/session.py).
START_FIELDS = {
    "time": NUMBER,
    "world_size": INTEGER,
    "tensor_parallel": INTEGER,
    "zero_stage": INTEGER,
    "resume_step": INTEGER,
    "run_id": TEXT,
    "device": TEXT,
    "precision": TEXT,
}
#: Every other record: the fields the report reads from each.
RECORD_FIELDS = {"time": NUMBER, "step": INTEGER, "seconds": NUMBER, "bytes": NUMBER}


def figure(value: Any) -> float | None:
    """``value`` as a float when it is a number (not a bool), finite and within :data:`MAX_FIGURE`; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > MAX_FIGURE:  # float() of 10**400 raises
        return None
    number = float(value)
    return number if math.isfinite(number) and abs(number) <= MAX_FIGURE else None


def step(value: Any) -> int | None:
    """``value`` when it is a whole number from 0 to :data:`MAX_STEP`; else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP
    return value if ok else None


def _lookup(data: Any, dotted: str) -> tuple[bool, Any]:
    for key in dotted.split("."):
        if not isinstance(data, dict) or key not in data:
            return False, None
        data = data[key]
    return True, data


def type_problems(data: Any, fields: dict[str, tuple[Any, str]], where: str) -> list[Problem]:
    """One problem per field of ``fields`` that ``data`` has with the wrong type (absent and null fields pass: a
    reader treats them as unknown)."""
    problems = []
    for dotted, (test, expected) in fields.items():
        present, value = _lookup(data, dotted)
        if present and value is not None and not test(value):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            problems.append(Problem(where, f"{dotted} is {shown}: expected {expected}"))
    return problems


def document(path: Path, fields: dict[str, tuple[Any, str]], within: Path | None = None) -> dict[str, Any] | None:
    """The JSON object in ``path`` with ``fields`` typed: None when there is no such file; RecipeError (one line per
    problem, naming the file) when it is a FIFO, a device, a link out of ``within``, too large, too deep, not an
    object or a field has the wrong type."""
    if not _exists(path):
        return None
    try:
        data = jsonfile.read(path, MAX_FILE_BYTES, within=within)
    except OSError as exc:
        raise RecipeError([Problem(str(path), f"cannot be read ({exc.strerror or exc})")]) from None
    except ValueError as exc:
        raise RecipeError([Problem(str(path), getattr(exc, "reason", str(exc)))]) from None
    if not isinstance(data, dict):
        raise RecipeError([Problem(str(path), "not a JSON object")])
    problems = type_problems(data, fields, str(path))
    if problems:
        raise RecipeError(problems)
    return data


def _exists(path: Path) -> bool:
    try:
        path.lstat()
    except OSError:
        return False
    return True


def record_problem(record: Any, start_event: str) -> str | None:
    """Why one metrics or recovery record cannot be used (its fields' types), or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    fields = START_FIELDS if record.get("event") == start_event else RECORD_FIELDS
    problems = type_problems(record, fields, "")
    return problems[0].message if problems else None
