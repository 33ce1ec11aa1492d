"""A 4-run sweep as one thing: built with `build -m`, dry-run with one `validate --dry-run` of its matrix root, its
runs side by side with one `compare` of the root, the HTML report opened in headless chromium.

The dry runs run one after another (each run's first start record comes after the previous run's last record: a
2-core machine never has four of them at once), each in its own work directory under the root's ``.dryrun``; the
summary has a row per bundle with its final loss. `compare` of the root finds those work directories, picks the
lowest final loss as best, and draws every run's loss on one plot. Slow: about two minutes (four tiny dry runs).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main
from recipekit.runtime.boundary import filenames, metricslog

pytestmark = pytest.mark.slow
pytest.importorskip("torch")
pytest.importorskip("matplotlib")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
RATES = ("1e-4", "3e-4", "1e-3", "3e-3")
_CHECK = """
<script>
window.addEventListener("load", () => {
  const drawn = Array.from(document.images).filter((i) => i.complete && i.naturalWidth > 0).length;
  const rows = document.querySelectorAll("tbody tr").length;
  const best = Array.from(document.querySelectorAll("tbody td")).filter((c) => c.textContent.includes("best")).length;
  document.title = `CHECK images=${document.images.length} drawn=${drawn} rows=${rows} best=${best}`;
});
</script>
"""


def _span(work: Path) -> tuple[float, float]:
    """The first and last record time of the run in a bundle's dry-run directory (one work directory per dry run)."""
    output = next(work.glob("*/shared/runs/tiny-sft-*"))
    times = [r["time"] for r in metricslog.read_records(output / filenames.METRICS_FILE) if "time" in r]
    return min(times), max(times)


def test_a_four_run_sweep_is_dry_run_and_compared_as_one(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    built = CliRunner().invoke(
        main, ["build", "-m", "recipe=tiny_sft", f"train.learning_rate={','.join(RATES)}", "-o", str(root)]
    )
    assert built.exit_code == 0, built.output
    validated = CliRunner().invoke(main, ["validate", str(root), "--dry-run", "--timeout", "600", "--json"])
    assert validated.exit_code == 0, validated.output[-3000:]
    document = json.loads(validated.stdout)
    assert [b["ok"] for b in document["bundles"]] == [True] * 4
    works = sorted((root / ".dryrun").iterdir())
    assert len(works) == 4
    spans = sorted(_span(work) for work in works)
    assert all(spans[i][1] < spans[i + 1][0] for i in range(3)), f"dry runs overlapped: {spans}"
    table = CliRunner().invoke(main, ["validate", str(root)])  # static only: the summary table, 80 columns
    assert table.exit_code == 0 and "4 of 4 bundles OK" in table.output
    assert all(len(line) <= 80 for line in table.output.splitlines())

    compared = CliRunner().invoke(main, ["compare", str(root), "--html", str(tmp_path / "report"), "--json"])
    assert compared.exit_code == 0, compared.output
    sweep = json.loads(compared.stdout)
    losses = [run["final_loss"] for run in sweep["runs"]]
    assert all(isinstance(loss, float) for loss in losses) and len(losses) == 4
    assert sweep["best"] == sweep["runs"][losses.index(min(losses))]["label"]
    assert [run["swept"] for run in sweep["runs"]] == [f"train.learning_rate={float(r)}" for r in RATES]
    assert all(run["final_step"] == 8 and run["wall_s"] > 0 and run["peak_memory_gib"] for run in sweep["runs"])
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium): the report was not opened")
    page = tmp_path / "checked.html"
    page.write_text((tmp_path / "report" / "report.html").read_text().replace("</body>", _CHECK + "</body>"))
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000", "--dump-dom"]
    dom = subprocess.run([*command, page.as_uri()], capture_output=True, text=True, timeout=180)
    title = re.search(r"<title>(.*?)</title>", dom.stdout)
    assert title and title.group(1) == "CHECK images=2 drawn=2 rows=4 best=1", dom.stderr[-2000:]
    shot = tmp_path / "sweep-screenshot.png"
    shot_command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,2200"]
    subprocess.run([*shot_command, f"--screenshot={shot}", (tmp_path / "report" / "report.html").as_uri()], timeout=180)
    assert shot.is_file()
    print(f"sweep report screenshot: {shot}")
