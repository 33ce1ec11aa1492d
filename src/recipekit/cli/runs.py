"""``recipekit runs history OUTPUT_DIR``: a run's interruptions and recoveries, and its MTTR, from the run directory.

It reads ``recovery.jsonl`` with runtime/volume/recovery.py, the code train.py writes it with and the dry run's judge
computes its MTTR with: one definition of MTTR (last step before the interruption → first step after the restart).
Standard library and click only; the directory may be a copy of the cluster's volume.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import click

from recipekit.cli.common import SETTINGS, fail
from recipekit.runtime.volume import recovery


@click.group("runs", context_settings=SETTINGS)
def runs_group() -> None:
    """Read a run's output directory: its interruptions, recoveries and MTTR.

    \b
    Examples:
      recipekit runs history /mnt/shared/runs/llama3-8b-sft-5891d6
      recipekit runs history ./runs/tiny-sft-a970ef --json
    """


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    try:
        return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # history() bounds times; this is the last guard
        return "?"


@runs_group.command("history")
@click.argument("output_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the history as one JSON document.")
def history_command(output_dir: Path, as_json: bool) -> None:
    """Each interruption of the run in OUTPUT_DIR and how it recovered, with the MTTR.

    MTTR = first step after the restart − last step completed before the interruption (detection, rescheduling,
    start-up and loading included); steps lost = that last step − the checkpoint step resumed from.

    \b
    Examples:
      recipekit runs history /mnt/shared/runs/llama3-8b-sft-5891d6
      recipekit runs history ./runs/tiny-sft-a970ef --json
    """
    path = output_dir / recovery.RECOVERY_FILE
    if not os.path.lexists(path):
        fail(f"{path} not found: not a run's output directory, or written by an older bundle")
    try:  # bounded, line by line, a regular file inside the directory (the volume is writable by others)
        lines = recovery.read_lines(output_dir)
    except OSError as exc:
        fail(f"{path}: cannot be read ({exc.strerror or exc})")
    records = [record for _, record in lines.values]
    for note in ([lines.cut] if lines.cut else []) + [f"line {n}: {why}" for n, why in lines.refused[:3]]:
        click.echo(f"warning: {path.name}: {note}", err=True)
    found = recovery.history(records)
    figures = recovery.summary(found)
    if as_json:
        click.echo(json.dumps({"recoveries": [r.to_json() for r in found], **figures}, indent=2))
        return
    starts = sum(1 for r in records if r.get("event") == "start")
    click.echo(f"{output_dir}: {starts} start(s), {figures['restarts']} recovery(ies)")
    for i, r in enumerate(found, 1):
        mttr = f"{r.mttr_s} s" if r.mttr_s is not None else "not recovered yet (no step since the restart)"
        click.echo(
            f"  {i}. interrupted after step {r.interrupted_step} ({_when(r.interrupted_time)} UTC); restarted "
            f"{_when(r.restart_time)}; resumed at step {r.resume_step}; first step {r.first_step or '-'} at "
            f"{_when(r.first_step_time)}; steps lost {r.steps_lost}; MTTR {mttr}"
        )
    if figures["mttr_s"] is not None:
        click.echo(f"MTTR {figures['mttr_s']} s (mean of {len(found)}); steps lost {figures['steps_lost']}")
