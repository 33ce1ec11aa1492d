"""`recipekit report`'s memory row: the measured peak beside the plan's memory per device, with the ratio — the device's
peak on a cluster run (held to the margin), a process's peak RSS on a CPU dry run (shown, not held)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main
from recipekit.runs.runlog import load_run
from recipekit.runs.runplan import DEFAULT_MARGIN, rows
from recipekit.runtime.boundary import filenames, metricslog
from tests.unit.runfixtures import step_record, write_plan

pytest.importorskip("matplotlib")


def run_with(path: Path, peaks: list[dict[str, float]]) -> Path:
    """An output directory whose steps 1..N log ``peaks[i]`` beside the usual figures (as the runtime does)."""
    path.mkdir(parents=True)
    records = [{"event": "start", "run_id": "abc123", "world_size": 2, "device": "npu", "time": 1000.0}]
    records += [step_record(i + 1, 6.0 - 0.1 * i, 1001.0 + i, **peak) for i, peak in enumerate(peaks)]
    (path / filenames.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


DEVICE = metricslog.PEAK_DEVICE_MEMORY_KEY
RSS = metricslog.PEAK_HOST_MEMORY_KEY


def test_a_device_run_holds_its_largest_peak_against_the_plan(tmp_path: Path) -> None:
    peaks = [{DEVICE: 2.5, RSS: 9.0}, {DEVICE: 3.3, RSS: 9.5}, {DEVICE: 2.9, RSS: 9.9}]
    run = load_run(run_with(tmp_path / "out", peaks), plan=write_plan(tmp_path / "plan.json"))  # plan: 3.0 GiB
    memory = {r.key: r for r in rows(run)}["memory_gib"]
    assert (memory.predicted, memory.measured, memory.unit) == (3.0, 3.3, "GiB")  # the device's, not the RSS
    assert memory.ratio == pytest.approx(1.1)
    assert not memory.deviates(DEFAULT_MARGIN) and memory.deviates(0.05)


def test_a_cpu_dry_run_shows_its_peak_rss_with_the_ratio_but_no_deviation(tmp_path: Path) -> None:
    run = load_run(run_with(tmp_path / "out", [{RSS: 1.2}, {RSS: 1.5}]), plan=write_plan(tmp_path / "plan.json"))
    memory = {r.key: r for r in rows(run)}["memory_gib"]
    assert memory.measured == 1.5 and memory.ratio == pytest.approx(0.5)
    assert "RSS" in memory.note and not memory.deviates(0.01)


def test_the_terminal_and_html_tables_show_the_memory_row_with_units_and_ratio(tmp_path: Path) -> None:
    out = run_with(tmp_path / "out", [{DEVICE: 2.5}, {DEVICE: 4.5}])
    plan = write_plan(tmp_path / "plan.json")
    args = ["report", str(out), "--plan", str(plan), "-o", str(tmp_path / "r")]
    result = CliRunner().invoke(main, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "memory per device" in line)
    assert "(GiB)" in line and "3" in line and "4.5" in line and "1.5" in line  # plan, peak, ratio
    html = (tmp_path / "r" / "report.html").read_text()
    assert "memory per device (peak) (GiB)" in html and "4.5" in html
    document = json.loads((tmp_path / "r" / "report.json").read_text())
    memory = next(r for r in document["plan"] if r["key"] == "memory_gib")
    assert memory["measured"] == 4.5 and memory["ratio"] == pytest.approx(1.5) and not memory["deviates"]
