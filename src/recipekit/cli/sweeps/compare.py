"""``recipekit compare`` of three or more runs, or of a matrix root: the sweep's runs side by side
(:mod:`recipekit.runs.sweep`), the best marked, with overlaid loss curves in one HTML report.

Called by ``compare`` when it is given three or more RUNs or a matrix root; two runs keep their alignment verdict.
Exit codes: 0 the table (a best run found); 2 unusable input; 3 no run logged a loss (nothing to rank).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from recipekit.runs.runlog import RunLog

#: ``compare``'s exit code when no run of the sweep logged a loss (the same code as an INCONCLUSIVE alignment).
NOTHING_TO_RANK = 3


def compare_sweep(
    runs: list[RunLog], window: int, html_out: Path | None, as_json: bool, progress: Any, write_files: Any
) -> int:
    """Print (or write) the sweep's table; the exit code. ``progress`` and ``write_files``: compare's own progress
    display and report writer (cli/run/report.py), so that the two views draw and write alike."""
    from recipekit.runs.sweep import sweep_document, sweep_rows

    rows = sweep_rows(runs, window)
    document = sweep_document(rows, window)
    if html_out is not None:
        from recipekit.runs.runplots import sweep_plots

        best = next((i for i, row in enumerate(rows) if row.best), None)
        with progress(not as_json) as step:
            plots = sweep_plots(runs, best, [row.swept for row in rows], step)
        document["files"] = write_files(html_out, sweep_html(rows, plots, window), plots, document)
    if as_json:
        click.echo(json.dumps(document, indent=2, default=str))
    else:
        _print(rows, window, document.get("files"))
    return 0 if document["best"] is not None else NOTHING_TO_RANK


def _fmt(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}"


def _memory(row: Any) -> str:
    if row.peak_memory_gib is None:
        return "n/a"
    planned = f"/{row.planned_memory_gib:.3g}" if row.planned_memory_gib else ""
    return f"{row.peak_memory_gib:.3g}{planned}"


def _print(rows: list[Any], window: int, files: list[str] | None) -> None:
    from recipekit.cli.terminal import console, plain, word_table

    out = console(soft_wrap=False)
    for i, row in enumerate(rows, 1):
        out.print(plain(f"{i}: {row.label}"), soft_wrap=True)
    keys = [part.split("=", 1)[0] for part in (rows[0].swept.split(", ") if rows and rows[0].swept else [])]
    if keys:
        out.print(plain(f"swept: {', '.join(keys)}"), soft_wrap=True)
    table = [
        [
            f"{i}{' best' if row.best else ''}",
            " ".join(part.split("=", 1)[-1] for part in row.swept.split(", ")) if row.swept else "-",
            _fmt(row.final_loss),
            _fmt(row.tokens_per_second, 4),
            _fmt(row.mfu, 3),
            _memory(row),
            _fmt(row.wall_s, 3),
        ]
        for i, row in enumerate(rows, 1)
    ]
    headers = ["run", "swept", "final loss", "tok/s", "MFU", "peak/plan GiB", "wall s"]
    out.print(word_table(headers, table, title=f"{len(rows)} runs side by side", whole=(0, 2, 3, 4, 5, 6)))
    out.print(
        f"final loss: the mean of the last {window} logged losses; tok/s and MFU per device, median after warm-up; "
        "peak: device memory (a CPU run: a process's RSS)",
        soft_wrap=False,
    )
    best = next((i for i, row in enumerate(rows, 1) if row.best), None)
    out.print(plain(f"best: run {best} (lowest final loss)" if best else "no run logged a loss: nothing to rank"))
    if files:
        out.print(plain(f"comparison: {files[0]}"), soft_wrap=True)


def sweep_html(rows: list[Any], plots: list[Any], window: int) -> str:
    from recipekit.runs import runhtml as h

    best = next((row for row in rows if row.best), None)
    parts = [
        h.heading("Runs"),
        h.paragraph(
            f"Best: {best.label} (lowest final loss, {_fmt(best.final_loss)})" if best else "No run logged a loss.",
            "good" if best else "bad",
        ),
        h.table(
            [
                "#",
                "run",
                "swept",
                f"final loss (last {window})",
                "steps",
                "tokens/s per device",
                "MFU",
                "peak memory GiB",
                "plan GiB",
                "peak / plan",
                "wall time s",
            ],
            [
                [
                    f"{i} ★ best" if row.best else i,
                    row.label,
                    row.swept or "-",
                    _fmt(row.final_loss),
                    row.final_step if row.final_step is not None else "n/a",
                    _fmt(row.tokens_per_second),
                    _fmt(row.mfu, 3),
                    f"{_fmt(row.peak_memory_gib, 3)} ({row.memory_measured})",
                    _fmt(row.planned_memory_gib, 3),
                    _fmt(row.memory_ratio, 3),
                    _fmt(row.wall_s),
                ]
                for i, row in enumerate(rows, 1)
            ],
            numeric=(3, 4, 5, 6, 8, 9, 10),
        ),
        h.paragraph(
            f"Final loss: the mean of each run's last {window} logged losses. Tokens/s and MFU: per device, the median "
            "over the logged steps after the first. Peak memory: the device's peak allocated memory, or on a run "
            "without a device (a CPU dry run) the peak RSS of a process, beside the plan's memory per device."
        ),
        h.heading("Curves"),
        *(h.figure(p) for p in plots),
    ]
    return h.page(f"Sweep: {len(rows)} runs", parts)
