"""Training health, engine-neutral: the in-process alerts and the figures of each logged step (device utilisation,
the exporter's gauges). The Trainer's callbacks (health.py) and the Megatron room's (runtime/megatron/ops.py) feed
it the same figures.

The alerts are the operators' defaults, every threshold from recipe.yaml's ``operations.alerts``
(recipekit.memory.operations resolved them): a loss spike or a gradient-norm jump beyond a ratio from one logged step to
the next; MFU below the target for N logged steps in a row; a checkpoint save slower than the limit; the device's
utilisation below the minimum for N logged steps in a row. Each is a warning in the log with the step, an ``alert``
record in metrics.jsonl (rank 0) and a count in ``recipekit_alerts_total``; the PrometheusRule recipekit renders
fires on the same figures, so the log and the dashboard agree. (A NaN/inf loss is the loss guard's, guard.py.)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..boundary import metricnames as names
from ..boundary import metricslog
from ..boundary.common import LOG
from ..boundary.recipeview import AlertsView

#: The alert a loss spike raises (a rise over ``loss_spike_ratio`` from one logged step to the next).
LOSS_SPIKE_ALERT = "loss_jump"


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


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (a checkpoint's size on disk; 0 where there is none)."""
    total = 0
    for file in path.rglob("*"):
        try:
            if file.is_file():
                total += file.stat().st_size
        except OSError:
            continue
    return total


def device_utilisation(kind: str) -> float | None:
    """The driver's utilisation figure of this process's device, 0-1; None where there is none (CPU, no NVML)."""
    if kind not in ("cuda", "npu"):
        return None
    try:
        return float(getattr(torch, kind).utilization()) / 100.0
    except Exception:  # noqa: BLE001 - no NVML, an old driver: the figure is simply absent
        return None


# ------------------------------------------------------------------------------------------------ the figures
class Health:
    """What every engine reports of a logged step: the alerts, the device's utilisation and the exporter's gauges,
    from the step's figures (``logs``: loss, grad_norm, learning_rate, the throughput of flopcount.step_figures).
    The Trainer's :class:`HealthCallback` and the Megatron room's callback both call :meth:`logged`."""

    def __init__(self, alerts: Alerts, exporter: Any, records: Any, device_kind: str):
        self.alerts, self.exporter, self.records = alerts, exporter, records
        self.device_kind = device_kind
        self._utilisation_works = device_kind in ("cuda", "npu")
        #: called on every rank with (step, message) when the loss-spike alert fires (EngineOps.loss_spike)
        self.on_loss_spike: Callable[[int, str], None] | None = None

    def raise_alert(self, alert: str, step: int, message: str) -> None:
        """One alert: a warning on rank 0's log, an ``alert`` record, and the exporter's counter."""
        LOG.warning("alert %s: %s", alert, message)
        self.records.add(metricslog.EVENT_ALERT, alert=alert, step=step, message=message)
        self.exporter.alert(alert)

    def stepped(self, step: int, step_time: float | None) -> None:
        """A step completed (every rank): the step and step-time gauges."""
        if step_time is not None:
            self.exporter.set(names.STEP_TIME, step_time)
        self.exporter.set(names.STEP, step)
        self.exporter.set(names.LAST_STEP_TIME, time.time())

    def saved(self, step: int, seconds: float, size: int | None, writer: bool, drained_later: bool = False) -> None:
        """A checkpoint of ``step`` was saved while training stood still ``seconds`` (every rank: the gauges);
        ``size``: its bytes on disk, on the ranks that measured it (the checkpoint-size gauge); ``writer``: this
        rank writes the run's records (the checkpoint record and a slow save's alert). ``drained_later``: a hot
        tier's drain reports the total later; else it is the same."""
        self.exporter.set(names.CHECKPOINT_SECONDS, seconds)
        if not drained_later:
            self.exporter.set(names.CHECKPOINT_TOTAL_SECONDS, seconds)
        if size is not None:
            self.exporter.set(names.CHECKPOINT_BYTES, size)
        if not writer:
            return
        self.records.add(metricslog.EVENT_CHECKPOINT, step=step, seconds=round(seconds, 3), bytes=size or 0)
        for alert, message in self.alerts.on_checkpoint(step, seconds):
            self.raise_alert(alert, step, message)

    def checkpoint_cold(self, step: int, seconds: float, code: int | None, error: str | None) -> None:
        """The cold tier's copy of the checkpoint of ``step`` ended (called in the copier's thread): its record, and
        an alert when it failed (the checkpoint stays on the shared volume; the next one is copied as usual)."""
        self.records.add(metricslog.EVENT_CHECKPOINT_COLD, step=step, seconds=round(seconds, 3), code=code, error=error)
        if code != 0:
            message = f"the checkpoint of step {step} was not copied to the cold store: {error}"
            self.raise_alert(names.COLD_COPY_FAILED, step, message)

    def logged(self, step: int, logs: dict[str, Any]) -> None:
        """A logged step's figures (``logs`` gains the device utilisation): alerts raised, gauges set."""
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
            if alert == LOSS_SPIKE_ALERT and self.on_loss_spike is not None:
                self.on_loss_spike(step, message)
