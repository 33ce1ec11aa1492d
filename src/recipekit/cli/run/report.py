"""``recipekit report`` and ``recipekit compare``: a run's report with plots, and the alignment of two runs.

Thin commands: :mod:`recipekit.runs.runlog` reads, :mod:`runplan`, :mod:`runsummary` and :mod:`compare` decide,
:mod:`runplots` draws, :mod:`runhtml` writes the page. matplotlib and rich are imported inside the commands only.
Exit codes: 0 done (compare: ALIGNED), 1 compare: NOT ALIGNED, 2 unusable input (one line each, no traceback),
3 compare: INCONCLUSIVE (the runs cannot tell: :func:`recipekit.runs.compare.cannot_tell`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from recipekit.base.errors import Problem, RecipeError
from recipekit.cli.common import SETTINGS
from recipekit.cli.common import user_errors as _user_errors


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RecipeError(
            [Problem("matplotlib", "not installed: pip install 'recipekit[report]' (or --json without plots)")]
        ) from None


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str], None]]:
    """A transient progress line on stderr while plots are drawn (long runs have many points)."""
    if not enabled:
        yield lambda title: None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from recipekit.cli.terminal import console

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("reading the run", total=None)
        yield lambda title: progress.update(task, description=f"drawing: {title}")


def _text_table(title: str, rows: Sequence[Sequence[object]], headers: Sequence[str]) -> Any:
    """A rich table of plain text that wraps cells between words only (:func:`recipekit.cli.terminal.word_table`)."""
    from recipekit.cli.terminal import word_table
    from recipekit.recipe.schema import printable

    cells = [["" if cell is None else printable(str(cell)) for cell in row] for row in rows]
    return word_table(list(headers), cells, title=title)


def _pairs(console: Any, title: str, rows: Sequence[tuple[str, str]]) -> None:
    """A titled list of ``name  value`` lines, not a table: a run directory or an image reference stays one token
    on one line (the terminal may wrap it, a table cell would cut it), and copies whole."""
    import textwrap

    from recipekit.recipe.schema import printable

    console.print(title, markup=False, style="bold")
    width = max((len(name) for name, _ in rows), default=0)
    for name, value in rows:  # values read from the run's files (a run id, a recipe name): escaped, never raw
        lines = textwrap.wrap(  # a long value breaks between words, under itself; a path stays one token
            printable(str(value)),
            width=max(20, console.width - width - 4),
            break_long_words=False,
            break_on_hyphens=False,
        ) or [""]
        console.print(f"  {printable(name):<{width}}  {lines[0]}", markup=False, highlight=False)
        for line in lines[1:]:
            console.print(f"  {'':<{width}}  {line}", markup=False, highlight=False)


def _titled(row: dict[str, Any]) -> str:
    """A plan row's figure with its unit (a ratio of peak, such as MFU, says so), unless the title names it."""
    unit = row["unit"] or "fraction of peak"
    named = unit in row["title"].replace("(", " ").replace(")", " ").split()  # a word of it ("s" is not in "step")
    return row["title"] if named else f"{row['title']} ({unit})"


def _html_note(row: dict[str, Any], cpu_twin: bool) -> str:
    """A figure's note, led for one beyond the margin by what it is: a deviation, or what a CPU twin is expected to
    miss (the terminal says the same below its table)."""
    if not row["deviates"]:
        return str(row["note"])
    lead = "expected of a CPU twin" if cpu_twin else "DEVIATES"
    return f"{lead}; {row['note']}" if row["note"] else lead


def _percent(value: Any) -> str:
    """A relative difference (a fraction) in percent, its unit in the cell."""
    return "n/a" if value is None else f"{100 * value:.3g} %"


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _write_files(out: Path, html: str, plots: Sequence[Any], document: dict[str, Any]) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for plot in plots:
        (out / f"{plot.name}.png").write_bytes(plot.png)
        written.append(str(out / f"{plot.name}.png"))
    (out / "report.html").write_text(html, encoding="utf-8")
    (out / "report.json").write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    return [str(out / "report.html"), *written, str(out / "report.json")]


# ------------------------------------------------------------------------------------------------------- report
#: Where reports go without -o: one directory per report, named by run id and time (never replaced).
REPORTS = Path("recipekit-report")
#: Reports kept there: the oldest beyond it are removed when a new one is written (`recipekit clean` removes all).
KEEP_REPORTS = 20
_REPORT_NAME = re.compile(r"[0-9A-Za-z_.-]+-\d{8}-\d{6}(-\d+)?")


def _run_id(doc: dict[str, Any]) -> str:
    found = dict(doc.get("what_ran") or []).get("run id", "")
    return found if isinstance(found, str) and re.fullmatch(r"[0-9A-Za-z_.-]{1,64}", found) else "run"


def new_report_dir(run_id: str, now: float | None = None) -> Path:
    """``recipekit-report/<run id>-<YYYYMMDD-HHMMSS>`` (UTC), not yet taken."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    base = REPORTS / f"{run_id}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def prune_reports(folder: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` report directories in ``folder`` (named by :func:`new_report_dir`)."""
    import shutil

    def when(path: Path) -> tuple[str, int]:
        found = re.search(r"-(\d{8}-\d{6})(?:-(\d+))?$", path.name)
        return (found.group(1), int(found.group(2) or 1)) if found else ("", 0)

    try:
        reports = [p for p in folder.iterdir() if _REPORT_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    old = sorted(reports, key=when)[: max(0, len(reports) - keep)]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def report_html(run: Any, doc: dict[str, Any], plots: Sequence[Any]) -> str:
    from recipekit.runs import runhtml as h

    parts = [
        h.heading("Summary"),
        h.table(["what ran", ""], doc["what_ran"]),
        h.table(["how it went", ""], doc["how_it_went"]),
    ]
    margin = doc["margin"]
    if doc["deviations"]:
        parts += [
            h.paragraph(f"Deviations from the plan beyond ×{1 + margin:g} either way:", "bad"),
            h.items(doc["deviations"]),
        ]
    elif doc["expected_deviations"]:
        parts += [
            h.paragraph(f"Beyond ×{1 + margin:g} of {doc['plan_source']}, as expected of a CPU twin:"),
            h.items(doc["expected_deviations"]),
        ]
    elif run.plan:
        parts.append(h.paragraph(f"Every measured figure is within ×{1 + margin:g} of the plan.", "good"))
    parts += [
        h.heading("Plan vs measured"),
        h.paragraph(
            f"Predicted: {doc['plan_source']}. Measured: median over the logged steps after the first. "
            "Ratio: measured / predicted."
        ),
        h.table(
            ["figure", "predicted", "measured", "ratio", "note"],
            [
                [
                    _titled(r),
                    _fmt(r["predicted"]),
                    _fmt(r["measured"]),
                    _fmt(r["ratio"]),
                    _html_note(r, doc["cpu_twin"]),
                ]
                for r in doc["plan"]
            ],
            numeric=(1, 2, 3),
        ),
    ]
    if doc["restarts"]:
        parts += [
            h.heading("Interruptions and recovery"),
            h.table(
                [
                    "attempt",
                    "interrupted after step",
                    "resumed from",
                    "replayed steps",
                    "down (s)",
                    "back past (s)",
                    "MTTR (s)",
                ],  # fmt: skip
                [
                    [
                        r["attempt"],
                        r["interrupted_at_step"],
                        r["resumed_step"],
                        r["replayed_steps"],
                        _fmt(r["downtime_s"]),
                        _fmt(r["recovery_s"]),
                        "n/a" if r["mttr_s"] is None else f"{r['mttr_s']:.2f}",
                    ]
                    for r in doc["restarts"]
                ],
                numeric=(0, 1, 2, 3, 4, 5, 6),
            ),
        ]
    if doc["warnings"]:
        parts += [h.heading("Warnings"), h.items(doc["warnings"])]
    parts.append(h.heading("Plots"))
    parts += [h.figure(p) for p in plots]
    return h.page(f"Run report: {run.label}", parts)


@click.command("report", context_settings=SETTINGS)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--volume", type=click.Path(path_type=Path), help="Where the bundle's shared volume is mounted here.")
@click.option(
    "--plan",
    "plan",
    type=click.Path(path_type=Path),
    help="A plan.json (or bundle) to hold an output directory against.",
)
@click.option(
    "-o",
    "--output",
    "out",
    type=click.Path(path_type=Path),
    default=None,
    help="Directory for report.html, the PNGs and report.json (default: a new one per report, "
    "recipekit-report/<run id>-<time>; the newest 20 kept).",
)
@click.option(
    "--margin",
    type=click.FloatRange(min=0, max=100),
    default=0.5,
    show_default=True,
    help="A measured figure beyond ×(1+margin) of the plan either way is a deviation.",
)
@click.option(
    "--export-baseline",
    type=click.Path(path_type=Path),
    help="Also write the run's numbers as a small baseline file for `compare --baseline`.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@_user_errors
def report_command(
    run_dir: Path,
    volume: Path | None,
    plan: Path | None,
    out: Path | None,
    margin: float,
    export_baseline: Path | None,
    as_json: bool,
) -> None:
    """Draw RUN_DIR's report: an HTML page (plots embedded, opens offline), PNGs and report.json.

    RUN_DIR is a run's output directory, a bundle (its output directory found on the shared volume, mounted here at
    --volume), a dry run's work directory, or a baseline file. The plan's predictions stand beside what was measured.

    \b
    Examples:
      recipekit report bundles/llama3_8b_sft --volume /mnt/pvc  # cluster
      recipekit report runs/tiny-sft-a970ef --json
      recipekit report /mnt/shared/runs/tiny-sft-5891d6 --plan bundles/tiny_sft
      recipekit report runs/tiny-sft-a970ef --export-baseline baseline.json
    """
    from recipekit.runs.runlog import baseline, load_run
    from recipekit.runs.runsummary import summary

    _need_matplotlib()
    from recipekit.runs.runplots import run_plots

    run = load_run(run_dir, volume, plan)
    doc = summary(run, margin)
    with _progress(not as_json) as progress:
        plots = run_plots(run, progress)
    if out is None:
        prune_reports(REPORTS, KEEP_REPORTS - 1)  # with this one, the newest KEEP_REPORTS
        out = new_report_dir(_run_id(doc))
    files = _write_files(out, report_html(run, doc, plots), plots, doc)
    if export_baseline is not None:
        export_baseline.parent.mkdir(parents=True, exist_ok=True)
        export_baseline.write_text(json.dumps(baseline(run), indent=1, default=str) + "\n", encoding="utf-8")
        files.append(str(export_baseline))
    doc["files"] = files
    if as_json:
        click.echo(json.dumps(doc, indent=2, default=str))
        return
    from recipekit.cli.terminal import console as make_console
    from recipekit.recipe.schema import printable

    console = make_console(soft_wrap=True)
    console.print(printable(f"run: {run.label}"), markup=False)
    _pairs(console, "What ran", doc["what_ran"])
    _pairs(console, "How it went", doc["how_it_went"])
    console.print(
        _text_table(
            "Plan vs measured (median after the first step)",
            [[_titled(r), _fmt(r["predicted"]), _fmt(r["measured"]), _fmt(r["ratio"]), r["note"]] for r in doc["plan"]],
            ["figure (unit)", "plan", "measured", "measured / plan", "note"],
        )
    )
    console.print(f"plan: {doc['plan_source']}", markup=False, soft_wrap=False)
    for line in map(printable, doc["deviations"]):
        console.print(f"deviation (beyond ×{1 + margin:g}): {line}", markup=False, style="yellow", soft_wrap=False)
    for line in map(printable, doc["expected_deviations"]):
        console.print(f"expected of a CPU twin (beyond ×{1 + margin:g}): {line}", markup=False, soft_wrap=False)
    for line in map(printable, doc["warnings"]):
        console.print(f"warning: {line}", markup=False, style="yellow", soft_wrap=False)
    console.print(f"report: {files[0]} ({len(plots)} plots)", markup=False)


# ------------------------------------------------------------------------------------------------------ compare
#: How the page draws each verdict: INCONCLUSIVE is neither a pass nor a failure.
_VERDICT_CSS = {"ALIGNED": "good", "NOT ALIGNED": "bad"}


def compare_html(result: Any, plots: Sequence[Any]) -> str:
    from recipekit.runs import runhtml as h

    doc = result.to_json()
    verdict = result.verdict.value
    parts = [
        h.heading("Verdict"),
        h.paragraph(f"{verdict} (A: {result.a}; B: {result.b})", _VERDICT_CSS.get(verdict, "")),
    ]
    if result.reasons:
        parts.append(h.items(result.reasons))
    t = doc["tolerances"]
    parts.append(
        h.paragraph(
            f"Tolerances: loss {t['loss_rtol']:g} relative over a {t['window']}-step window, grad norm "
            f"{t['grad_norm_rtol']:g}, eval loss {t['eval_rtol']:g}; at least {t['min_steps']} common steps."
        )
    )
    parts += [
        h.heading("Alignment"),
        h.table(
            [
                "series",
                "common steps",
                "max |B−A|",
                "max relative",
                "max windowed relative",
                "tolerance",
                "first divergence",
            ],
            [
                [
                    key,
                    len(doc[key]["steps"]),
                    _fmt(doc[key]["max_abs_diff"]),
                    _fmt(doc[key]["max_rel_diff"]),
                    _fmt(doc[key]["max_window_rel_diff"]),
                    _fmt(doc[key]["rtol"]),
                    _fmt(doc[key]["first_divergence"]) if doc[key]["first_divergence"] is not None else "none",
                ]
                for key in ("loss", "grad_norm", "eval_loss")
            ],
            numeric=(1, 2, 3, 4, 5),
        ),
        h.heading("Throughput and MFU side by side"),
        h.table(
            ["figure", "A", "B", "B / A"],
            [[r["title"], _fmt(r["a"]), _fmt(r["b"]), _fmt(r["ratio"])] for r in doc["throughput"]],
            numeric=(1, 2, 3),
        ),
        h.heading("What differs"),
        h.items(doc["recipe_changes"] or ["no recipe key differs"]),
        h.items(doc["version_changes"] or ["no version differs"]),
    ]
    if doc["notes"]:
        parts += [h.heading("Notes"), h.items(doc["notes"])]
    parts += [h.heading("Plots"), *(h.figure(p) for p in plots)]
    return h.page("Run comparison", parts)


@click.command("compare", context_settings=SETTINGS)
@click.argument("runs", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--baseline",
    type=click.Path(path_type=Path),
    help="Compare the one RUN against this stored baseline (file or run).",
)
@click.option("--volume", type=click.Path(path_type=Path), help="Where the bundles' shared volume is mounted here.")
@click.option(
    "--loss-rtol",
    type=click.FloatRange(min=0),
    default=0.02,
    show_default=True,
    help="Largest relative difference of the windowed mean loss.",
)
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Steps in the trailing window the loss and grad norm are averaged over.",
)
@click.option(
    "--grad-norm-rtol",
    type=click.FloatRange(min=0),
    default=0.25,
    show_default=True,
    help="Largest relative difference of the windowed mean grad norm.",
)
@click.option(
    "--eval-rtol",
    type=click.FloatRange(min=0),
    default=0.02,
    show_default=True,
    help="Largest relative difference of an evaluation's loss.",
)
@click.option(
    "--html",
    "html_out",
    type=click.Path(path_type=Path),
    help="Write the comparison (both curves plotted) into this directory.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON on stdout.")
@_user_errors
def compare_command(
    runs: tuple[Path, ...],
    baseline: Path | None,
    volume: Path | None,
    loss_rtol: float,
    window: int,
    grad_norm_rtol: float,
    eval_rtol: float,
    html_out: Path | None,
    as_json: bool,
) -> None:
    """Is run B aligned with run A? Loss, grad norm and eval loss step by step; exit 0 ALIGNED, 1 NOT ALIGNED,
    3 INCONCLUSIVE: within the tolerances, but the runs cannot tell (too few common steps, the learning rate still
    warming up, a loss that moved less than the tolerance, noise larger than it).

    RUN_A and RUN_B are output directories, bundles (with --volume), dry-run work directories or baseline files.
    With --baseline, give one RUN: it is compared against the stored baseline (a team's CI regression gate).

    Three or more RUNs, or a matrix root (the directory `build -m` wrote; its dry runs' work directories where
    `validate --dry-run` left them): the sweep side by side instead, one row each (what it sweeps, final loss,
    tokens/s, MFU, peak memory against the plan, wall time), the best marked; --html draws the loss curves of all
    of them on one plot. Exit 0, or 3 when no run logged a loss.

    \b
    Examples:
      recipekit compare runs/cuda-a100 runs/ascend-910b
      recipekit compare bundles/tiny_sft@h100 bundles/tiny_sft --volume /mnt/pvc
      recipekit compare runs/cuda-a100 runs/ascend-910b --html compare-html
      recipekit compare runs/lr-1e-4 runs/lr-3e-4 runs/lr-1e-3 --html sweep/
    """
    from recipekit.runs.compare import Tolerances, compare
    from recipekit.runs.runlog import load_run
    from recipekit.runs.sweep import matrix_runs

    expanded = [found for run in runs for found in (matrix_runs(run) or [run])]
    if baseline is None and (len(expanded) >= 3 or len(expanded) > len(runs)):  # a sweep: its runs side by side
        from recipekit.cli.sweeps.compare import compare_sweep

        if html_out is not None:
            _need_matplotlib()
        found = [load_run(p, volume) for p in expanded]
        raise SystemExit(compare_sweep(found, window, html_out, as_json, _progress, _write_files))
    if baseline is not None:
        if len(runs) != 1:
            raise RecipeError(
                [Problem("compare", f"--baseline takes exactly one RUN to hold against it, got {len(runs)}")]
            )
        paths = (baseline, runs[0])
    elif len(runs) != 2:
        raise RecipeError(
            [Problem("compare", f"give two runs (RUN_A RUN_B) or one RUN with --baseline, got {len(runs)}")]
        )
    else:
        paths = (runs[0], runs[1])
    if html_out is not None:
        _need_matplotlib()
    a, b = (load_run(p, volume) for p in paths)
    result = compare(a, b, Tolerances(loss_rtol, window, grad_norm_rtol, eval_rtol))
    doc = result.to_json()
    if html_out is not None:
        from recipekit.runs.runplots import compare_plots

        with _progress(not as_json) as progress:
            plots = compare_plots(a, b, progress)
        doc["files"] = _write_files(html_out, compare_html(result, plots), plots, doc)
    if as_json:
        click.echo(json.dumps(doc, indent=2, default=str))
    else:
        _print_comparison(result, doc)
    raise SystemExit(result.verdict.exit_code)


def _print_comparison(result: Any, doc: dict[str, Any]) -> None:
    from recipekit.cli.terminal import console as make_console

    console = make_console(soft_wrap=True)
    console.print(f"A: {result.a}\nB: {result.b}", markup=False)
    console.print(
        _text_table(
            "Alignment",
            [
                [
                    key,
                    len(doc[key]["steps"]),
                    _fmt(doc[key]["max_abs_diff"]),
                    _percent(doc[key]["max_rel_diff"]),
                    _percent(doc[key]["max_window_rel_diff"]),
                    _percent(doc[key]["rtol"]),
                    doc[key]["first_divergence"] if doc[key]["first_divergence"] is not None else "none",
                ]
                for key in ("loss", "grad_norm", "eval_loss")
            ],
            ["series", "steps", "max |B−A|", "max rel", "max window rel", "tolerance", "diverges at step"],
        )
    )
    console.print(
        _text_table(
            "Throughput and MFU",
            [[r["title"], _fmt(r["a"]), _fmt(r["b"]), _fmt(r["ratio"])] for r in doc["throughput"]],
            ["figure (unit)", "A", "B", "B / A"],
        )
    )
    if doc.get("benchmarks"):  # eval.enabled: the scores after training, side by side (not in the verdict)
        console.print(
            _text_table(
                "Benchmarks after training",
                [
                    [f"{r['task']} {r['metric']}", _fmt(r["a"]), _fmt(r["b"]), _fmt(r["difference"])]
                    for r in doc["benchmarks"]
                ],
                ["task metric", "A", "B", "B − A"],
            )
        )
    for line in doc["recipe_changes"]:
        console.print(f"recipe: {line}", markup=False)
    for line in doc["version_changes"]:
        console.print(f"version: {line}", markup=False)
    for line in [*doc["notes"], *result.reasons]:  # prose: wrapped between words (soft_wrap=False)
        console.print(line, markup=False, soft_wrap=False)
    if "files" in doc:
        console.print(f"comparison: {doc['files'][0]}", markup=False)
    colour = {"ALIGNED": "green", "NOT ALIGNED": "red"}.get(result.verdict.value, "yellow")
    console.print(result.verdict.value, markup=False, style=colour)
