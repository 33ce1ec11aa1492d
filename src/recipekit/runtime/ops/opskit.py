"""The operations layer of one training process, as session.py uses it: preflight, then the callbacks, then the
verdict on a stopped run.

Everything it reads is recipe.yaml's ``operations`` section (recipekit.memory.operations computed it; config.py
reads it into recipeview.OperationsView). The parts live in their own modules:
preflight.py (the checks), watchdog.py (the hang watchdog), guard.py (the loss guard and the Trainer that feeds it),
health.py (timing, alerts, metrics), exporter.py (Prometheus), faults.py (testing-only fault injection),
profiling.py (the profiler window) and trackers.py (W&B, MLflow and SwanLab, guarded).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..boundary import exitcodes, filenames, metricslog
from ..boundary.common import LOG
from ..boundary.config import RunConfig
from ..boundary.resume import checkpointdirs
from ..data.sampler import step_positions
from ..volume.recovery import RecoveryLog
from . import trackers
from .device import Device
from .exporter import start_exporter
from .faults import Faults
from .guard import GuardCallback, LossGuard, nonfinite_report
from .health import Alerts, HealthCallback, WatchdogCallback
from .preflight import PreflightFailed, pod_index, run_preflight
from .profiling import ProfilerCallback
from .recoverycallback import RecoveryCallback
from .watchdog import Watchdog


class OpsLayer:
    """Preflight, hang watchdog, loss guard, alerts, metrics and profiler for one process of one run."""

    def __init__(self, run: RunConfig, args: Any, device: Device):
        self.run, self.args, self.device = run, args, device
        self.operations = run.operations
        self.output_dir = Path(args.output_dir)
        self.rank = args.process_index
        self.metrics_file = self.output_dir / filenames.METRICS_FILE
        self.faults = Faults(self.operations.testing, self.output_dir, self.rank, pod_index())
        self.guard = LossGuard()
        self.exporter: Any = None
        self.trackers: list[trackers.GuardedTracker] = []
        #: interruptions and recoveries in the run directory (rank 0 writes; runtime/volume/recovery.py)
        self.recovery = RecoveryLog(self.output_dir, enabled=self.rank == 0)

    # -- before training
    def preflight(self) -> dict[str, Any] | None:
        """Run preflight when the recipe asks for it; raises PreflightFailed (exit 3) on a failed check."""
        self.faults.user_error_now()
        settings = self.operations.preflight
        if not settings.enabled:
            return None
        try:
            return self._run_preflight(asdict(settings))
        except PreflightFailed:
            self.faults.devices_failed()
            raise

    def _run_preflight(self, plain: dict[str, Any]) -> dict[str, Any]:
        return run_preflight(
            plain,
            output_dir=self.output_dir,
            device_kind=self.device.kind,
            device_count=self.device.count,
            torch_device=self.args.device,
            simulated_devices=self.faults.simulated_devices(),
            runtime_context_gib=self.run.recipe.hw.runtime_context_gib,
            metrics_file=self.metrics_file,
        )

    # -- the callbacks
    def install(self, trainer: Any, records: Any) -> None:
        """Give the Trainer (an OpsTrainer) the loss guard and the faults, and add the callbacks in their order."""
        trainer.guard, trainer.faults = self.guard, self.faults
        operations, job = self.operations, self.run.plan.job_name
        self.exporter = start_exporter(operations.metrics, job, self.rank, int(os.environ.get("LOCAL_RANK", "0")))
        health = HealthCallback(trainer, Alerts(operations.alerts), self.exporter, records, self.device.kind)
        handler = trainer.callback_handler.callbacks
        handler.insert(1, health)  # after throughput, before the reporters and metrics.jsonl: they see its figures
        # the trackers' integrations, guarded where they stand: one that is down is turned off, never the run
        self.trackers = trackers.guard_trackers(
            handler,
            trackers.deadline_s(operations.watchdog.startup_timeout_s),
            lambda name, message: health.raise_alert(trackers.ALERT, trainer.state.global_step, message),
        )
        trainer.add_callback(GuardCallback(self.guard, operations.alerts.nonfinite_loss, health.raise_alert))
        watchdog = Watchdog(output_dir=self.output_dir, rank=self.rank, metrics_file=self.metrics_file)
        trainer.add_callback(WatchdogCallback(watchdog, operations.watchdog, self.faults))
        trainer.add_callback(RecoveryCallback(self.recovery, self.exporter))
        steps = self.run.recipe.train.profile_steps
        if steps:
            trainer.add_callback(ProfilerCallback(steps, self.output_dir, self.rank, self.device.kind, records))

    # -- after training
    def stopped(self, trainer: Any, records: Any) -> int | None:
        """The exit code of a run the loss guard stopped (after writing what can be saved), else None."""
        step = self.guard.stopped_at
        if step is None:
            return None
        where = nonfinite_report(self.guard, self.output_dir, self.rank, list(trainer.state.log_history))
        last_good = checkpointdirs.latest_complete_checkpoint(self.output_dir)
        mode = self.operations.alerts.nonfinite_loss
        action = exitcodes.nonfinite_action(mode)
        skipped = self._skip(trainer, step) if mode == "skip" else None
        then = (
            f"the Job restarts ({action}) from the last good checkpoint and the resume skips step {step}'s batch "
            f"(positions {skipped[1]}-{skipped[2] - 1} of epoch {skipped[0]}'s order; ops.nonfinite_loss: skip)"
            if skipped
            else f"the Job ends ({action}, ops.nonfinite_loss: {mode}): lower train.learning_rate or check the data "
            "there, then resubmit the Job; it resumes from the last good checkpoint"
        )
        message = (
            f"loss is not finite at step {step} (ranks {', '.join(map(str, self.guard.ranks))}): stopped without "
            f"saving the poisoned weights; the last good checkpoint is {last_good.name if last_good else 'none'}; "
            f"the report and the offending batches are in {where}; {then}"
        )
        LOG.error(message)
        records.add(
            metricslog.EVENT_NONFINITE,
            step=step,
            ranks=self.guard.ranks,
            stopped=True,
            last_good_checkpoint=str(last_good) if last_good else None,
            report=str(where),
            action=action,
            skipped=list(skipped) if skipped else None,
            message=message,
        )
        return exitcodes.EXIT_NONFINITE

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
        if self.exporter is not None:
            self.exporter.close()
