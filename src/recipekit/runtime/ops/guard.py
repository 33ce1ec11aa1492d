"""The loss guard and the Trainer that feeds it: a NaN/inf loss is found at the step it happens, on every rank.

The Trainer reports a loss only every ``logging_steps`` (and its ``logging_nan_inf_filter``, which the plan turns
off, would hide a non-finite one behind the running mean, at a device sync per micro-batch); a divergence would go
on poisoning the weights and, worse, be saved as the newest checkpoint, which ``--resume auto`` then continues from.
So :class:`OpsTrainer` flags a non-finite loss of every micro-batch on the device, and :class:`GuardCallback`
all-reduces the flags once per step, so every rank stops at the same step (the guard's state and its report,
engine-neutral: lossguard.py).

With ``ops.nonfinite_loss: stop`` or ``skip`` the step's checkpoint is not saved (its weights took the non-finite
update), the run stops, and train.py writes ``nonfinite-step-N/`` (a report naming the last good checkpoint, each
rank's offending batch) and exits ``exitcodes.EXIT_NONFINITE``. Under ``stop`` the Job's exitCode policy ends the
Job (TerminateJob): a restart would replay the same keyed data order into the same NaN until ``maxRetry``. Under
``skip`` the Job restarts from the last good checkpoint and the resume leaves the step's batch out (a ``skip``
record in recovery.jsonl; sampler.py). With ``warn`` it is a warning with the step.

OpsTrainer also times the wait for each step's batches (the dataloader wait share the metrics report).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from ..volume.rowledger import ROWS_KEY, RowLedger
from .faults import Faults
from .lossguard import LossGuard


class OpsTrainer(Trainer):
    """The Trainer, with each step's batch wait timed, each micro-batch's loss checked, and (testing only) a
    poisoned loss at ``ops.testing.nan_at_step``, a spiked one at ``spike_at_step`` and each micro-batch's rows in
    the ledger."""

    guard: LossGuard | None = None  # None until OpsLayer.install gives it one (nothing checks the loss)
    faults: Faults | None = None
    ledger: RowLedger | None = None  # ops.testing.record_rows: the rows of every micro-batch (rowledger.py)
    batch_wait_s: float = 0.0
    batch_started: float | None = None

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        start = time.perf_counter()
        batches = super().get_batch_samples(epoch_iterator, num_batches, device)
        self.batch_started, self.batch_wait_s = start, time.perf_counter() - start
        return batches

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kwargs: Any) -> Any:
        result = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        if self.faults is None:
            return result
        step = self.state.global_step + 1
        factor = float("nan") if self.faults.poison_loss(step) else self.faults.spike(step)
        if factor == 1.0:
            return result
        return (result[0] * factor, result[1]) if return_outputs else result * factor

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        rows = inputs.pop(ROWS_KEY, None)  # the row ledger's indices (testing only): never the model's input
        if rows is not None and self.ledger is not None:
            self.ledger.record(self.state.global_step + 1, rows.tolist(), getattr(self, "row_sampler", None))
        loss = super().training_step(model, inputs, *args, **kwargs)
        if self.guard is not None:
            self.guard.observe(loss, inputs)
        return loss


class GuardCallback(TrainerCallback):
    """At each step end: agree on a non-finite loss; stop (never saving that step) or warn, per the recipe."""

    def __init__(self, guard: LossGuard, mode: str, on_alert: Any):
        self.guard, self.mode, self.on_alert = guard, mode, on_alert

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        ranks = self.guard.agree(args.device, step)
        if ranks and self.mode in ("stop", "skip"):
            control.should_save = False  # the weights took the non-finite update: never a resumable checkpoint
            control.should_training_stop = True
            self.guard.stopped_at, self.guard.ranks = step, ranks
            self.guard.steps_per_epoch = _steps_per_epoch(kwargs.get("train_dataloader"), args)
            self.guard.keep_offending()
        elif ranks:
            self.on_alert(
                "nonfinite_loss",
                step,
                f"loss is not finite at step {step} (ranks {', '.join(map(str, ranks))}); training goes on "
                "(ops.nonfinite_loss: warn)",
            )
        self.guard.reset()


def _steps_per_epoch(loader: Any, args: Any) -> int | None:
    """Optimizer steps per epoch, as the Trainer counts them (its batches per rank over gradient accumulation)."""
    try:
        batches, accumulation = len(loader), max(1, int(args.gradient_accumulation_steps))
    except (TypeError, ValueError):
        return None
    return max(1, -(-batches // accumulation))
