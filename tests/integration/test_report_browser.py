"""The run report opened in a real headless browser (Debian's ``chromium``): every plot renders, every plot has its
title, the page logs no console error; a screenshot is kept as the test's artifact (its path is printed).

The report itself carries no script. The test appends one to a copy of it: after ``load`` it counts the images that
decoded (``naturalWidth > 0``) and the figures with a caption, and writes the counts into ``document.title``, which
``--dump-dom`` hands back. Skipped where chromium is not installed (.ci/run installs it).
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main
from tests.unit.runfixtures import losses, write_plan, write_run

pytest.importorskip("matplotlib")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

_CHECK = """
<script>
window.addEventListener("load", () => {
  const images = Array.from(document.images);
  const drawn = images.filter((i) => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0).length;
  const titled = Array.from(document.querySelectorAll("figure")).filter(
    (f) => (f.querySelector("figcaption")?.textContent || "").trim().length > 0).length;
  document.title = `CHECK images=${images.length} drawn=${drawn} titled=${titled}`;
});
</script>
"""


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def test_the_report_renders_every_plot_in_chromium(tmp_path: Path) -> None:
    from PIL import Image, ImageStat

    run = write_run(tmp_path / "out", losses(), kill_after=6, evals={4: 5.9, 8: 5.7})
    result = CliRunner().invoke(
        main, ["report", str(run), "--plan", str(write_plan(tmp_path / "plan.json")), "-o", str(tmp_path / "r")]
    )
    assert result.exit_code == 0, result.output
    pngs = sorted((tmp_path / "r").glob("*.png"))
    assert len(pngs) == 9
    for png in pngs:  # non-blank: the pixels vary (a blank or single-colour image has no variance)
        image = Image.open(io.BytesIO(png.read_bytes())).convert("L")
        assert ImageStat.Stat(image).var[0] > 100, png.name

    page = tmp_path / "checked.html"
    page.write_text((tmp_path / "r" / "report.html").read_text().replace("</body>", _CHECK + "</body>"))
    dom = _chromium("--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    title = re.search(r"<title>(.*?)</title>", dom.stdout)
    assert title, dom.stderr[-2000:]
    assert title.group(1) == f"CHECK images={len(pngs)} drawn={len(pngs)} titled={len(pngs)}"
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console

    shot = tmp_path / "report-screenshot.png"
    _chromium("--window-size=1200,3000", f"--screenshot={shot}", (tmp_path / "r" / "report.html").as_uri())
    assert shot.is_file() and ImageStat.Stat(Image.open(shot).convert("L")).var[0] > 100
    print(f"report screenshot: {shot}")
