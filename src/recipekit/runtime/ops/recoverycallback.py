"""The Trainer side of runtime/volume/recovery.py: mark when the checkpoint is loaded and every completed step, and
serve the run's recovery figures as metrics (restarts, steps lost, the last recovery's seconds)."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from ..volume.recovery import RecoveryLog
from .exporter import publish_recovery


class RecoveryCallback(TrainerCallback):
    """Records ``loaded`` at the training loop's start and each step's progress; rank 0 sets the recovery gauges."""

    def __init__(self, log: RecoveryLog, exporter: Any):
        self.log, self.exporter = log, exporter
        self.reported_first = False

    def _publish(self) -> None:
        publish_recovery(self.log, self.exporter)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.log.loaded(state.global_step)  # the Trainer has loaded the checkpoint by now
        self._publish()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.log.step(state.global_step)
        if not self.reported_first:  # the first step after a restart completes the recovery: its MTTR is known
            self.reported_first = True
            self._publish()
