"""The report's plots as PNG bytes, drawn with matplotlib's object API on the Agg canvas (no display, no pyplot).

matplotlib is imported inside :func:`_figure` only: ``recipekit build`` must never pay for it, and it is an extra
(``pip install recipekit[report]``). The bytes are deterministic — a fixed size and dpi, no ``Software`` or date
metadata, a fixed SVG hash salt, the bundled DejaVu font — so the same run draws the same files on any machine.
Every plot has a title; a series the run did not record is left out rather than drawn empty.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from recipekit.runs.runfiles import figure as bounded
from recipekit.runs.runlog import RunLog, Series
from recipekit.runs.runplan import predictions, steady

DPI = 100
SIZE = (8.0, 3.6)  # inches: 800 × 360 pixels
#: Each series' colour (each run's in a comparison); the plan's prediction for a series is its colour, dashed.
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Plot:
    name: str  # file stem: loss, learning_rate, ...
    title: str
    png: bytes


def _figure(rows: int = 1) -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    matplotlib.rcParams["svg.hashsalt"] = "recipekit"
    matplotlib.rcParams["font.family"] = "DejaVu Sans"
    matplotlib.rcParams["text.parse_math"] = False  # labels carry paths and run names: a "$" is not TeX
    height = SIZE[1] * (1.0 if rows == 1 else 0.75 * rows)
    figure = Figure(figsize=(SIZE[0], height), dpi=DPI, layout="constrained")
    axes = figure.subplots(rows, 1, squeeze=False, sharex=True)
    return figure, [row[0] for row in axes]


def _png(figure: Any) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def _line(axis: Any, series: Series, label: str, colour: str, **kwargs: Any) -> None:
    if series:
        steps, values = zip(*series)
        marker = "o" if len(series) <= 40 else None
        axis.plot(steps, values, label=label, color=colour, marker=marker, markersize=3, linewidth=1.4, **kwargs)


def _plan_line(
    axis: Any, value: float | None, what: str, measured: list[float] | None = None, colour: str = "black"
) -> None:
    """The plan's value as a dashed line; one ten times beyond the measured range is named in a note instead, so the
    measured curve is not squashed flat against one edge."""
    if value is None:
        return
    data = [v for v in measured or [] if v > 0]
    typical = steady(data)
    label = f"plan: {what} {value:.4g}" + (f" (measured/plan {typical / value:.3g})" if typical and value else "")
    if data and value > 0 and (value > 10 * max(data) or value < min(data) / 10):
        below = 0.02 + 0.08 * len(axis.texts)  # one note above the other
        axis.annotate(f"{label}, off this scale", (0.01, below), xycoords="axes fraction", fontsize=8)
        return
    axis.axhline(value, color=colour, linestyle="--", linewidth=1, label=label)


def _restarts(axis: Any, run: RunLog) -> None:
    for restart in run.restarts:
        if restart.interrupted_at_step is not None:
            axis.axvline(restart.interrupted_at_step, color="#ff7f0e", linestyle=":", linewidth=1.5)
            axis.annotate(
                f"interrupted at {restart.interrupted_at_step}",
                (restart.interrupted_at_step, 0.98),
                xycoords=("data", "axes fraction"),
                va="top",
                ha="right",
                rotation=90,
                fontsize=7,
                color="#ff7f0e",
            )
        if restart.resumed_step is not None:
            axis.axvline(restart.resumed_step, color="#8c564b", linestyle="-.", linewidth=1.2)
            axis.annotate(
                f"resumed from {restart.resumed_step}",
                (restart.resumed_step, 0.0),
                xycoords=("data", "axes fraction"),
                va="bottom",
                ha="right",
                rotation=90,
                fontsize=7,
                color="#8c564b",
            )


def _finish(figure: Any, axes: list[Any], title: str, ylabels: Iterable[str]) -> bytes:
    figure.suptitle(title)
    for axis, ylabel in zip(axes, ylabels):
        axis.set_ylabel(ylabel)
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8, loc="best")
    axes[-1].set_xlabel("step")
    return _png(figure)


def _series_plot(run: RunLog, keys: list[tuple[str, str]], title: str, ylabel: str, plan: dict[str, Any]) -> bytes:
    figure, (axis,) = _figure()
    for i, (key, label) in enumerate(keys):
        _line(axis, run.series.get(key, []), label, COLOURS[i % len(COLOURS)])
        _plan_line(axis, plan.get(key), label, run.values(key), COLOURS[i % len(COLOURS)])
    _restarts(axis, run)
    return _finish(figure, [axis], title, [ylabel])


def run_plots(run: RunLog, progress: Progress = lambda title: None) -> list[Plot]:
    """Every plot the run has data for, in the report's order."""
    plan = predictions(run.plan)
    wanted: list[tuple[str, str, Callable[[], bytes]]] = []

    def series(name: str, title: str, keys: list[tuple[str, str]], ylabel: str) -> None:
        if any(run.series.get(key) for key, _ in keys):
            wanted.append((name, title, lambda: _series_plot(run, keys, title, ylabel, plan)))

    series("loss", "Loss and eval loss", [("loss", "loss"), ("eval_loss", "eval loss")], "loss")
    series("learning_rate", "Learning rate", [("learning_rate", "learning rate")], "learning rate")
    series("grad_norm", "Gradient norm (before clipping)", [("grad_norm", "grad norm")], "grad norm")
    series(
        "tokens_per_second",
        "Tokens/s per device (plan dashed)",
        [("tokens_per_second_per_device", "tokens/s")],
        "tokens/s per device",
    )
    series("utilisation", "MFU and HFU (plan dashed)", [("mfu", "MFU"), ("hfu", "HFU")], "fraction of peak")
    if run.series.get("step_time_s"):
        wanted.append(
            ("step_time", "Step time: data wait, compute, checkpoint (plan dashed)", lambda: _step_split(run, plan))
        )
    if run.checkpoints:
        wanted.append(("checkpoints", "Checkpoint save durations", lambda: _checkpoints(run)))
    if run.restarts and any(a.started is not None for a in run.attempts):
        wanted.append(("restarts", "Attempts, interruptions and recovery", lambda: _timeline(run)))
    if _bandwidth(run):
        wanted.append(("preflight_bandwidth", "Preflight all-reduce bandwidth", lambda: _bandwidth_plot(run)))
    plots = []
    for name, title, draw in wanted:
        progress(title)
        plots.append(Plot(name, title, draw()))
    return plots


def _step_split(run: RunLog, plan: dict[str, Any]) -> bytes:
    figure, (axis,) = _figure()
    times = dict(run.series.get("step_time_s", []))
    waits = dict(run.series.get("dataloader_wait_fraction", []))
    saves = {int(c["step"]): c["seconds"] for c in run.checkpoints if c["seconds"] == c["seconds"]}
    steps = sorted(times)
    wait = [times[s] * waits.get(s, 0.0) for s in steps]
    compute = [times[s] - w for s, w in zip(steps, wait)]
    save = [saves.get(s, 0.0) for s in steps]
    axis.bar(steps, wait, color="#ff7f0e", label="data wait")
    axis.bar(steps, compute, bottom=wait, color=COLOURS[0], label="compute (incl. communication)")
    if any(save):
        axis.bar(steps, save, bottom=[w + c for w, c in zip(wait, compute)], color="#7f7f7f", label="checkpoint save")
    _plan_line(axis, plan.get("step_time_s"), "step time", run.values("step_time_s"))
    _restarts(axis, run)
    return _finish(figure, [axis], "Step time: data wait, compute, checkpoint (plan dashed)", ["seconds"])


def _checkpoints(run: RunLog) -> bytes:
    figure, (axis,) = _figure()
    steps = [c["step"] for c in run.checkpoints]
    seconds = [c["seconds"] for c in run.checkpoints]
    axis.bar(steps, seconds, color="#7f7f7f", width=0.6, label="save seconds")
    for step, value, size in zip(steps, seconds, (c["bytes"] for c in run.checkpoints)):
        if size == size:
            axis.annotate(f"{size / 2**20:.1f} MiB", (step, value), ha="center", va="bottom", fontsize=7)
    return _finish(figure, [axis], "Checkpoint save durations", ["seconds"])


def _timeline(run: RunLog) -> bytes:
    figure, (axis,) = _figure()
    origin = min(a.started for a in run.attempts if a.started is not None)
    for attempt in run.attempts:
        if attempt.started is None or attempt.ended is None:
            continue
        axis.barh(
            attempt.number,
            attempt.ended - attempt.started,
            left=attempt.started - origin,
            color=COLOURS[attempt.number % len(COLOURS)],
            label=f"attempt {attempt.number}: steps {attempt.first_step}–{attempt.last_step}",
        )
    for restart in run.restarts:
        before = run.attempts[restart.attempt - 1]
        if before.ended is not None and restart.downtime_s is not None:
            axis.barh(
                restart.attempt - 0.5,
                restart.downtime_s,
                left=before.ended - origin,
                height=0.3,
                color="#ff7f0e",
                label=f"down {restart.downtime_s:.1f} s, recovered in {_seconds(restart.recovery_s)}",
            )
    axis.set_yticks([a.number for a in run.attempts])
    axis.set_yticklabels([f"attempt {a.number}" for a in run.attempts])
    figure.suptitle("Attempts, interruptions and recovery")
    axis.set_xlabel("seconds since the first start")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8, loc="best")
    return _png(figure)


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def _bandwidth(run: RunLog) -> list[dict[str, float]]:
    for check in (run.preflight or {}).get("checks") or []:
        if isinstance(check, dict) and check.get("check") == "allreduce" and isinstance(check.get("results"), list):
            return [r for r in check["results"] if isinstance(r, dict) and (bounded(r.get("size_mb")) or 0) > 0]
    return []


def _bandwidth_plot(run: RunLog) -> bytes:
    return _png(bandwidth_figure(run))


def bandwidth_figure(run: RunLog) -> Any:
    """The preflight's all-reduce bandwidth over message size, the size axis logarithmic with plain numbers.

    matplotlib's log axis labels its ticks in TeX (``$\\mathdefault{10^{0}}$``), which prints raw with
    ``text.parse_math`` off (:func:`_figure`): the ticks get a plain number formatter instead. On 2 ranks the bus
    bandwidth equals the algorithm bandwidth (busbw = algbw × 2(n−1)/n), so the two lines differ by marker and
    style and a note says why only one seems drawn.
    """
    from matplotlib.ticker import FuncFormatter, NullFormatter

    figure, (axis,) = _figure()
    results = _bandwidth(run)
    sizes = [bounded(r["size_mb"]) for r in results]
    drawn = []
    for i, (key, style, marker) in enumerate((("algbw_gbps", "-", "o"), ("busbw_gbps", "--", "s"))):
        values = [bounded(r.get(key)) or 0.0 for r in results]  # finite and bounded before it is drawn
        drawn.append(values)
        label = key.replace("_gbps", " (GB/s)")
        axis.plot(sizes, values, marker=marker, linestyle=style, color=COLOURS[i], fillstyle="none", label=label)
    if results and drawn[0] == drawn[1]:
        axis.annotate("busbw = algbw here (2 ranks: busbw = algbw × 2(n−1)/n)", (0.01, 0.02),
                      xycoords="axes fraction", fontsize=8)  # fmt: skip
    axis.set_xscale("log")
    ticks = sorted({size for size in sizes if size is not None})
    if ticks:  # a tick at every measured size: two sizes within one decade would otherwise show a single label
        axis.set_xticks(ticks)
    for ticks in (axis.xaxis, axis.yaxis):
        ticks.set_major_formatter(FuncFormatter(lambda value, position: f"{value:g}"))
    axis.xaxis.set_minor_formatter(NullFormatter())
    figure.suptitle("Preflight all-reduce bandwidth")
    axis.set_xlabel("message size (MB)")
    axis.set_ylabel("GB/s")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    return figure


# -------------------------------------------------------------------------------------------------- comparisons
def compare_plots(a: RunLog, b: RunLog, progress: Progress = lambda title: None) -> list[Plot]:
    """Both runs' curves on one axis each: loss (with the difference below), eval loss, grad norm, tokens/s, MFU."""
    plots = []
    for key, title, ylabel in (
        ("loss", "Loss: both runs, and B − A", "loss"),
        ("eval_loss", "Eval loss: both runs", "eval loss"),
        ("grad_norm", "Gradient norm: both runs", "grad norm"),
        ("tokens_per_second_per_device", "Tokens/s per device: both runs", "tokens/s"),
        ("mfu", "MFU: both runs", "MFU"),
    ):
        if not (a.series.get(key) or b.series.get(key)):
            continue
        progress(title)
        rows = 2 if key == "loss" else 1
        figure, axes = _figure(rows)
        _line(axes[0], a.series.get(key, []), f"A: {_short(a.label)}", COLOURS[0])
        _line(axes[0], b.series.get(key, []), f"B: {_short(b.label)}", COLOURS[1], linestyle="--")
        labels = [ylabel]
        if rows == 2:
            mine, theirs = dict(a.series.get(key, [])), dict(b.series.get(key, []))
            common = sorted(set(mine) & set(theirs))
            axes[1].plot(common, [theirs[s] - mine[s] for s in common], color="#7f7f7f", marker="o", markersize=3)
            axes[1].axhline(0, color="black", linewidth=0.8)
            labels.append("B − A")
        plots.append(Plot(f"compare_{key}", title, _finish(figure, axes, title, labels)))
    return plots


def _short(label: str, limit: int = 48) -> str:
    return label if len(label) <= limit else "…" + label[-(limit - 1) :]


# ------------------------------------------------------------------------------------------------------ sweeps
#: A sweep's runs, one colour each (matplotlib's tab10, in order); more runs than colours repeat them dashed.
SWEEP_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def sweep_plots(
    runs: list[RunLog], best: int | None, labels: list[str] | None = None, progress: Progress = lambda title: None
) -> list[Plot]:
    """Every run's loss on one axis (the best drawn thicker and named so), then tokens/s per device the same way;
    each run named by ``labels`` (what it sweeps) where given, else by its path."""
    plots = []
    for key, title, ylabel in (
        ("loss", f"Loss: {len(runs)} runs", "loss"),
        ("tokens_per_second_per_device", f"Tokens/s per device: {len(runs)} runs", "tokens/s"),
    ):
        if not any(run.series.get(key) for run in runs):
            continue
        progress(title)
        figure, (axis,) = _figure()
        for i, run in enumerate(runs):
            name = labels[i] if labels and labels[i] else run.label
            label = f"{i + 1}: {_short(name)}" + (" (best)" if i == best else "")
            style = "-" if i < len(SWEEP_COLOURS) else "--"
            width = {"linewidth": 2.8} if i == best else {}
            series = run.series.get(key, [])
            if series:
                steps, values = zip(*series)
                marker = "o" if len(series) <= 40 else None
                axis.plot(
                    steps,
                    values,
                    label=label,
                    color=SWEEP_COLOURS[i % len(SWEEP_COLOURS)],
                    linestyle=style,
                    marker=marker,
                    markersize=3,
                    **({"linewidth": 1.4} | width),
                )
        plots.append(Plot(f"sweep_{key}", title, _finish(figure, [axis], title, [ylabel])))
    return plots
