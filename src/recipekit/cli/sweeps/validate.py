"""``recipekit validate MATRIX_ROOT``: every bundle of a sweep validated one after another (recipekit.validate.sweep),
then one table. Called by ``recipekit validate`` when its BUNDLE is a matrix root, with its progress display.

Exit codes as for one bundle: 0 every bundle passed; 1 a check of some bundle failed (or a bundle could not be
validated while others could); 2 no bundle could be validated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from recipekit.validate.dryrun.options import DryRunOptions


def run_sweep(root: Path, bundles: list[Path], options: DryRunOptions | None, as_json: bool, progress: Any) -> int:
    """Validate ``bundles`` of matrix root ``root`` (``progress``: validate's display, a context manager) and print
    the summary (or one JSON document); the exit code."""
    from recipekit.validate.sweep import validate_sweep

    with progress:
        entries = validate_sweep(bundles, dry_run=options, progress=progress)
    usable = [e for e in entries if e.verdict is not None]
    code = 2 if not usable else 0 if all(e.ok for e in entries) else 1
    if as_json:
        document = {"root": str(root), "ok": code == 0, "exit_code": code, "bundles": [e.to_json() for e in entries]}
        click.echo(json.dumps(document, indent=2, default=str))
        return code
    _print(root, entries, options is not None)
    return code


def _print(root: Path, entries: list, dry_run: bool) -> None:
    from recipekit.cli.terminal import console, plain, word_table
    from recipekit.validate.shared.results import Status
    from recipekit.validate.sweep import summary_rows

    out = console(soft_wrap=False)
    for entry in entries:  # what failed, bundle by bundle: the table below only names it
        for result in entry.verdict.results if entry.verdict else []:
            for finding in result.findings if result.status is Status.FAIL else []:
                out.print(plain(f"{entry.name}: {result.id}: {finding}", style="red"))
    headers = ["bundle", "static", "dry run", "s"]
    rows = summary_rows(entries)
    title = f"recipekit validate {root} ({len(entries)} bundles)"
    out.print(word_table(headers, rows, title=title, whole=(0, 3)))
    if not dry_run:
        out.print("static checks only: --dry-run also runs each bundle, one after another")
    passed = sum(e.ok for e in entries)
    style = "green" if passed == len(entries) else "bold red"
    out.print(plain(f"{passed} of {len(entries)} bundles OK", style=style))
