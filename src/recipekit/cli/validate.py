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
from recipekit.cli.terminal import plain, shown_path
from recipekit.validate.dryrun.options import BUILD_PROGRESS, DryRunOptions, DryRunUsageError, Flag, flag_name, flags
from recipekit.validate.shared.results import Result, Status, Verdict

_STYLE = {Status.PASS: "green", Status.FAIL: "bold red", Status.SKIP: "yellow"}
_STEP_LINE = re.compile(r"attempt \d+: step \d+")


def _click_type(annotation: str, flag: Flag) -> Any:
    """The click type of a :class:`DryRunOptions` field, from its annotation and its flag's range or choices."""
    base = annotation.split(" | ")[0]
    if flag.choices:
        return click.Choice(flag.choices)
    if base == "Path":
        return click.Path(path_type=Path)
    if base == "str":
        return str
    if base == "float":
        return click.FloatRange(flag.low, flag.high)
    if flag.low is None or flag.high is None:
        return int
    return click.IntRange(int(flag.low), int(flag.high))


def dry_run_flags(command: Any) -> Any:
    """Add one click option per :class:`DryRunOptions` flag, from the field's default and metadata (its one home)."""
    for option in reversed(flags()):
        flag: Flag = option.metadata["flag"]
        name = flag_name(option.name)

        def allowed(ctx: click.Context, param: Any, value: Any, flag: Flag = flag, name: str = name) -> Any:
            problem = flag.problem(name, value)
            return ctx.fail(problem) if problem else value

        command = click.option(
            "--" + name,
            option.name,
            type=_click_type(str(option.type), flag),
            default=option.default,
            show_default=option.default is not None,
            callback=allowed,
            help=flag.help,
        )(command)
    return command


@click.command("validate", context_settings=SETTINGS)
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--dry-run",
    is_flag=True,
    help="Also run the bundle's run.sh/train.py as simulated Volcano pods on "
    "this machine (tiny twin model, generated data).",
)
@dry_run_flags
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (checks, findings, figures).")
@click.pass_context
def validate_command(ctx: click.Context, bundle: Path, dry_run: bool, as_json: bool, **dry_flags: Any) -> None:
    """Check a built bundle: files, hashes, the Volcano Job, cross-file consistency, linters; optionally a dry run.

    BUNDLE may be a matrix root (the directory `build -m` wrote): every bundle in it is validated, one after
    another (dry runs never run side by side), then one summary table.

    \b
    Examples:
      recipekit validate bundles/llama3_8b_sft
      recipekit validate bundles/llama3_8b_sft --dry-run
      recipekit validate bundles/tiny_sft --dry-run --kill-pod 1 --at-step 6
      recipekit validate bundles/tiny_sft --dry-run --kill-pod 1 --resume-pods 1
      recipekit validate bundles/tp2 --dry-run --pods 2 --procs-per-pod 2
      recipekit validate bundles/tiny_sft --dry-run --device npu  # exit 2: no NPU
      recipekit validate bundles/tiny_sft --json
      recipekit validate bundles/tiny_sft --dry-run --restart checkpoint-4,fresh
      recipekit build -m recipe=tiny_sft train.seed=1,2 -o bundles/seeds
      recipekit validate bundles/seeds  # the sweep the line above built, as one
    """
    from recipekit.validate import validate
    from recipekit.validate.shared.loader import BundleUnusable

    if not dry_run:
        given = [name for name in dry_flags if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT]
        if given:
            names = ", ".join("--" + flag_name(name) for name in given)
            verb = "makes" if len(given) == 1 else "make"
            raise click.UsageError(f"{names} only {verb} sense with --dry-run")
    options = DryRunOptions(**dry_flags) if dry_run else None
    from recipekit.bundle.files import matrix_bundles

    bundles = matrix_bundles(bundle)
    if bundles is not None:  # a matrix root: every bundle of the sweep, one at a time, one summary
        from recipekit.cli.sweeps.validate import run_sweep

        try:
            resolved = options.resolved() if options else None
            ctx.exit(run_sweep(bundle, bundles, resolved, as_json, _Progress(dry_run)))
        except DryRunUsageError as exc:
            fail(str(exc))

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
            from recipekit.cli.terminal import fitted_words

            message = fitted_words(message, self.console.width - 12)  # log's time column: a path is never folded
            self.status.update(plain(message))  # a pod's line may hold "[/...]": never markup
            # Static checks and bare steps only move the spinner; a step's loss and a phase (pod launched, torchrun
            # up, train.py started, a kill, a restart) stay on screen, one line each.
            if not _transient(message):
                self.console.log(plain(message))
        elif self.dry_run and not message.startswith(("static check:", BUILD_PROGRESS)):
            click.echo(message, err=True)


def _transient(message: str) -> bool:
    """Whether ``message`` only moves the spinner (a bare step, a static check, the op build's progress) rather than
    staying on screen. A step that reports its loss stays: the scrollback keeps the run's losses, as a Trainer's log
    does, and a user who scrolls back after the verdict finds them."""
    step = bool(_STEP_LINE.match(message)) and ", loss " not in message
    return step or message.startswith(("static check:", BUILD_PROGRESS))


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
    from recipekit.cli.terminal import middle

    # a word wider than the details column (an image reference, a path) is shortened from the middle, not cut
    room = max(16, console.width - max((len(r.id) for r in report.results), default=5) - len("skipped") - 10)
    for result in report.results:
        details = "\n".join(" ".join(middle(w, room) for w in line.split(" ")) for line in _details(result).split("\n"))
        table.add_row(
            Text(result.id),
            Text(result.status.value, style=_STYLE[result.status]),
            Text(details, style="red" if result.failed else ""),
        )
    console.print(table)
    seen: set[str] = set()
    workdir = ""
    for result in report.results:
        subs = result.details.get("substitutions")
        workdir = workdir or str(result.details.get("workdir") or "")
        if subs and not result.failed:
            for line in substitution_lines(subs, str(result.details.get("workdir") or "")):
                _print_wrapped(console, line)
        for name, tail in (result.details.get("log_tails") or {}).items():
            console.print(plain(f"{result.id}: last lines of {name}", style="bold red"))
            # as written, never re-wrapped (a line copied is the line logged); a traceback shown once
            console.print(Text(traceback_once(tail, seen)), soft_wrap=True)
    for warning in report.warnings:
        console.print(styled(("warning:", "bold yellow"), f" {warning}"))
    if workdir:
        _print_wrapped(
            console, f"dry run kept in {shown_path(workdir)} (report, runs history read it; clean removes it)"
        )
    counts, verdict = report.summary().split(": ", 1)
    console.print(styled(f"{counts}: ", (verdict, "green" if report.ok else "bold red")))


def _print_wrapped(console: Any, line: str) -> None:
    """``line`` broken between words at the console's width, continuation lines indented under its text; a path
    wider than the line stays whole (:func:`recipekit.cli.terminal.fitted_words` shortens one wider still)."""
    import textwrap

    from recipekit.cli.terminal import fitted_words

    lead = " " * (len(line) - len(line.lstrip(" ")))
    text = fitted_words(line.strip(), console.width - len(lead) - 4)
    for part in textwrap.wrap(
        text, width=console.width, initial_indent=lead, subsequent_indent=lead + "    ", break_long_words=False,
        break_on_hyphens=False,
    ) or [""]:  # fmt: skip
        console.print(plain(part), soft_wrap=True)


_TRACEBACK = "Traceback (most recent call last):"
#: What torchrun puts before a worker's line (``[rank1]:``, ``[default0]:``): not part of what the worker said.
_RANK_PREFIX = re.compile(r"^\[[\w.-]+\]:\s?")


def traceback_once(tail: str, seen: set[str]) -> str:
    """``tail`` with each traceback another pod's tail already showed (every rank raises the same one) replaced by
    one line saying so; the tracebacks shown are added to ``seen`` (compared without torchrun's rank prefix)."""
    lines = tail.splitlines()
    bare = [_RANK_PREFIX.sub("", line) for line in lines]
    out, i = [], 0
    while i < len(lines):
        if not bare[i].startswith(_TRACEBACK):
            out.append(lines[i])
            i += 1
            continue
        end = i + 1
        while end < len(lines) and (bare[end].startswith((" ", "\t")) or not bare[end].strip()):
            end += 1
        block = "\n".join(bare[i : end + 1])  # the traceback and the exception line after it
        if block in seen:
            out.append("(the same traceback as above)")
        else:
            seen.add(block)
            out.extend(lines[i : end + 1])
        i = end + 1
    return "\n".join(out)


def substitution_lines(subs: list[dict[str, Any]], workdir: str) -> list[str]:
    """The dry run's substitutions, short and true: one line per reason with the recipe keys it changed, then the
    count of file values that follow from them (every one is in substitutions.json). A path in the work directory is
    shown relative to it; a value too long for a line is left out, never cut."""
    explicit = [s for s in subs if not s.get("derived")]
    derived: dict[str, int] = {}
    for sub in subs:
        if sub.get("derived"):
            derived[str(sub.get("file"))] = derived.get(str(sub.get("file")), 0) + 1
    reasons: dict[str, list[str]] = {}
    for sub in explicit:
        reasons.setdefault(str(sub.get("why")), []).append(_change(sub, workdir))
    lines = [
        f"dry-run substitutions, {len(explicit)} in the recipe (paths relative to {shown_path(workdir)}; every value "
        "in substitutions.json there):"
    ]
    lines += [f"  {', '.join(changes)}: {why}" for why, changes in reasons.items()]
    if derived:
        files = ", ".join(f"{file} {count}" for file, count in derived.items())
        lines.append(f"  and {sum(derived.values())} values that follow from them when re-planned ({files})")
    return lines


def _change(sub: dict[str, Any], workdir: str) -> str:
    key = str(sub.get("field") or "").removeprefix("recipe.")
    if sub.get("file") not in ("recipe.yaml", None):
        key = f"{sub['file']} {key}"
    old, new = _value(sub.get("old"), workdir), _value(sub.get("new"), workdir)
    if old is None or new is None:
        return key
    return f"{key} {old} → {new}"


def _value(value: object, workdir: str, limit: int = 32) -> str | None:
    """``value`` as the substitution list shows it, or None when it does not fit (it is in substitutions.json)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if workdir and text.startswith(workdir + "/"):
        text = "./" + text[len(workdir) + 1 :]
    return text if len(text) <= limit else None


@click.command("clean", context_settings=SETTINGS)
@click.argument("bundles", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--keep",
    type=click.IntRange(0, 10_000),
    default=0,
    show_default=True,
    help="Keep the newest N dry runs of each bundle (and the newest N reports).",
)
def clean_command(bundles: tuple[Path, ...], keep: int) -> None:
    """Remove the dry runs `validate --dry-run` kept and the reports `report` wrote.

    Each dry run keeps its own work directory (bundles/.dryrun/<bundle>/<run id>-<time>: its logs, checkpoints and
    report); the newest 5 of a bundle stay until this removes them. Without BUNDLE: the dry runs of every bundle
    under ./bundles and the reports under ./recipekit-report. A dry run still running is left in place.

    \b
    Examples:
      recipekit clean
      recipekit clean bundles/tiny_sft --keep 1
    """
    from recipekit.cli.terminal import shown_path
    from recipekit.validate.dryrun.workdir import kept

    folders = [kept.runs_dir(b) for b in bundles] or sorted(Path("bundles", ".dryrun").glob("*"))
    for folder in folders:
        cleaned = kept.prune(folder, keep)
        if cleaned.removed or cleaned.busy:
            busy = f"; {len(cleaned.busy)} still running, left in place" if cleaned.busy else ""
            click.echo(
                f"removed {len(cleaned.removed)} dry run(s) of {folder.name} "
                f"({cleaned.bytes_freed / 2**20:.1f} MiB) from {shown_path(folder)}{busy}"
            )
    if not bundles:
        from recipekit.cli.run.report import REPORTS, prune_reports

        removed = prune_reports(REPORTS, keep)
        if removed:
            click.echo(f"removed {len(removed)} report(s) from {REPORTS}")
