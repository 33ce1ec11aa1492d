"""Fault injection (recipe ``ops.testing``) — TESTING ONLY: break a run on purpose to prove it is noticed and healed.

* ``stall_at_step`` (with ``stall_rank``): that rank blocks forever as it begins the step; the hang watchdog must
  detect it, dump the stacks and fail the pod, and the restarted job must resume.
* ``nan_at_step``: the loss of that step becomes NaN on every rank before backward, so the gradients and the update
  are poisoned as a real divergence poisons them; the loss guard must stop the run without saving them.
* ``spike_at_step`` (with ``spike_rank``): that rank's loss of that step is :data:`SPIKE_FACTOR` times what it was
  (and so are its gradients, as a bad batch's are); the loss-spike alert must fire and its report name that rank.
* ``device_count`` with ``device_count_pod``: that pod's preflight sees the wrong number of devices, once; the pod
  exits with the preflight code and the Job's policy restarts it (one faulty node).
* ``user_error_pod``: that pod stops before training with the configuration-error code, every time (a broken
  configuration does not heal); the Job's policy must end the Job without a retry.

Each fault fires once per output directory: the process that injects it first writes a marker into
``<output_dir>/faults/``, and every process decides at start whether its fault is still armed (markers only appear
at the fault's step, long after every rank has started), so a restarted job runs clean — as a drill should.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ..boundary import exitcodes, filenames, jsonfile
from ..boundary.common import LOG, RunError
from ..boundary.recipeview import FaultsView

#: How many times its loss ``ops.testing.spike_at_step`` makes the spiking rank's.
SPIKE_FACTOR = 10.0


class InjectedUserError(RunError):
    """ops.testing.user_error_pod: a configuration error on purpose (exit ``user_error``)."""

    code = exitcodes.EXIT_USER_ERROR


class Faults:
    """The faults still armed in this process, from recipe.yaml's ``operations.testing``."""

    def __init__(self, testing: FaultsView, output_dir: Path, rank: int, pod: int = 0):
        self.dir = Path(output_dir) / filenames.FAULTS_DIR
        self.pod = pod
        self.user_error = testing.user_error_pod == pod
        self.device_count = testing.device_count
        device_pod = testing.device_count_pod
        if device_pod is not None and (device_pod != pod or self._marker("device-count", 0).exists()):
            self.device_count = None  # another pod's fault, or this one's already healed by a restart
        stall_at = testing.stall_at_step
        nan_at = testing.nan_at_step
        self.stall_at = stall_at if stall_at and rank == testing.stall_rank else None
        self.nan_at = nan_at
        self.rank = rank
        if self.stall_at is not None and self._marker("stall", self.stall_at).exists():
            self.stall_at = None
        if self.nan_at is not None and self._marker("nan", self.nan_at).exists():
            self.nan_at = None
        spike_at = testing.spike_at_step
        self.spike_at = spike_at if spike_at and rank == testing.spike_rank else None
        if self.spike_at is not None and self._marker("spike", self.spike_at).exists():
            self.spike_at = None

    def _marker(self, kind: str, step: int) -> Path:
        return self.dir / f"{kind}-at-step-{step}"

    def _mark(self, kind: str, step: int) -> None:
        try:
            jsonfile.replace_text(self._marker(kind, step), f"injected by rank {self.rank}\n")
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

    def spike(self, next_step: int) -> float:
        """The factor of this rank's loss of ``next_step``: :data:`SPIKE_FACTOR` where the spike is armed for it
        (every micro-batch of the step; the marker is written once), else 1."""
        if self.spike_at is None or next_step != self.spike_at:
            return 1.0
        if not self._marker("spike", next_step).exists():
            self._mark("spike", next_step)
            LOG.warning("TESTING: ops.testing.spike_at_step: rank %d's loss of step %d is %g times", self.rank,
                        next_step, SPIKE_FACTOR)  # fmt: skip
        return SPIKE_FACTOR

    def simulated_devices(self) -> int | None:
        """The device count preflight must see instead of the driver's (ops.testing.device_count), or None."""
        return self.device_count

    def devices_failed(self) -> None:
        """Preflight failed with a simulated count: a one-pod fault fires once (the restart sees the real count)."""
        if self.device_count is not None:
            self._mark("device-count", 0)

    def user_error_now(self) -> None:
        """Raise the injected configuration error when this pod is the one ops.testing names."""
        if self.user_error:
            LOG.warning("TESTING: ops.testing.user_error_pod: pod %d stops with a configuration error", self.pod)
            raise InjectedUserError(f"ops.testing.user_error_pod: pod {self.pod} was given a broken configuration")
