"""Run a command in a child process and measure it: exit code, output, wall time and peak RSS.

The RSS comes from a small wrapper process that waits for the command and reads its own children's rusage. Measured
directly from the test process, a forked child's peak starts at the size of the parent it was forked from (Linux
keeps the pre-exec high-water mark), so a 1 GB pytest late in a full run would make every child look 1 GB big.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: Runs the command given after its two arguments and writes its exit code, wall time and peak RSS (of the command
#: and every process it waited for: the wrapper's only child) as JSON to the file named first.
_WRAPPER = """
import json, resource, subprocess, sys, time
out, limit, *command = sys.argv[1:]
start = time.monotonic()
try:
    code = subprocess.run(command, timeout=float(limit)).returncode
except subprocess.TimeoutExpired:
    code = 124
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(out, "w") as handle:
    json.dump({"code": code, "wall_s": time.monotonic() - start, "rss_mib": usage.ru_maxrss / 1024,
               "cpu_s": usage.ru_utime + usage.ru_stime}, handle)
"""


@dataclass(frozen=True)
class Measured:
    code: int
    stdout: str
    stderr: str
    wall_s: float
    rss_mib: float
    cpu_s: float = 0.0  # user + system time: what the command costs, whatever else the machine is doing


def measure(command: list[str], cwd: Path, env: dict[str, str], limit_s: float) -> Measured:
    """``command`` run in ``cwd`` with ``env`` (killed after ``limit_s``: exit code 124), measured."""
    with tempfile.TemporaryDirectory() as scratch:
        figures_file = Path(scratch) / "figures.json"
        wrapper = [sys.executable, "-c", _WRAPPER, str(figures_file), str(limit_s)]
        done = subprocess.run(
            [*wrapper, *command], cwd=cwd, env=env, capture_output=True, text=True, timeout=limit_s + 60
        )
        figures = json.loads(figures_file.read_text())
    return Measured(figures["code"], done.stdout, done.stderr, figures["wall_s"], figures["rss_mib"], figures["cpu_s"])
