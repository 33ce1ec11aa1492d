"""The report's plots read as numbers: no raw TeX in any tick label, and lines that coincide are both visible."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipekit.runs.runlog import load_run
from tests.unit.runfixtures import losses, write_run

matplotlib = pytest.importorskip("matplotlib")


def _tick_texts(figure) -> list[str]:
    texts = []
    for axis in figure.axes:
        for ticks in (axis.xaxis, axis.yaxis):
            labels = ticks.get_ticklabels(minor=False) + ticks.get_ticklabels(minor=True)
            texts += [label.get_text() for label in labels]
            texts.append(ticks.get_offset_text().get_text())
    return texts


def test_the_bandwidth_plots_log_axis_prints_plain_numbers(tmp_path: Path) -> None:
    """Issue 32: with text.parse_math off, the log formatter's ``$\\mathdefault{10^{0}}$`` was printed raw."""
    from recipekit.runs.runplots import _png, bandwidth_figure

    run = load_run(write_run(tmp_path / "out", losses()))
    figure = bandwidth_figure(run)
    assert _png(figure).startswith(b"\x89PNG")  # rendered: the labels below are the ones drawn
    texts = [text for text in _tick_texts(figure) if text]
    assert texts, "no tick labels drawn"
    assert not [text for text in texts if "$" in text or "mathdefault" in text], texts
    assert {"1", "10"} & set(texts), texts  # the size axis: 1 MB and 4 MB, a decade tick labelled as a number


def test_algbw_and_busbw_on_two_ranks_are_both_visible(tmp_path: Path) -> None:
    """The fixture's 2-rank preflight has busbw == algbw: different markers and styles, and a note saying so."""
    from recipekit.runs.runplots import bandwidth_figure

    (axis,) = bandwidth_figure(load_run(write_run(tmp_path / "out", losses()))).axes
    algbw, busbw = axis.get_lines()
    assert list(algbw.get_ydata()) == list(busbw.get_ydata())
    assert (algbw.get_marker(), algbw.get_linestyle()) != (busbw.get_marker(), busbw.get_linestyle())
    assert any("busbw = algbw" in text.get_text() for text in axis.texts)


def test_no_report_plot_shows_tex(tmp_path: Path) -> None:
    """Every plot of a report, drawn: the rendered PNGs and the tick labels of their figures carry no TeX."""
    import matplotlib.figure

    from recipekit.runs.runplots import run_plots

    drawn: list = []
    original = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        drawn.append(self)
        return original(self, *args, **kwargs)

    matplotlib.figure.Figure.savefig = keep  # type: ignore[method-assign]
    try:
        plots = run_plots(load_run(write_run(tmp_path / "out", losses(), kill_after=6)))
    finally:
        matplotlib.figure.Figure.savefig = original  # type: ignore[method-assign]
    assert len(drawn) == len(plots) > 3
    texts = [text for figure in drawn for text in _tick_texts(figure)]
    assert not [text for text in texts if "$" in text or "mathdefault" in text], texts
