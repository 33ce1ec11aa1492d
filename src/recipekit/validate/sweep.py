"""``recipekit validate`` of a matrix root: every bundle a sweep built (``recipekit build -m``), validated one after
another, and one summary.

A matrix root is the output root of a matrix build (bundle/sweep.py): a directory that is no bundle itself and holds
bundles, one directory each, named ``<recipe>[@<value>...]``. Each is validated exactly as ``recipekit validate
BUNDLE`` would (static checks, then with ``--dry-run`` its dry run), in name order.

The dry runs run one at a time. Each is already N simulated pods of training processes plus a DeepSpeed op build, and
a build machine has two cores: started together, four of them would each get half a core, time out on their
collectives and prove nothing. One at a time, every dry run has the machine a single dry run is sized for, and
``--timeout`` means for each what it means for one. Each gets its own work directory: ``--workdir`` DIR gives
``DIR/<bundle name>``, else each bundle's default (``<root>/.dryrun/<bundle name>``, where ``recipekit compare`` of
the matrix root finds the runs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from recipekit.validate.dryrun.options import DryRunOptions, DryRunUsageError
from recipekit.validate.shared.loader import BundleUnusable
from recipekit.validate.shared.results import Status, Verdict


@dataclass
class SweepEntry:
    """One bundle of the sweep: its verdict, or why it could not be validated, and the time it took."""

    name: str
    path: Path
    verdict: Verdict | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.verdict is not None and self.verdict.ok

    def result(self, check: str) -> Any:
        """The verdict's result ``check`` (``dryrun.train``), or None."""
        found = [r for r in (self.verdict.results if self.verdict else []) if r.id == check]
        return found[0] if found else None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "ok": self.ok,
            "error": self.error,
            "seconds": round(self.seconds, 1),
            "verdict": self.verdict.to_json() if self.verdict else None,
        }


def validate_sweep(
    bundles: list[Path],
    *,
    dry_run: DryRunOptions | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> list[SweepEntry]:
    """Validate each of ``bundles`` in turn (see the module's docstring), each dry run with its own work directory.

    A bundle that cannot be validated (BundleUnusable, or options its dry run cannot use) is an entry with its
    error; the others are still validated."""
    from recipekit.validate import validate

    entries = []
    for number, path in enumerate(bundles, 1):
        entry = SweepEntry(path.name, path)
        options = dry_run
        if options is not None and options.workdir is not None:
            options = replace(options, workdir=options.workdir / path.name)
        progress(f"bundle {number}/{len(bundles)}: {path.name}")
        started = time.monotonic()
        try:
            entry.verdict = validate(path, dry_run=options, progress=progress)
        except (BundleUnusable, DryRunUsageError) as exc:
            entry.error = str(exc)
        entry.seconds = time.monotonic() - started
        entries.append(entry)
    return entries


def summary_rows(entries: list[SweepEntry]) -> list[list[str]]:
    """One row per bundle: name, static checks, dry run (and its final loss), seconds."""
    rows = []
    for entry in entries:
        if entry.verdict is None:
            rows.append([entry.name, "unusable", entry.error or "", f"{entry.seconds:.0f}"])
            continue
        static = [r for r in entry.verdict.results if not r.id.startswith("dryrun.")]
        failed = [r.id for r in static if r.status is Status.FAIL]
        skipped = sum(r.status is Status.SKIP for r in static)
        checks = f"{len(static) - len(failed) - skipped} pass" + (f", {skipped} skip" if skipped else "")
        checks += f", FAIL {', '.join(failed)}" if failed else ""
        rows.append([entry.name, checks, _dry_run_cell(entry), f"{entry.seconds:.0f}"])
    return rows


def _dry_run_cell(entry: SweepEntry) -> str:
    dry = [r for r in (entry.verdict.results if entry.verdict else []) if r.id.startswith("dryrun.")]
    if not dry:
        return "-"
    failed = [r.id for r in dry if r.status is Status.FAIL]
    if failed:
        return "FAIL " + ", ".join(failed)
    train = entry.result("dryrun.train")
    if train is None or train.status is Status.SKIP:
        return "skipped" + (f": {train.reason}" if train is not None and train.reason else "")
    loss = train.details.get("final_loss")
    return "pass" + (f", final loss {loss:.4g}" if isinstance(loss, (int, float)) else "")
