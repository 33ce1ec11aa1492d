"""Training health in the Trainer: step timing, the in-process alerts, the metrics served for Prometheus, and the
hang watchdog's arming — Trainer callbacks around :mod:`alerts` (the rules and figures), :mod:`phases` (the
watchdog's deadlines), :mod:`exporter` and :mod:`metricnames`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ..boundary import filenames, metricslog
from ..boundary import metricnames as names
from ..boundary.recipeview import WatchdogView
from .alerts import Alerts, Health, directory_bytes
from .faults import Faults
from .phases import PhaseWatch
from .watchdog import Watchdog


# ------------------------------------------------------------------------------------------------ the callback
class HealthCallback(Health, TrainerCallback):
    """Step time and data wait of every step, the alerts of every logging step, checkpoint time and size, and the
    exporter's gauges. Inserted right after the throughput callback, so its figures (and the ones it adds to the
    logs: step time, dataloader wait share, jump ratios, device utilisation) reach metrics.jsonl and TensorBoard."""

    def __init__(self, trainer: Any, alerts: Alerts, exporter: Any, records: Any, device_kind: str):
        super().__init__(alerts, exporter, records, device_kind)
        self.trainer = trainer
        self.step_time: float | None = None
        self.wait_fraction: float | None = None
        self.step_ended = time.perf_counter()
        #: each saved step's blocking seconds, until its drain reports the total (hot tier only)
        self.blocking_s: dict[int, float] = {}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        started = getattr(self.trainer, "batch_started", None)
        if started is not None:
            self.step_time = now - started
            wait = getattr(self.trainer, "batch_wait_s", 0.0)
            self.wait_fraction = wait / self.step_time if self.step_time > 0 else None
            if self.wait_fraction is not None:
                self.exporter.set(names.DATALOADER_WAIT, self.wait_fraction)
        self.step_ended = now
        self.stepped(state.global_step, self.step_time if started is not None else None)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs is None or "loss" not in logs:
            return
        step = state.global_step
        if self.step_time is not None:
            logs["step_time_s"] = round(self.step_time, 4)
        if self.wait_fraction is not None:
            logs["dataloader_wait_fraction"] = round(self.wait_fraction, 4)
        self.logged(step, logs)

    def checkpoint_saved(self, step: int, checkpoint_dir: Path, writer: bool, drained_later: bool) -> None:
        """A save (the evaluation before it, and its signature or hand-over to the drain) ran between the step's end
        and now: the seconds training stood still (:class:`SaveTimerCallback`, the last callback, calls this).
        ``drained_later``: a hot tier's drain reports the total (:meth:`checkpoint_drained`); else it is the same."""
        seconds = time.perf_counter() - self.step_ended
        self.blocking_s[step] = seconds
        size = directory_bytes(checkpoint_dir / f"{filenames.CHECKPOINT_PREFIX}{step}") if writer else None
        self.saved(step, seconds, size, writer, drained_later)

    def checkpoint_drained(self, step: int, seconds: float, size: int) -> None:
        """The hot tier's drain put ``checkpoint-<step>`` on the shared volume (called in the drain's thread)."""
        total = self.blocking_s.pop(step, 0.0) + seconds
        self.exporter.set(names.CHECKPOINT_TOTAL_SECONDS, total)
        self.records.add(
            metricslog.EVENT_CHECKPOINT_DRAINED, step=step, seconds=round(seconds, 3), total=round(total, 3), bytes=size
        )


class SaveTimerCallback(TrainerCallback):
    """Appended after the run record's callback (the last of all), so that the time it gives the health callback
    includes every part of a save that training waits for."""

    def __init__(self, health: HealthCallback, checkpoint_dir: Path, drained_later: bool):
        self.health, self.checkpoint_dir, self.drained_later = health, checkpoint_dir, drained_later

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        writer = state.is_world_process_zero
        self.health.checkpoint_saved(state.global_step, self.checkpoint_dir, writer, self.drained_later)


# -------------------------------------------------------------------------------------------------- the watchdog
class WatchdogCallback(TrainerCallback):
    """The Trainer's events for :class:`PhaseWatch`.

    Appended after the preemption and guard callbacks, so at a step's end it knows whether a save follows
    (the Trainer saves after ``on_step_end``: a save is watched with the steady timeout, a step with the stall one).
    """

    def __init__(self, watchdog: Watchdog, timeouts: WatchdogView, faults: Faults):
        self.phases = PhaseWatch(watchdog, timeouts, faults)
        self.watchdog = watchdog

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.begin(state.global_step, state.is_world_process_zero)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.step_begins(state.global_step + 1)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.step_ended(state.global_step, bool(control.should_save or control.should_evaluate))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.next_step(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phases.end()
