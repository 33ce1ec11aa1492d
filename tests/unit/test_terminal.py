"""What a user's terminal shows: foreign text never read as rich markup, lines that fit the terminal's width.

Run on a real pseudo-terminal (tests/pty_terminal.py) at 80 columns: piped output takes rich's other path.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

from tests.pty_terminal import run_in_terminal

SRC = str(Path(__file__).resolve().parents[2] / "src")
GLOO = (
    "[W1201 10:12:13.123 socket.cpp:755] [c10d] "
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Read error [/x]"
)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {SRC!r})\n" + textwrap.dedent(code)]


def _visible(output: str) -> list[str]:
    return re.split(r"\r\n|\r|\n", ANSI.sub("", output))


def test_dry_run_progress_shows_a_bracketed_log_line_as_written_at_80_columns() -> None:
    code = f"""
        from recipekit.validate.command import _Progress
        line = {GLOO!r}
        with _Progress(dry_run=True) as progress:
            assert progress.interactive, "not a terminal"
            progress("pod 1: " + line)
            progress("attempt 1: step 3 " + line)
            progress("static check: [/bold] " + line)
        print("done")
        """
    run = run_in_terminal(_python(code), columns=80)
    assert "MarkupError" not in run.output and run.returncode == 0, run.output[-3000:]
    text = ANSI.sub("", run.output)
    assert "pair.cc:553]" in text and "done" in text
    assert "command.py" not in text  # no logging internals (the source-file column of console.log)
    assert all(len(line) <= 80 for line in _visible(run.output)), _visible(run.output)


def test_the_report_fits_80_columns_and_prints_foreign_text_verbatim(tmp_path: Path) -> None:
    code = f"""
        from recipekit.validate.checks import Report, Result, Status
        report = Report("bundles/[/odd]")
        failed = Result("dryrun.pods", "pods ran")
        failed.status = Status.FAIL
        failed.reason = {GLOO!r}
        failed.details["log_tails"] = {{"pod-[/0].log": {GLOO!r}}}
        report.extend([failed, Result("bundle.files", "files are all there " * 8)])
        from recipekit.validate.command import print_report
        print_report(report)
        """
    run = run_in_terminal(_python(code), columns=80)
    assert "MarkupError" not in run.output and run.returncode == 0, run.output[-3000:]
    lines = _visible(run.output)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert "bundles/[/odd]" in ANSI.sub("", run.output) and "pod-[/0].log" in ANSI.sub("", run.output)
