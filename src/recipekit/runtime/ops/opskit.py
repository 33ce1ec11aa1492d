"""The operations layer of one Trainer process, as session.py uses it: preflight, then the callbacks, then the
verdict on a stopped run.

The engine-neutral part (preflight, exporter, watchdog, recovery records, the loss guard's verdict) is
engineops.py's EngineOps, which the Megatron room uses too; this module adds the Trainer's callbacks, in their
own modules: guard.py (the Trainer that feeds the loss guard), health.py (timing, alerts, metrics, the watchdog's
arming), recoverycallback.py, profiling.py (the profiler window) and trackers/ (W&B, MLflow and SwanLab,
guarded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..boundary.common import LOG
from ..boundary.config import RunConfig
from ..boundary.resume import checkpointdirs
from ..data.sampler import step_positions
from .device import Device
from .engineops import EngineOps
from .guard import GuardCallback
from .health import Alerts, HealthCallback, SaveTimerCallback, WatchdogCallback
from .profiling import ProfilerCallback
from .recoverycallback import RecoveryCallback
from .trackers import guarded as trackers


class OpsLayer(EngineOps):
    """Preflight, hang watchdog, loss guard, alerts, metrics and profiler for one Trainer process of one run."""

    def __init__(self, run: RunConfig, args: Any, device: Device):
        super().__init__(run, Path(args.output_dir), args.process_index, device, args.device)
        self.args = args
        self.health: HealthCallback | None = None
        self.trackers: list[trackers.GuardedTracker] = []

    # -- the callbacks
    def install(self, trainer: Any, records: Any) -> None:
        """Give the Trainer (an OpsTrainer) the loss guard and the faults, and add the callbacks in their order."""
        trainer.guard, trainer.faults = self.guard, self.faults
        operations = self.operations
        self.start_exporter()
        health = HealthCallback(trainer, Alerts(operations.alerts), self.exporter, records, self.device.kind)
        self.health = health
        # a spike's report covers the steps the logged loss averaged (logging_steps, or 1 where it is a fraction)
        self.guard.keep_steps(int(self.args.logging_steps) if self.args.logging_steps >= 1 else 1)
        health.on_loss_spike = lambda step, message: self.loss_spike(step, message, records)
        handler = trainer.callback_handler.callbacks
        handler.insert(1, health)  # after throughput, before the reporters and metrics.jsonl: they see its figures
        # the trackers' integrations, guarded where they stand: one that is down is turned off, never the run
        self.trackers = trackers.guard_trackers(
            handler,
            trackers.deadline_s(operations.watchdog.startup_timeout_s),
            lambda name, message: health.raise_alert(trackers.ALERT, trainer.state.global_step, message),
        )
        trainer.add_callback(GuardCallback(self.guard, operations.alerts.nonfinite_loss, health.raise_alert))
        trainer.add_callback(WatchdogCallback(self.watchdog(), operations.watchdog, self.faults))
        trainer.add_callback(RecoveryCallback(self.recovery, self.exporter))
        steps = self.run.recipe.train.profile_steps
        if steps:
            trainer.add_callback(ProfilerCallback(steps, self.output_dir, self.rank, self.device.kind, records))

    def time_saves(self, trainer: Any, checkpoint_dir: Path, drained_later: bool) -> None:
        """Add the callback that times each save: after the run record's, the last of all (health.py)."""
        assert self.health is not None, "install() first"
        trainer.add_callback(SaveTimerCallback(self.health, checkpoint_dir, drained_later))

    def checkpoint_drained(self, drained: Any) -> None:
        """A hot tier's drain (volume/hottier.py ``Drained``) reached the shared volume: the total time's gauge
        and record (called in the drain's thread)."""
        if self.health is not None:
            self.health.checkpoint_drained(drained.step, drained.seconds, drained.bytes)

    def checkpoint_cold(self, copied: Any) -> None:
        """The cold tier's copy of a checkpoint ended (volume/coldtier.py ``ColdCopy``; called in its thread)."""
        if self.health is not None:
            self.health.checkpoint_cold(copied.step, copied.seconds, copied.code, copied.error)

    # -- after training
    def stopped(self, trainer: Any, records: Any) -> int | None:
        """The exit code of a run the loss guard stopped (after writing what can be saved), else None."""
        step = self.guard.stopped_at
        if step is None:
            return None
        last_good = checkpointdirs.latest_complete_checkpoint(self.output_dir)
        skipped = self._skip(trainer, step) if self.operations.alerts.nonfinite_loss == "skip" else None
        return self.nonfinite_stop(records, last_good, list(trainer.state.log_history), skipped)

    def _skip(self, trainer: Any, step: int) -> tuple[int, int, int] | None:
        """Record (rank 0, recovery.jsonl) the positions of ``step``'s batch in its epoch's order, which the resume
        leaves out (sampler.py); None where the order is not the resumable sampler's (nothing can be skipped)."""
        sampler, args = getattr(trainer, "row_sampler", None), self.args
        if sampler is None or self.guard.steps_per_epoch is None:
            LOG.warning("ops.nonfinite_loss: skip: the training order is not recipekit's sampler; nothing skipped")
            return None
        data_parallel = max(1, args.world_size // max(1, self.run.plan.tensor_parallel))
        rows = args.per_device_train_batch_size * args.gradient_accumulation_steps * data_parallel
        epoch, start, stop = step_positions(step, self.guard.steps_per_epoch, rows, len(sampler))
        self.recovery.skipped(step, epoch, start, stop)
        return epoch, start, stop

    def close(self) -> None:
        trackers.finish(self.trackers)
        super().close()
