"""Several runs side by side (``recipekit compare`` of three or more runs, or of a matrix root): a sweep's table.

Where two runs are compared for alignment (:mod:`recipekit.runs.compare`: does B follow A's loss?), a sweep asks
which of its runs did best and at what cost. Each run gets one row: what its recipe sets that the others do not
(the swept keys), its final loss — the mean of its last ``window`` logged losses, so one noisy step does not pick
the winner — its tokens/s and MFU per device (the median after warm-up, as the report measures them), its peak
memory against the plan's, and its wall time (first start to last record, restarts included). The best run is the
one with the lowest final loss; a run that logged no loss is never best. Pure functions of the runs, no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recipekit.bundle.files import matrix_bundles
from recipekit.runs.runlog import RunLog
from recipekit.runs.runplan import memory_row, predictions, steady
from recipekit.validate.dryrun.workdir.kept import kept_runs, runs_dir

#: Resolved recipe keys that differ between any two runs of one recipe without being what was swept.
_NOT_SWEPT = ("name", "description")


@dataclass(frozen=True)
class SweepRow:
    """One run of the sweep, as the table shows it."""

    label: str
    swept: str  # the recipe keys this run sets differently from the others, ``key=value`` each
    final_step: int | None
    final_loss: float | None
    tokens_per_second: float | None
    mfu: float | None
    peak_memory_gib: float | None
    planned_memory_gib: float | None
    memory_measured: str  # "device" or "process RSS" (a CPU run has no device memory)
    wall_s: float | None
    best: bool = False

    @property
    def memory_ratio(self) -> float | None:
        if self.peak_memory_gib is None or not self.planned_memory_gib:
            return None
        return self.peak_memory_gib / self.planned_memory_gib


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    found: dict[str, Any] = {}
    for key, value in data.items():
        found.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return found


def swept_keys(runs: list[RunLog]) -> list[str]:
    """The resolved recipe keys whose values are not the same in every run (those of runs with a recipe)."""
    flats = [_flat(run.recipe) for run in runs if run.recipe]
    if len(flats) < 2:
        return []
    keys = sorted(set().union(*flats))
    return [k for k in keys if k.split(".")[-1] not in _NOT_SWEPT and len({repr(f.get(k)) for f in flats}) > 1]


def final_loss(run: RunLog, window: int) -> float | None:
    """The mean of the run's last ``window`` logged losses (each step's final value after a restart)."""
    losses = [loss for _, loss in sorted(run.series.get("loss", []))][-window:]
    return sum(losses) / len(losses) if losses else None


def wall_seconds(run: RunLog) -> float | None:
    """First attempt's start to the last record of the last attempt: the run's wall time, downtime included."""
    starts = [a.started for a in run.attempts if a.started is not None]
    ends = [a.ended for a in run.attempts if a.ended is not None]
    return max(ends) - min(starts) if starts and ends and max(ends) >= min(starts) else None


def sweep_rows(runs: list[RunLog], window: int = 3) -> list[SweepRow]:
    """One row per run, in the order given, the best (lowest final loss) marked."""
    keys = swept_keys(runs)
    rows = []
    for run in runs:
        flat = _flat(run.recipe)
        memory = memory_row(run, predictions(run.plan)["memory_gib"])
        rows.append(
            SweepRow(
                label=run.label,
                swept=", ".join(f"{k}={flat[k]}" for k in keys if k in flat),
                final_step=run.final_step,
                final_loss=final_loss(run, window),
                tokens_per_second=steady(run.values("tokens_per_second_per_device")),
                mfu=steady(run.values("mfu")),
                peak_memory_gib=memory.measured,
                planned_memory_gib=memory.predicted,
                memory_measured="device" if memory.held else "process RSS",
                wall_s=wall_seconds(run),
            )
        )
    scored = [(row.final_loss, i) for i, row in enumerate(rows) if row.final_loss is not None]
    if scored:
        best = min(scored)[1]
        rows[best] = SweepRow(**{**asdict(rows[best]), "best": True})
    return rows


def sweep_document(rows: list[SweepRow], window: int) -> dict[str, Any]:
    """The sweep as one JSON-ready document (``compare --json``)."""
    best = next((row.label for row in rows if row.best), None)
    return {
        "kind": "sweep",
        "window": window,
        "best": best,
        "runs": [{**asdict(row), "memory_ratio": row.memory_ratio} for row in rows],
    }


def matrix_runs(root: Path) -> list[Path] | None:
    """The runs of a matrix root (the directory ``build -m`` wrote, bundle/sweep.py): for each bundle, the work
    directory of its newest dry run when ``validate --dry-run`` left one (``<root>/.dryrun/<bundle>/<run id>-<time>``,
    validate.dryrun.workdir.kept), else the bundle (its output directory then comes from ``--volume``). None when
    ``root`` is not a matrix root."""
    bundles = matrix_bundles(root)
    if bundles is None:
        return None
    found = []
    for bundle in bundles:
        dry_runs = kept_runs(runs_dir(bundle))
        found.append(dry_runs[-1] if dry_runs else bundle)
    return found
