"""The hang watchdog: a thread that turns "no progress" into a stack dump and a failed pod. Standard library only.

A hung collective (a dead link, a peer stuck in I/O, a deadlocked dataloader) never raises: every rank waits, no pod
fails, and Volcano's RestartJob policy never fires — for as long as the collective timeout, 30 minutes by default.
The watchdog bounds that wait. The training loop arms it with a deadline for the phase it enters (the first step:
the startup timeout; each later step: the stall timeout; a checkpoint save: the steady timeout, see
recipekit.memory.operations). If the deadline passes, the thread

1. writes every thread's Python stack (``faulthandler``, which needs no lock the hung thread may hold) to the log
   and to ``<output_dir>/hang/stall-step-<N>-rank-<R>.txt``;
2. appends a ``stalled`` record to metrics.jsonl (any rank: rank 0 may be the one that hangs);
3. ends the process with ``os._exit`` and a non-zero code: no cleanup handler can block on the hung collective.

torchrun then stops the pod's other workers and exits non-zero, the pod fails, and Volcano restarts the job, which
resumes from the last complete checkpoint. Preflight uses the same thread with its own deadline and message.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..boundary import exitcodes, filenames, jsonfile, metricslog
from ..volume import attemptends

#: The longest the thread sleeps between looks at the deadline, seconds.
MAX_POLL_S = 2.0


class Watchdog:
    """A deadline watched by a daemon thread; :meth:`arm` moves it, :meth:`disarm` stops watching.

    ``on_expiry`` (called in the watchdog thread, with the phase, seconds since the last arm and the timeout)
    returns the one-line reason to print; then stacks are dumped, the record written and ``exit(code)`` called.
    ``exit`` and ``clock`` are replaceable for tests.
    """

    def __init__(
        self,
        *,
        output_dir: Path,
        rank: int,
        metrics_file: Path | None,
        code: int = exitcodes.EXIT_STALLED,
        exit: Callable[[int], Any] = os._exit,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = MAX_POLL_S,
    ):
        self.output_dir, self.rank, self.metrics_file, self.code = Path(output_dir), rank, metrics_file, code
        self._exit, self._clock, self._poll = exit, clock, poll_s
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._armed_at = 0.0
        self._phase = ""
        self._timeout = 0.0
        self._step = 0
        self._reason: Callable[[str, float, float], str] | None = None
        self._thread: threading.Thread | None = None
        self.fired: dict[str, Any] | None = None

    # -- control
    def arm(self, phase: str, timeout_s: float, step: int, reason: Callable[[str, float, float], str] | None = None):
        """Expect progress within ``timeout_s`` of now; ``step`` is the last completed optimizer step."""
        with self._lock:
            now = self._clock()
            self._deadline, self._armed_at, self._phase = now + timeout_s, now, phase
            self._timeout, self._step, self._reason = float(timeout_s), step, reason
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="recipekit-watchdog", daemon=True)
            self._thread.start()

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None

    # -- the thread
    def _watch(self) -> None:
        while True:
            with self._lock:
                deadline = self._deadline
            now = self._clock()
            if deadline is not None and now >= deadline:
                self.fire()
                return
            wait = self._poll if deadline is None else min(self._poll, max(0.05, deadline - now))
            time.sleep(wait)

    def fire(self) -> None:
        """The deadline passed: say why, dump every thread's stack, record it, and end the process."""
        with self._lock:
            phase, timeout, step, reason = self._phase, self._timeout, self._step, self._reason
            waited = self._clock() - self._armed_at
        message = (
            reason(phase, waited, timeout)
            if reason
            else (
                f"watchdog: no progress for {waited:.0f} s in {phase} after step {step} (stall timeout "
                f"{timeout:.0f} s): dumping every thread's stack and exiting {self.code} so the job restarts from "
                "the last checkpoint"
            )
        )
        dump = self.output_dir / filenames.HANG_DIR / f"stall-step-{step}-rank-{self.rank}.txt"
        print(f"rank {self.rank}: {message}", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        try:
            with jsonfile.replacing(dump) as handle:  # never through a link planted in hang/
                handle.write((message + "\n\n").encode("utf-8"))
                handle.flush()
                faulthandler.dump_traceback(file=handle, all_threads=True)
        except OSError as exc:
            print(f"rank {self.rank}: watchdog: cannot write {dump}: {exc}", file=sys.stderr, flush=True)
            dump = None  # type: ignore[assignment]
        self.fired = metricslog.event(
            metricslog.EVENT_STALLED,
            rank=self.rank,
            phase=phase,
            step=step,
            waited_s=round(waited, 2),
            timeout_s=timeout,
            stacks=str(dump) if dump else None,
            exit_code=self.code,
            time=time.time(),
        )
        if self.metrics_file is not None:
            try:
                metricslog.append_record(self.metrics_file, self.fired)
            except OSError:
                pass
        sys.stderr.flush()
        exitcodes.record_exit(self.code)  # os._exit skips train.py's own record
        attemptends.record_end(self.code)
        self._exit(self.code)
