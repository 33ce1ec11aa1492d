"""The ``recipekit validate`` click command: parse flags, call :func:`recipekit.validate.validate`, print.

Exit codes: 0 every check passed (skipped ones say why); 1 a check failed; 2 the bundle or the flags are unusable,
with one message and no traceback. The table goes to stdout (``--json``: one JSON document instead); progress of
the long steps goes to stderr.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from recipekit.cli.common import SETTINGS, fail
from recipekit.cli.terminal import plain
from recipekit.runtime.boundary.recipeview import DEVICE_TARGETS as TARGETS
from recipekit.validate.shared.results import Result, Status, Verdict

_DRY_RUN_ONLY = (
    "pods",
    "procs_per_pod",
    "kill_pod",
    "at_step",
    "resume_pods",
    "device",
    "workdir",
    "steps",
    "timeout",
)
_STYLE = {Status.PASS: "green", Status.FAIL: "bold red", Status.SKIP: "yellow"}
_STEP_LINE = re.compile(r"attempt \d+: step \d+")


@click.command("validate", context_settings=SETTINGS)
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--dry-run",
    is_flag=True,
    help="Also run the bundle's run.sh/train.py as simulated Volcano pods on "
    "this machine (tiny twin model, generated data).",
)
@click.option(
    "--pods", type=click.IntRange(1, 16), default=2, show_default=True, help="Simulated pods (--procs-per-pod each)."
)
@click.option(
    "--procs-per-pod",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    help="Training processes (devices) per simulated pod, e.g. 2 pods of 2 for TP 2 × DP 2.",
)
@click.option(
    "--kill-pod",
    type=int,
    default=None,
    help="Kill this pod (its whole process tree) during the run, "
    "restart all pods as Volcano's RestartJob does, check resume.",
)
@click.option(
    "--at-step",
    type=int,
    default=None,
    help="Training step at which --kill-pod strikes (default: between the midway checkpoint and the end).",
)
@click.option(
    "--resume-pods",
    type=click.IntRange(1, 16),
    default=None,
    help="After --kill-pod, continue on this many pods (a node lost for good): the work copy is rebuilt at the "
    "same global batch as `recipekit rescale` does, and the resume is checked row by row.",
)
@click.option(
    "--device",
    type=click.Choice(["cpu", *(t for t in TARGETS if t != "cpu")]),
    default="cpu",
    show_default=True,
    help="Run on real devices (--procs-per-pod per pod) instead of CPU (skipped with a reason where there are too "
    "few).",
)
@click.option(
    "--steps",
    type=click.IntRange(2, 10_000),
    default=8,
    show_default=True,
    help="Optimizer steps of the dry run (checkpoint at half).",
)
@click.option(
    "--workdir",
    type=click.Path(path_type=Path),
    default=None,
    help="Work directory for the dry run (default: <bundle>/../.dryrun/<name>); logs stay there.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(10, 24 * 3600),
    callback=lambda ctx, param, value: value if value == value else ctx.fail("--timeout: nan is not a number"),
    default=900.0,
    show_default=True,
    help="Seconds the whole dry run may take; pods are killed past it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (checks, findings, figures).")
@click.pass_context
def validate_command(
    ctx: click.Context,
    bundle: Path,
    dry_run: bool,
    pods: int,
    procs_per_pod: int,
    kill_pod: int | None,
    at_step: int | None,
    resume_pods: int | None,
    device: str,
    steps: int,
    workdir: Path | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Check a built bundle: files, hashes, the Volcano Job, cross-file consistency, linters; optionally a dry run.

    \b
    Examples:
      recipekit validate bundles/llama3_8b_sft
      recipekit validate bundles/llama3_8b_sft --dry-run
      recipekit validate bundles/llama3_8b_sft --dry-run --pods 2 --kill-pod 1 --at-step 6
      recipekit validate bundles/tiny_sft --dry-run --kill-pod 1 --at-step 6 --resume-pods 1
      recipekit validate bundles/llama3_8b_tp2 --dry-run --pods 2 --procs-per-pod 2
      recipekit validate bundles/llama3_8b_sft --dry-run --device npu
      recipekit validate bundles/tiny_sft --json
    """
    from recipekit.validate import validate
    from recipekit.validate.dryrun.options import DryRunOptions, DryRunUsageError
    from recipekit.validate.shared.loader import BundleUnusable

    if not dry_run:
        given = [name for name in _DRY_RUN_ONLY if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            verb = "makes" if len(given) == 1 else "make"
            raise click.UsageError(f"{flags} only {verb} sense with --dry-run")
    options = (
        DryRunOptions(
            pods=pods,
            procs_per_pod=procs_per_pod,
            steps=steps,
            kill_pod=kill_pod,
            at_step=at_step,
            resume_pods=resume_pods,
            device=device,
            workdir=workdir,
            timeout=timeout,
        )
        if dry_run
        else None
    )

    progress = _Progress(dry_run)
    try:
        with progress:
            report = validate(bundle, dry_run=options, progress=progress)
    except (BundleUnusable, DryRunUsageError) as exc:
        fail(str(exc))
    except OSError as exc:  # a path the user gave that the file system refuses (unreadable, a loop, ...)
        where = os.fsdecode(exc.filename) if exc.filename is not None else str(bundle)
        fail(f"{where}: {exc.strerror or exc}".encode("utf-8", "backslashreplace").decode())
    except KeyboardInterrupt:
        click.echo("interrupted: every pod process was stopped", err=True)
        ctx.exit(130)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print_verdict(report)
    ctx.exit(report.exit_code)


class _Progress:
    """Progress of long steps on stderr: a spinner on a terminal, plain lines otherwise (dry-run steps only)."""

    def __init__(self, dry_run: bool) -> None:
        from recipekit.cli.terminal import console

        self.console = console(stderr=True, soft_wrap=True)
        self.interactive = self.console.is_terminal
        self.dry_run = dry_run
        self.status: Any = None

    def __enter__(self) -> _Progress:
        if self.interactive:
            self.status = self.console.status(plain("validating"))
            self.status.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.status is not None:
            self.status.__exit__(*exc)

    def __call__(self, message: str) -> None:
        if self.status is not None:
            self.status.update(plain(message))  # a pod's line may hold "[/...]": never markup
            # Steps and static checks only move the spinner; a phase (pod launched, torchrun up, train.py started,
            # a kill, a restart) stays on screen, one line each.
            if not message.startswith("static check:") and not _STEP_LINE.match(message):
                self.console.log(plain(message))
        elif self.dry_run and not message.startswith("static check:"):
            click.echo(message, err=True)


def _details(result: Result) -> str:
    if result.findings:
        return "\n".join(str(f) for f in result.findings)
    return result.reason


def print_verdict(report: Verdict) -> None:
    """The table of checks, then substitutions, log tails, warnings and the verdict, at the terminal's width
    (80 columns when piped). Text that is not recipekit's own is printed as written (:mod:`recipekit.cli.terminal`)."""
    from rich.table import Column, Table
    from rich.text import Text

    from recipekit.cli.terminal import console as make_console
    from recipekit.cli.terminal import styled

    console = make_console()
    table = Table(
        "check",
        "result",
        Column("details", overflow="fold"),
        title=plain(f"recipekit validate {report.bundle}"),
        title_justify="left",
        show_lines=False,
        expand=False,
    )
    for result in report.results:
        table.add_row(
            Text(result.id),
            Text(result.status.value, style=_STYLE[result.status]),
            Text(_details(result), style="red" if result.failed else ""),
        )
    console.print(table)
    for result in report.results:
        subs = result.details.get("substitutions")
        if subs and not result.failed:
            console.print(styled(("dry-run substitutions", "bold"), f" ({result.details.get('workdir')}):"))
            derived: dict[str, int] = {}
            for sub in subs:
                if sub.get("derived"):
                    derived[sub["file"]] = derived.get(sub["file"], 0) + 1
                else:
                    where = sub["field"] if sub["file"] == "recipe.yaml" else f"{sub['file']} {sub['field']}"
                    console.print(Text(f"  {where}: {_value(sub['old'])} → {_value(sub['new'])} ({sub['why']})"))
            if derived:
                counted = ", ".join(f"{file} {count}" for file, count in derived.items())
                console.print(Text(f"  and what follows from them when re-planned: {counted} (substitutions.json)"))
        for name, tail in (result.details.get("log_tails") or {}).items():
            console.print(plain(f"{result.id}: last lines of {name}", style="bold red"))
            console.print(Text(tail))
    for warning in report.warnings:
        console.print(styled(("warning:", "bold yellow"), f" {warning}"))
    counts = report.counts()
    verdict = ("bundle OK", "green") if report.ok else ("bundle has problems", "bold red")
    console.print(styled(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped: ", verdict))


def _value(value: object, limit: int = 48) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
