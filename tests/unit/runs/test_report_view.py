"""What the report and compare print: a CPU twin's plan is labelled as the hardware profile's and its expected misses
are not deviations; every table has units; nothing is cut inside a word at 80 columns (issue 32, item 6, point 9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.runfixtures import PLAN, losses, write_plan, write_run

pytest.importorskip("matplotlib")

#: A CPU twin's plan: the cpu profile's nominal 1 TFLOP/s peak predicts a step ~300× faster than a CPU takes.
TWIN_PLAN = {**PLAN, "hw": "cpu", "time": {"step_s": 0.0019, "total_steps": 8}}


def recipekit(*args: object, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm"}
    return subprocess.run(
        [sys.executable, "-m", "recipekit.cli", *map(str, args)], capture_output=True, text=True, env=env, check=False
    )


def test_a_cpu_twins_report_labels_the_plan_and_shows_no_deviation(tmp_path: Path) -> None:
    run = write_run(tmp_path / "twin", losses())
    plan = write_plan(tmp_path / "plan.json", TWIN_PLAN)
    result = recipekit("report", run, "--plan", plan, "-o", tmp_path / "r")
    assert result.returncode == 0, result.stderr
    assert "deviation" not in result.stdout and "expected of a CPU twin" in result.stdout
    assert "plan: the plan for cpu (a CPU twin" in result.stdout
    html = (tmp_path / "r" / "report.html").read_text()
    assert "Deviations from the plan" not in html and 'class="bad"' not in html
    assert "as expected of a CPU twin" in html and "Predicted: the plan for cpu" in html
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["cpu_twin"] is True and doc["deviations"] == [] and len(doc["expected_deviations"]) == 4


def test_a_run_on_the_hardware_still_shows_its_deviations(tmp_path: Path) -> None:
    run = write_run(tmp_path / "real", losses())
    metrics = run / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"device": "cpu"', '"device": "npu"'))
    plan = write_plan(tmp_path / "plan.json", {**TWIN_PLAN, "hw": "ascend910b"})
    result = recipekit("report", run, "--plan", plan, "-o", tmp_path / "r")
    assert result.returncode == 0, result.stderr
    assert "deviation (beyond ×1.5): step time" in result.stdout
    assert "Deviations from the plan" in (tmp_path / "r" / "report.html").read_text()


def test_every_table_has_units_and_no_cell_breaks_a_word_at_80_columns(tmp_path: Path) -> None:
    long_dir = tmp_path / ("run-directory-with-a-long-name-" + "x" * 30)
    run = write_run(long_dir, losses())
    other = write_run(tmp_path / "b", [v * 1.004 for v in losses()])
    report = recipekit("report", run, "--plan", write_plan(tmp_path / "plan.json", TWIN_PLAN), "-o", tmp_path / "r")
    compare = recipekit("compare", run, other)
    assert report.returncode == 0 and compare.returncode == 0, report.stderr + compare.stderr
    # the run directory is one token on one line, as printed (a terminal may wrap it; no table cuts it)
    assert any(str(long_dir) in line for line in report.stdout.splitlines()), report.stdout
    table_lines = [line for line in (report.stdout + compare.stdout).splitlines() if line.startswith("│")]
    cells = [cell.strip() for line in table_lines for cell in line.strip("│").split("│")]
    for word in ("grad_norm", "eval_loss", "2.695e+05", "0.003711", "0.0019"):
        assert word in cells or not any(word[:4] in cell for cell in cells), (word, cells)
    for unit in ("step time (s)", "(GiB)", "tokens/s per", "(fraction of", "2 %", "25 %"):
        assert unit in report.stdout + compare.stdout, unit


def test_a_unit_that_is_part_of_a_word_is_still_shown() -> None:
    """ "s" is a letter of "step time", not its unit: the figure still says (s)."""
    from recipekit.cli.run.report import _titled

    assert _titled({"title": "step time", "unit": "s"}) == "step time (s)"
    assert _titled({"title": "tokens/s per device", "unit": "tokens/s"}) == "tokens/s per device"
    assert _titled({"title": "MFU", "unit": ""}) == "MFU (fraction of peak)"


def test_the_html_note_says_expected_of_a_cpu_twin_not_deviates() -> None:
    from recipekit.cli.run.report import _html_note

    assert _html_note({"deviates": True, "note": ""}, cpu_twin=True) == "expected of a CPU twin"
    assert _html_note({"deviates": True, "note": "x"}, cpu_twin=False) == "DEVIATES; x"
    assert _html_note({"deviates": False, "note": "x"}, cpu_twin=True) == "x"
