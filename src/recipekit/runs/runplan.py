"""The plan's predictions held against what a run measured: step time, tokens/s, MFU, HFU, memory per device.

The predictions come from the bundle's plan.json (recipekit.bundle.planview.estimate_dict) and follow its arithmetic:
the predicted step time is ``time.step_s``; tokens/s per device is the step's tokens over that time and the world size;
MFU and HFU are those tokens/s through the runtime boundary's own
:func:`~recipekit.runtime.boundary.flopcount.utilisation` (model FLOPs, then × the recomputation factor for HFU), so
planner and runtime cannot mean different things. The measured value of each is the median over the logged steps after
the first (the first step pays for warm-up), so one slow step (a checkpoint, a restart) does not move it. Pure
functions, no I/O.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from recipekit.runs.runlog import RunLog
from recipekit.runtime.boundary import flopcount, metricslog

#: A measured figure more than this fraction away from the plan's (ratio outside [1/(1+m), 1+m]) is a deviation.
DEFAULT_MARGIN = 0.5


@dataclass(frozen=True)
class Row:
    """One prediction and its measurement; ``ratio`` is measured / predicted. ``held`` False: the measurement is not
    the quantity predicted (a CPU process's RSS beside the plan's device memory), so its ratio is shown but never a
    deviation."""

    key: str
    title: str
    unit: str
    predicted: float | None
    measured: float | None
    note: str = ""
    held: bool = True

    @property
    def ratio(self) -> float | None:
        if self.predicted is None or self.measured is None or self.predicted == 0:
            return None
        return self.measured / self.predicted

    def deviates(self, margin: float) -> bool:
        ratio = self.ratio
        return self.held and ratio is not None and not (1 / (1 + margin) <= ratio <= 1 + margin)


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def predictions(plan: dict[str, Any] | None) -> dict[str, float | None]:
    """The plan's step time (s), tokens/s per device, MFU, HFU and memory per device (GiB)."""
    step_s = _num(_get(plan, "time", "step_s"))
    tokens = _num(_get(plan, "compute", "tokens_per_step"))
    world = _num(_get(plan, "layout", "world_size"))
    flops = _num(_get(plan, "compute", "flops_per_token"))
    peak = _num(_get(plan, "compute", "peak_tflops"))
    recompute = _num(_get(plan, "compute", "recompute_factor")) or 1.0
    tps = tokens / step_s / world if step_s and tokens and world else None
    mfu = flopcount.utilisation(tps, flops, peak) if tps is not None and flops and peak else None
    return {
        "step_time_s": step_s,
        "tokens_per_second_per_device": tps,
        "mfu": mfu,
        "hfu": mfu * recompute if mfu is not None else None,
        "memory_gib": _num(_get(plan, "memory_gib", "total")),
    }


def steady(values: list[float]) -> float | None:
    """The median after the first value (warm-up), or of all when there are fewer than three."""
    if not values:
        return None
    return statistics.median(values[1:] if len(values) >= 3 else values)


def rows(run: RunLog) -> list[Row]:
    """Every prediction beside its measurement; a figure the run did not record is measured None with a note."""
    plan = predictions(run.plan)
    return [
        Row("step_time_s", "step time", "s", plan["step_time_s"], steady(run.values("step_time_s"))),
        Row(
            "tokens_per_second_per_device",
            "tokens/s per device",
            "tokens/s",
            plan["tokens_per_second_per_device"],
            steady(run.values("tokens_per_second_per_device")),
        ),
        Row("mfu", "MFU", "", plan["mfu"], steady(run.values("mfu"))),
        Row("hfu", "HFU", "", plan["hfu"], steady(run.values("hfu"))),
        memory_row(run, plan["memory_gib"]),
    ]


def memory_row(run: RunLog, predicted: float | None) -> Row:
    """The plan's memory per device beside the run's peak: the device's peak allocated memory (the largest over
    ranks and logged steps: what the plan estimates), or on a run without a device (a CPU dry run) the peak RSS of a
    process, shown with its ratio but not held to the margin (it counts the interpreter and libraries too)."""
    device = run.values(metricslog.PEAK_DEVICE_MEMORY_KEY)
    if device:
        return Row("memory_gib", "memory per device (peak)", "GiB", predicted, max(device), "peak allocated, all ranks")
    host = run.values(metricslog.PEAK_HOST_MEMORY_KEY)
    if host:
        note = "peak RSS of a process (no device memory on this run): includes the interpreter and libraries"
        return Row("memory_gib", "memory per device (peak)", "GiB", predicted, max(host), note, held=False)
    return Row("memory_gib", "memory per device (peak)", "GiB", predicted, None, "the run logged no peak memory")


def deviations(table: list[Row], margin: float) -> list[str]:
    """One line per figure outside the margin, e.g. ``step time: 2.1 × the plan (0.42 s vs 0.2 s)``."""
    return [
        f"{row.title}: {row.ratio:.3g} × the plan ({row.measured:.4g} vs {row.predicted:.4g}"
        f"{' ' + row.unit if row.unit else ''})"
        for row in table
        if row.deviates(margin) and row.ratio is not None and row.measured is not None and row.predicted is not None
    ]
