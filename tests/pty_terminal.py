"""Run a command on a real pseudo-terminal of a given size, as a user's terminal would: rich sees a TTY.

Output piped to a test (CliRunner, subprocess pipes) takes rich's non-interactive path, so markup crashes in the
spinner and the terminal's width never show there. Standard library only (``pty``, ``termios``).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TerminalRun:
    returncode: int
    output: str  # what the terminal received, escape sequences included


def run_in_terminal(
    argv: Sequence[str],
    *,
    columns: int = 80,
    rows: int = 40,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = 60.0,
) -> TerminalRun:
    """Run ``argv`` with stdin, stdout and stderr on one pty of ``columns`` × ``rows``; kill it past ``timeout``."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    environment = {k: v for k, v in (env if env is not None else os.environ).items() if k not in ("COLUMNS", "LINES")}
    environment.update({"TERM": "xterm-256color"})
    environment.pop("NO_COLOR", None)
    environment.pop("TERM_PROGRAM", None)
    process = subprocess.Popen(
        list(argv), stdin=slave, stdout=slave, stderr=slave, env=environment, cwd=cwd, start_new_session=True
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise TimeoutError(f"{argv[:3]} ran past {timeout} s; output so far:\n" + _text(chunks)[-4000:])
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the slave side
                    data = b""
                if not data:
                    break
                chunks.append(data)
            elif process.poll() is not None:
                continue  # drain what is left; the read returns EIO once it is all read
    finally:
        os.close(master)
    return TerminalRun(process.wait(), _text(chunks))


_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def plain_text(output: str) -> str:
    """``output`` without terminal escape sequences (colours, cursor moves, titles)."""
    return _ESCAPES.sub("", output)


def visible_lines(output: str) -> list[str]:
    """The lines the terminal drew: escapes removed, split at every carriage return and newline."""
    return re.split(r"\r\n|\r|\n", plain_text(output))


def _text(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", errors="replace")
