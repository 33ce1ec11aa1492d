"""Fault injection (recipe ``ops.testing``) — TESTING ONLY: break a run on purpose to prove it is noticed and healed.

* ``stall_at_step`` (with ``stall_rank``): that rank blocks forever as it begins the step; the hang watchdog must
  detect it, dump the stacks and fail the pod, and the restarted job must resume.
* ``nan_at_step``: the loss of that step becomes NaN on every rank before backward, so the gradients and the update
  are poisoned as a real divergence poisons them; the loss guard must stop the run without saving them.

Each fault fires once per output directory: the process that injects it first writes a marker into
``<output_dir>/faults/``, and every process decides at start whether its fault is still armed (markers only appear
at the fault's step, long after every rank has started), so a restarted job runs clean — as a drill should.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from . import contract
from .common import LOG


class Faults:
    """The faults still armed in this process, from recipe.yaml's ``operations.testing``."""

    def __init__(self, testing: Any, output_dir: Path, rank: int):
        self.dir = Path(output_dir) / contract.FAULTS_DIR
        stall_at = getattr(testing, "stall_at_step", None)
        nan_at = getattr(testing, "nan_at_step", None)
        self.stall_at = stall_at if stall_at and rank == getattr(testing, "stall_rank", 0) else None
        self.nan_at = nan_at
        self.rank = rank
        if self.stall_at is not None and self._marker("stall", self.stall_at).exists():
            self.stall_at = None
        if self.nan_at is not None and self._marker("nan", self.nan_at).exists():
            self.nan_at = None

    def _marker(self, kind: str, step: int) -> Path:
        return self.dir / f"{kind}-at-step-{step}"

    def _mark(self, kind: str, step: int) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._marker(kind, step).write_text(f"injected by rank {self.rank}\n", encoding="utf-8")
        except OSError as exc:
            LOG.warning("faults: cannot write the %s marker: %s", kind, exc)

    def stall_now(self, next_step: int) -> None:
        """Block this thread forever if the stall is armed for ``next_step`` (the step about to begin)."""
        if self.stall_at is None or next_step != self.stall_at:
            return
        self._mark("stall", next_step)
        LOG.log(logging.WARNING, "TESTING: ops.testing.stall_at_step: rank %d stalls at step %d", self.rank, next_step)
        self.stall_at = None
        threading.Event().wait()  # forever: only the watchdog ends this process

    def poison_loss(self, next_step: int) -> bool:
        """Whether the loss of ``next_step`` must become NaN (once; rank 0 writes the marker)."""
        if self.nan_at is None or next_step != self.nan_at:
            return False
        if self.rank == 0:
            self._mark("nan", next_step)
            LOG.warning("TESTING: ops.testing.nan_at_step: the loss of step %d becomes NaN", next_step)
        return True
