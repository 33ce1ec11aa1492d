"""``recipekit runs history OUTPUT_DIR``: a run's interruptions and recoveries, and its MTTR, from the run directory.

It reads ``recovery.jsonl`` with runtime/volume/recovery.py, the code train.py writes it with and the dry run's judge
computes its MTTR with: one definition of MTTR (last step before the interruption → first step after the restart).
Standard library and click for a run's output directory (it may be a copy of the cluster's volume); a dry run's work
directory or a bundle is resolved to its output directory the way ``report`` and ``compare`` do (runs/runlog).
MTTR is printed as the report prints it (:func:`recipekit.runs.runsummary.mttr_text`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import click

from recipekit.cli.common import SETTINGS, fail
from recipekit.runtime.volume import attemptends, recovery


@click.group("runs", context_settings=SETTINGS)
def runs_group() -> None:
    """Read a run's output directory: its interruptions, recoveries and MTTR, and the restarts asked for.

    \b
    Examples:
      recipekit runs history /mnt/shared/runs/llama3-8b-sft-5891d6  # cluster
      recipekit runs history ./runs/tiny-sft-a970ef --json
    """


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    try:
        return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # history() bounds times; this is the last guard
        return "?"


def _output_dir(given: Path) -> tuple[Path, int | None]:
    """``given`` when it holds recovery.jsonl (any entry of that name: the bounded reader says what is wrong with a
    FIFO or a link); else the output directory of the dry run's work directory or bundle it is, found as ``report``
    finds it (a run that has not started yet has none), with the Job's world size from its plan (None when unknown:
    a bare output directory)."""
    if os.path.lexists(given / recovery.RECOVERY_FILE) or not given.is_dir():
        return given, None
    from recipekit.base.errors import RecipeError
    from recipekit.runs.runlog import load_run

    try:
        run = load_run(given)
    except RecipeError as err:
        fail(f"{given}: not a run's output directory, a dry run's work directory or a bundle ({err.problems[0]})")
    layout = (run.plan or {}).get("layout")
    world = layout.get("world_size") if isinstance(layout, dict) else None
    return (run.output_dir if run.output_dir is not None else given), world if isinstance(world, int) else None


#: Recoveries printed one per line; the earlier ones are counted (``--json`` has them all).
SHOWN_RECOVERIES = 1000
#: The ends ``--json`` lists of each attempt (the first ones, the cause among them); ``ends_recorded`` counts them all.
LISTED_ENDS = 100


def strict(value: Any) -> Any:
    """``value`` with every non-finite float as None: JSON that every parser reads (``json.dumps`` would write NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def _say(line: str) -> None:
    """``line`` broken between words at the terminal's width (80 columns when piped), its continuation lines indented
    under its text: a reason read from the volume is long, and a terminal would break it mid-word."""
    from recipekit.recipe.schema import printable

    line = printable(line)  # its fields are typed and escaped when read; this is the last guard
    indent = " " * (len(line) - len(line.lstrip(" ")) + 3)
    width = max(40, shutil.get_terminal_size((80, 24)).columns)
    click.echo(
        textwrap.fill(line, width=width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)
    )


@runs_group.command("history")
@click.argument("output_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the history as one JSON document.")
def history_command(output_dir: Path, as_json: bool) -> None:
    """Each interruption of the run in OUTPUT_DIR and how it recovered, with the MTTR.

    OUTPUT_DIR is a run's output directory, a dry run's work directory (validate --dry-run --workdir) or a bundle
    whose output directory is on this machine, as for `recipekit report`.

    MTTR = first step after the restart − last step completed before the interruption (detection, rescheduling,
    start-up and loading included); steps lost = that last step − the checkpoint step resumed from.

    \b
    Examples:
      recipekit runs history /mnt/shared/runs/llama3-8b-sft-5891d6  # cluster
      recipekit runs history ./runs/tiny-sft-a970ef --json
    """
    from recipekit.recipe.schema import printable
    from recipekit.runs.runsummary import mttr_text

    output_dir, job_world = _output_dir(output_dir)
    path = output_dir / recovery.RECOVERY_FILE
    if not os.path.lexists(path):
        fail(f"{path} not found: not a run's output directory, or written by an older bundle")
    try:  # bounded, line by line, a regular file inside the directory (the volume is writable by others)
        tail, lines = recovery.read_tail(output_dir)  # the last attempts' records only, compact
    except OSError as exc:
        fail(f"{path}: cannot be read ({exc.strerror or exc})")
    records = tail.records
    cut: list[str] = []
    ends = attemptends.read_ends(output_dir, cut)  # bounded in all, typed, text printable
    notes = [f"{path.name}: {n}" for n in ([lines.cut] if lines.cut else []) + ([tail.cut] if tail.cut else [])]
    notes += [f"{path.name}: line {n}: {why}" for n, why in lines.refused[:3]] + cut
    for note in notes:
        click.echo(f"warning: {printable(note)}", err=True)
    found, attempts, ended = recovery.recoveries_seen(records, ends, job_world)
    figures = recovery.summary(found)
    restarts = recovery.restarts(records)  # the restarts asked for (recipekit restart), apart from recoveries
    if as_json:
        recoveries = [{**r.to_json(), "ended": a["why"]} for r, a in zip(found, ended)]
        listed = [{**a, "ends": a["ends"][:LISTED_ENDS], "ends_recorded": len(a["ends"])} for a in attempts]
        document = strict({"recoveries": recoveries, "attempts": listed, **figures, "restarts_asked": restarts})
        click.echo(json.dumps(document, indent=2, allow_nan=False))
        return
    click.echo(f"{printable(str(output_dir))}: {len(attempts)} start(s), {figures['restarts']} recovery(ies)")
    if len(found) > SHOWN_RECOVERIES:
        click.echo(f"  ... {len(found) - SHOWN_RECOVERIES:,} earlier recoveries (--json lists them all)")
    for i, r in enumerate(found, 1):
        if i <= len(found) - SHOWN_RECOVERIES:
            continue
        mttr = mttr_text(r.mttr_s) if r.mttr_s is not None else "not recovered yet (no step since the restart)"
        _say(
            f"  {i}. interrupted after step {r.interrupted_step} ({_when(r.interrupted_time)} UTC); restarted "
            f"{_when(r.restart_time)}; resumed at step {r.resume_step}; first step {r.first_step or '-'} at "
            f"{_when(r.first_step_time)}; steps lost {r.steps_lost}; MTTR {mttr}"
        )
        if r.mttr_s is not None:
            _say(f"     {_parts(r.parts)}")
        if i <= len(ended) and ended[i - 1]["why"]:
            _say(f"     ended: {ended[i - 1]['why']}")
    if attempts and attempts[-1]["why"] and not any(r.get("event") == "done" for r in records):
        _say(f"  the last attempt ended: {attempts[-1]['why']}")
    _restarts(restarts)
    if figures["mttr_s"] is not None:
        click.echo(f"MTTR {mttr_text(figures['mttr_s'])} (mean of {len(found)}); steps lost {figures['steps_lost']}")


def _parts(parts: dict[str, float | None]) -> str:
    """The MTTR's parts in words: ``detect 2.10 s, reschedule 31.00 s, ...`` (a part not recorded: ``-``)."""
    shown = [f"{name.replace('_', ' ')} {'-' if value is None else f'{value:.2f} s'}" for name, value in parts.items()]
    return "parts: " + ", ".join(shown)


def _restarts(restarts: list[dict]) -> None:
    """The restarts the user asked for (``recipekit restart``) that the run applied: none is a recovery."""
    for i, r in enumerate(restarts, 1):
        start = f"from {r['from']}" if r["from"] else "fresh, from step 0"
        aside = ", ".join(r["superseded"]) or "nothing"
        _say(f"  restart {i} ({r['id']}) asked for: {start}, applied {_when(r['time'])} UTC; set aside: {aside}")
