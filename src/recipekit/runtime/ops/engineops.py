"""The operations layer of one training process, engine-neutral: what every engine's run does the same way,
whatever loop it has. The Trainer's OpsLayer (opskit.py) installs it as Trainer callbacks; the Megatron room
(runtime/megatron/ops.py) drives it from Megatron-Bridge's callback events.

Everything it reads is recipe.yaml's ``operations`` section (recipekit.memory.operations computed it; recipeview.py
types it): preflight.py (the checks), watchdog.py (the hang watchdog; phases.py arms it), lossguard.py (the loss
guard's state and report), alerts.py (the alerts and the figures), exporter.py (Prometheus), faults.py
(testing-only fault injection), and volume/recovery.py (the attempts and their recoveries).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..boundary import exitcodes, filenames, metricslog
from ..boundary.common import LOG
from ..volume.recovery import RecoveryLog
from . import logevents
from .device import Device
from .exporter import start_exporter
from .faults import Faults
from .lossguard import LossGuard, nonfinite_report, plain_losses, spike_report
from .preflight import PreflightFailed, pod_index, run_preflight
from .watchdog import Watchdog


class EngineOps:
    """The engine-neutral part of the operations layer, for one process of one run: preflight, the drills' faults,
    the exporter, the hang watchdog, the recovery records and the loss guard's verdict. The Trainer's
    :class:`OpsLayer` adds its callbacks; the Megatron room drives the same parts from Bridge's callback events
    (runtime/megatron/ops.py).

    ``run`` is any typed recipe.yaml with ``recipe``, ``plan`` and ``operations`` (the Trainer's RunConfig, the
    Megatron room's EngineRun); ``torch_device`` is where this process's collectives run.
    """

    def __init__(self, run: Any, output_dir: Path, rank: int, device: Device, torch_device: Any):
        self.run, self.device, self.torch_device = run, device, torch_device
        self.operations = run.operations
        self.output_dir = Path(output_dir)
        self.rank = rank
        self.metrics_file = self.output_dir / filenames.METRICS_FILE
        self.faults = Faults(self.operations.testing, self.output_dir, self.rank, pod_index())
        self.guard = LossGuard()
        self.exporter: Any = None
        #: interruptions and recoveries in the run directory (rank 0 writes; runtime/volume/recovery.py)
        self.recovery = RecoveryLog(self.output_dir, enabled=self.rank == 0)
        #: log keywords naming a fault (HCCL/NCCL timeout, ECC/Xid, OOM), counted from here to the process's end
        self.log_events = logevents.install(self.output_dir, self.rank)

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
            torch_device=self.torch_device,
            simulated_devices=self.faults.simulated_devices(),
            runtime_context_gib=self.run.recipe.hw.runtime_context_gib,
            metrics_file=self.metrics_file,
        )

    def start_exporter(self) -> Any:
        """This process's Prometheus exporter (recipe.yaml ``operations.metrics``), or a no-op; started once."""
        if self.exporter is None:
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            self.exporter = start_exporter(self.operations.metrics, self.run.plan.job_name, self.rank, local_rank)
            self.log_events.events.attach(self.exporter)
        return self.exporter

    def watchdog(self) -> Watchdog:
        """The hang watchdog of this process (armed by the engine's loop, health.PhaseWatch)."""
        return Watchdog(output_dir=self.output_dir, rank=self.rank, metrics_file=self.metrics_file)

    # -- during training
    def loss_spike(self, step: int, message: str, records: Any) -> None:
        """The loss-spike alert fired at logged ``step`` (every rank): the guard's report of the steps it averaged
        (each rank's loss and tokens, its batches' fingerprints) and, from rank 0, a ``loss_spike`` record naming
        the rank whose loss per token was highest at the last of them (``report`` null where none was written:
        past the cap, or refused by the volume)."""
        if not self.guard.window:
            return
        where = spike_report(self.guard, step, message, self.output_dir, self.rank)
        last = self.guard.window[-1]
        highest = last.highest()
        if self.rank == 0 and where is not None:
            LOG.warning("loss spike at step %d: the highest loss was rank %s's; each rank's loss and batch "
                        "fingerprints are in %s", step, highest[0] if highest else "?", where)  # fmt: skip
        records.add(
            metricslog.EVENT_LOSS_SPIKE,
            step=step,
            losses=plain_losses(last.losses),
            tokens=last.tokens,
            highest_rank=highest[0] if highest else None,
            report=str(where) if where is not None else None,
        )

    # -- after training
    def nonfinite_stop(
        self,
        records: Any,
        last_good: Path | None,
        log_history: list[dict[str, Any]],
        skipped: tuple[int, int, int] | None = None,
    ) -> int:
        """The loss guard stopped every rank at its step: the report (``nonfinite-step-N/``, naming ``last_good``),
        the error line with what the Job does next, the ``nonfinite`` record; returns ``EXIT_NONFINITE``."""
        step = self.guard.stopped_at
        where = nonfinite_report(self.guard, self.output_dir, self.rank, log_history, last_good)
        mode = self.operations.alerts.nonfinite_loss
        action = exitcodes.nonfinite_action(mode)
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

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.close()
