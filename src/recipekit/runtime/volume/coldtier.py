"""The checkpoints' cold tier: a copy of each signed checkpoint in a cold store, by a command of the image.

Why a command and not a client library: the stores platform teams use differ (Huawei OBS with ``obsutil`` beside
Ascend clusters, S3 with ``aws`` or ``rclone``, an NFS archive with ``cp``), each has a CLI that already does
multipart uploads, retries and credentials from the pod's environment, and the image is the place that decides
which one is there. So recipe.yaml's ``train.cold_checkpoints.command`` is an argv (no shell: nothing in a path can
become a command) with the checkpoint's directory, name, step and the run id filled in.

The copy starts once the checkpoint is final on the shared volume (signed there, or renamed into place by the hot
tier's drain), so the cold copy holds the signed run record and verifies as any checkpoint does. Global rank 0 runs
one copy at a time in a daemon thread: a checkpoint saved while a copy runs waits, and a newer one replaces it
(the store gets the newest, not a queue that falls behind). Training never waits, but at the end of a finished run
the last copy is awaited (within its timeout), so the pod does not end before the run's last checkpoint is in the
store; a failed or preempted pod ends at once.

Standard library only, like the rest of the runtime.
"""

from __future__ import annotations

import logging
import string
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..boundary import filenames
from ..boundary.recipeview import ColdCheckpointsView

LOG = logging.getLogger("recipekit.coldtier")

#: The fields a command may name, each in braces: the checkpoint's directory, its name, its step, the run id.
FIELDS = ("checkpoint", "name", "step", "run")
#: The end of a failed copy's output kept for its record and the log.
OUTPUT_TAIL = 2000


def unknown_fields(command: list[str]) -> list[str]:
    """The problems of ``command``'s fields, one sentence each: a field not in :data:`FIELDS`, a format spec or
    conversion (a field is a plain name), or an unmatched brace. Empty: every part renders."""
    problems = []
    for part in command:
        try:
            parsed = list(string.Formatter().parse(part))
        except ValueError as exc:  # a single { or }
            problems.append(f"{part!r}: {exc} (a literal brace is written twice: {{{{ or }}}})")
            continue
        for _, field, spec, conversion in parsed:
            if field is None:
                continue
            if field not in FIELDS:
                named = ", ".join(f"{{{name}}}" for name in FIELDS)
                problems.append(f"{part!r} names {{{field}}}; the fields are {named}")
            elif spec or conversion:
                problems.append(f"{part!r}: {{{field}}} takes no format or conversion")
    return problems


def render(command: list[str], checkpoint: Path, step: int, run: str) -> list[str]:
    """The argv for ``checkpoint`` (the command's fields filled in; checked by :func:`unknown_fields` at build)."""
    fields = {"checkpoint": str(checkpoint), "name": checkpoint.name, "step": str(step), "run": run}
    return [part.format_map(fields) for part in command]


@dataclass(frozen=True)
class ColdCopy:
    """One copy's outcome: its step, seconds, the command's exit code (None: not started or stopped at the
    timeout) and, when it failed, why (the end of its output)."""

    step: int
    seconds: float
    code: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.code == 0


def copy_one(view: ColdCheckpointsView, checkpoint: Path, step: int, run: str) -> ColdCopy:
    """Run the command for ``checkpoint`` (stdin closed, output kept to its tail, stopped at the timeout)."""
    argv = render(view.command, checkpoint, step, run)
    started = time.monotonic()
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=view.timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return ColdCopy(step, time.monotonic() - started, None, f"still running after {view.timeout_s} s: stopped")
    except OSError as exc:  # the program is not in the image, or not executable
        return ColdCopy(step, time.monotonic() - started, None, f"{argv[0]}: {exc.strerror or exc}")
    seconds = time.monotonic() - started
    if done.returncode == 0:
        return ColdCopy(step, seconds, 0)
    output = (done.stderr or done.stdout or b"").decode("utf-8", "replace")[-OUTPUT_TAIL:]
    return ColdCopy(step, seconds, done.returncode, " ".join(output.split()) or f"exit {done.returncode}")


class ColdCopier:
    """Global rank 0's copies to the cold store, one at a time in a daemon thread (see the module's docstring).

    :meth:`submit` hands over a checkpoint that is final on the shared volume; ``done`` is called in the thread
    with each :class:`ColdCopy`. :meth:`close` waits for the copy running and the one waiting, within their
    timeouts."""

    def __init__(self, view: ColdCheckpointsView, run: str, done: Callable[[ColdCopy], None]):
        self.view, self.run, self.done = view, run, done
        self._lock = threading.Lock()
        self._waiting: tuple[Path, int] | None = None
        self._running = False  # under the lock: a thread is copying or about to look for the next
        self._thread: threading.Thread | None = None

    def submit(self, checkpoint: Path, step: int) -> bool:
        """Copy ``checkpoint`` when its step is one of every ``every``th; whether it was taken."""
        if step % self.view.every:
            return False
        with self._lock:
            self._waiting = (checkpoint, step)  # a newer checkpoint replaces one still waiting
            if not self._running:
                self._running = True
                self._thread = threading.Thread(target=self._copy_all, name="cold-copy", daemon=True)
                self._thread.start()
        return True

    def _copy_all(self) -> None:
        while True:
            with self._lock:
                if self._waiting is None:
                    self._running = False
                    return
                (checkpoint, step), self._waiting = self._waiting, None
            copied = copy_one(self.view, checkpoint, step, self.run)
            if copied.ok:
                LOG.info("%s copied to the cold store in %.1f s", checkpoint.name, copied.seconds)
            else:
                LOG.error("%s was not copied to the cold store: %s", checkpoint.name, copied.error)
            self.done(copied)

    def close(self) -> None:
        """Wait for the copies under way (each within its timeout): the run's last checkpoint reaches the store."""
        thread = self._thread
        if thread is not None:
            thread.join()


def cold_copier(
    view: ColdCheckpointsView | None, run: str, rank: int, done: Callable[[ColdCopy], None]
) -> ColdCopier | None:
    """Global rank 0's copier when the recipe names a command (None elsewhere: one process copies)."""
    if view is None or not view.command or rank != 0:
        return None
    return ColdCopier(view, run, done)


def checkpoint_path(output_dir: Path, step: int) -> Path:
    """``checkpoint-<step>`` on the shared volume."""
    return Path(output_dir) / f"{filenames.CHECKPOINT_PREFIX}{step}"
