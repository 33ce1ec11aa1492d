"""What a user's terminal shows: foreign text never read as rich markup, lines that fit the terminal's width.

Run on a real pseudo-terminal (tests/pty_terminal.py) at 80 columns: piped output takes rich's other path.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from tests.pty_terminal import plain_text, run_in_terminal, visible_lines

SRC = str(Path(__file__).resolve().parents[3] / "src")
GLOO = (
    "[W1201 10:12:13.123 socket.cpp:755] [c10d] "
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Read error [/x]"
)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {SRC!r})\n" + textwrap.dedent(code)]


def test_dry_run_progress_shows_a_bracketed_log_line_as_written_at_80_columns() -> None:
    code = f"""
        from recipekit.cli.validate import _Progress
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
    text = plain_text(run.output)
    assert "pair.cc:553]" in text and "done" in text
    assert "command.py" not in text  # no logging internals (the source-file column of console.log)
    assert all(len(line) <= 80 for line in visible_lines(run.output)), visible_lines(run.output)


def test_the_report_fits_80_columns_and_prints_foreign_text_verbatim(tmp_path: Path) -> None:
    code = f"""
        from recipekit.validate.shared.results import Verdict, Result, Status
        report = Verdict("bundles/[/odd]")
        failed = Result("dryrun.pods", "pods ran")
        failed.status = Status.FAIL
        failed.reason = {GLOO!r}
        failed.details["log_tails"] = {{"pod-[/0].log": {GLOO!r}}}
        report.extend([failed, Result("bundle.files", "files are all there " * 8)])
        from recipekit.cli.validate import print_verdict
        print_verdict(report)
        """
    run = run_in_terminal(_python(code), columns=80)
    assert "MarkupError" not in run.output and run.returncode == 0, run.output[-3000:]
    lines = visible_lines(run.output)
    # a pod's own log lines are printed as written (issue 41: copied, a hard-wrapped traceback was broken);
    # everything recipekit writes fits the terminal
    assert all(len(line) <= 80 for line in lines if line != GLOO), "\n".join(lines)
    assert GLOO in lines, "\n".join(lines)
    assert "bundles/[/odd]" in plain_text(run.output) and "pod-[/0].log" in plain_text(run.output)


def test_every_rich_console_comes_from_the_terminal_module() -> None:
    """One place decides how foreign text is printed (no markup) and how wide (the terminal's): a Console made
    anywhere else, a markup string given to a spinner or a progress column, would bring the crash back."""
    src = Path(SRC) / "recipekit"
    offenders = []
    for path in sorted(src.rglob("*.py")):
        text = path.read_text()
        if path.name != "terminal.py" and "Console(" in text:
            offenders.append(f"{path.relative_to(src)}: Console(")
        for call in ("TextColumn(", "console.status(", "Text.from_markup("):
            for line in text.splitlines():
                if call in line and "markup=False" not in line and "plain(" not in line:
                    offenders.append(f"{path.relative_to(src)}: {line.strip()}")
    assert not offenders, offenders
