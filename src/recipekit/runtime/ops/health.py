"""Training health: step timing, the in-process alerts, the metrics served for Prometheus, and the hang watchdog's
arming — Trainer callbacks around :mod:`watchdog`, :mod:`exporter` and :mod:`metricnames`.

The alerts are the operators' defaults, every threshold from recipe.yaml's ``operations.alerts``
(recipekit.memory.operations resolved them): a loss spike or a gradient-norm jump beyond a ratio from one logged step to
the next; MFU below the target for N logged steps in a row; a checkpoint save slower than the limit; the device's
utilisation below the minimum for N logged steps in a row. Each is a warning in the log with the step, an ``alert``
record in metrics.jsonl (rank 0) and a count in ``recipekit_alerts_total``; the PrometheusRule recipekit renders
fires on the same figures, so the log and the dashboard agree. (A NaN/inf loss is the loss guard's, guard.py.)
"""

from __future__ import annotations

import logging
import math
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from ..boundary import filenames, metricslog
from ..boundary import metricnames as names
from ..boundary.common import LOG
from ..boundary.recipeview import AlertsView, WatchdogView
from .faults import Faults
from .watchdog import Watchdog


# ----------------------------------------------------------------------------------------------------- alerts
class Alerts:
    """The alert rules as pure arithmetic on what each logging step reports (unit-tested without a Trainer).

    Each ``on_*`` method returns the alerts it raises as ``(alert, message)``; the ratios it computed are kept in
    :attr:`figures` for the logs and the exporter.
    """

    def __init__(self, thresholds: AlertsView):
        self.t = thresholds
        self.previous: dict[str, float] = {}
        self.low_mfu = 0
        self.low_utilisation = 0
        self.figures: dict[str, float] = {}

    def _jump(
        self, key: str, value: Any, ratio: float, label: str, step: int, both_ways: bool = False
    ) -> list[tuple[str, str]]:
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return []
        before = self.previous.get(key)
        self.previous[key] = float(value)
        if before is None or before <= 0:
            return []
        jump = value / before - 1
        self.figures[f"{key}_jump_ratio"] = round(jump, 6)
        if jump > ratio or (both_ways and -jump > ratio):
            moved = "rose" if jump > 0 else "fell"
            return [
                (
                    f"{key}_jump",
                    f"{label} {moved} {100 * abs(jump):.0f}% in one logged step at step {step} ({before:.4g} → "
                    f"{value:.4g}; limit {100 * ratio:.0f}%)",
                )
            ]
        return []

    def on_log(self, step: int, logs: dict[str, Any]) -> list[tuple[str, str]]:
        self.figures = {}
        raised = self._jump("loss", logs.get("loss"), float(self.t.loss_spike_ratio), "loss", step)
        # the grad norm either way (seed 004: a collapse is as suspicious as a spike)
        raised += self._jump(
            "grad_norm", logs.get("grad_norm"), float(self.t.grad_norm_jump_ratio), "grad norm", step, both_ways=True
        )
        mfu = logs.get("mfu")
        if isinstance(mfu, (int, float)):
            self.low_mfu = self.low_mfu + 1 if mfu < float(self.t.mfu_target) else 0
            self.figures["mfu_low_steps"] = self.low_mfu
            if self.low_mfu == int(self.t.mfu_low_steps):
                raised.append(
                    (
                        "mfu_low",
                        f"MFU {mfu:.3g} below the target {float(self.t.mfu_target):.3g} for {self.low_mfu} logged "
                        f"steps, at step {step}",
                    )
                )
        return raised

    def on_utilisation(self, step: int, value: float) -> list[tuple[str, str]]:
        floor = float(self.t.device_utilisation_min)
        self.low_utilisation = self.low_utilisation + 1 if value < floor else 0
        if self.low_utilisation == int(self.t.mfu_low_steps):
            return [
                (
                    "device_utilisation_low",
                    f"device utilisation {100 * value:.0f}% below {100 * floor:.0f}% for {self.low_utilisation} "
                    f"logged steps, at step {step}",
                )
            ]
        return []

    def on_checkpoint(self, step: int, seconds: float) -> list[tuple[str, str]]:
        limit = float(self.t.checkpoint_save_limit_s)
        if seconds > limit:
            return [("checkpoint_slow", f"saving checkpoint-{step} took {seconds:.0f} s, over the {limit:.0f} s limit")]
        return []


def device_utilisation(kind: str) -> float | None:
    """The driver's utilisation figure of this process's device, 0-1; None where there is none (CPU, no NVML)."""
    if kind not in ("cuda", "npu"):
        return None
    try:
        return float(getattr(torch, kind).utilization()) / 100.0
    except Exception:  # noqa: BLE001 - no NVML, an old driver: the figure is simply absent
        return None


def directory_bytes(path: Path) -> int:
    total = 0
    for file in path.rglob("*"):
        try:
            if file.is_file():
                total += file.stat().st_size
        except OSError:
            continue
    return total


# ------------------------------------------------------------------------------------------------ the callback
class HealthCallback(TrainerCallback):
    """Step time and data wait of every step, the alerts of every logging step, checkpoint time and size, and the
    exporter's gauges. Inserted right after the throughput callback, so its figures (and the ones it adds to the
    logs: step time, dataloader wait share, jump ratios, device utilisation) reach metrics.jsonl and TensorBoard."""

    def __init__(self, trainer: Any, alerts: Alerts, exporter: Any, records: Any, device_kind: str):
        self.trainer, self.alerts, self.exporter, self.records = trainer, alerts, exporter, records
        self.device_kind = device_kind
        self.step_time: float | None = None
        self.wait_fraction: float | None = None
        self.step_ended = time.perf_counter()
        #: each saved step's blocking seconds, until its drain reports the total (hot tier only)
        self.blocking_s: dict[int, float] = {}
        self._utilisation_works = device_kind in ("cuda", "npu")

    def raise_alert(self, alert: str, step: int, message: str) -> None:
        """One alert: a warning on rank 0's log, an ``alert`` record, and the exporter's counter."""
        LOG.warning("alert %s: %s", alert, message)
        self.records.add(metricslog.EVENT_ALERT, alert=alert, step=step, message=message)
        self.exporter.alert(alert)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        started = getattr(self.trainer, "batch_started", None)
        if started is not None:
            self.step_time = now - started
            wait = getattr(self.trainer, "batch_wait_s", 0.0)
            self.wait_fraction = wait / self.step_time if self.step_time > 0 else None
            self.exporter.set(names.STEP_TIME, self.step_time)
            if self.wait_fraction is not None:
                self.exporter.set(names.DATALOADER_WAIT, self.wait_fraction)
        self.step_ended = now
        self.exporter.set(names.STEP, state.global_step)
        self.exporter.set(names.LAST_STEP_TIME, time.time())

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs is None or "loss" not in logs:
            return
        step = state.global_step
        if self.step_time is not None:
            logs["step_time_s"] = round(self.step_time, 4)
        if self.wait_fraction is not None:
            logs["dataloader_wait_fraction"] = round(self.wait_fraction, 4)
        raised = self.alerts.on_log(step, logs)
        if self._utilisation_works:
            value = device_utilisation(self.device_kind)
            if value is None:
                self._utilisation_works = False
            else:
                logs["device_utilisation"] = round(value, 3)
                self.exporter.set(names.DEVICE_UTILISATION, value)
                raised += self.alerts.on_utilisation(step, value)
        for key, metric in (
            ("loss", names.LOSS),
            ("grad_norm", names.GRAD_NORM),
            ("learning_rate", names.LEARNING_RATE),
            ("mfu", names.MFU),
            ("hfu", names.HFU),
            ("tokens_per_second_per_device", names.TOKENS_PER_S),
            ("tflops_per_device", names.TFLOPS),
        ):
            if isinstance(logs.get(key), (int, float)):
                self.exporter.set(metric, float(logs[key]))
        figures = self.alerts.figures
        for key, metric in (
            ("loss_jump_ratio", names.LOSS_JUMP),
            ("grad_norm_jump_ratio", names.GRAD_NORM_JUMP),
            ("mfu_low_steps", names.MFU_LOW_STEPS),
        ):
            if key in figures:
                self.exporter.set(metric, figures[key])
        for alert, message in raised:
            self.raise_alert(alert, step, message)

    def checkpoint_saved(self, step: int, checkpoint_dir: Path, writer: bool, drained_later: bool) -> None:
        """A save (the evaluation before it, and its signature or hand-over to the drain) ran between the step's end
        and now: the seconds training stood still (:class:`SaveTimerCallback`, the last callback, calls this).
        ``drained_later``: a hot tier's drain reports the total (:meth:`checkpoint_drained`); else it is the same."""
        seconds = time.perf_counter() - self.step_ended
        self.exporter.set(names.CHECKPOINT_SECONDS, seconds)
        if not drained_later:
            self.exporter.set(names.CHECKPOINT_TOTAL_SECONDS, seconds)
        self.blocking_s[step] = seconds
        if not writer:
            return
        path = checkpoint_dir / f"{filenames.CHECKPOINT_PREFIX}{step}"
        size = directory_bytes(path) if path.is_dir() else 0
        self.exporter.set(names.CHECKPOINT_BYTES, size)
        self.records.add(metricslog.EVENT_CHECKPOINT, step=step, seconds=round(seconds, 3), bytes=size)
        for alert, message in self.alerts.on_checkpoint(step, seconds):
            self.raise_alert(alert, step, message)

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
    """Arms the hang watchdog for each phase of the loop, shortens the process group's timeout to the steady one
    after the first step, and (testing only) stalls the configured rank at its step.

    Appended after the preemption and guard callbacks, so at a step's end it knows whether a save follows
    (the Trainer saves after ``on_step_end``: a save is watched with the steady timeout, a step with the stall one).
    """

    def __init__(self, watchdog: Watchdog, timeouts: WatchdogView, faults: Faults):
        self.watchdog, self.t, self.faults = watchdog, timeouts, faults
        self.steady_set = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            LOG.info(
                "hang watchdog: %d s to the first step, then %d s a step (the plan expects %.3g s) and %d s a save",
                self.t.startup_timeout_s,
                self.t.stall_timeout_s,
                self.t.planned_step_time_s,
                self.t.steady_timeout_s,
            )
        self.watchdog.arm("the first step", float(self.t.startup_timeout_s), state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.faults.stall_now(state.global_step + 1)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        if not self.steady_set:
            self.steady_set = True
            steady_process_group_timeout(float(self.t.steady_timeout_s))
        if control.should_save or control.should_evaluate:
            self.watchdog.arm(f"the checkpoint save after step {step}", float(self.t.steady_timeout_s), step)
        else:
            self.watchdog.arm(f"step {step + 1}", float(self.t.stall_timeout_s), step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        self.watchdog.arm(f"step {step + 1}", float(self.t.stall_timeout_s), step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
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
