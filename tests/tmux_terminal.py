"""Run commands in a real terminal of a given size (tmux) and read back what it shows, wrapped lines joined.

A pseudo-terminal (tests/pty_terminal.py) gives the bytes a program wrote; a terminal emulator decides what a person
sees: where a line longer than the window wraps, what a carriage return overwrites. tmux is one: each command runs
in a detached session of ``columns`` × ``rows`` on a private server, and ``capture-pane -J`` returns the screen and
its scrollback with every line the terminal wrapped joined again, so a line wider than the window reads as one long
line. Skipped where tmux is not installed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Capture:
    command: str
    returncode: int
    lines: list[str]  # as the terminal shows them, wrapped lines joined, trailing blank lines dropped


def tmux_available() -> bool:
    return shutil.which("tmux") is not None


class Terminal:
    """A private tmux server; :meth:`run` runs one shell command in a fresh window of the given size."""

    def __init__(self, cwd: Path, env: Mapping[str, str], columns: int = 80, rows: int = 50) -> None:
        self.cwd, self.columns, self.rows = cwd, columns, rows
        self.env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES", "TMUX", "NO_COLOR")}
        self.env.update(TERM="xterm-256color", PS1="", PS2="")  # no prompt in what is captured
        self.socket = f"recipekit-test-{uuid.uuid4().hex[:8]}"

    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, "-f", os.devnull, *args],
            capture_output=True,
            text=True,
            check=check,
            env=self.env,
            timeout=30,
        )

    def run(self, command: str, timeout: float = 600) -> Capture:
        """``command`` (a bash line) in an ``columns`` × ``rows`` window; what the window and its scrollback show."""
        name = uuid.uuid4().hex[:8]
        status = self.cwd / f".tmux-{name}.status"
        script = f"{command}; echo $? > {shlex.quote(str(status))}; tmux -L {self.socket} wait-for -S {name}"
        self._tmux(
            "new-session", "-d", "-s", name, "-x", str(self.columns), "-y", str(self.rows), "-c", str(self.cwd),
            "bash", "--norc", "--noprofile",
        )  # fmt: skip
        try:
            self._tmux("set-option", "-t", name, "history-limit", "100000")
            self._tmux("resize-window", "-t", name, "-x", str(self.columns), "-y", str(self.rows), check=False)
            self._tmux("send-keys", "-t", name, "clear; " + script, "Enter")
            subprocess.run(["tmux", "-L", self.socket, "wait-for", name], timeout=timeout, check=True, env=self.env)
            shown = self._tmux("capture-pane", "-p", "-J", "-t", name, "-S", "-", "-E", "-").stdout
        finally:
            self._tmux("kill-session", "-t", name, check=False)
        code = int(status.read_text().strip() or "-1")
        status.unlink()
        lines = shown.splitlines()
        start = next((i for i, line in enumerate(lines) if "clear; " in line), -1) + 1  # after the typed line
        lines = lines[start:]
        while lines and not lines[-1].strip():
            lines.pop()
        return Capture(command, code, [line.rstrip() for line in lines])

    def close(self) -> None:
        self._tmux("kill-server", check=False)
