"""The hang watchdog's phases in an engine's loop (watchdog.py is the thread): which deadline each phase of the loop
gets, from recipe.yaml's ``operations.watchdog`` (recipekit.memory.operations computed them), and the process
group's timeout after the first step. The Trainer's WatchdogCallback (health.py) and the Megatron room's callback
(runtime/megatron/ops.py) call the same :class:`PhaseWatch`.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import torch

from ..boundary.common import LOG
from ..boundary.recipeview import WatchdogView
from .faults import Faults
from .watchdog import Watchdog


class PhaseWatch:
    """Arms the hang watchdog for each phase of an engine's loop, whatever the engine: the first step (the startup
    timeout), each later step (the stall timeout), a save or an evaluation after a step (the steady timeout); shortens
    the process group's timeout to the steady one after the first step, and (testing only) stalls the configured rank
    at its step. The Trainer's :class:`WatchdogCallback` and the Megatron room's callback call it."""

    def __init__(self, watchdog: Watchdog, timeouts: WatchdogView, faults: Faults):
        self.watchdog, self.t, self.faults = watchdog, timeouts, faults
        self.steady_set = False

    def begin(self, step: int, announce: bool) -> None:
        """The loop begins after ``step`` (the step resumed from; ``announce``: rank 0 logs the timeouts)."""
        if announce:
            LOG.info(
                "hang watchdog: %d s to the first step, then %d s a step (the plan expects %.3g s) and %d s a save",
                self.t.startup_timeout_s,
                self.t.stall_timeout_s,
                self.t.planned_step_time_s,
                self.t.steady_timeout_s,
            )
        self.watchdog.arm("the first step", float(self.t.startup_timeout_s), step)

    def step_begins(self, step: int) -> None:
        """Step ``step`` begins (testing only: the configured rank stalls here)."""
        self.faults.stall_now(step)

    def step_ended(self, step: int, save_follows: bool) -> None:
        """Step ``step`` completed; ``save_follows``: a checkpoint save (or an evaluation) runs before the next."""
        if not self.steady_set:
            self.steady_set = True
            steady_process_group_timeout(float(self.t.steady_timeout_s))
        if save_follows:
            self.watchdog.arm(f"the checkpoint save after step {step}", float(self.t.steady_timeout_s), step)
        else:
            self.next_step(step)

    def next_step(self, step: int) -> None:
        """Nothing but step ``step + 1`` runs until the next arming (after a save, say)."""
        self.watchdog.arm(f"step {step + 1}", float(self.t.stall_timeout_s), step)

    def end(self) -> None:
        self.watchdog.disarm()


def steady_process_group_timeout(seconds: float) -> None:
    """From the startup timeout (``ddp_timeout``: connect, load, first step) to the steady one; a backend that
    cannot change it keeps the startup timeout (the watchdog still bounds a hang)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    try:
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timedelta(seconds=seconds))
        LOG.info("collective timeout now %d s (steady state)", seconds)
    except Exception as exc:  # noqa: BLE001 - a backend without the call keeps its startup timeout
        LOG.log(logging.INFO, "collective timeout stays at the startup value (%s)", exc)
