"""The loss guard and the Trainer that feeds it: a NaN/inf loss is found at the step it happens, on every rank.

The Trainer hides a non-finite loss (``logging_nan_inf_filter`` replaces it with the running mean in the logs) and
reports a loss only every ``logging_steps``; a divergence would go on poisoning the weights and, worse, be saved as
the newest checkpoint, which ``--resume auto`` then continues from. So :class:`OpsTrainer` looks at the loss of
every micro-batch (the Trainer already synchronises on it for its own filter, so this costs no extra device sync),
and :class:`GuardCallback` all-reduces the flag at each step end so every rank stops at the same step.

With ``ops.nonfinite_loss: stop`` the step's checkpoint is not saved (its weights took the non-finite update), the
run stops, and train.py writes ``nonfinite-step-N/`` (a report naming the last good checkpoint, each rank's
offending batch) and exits ``contract.EXIT_NONFINITE``: Volcano restarts from the last good checkpoint, and a
divergence that comes back fails the job after ``maxRetry`` restarts. With ``warn`` it is a warning with the step.

OpsTrainer also times the wait for each step's batches (the dataloader wait share the metrics report).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from . import contract
from .common import LOG
from .faults import Faults


class LossGuard:
    """What this rank saw of the current step: a non-finite micro-batch loss, and its batch."""

    def __init__(self) -> None:
        self.nonfinite: float | None = None  # the first non-finite loss of the current step
        self.batch: Any = None
        self.stopped_at: int | None = None
        self.ranks: list[int] = []

    def observe(self, loss: torch.Tensor, inputs: Any) -> None:
        value = float(loss.detach().float().mean().item())
        if not math.isfinite(value) and self.nonfinite is None:
            self.nonfinite, self.batch = value, inputs

    def agree(self, device: torch.device) -> list[int]:
        """The ranks that saw a non-finite loss this step (every rank gets the same list), and reset."""
        flag = 1.0 if self.nonfinite is not None else 0.0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flags = torch.zeros(torch.distributed.get_world_size(), device=device)
            flags[torch.distributed.get_rank()] = flag
            torch.distributed.all_reduce(flags)
            ranks = [i for i, f in enumerate(flags.tolist()) if f > 0]
        else:
            ranks = [0] if flag else []
        return ranks


class OpsTrainer(Trainer):
    """The Trainer, with each step's batch wait timed, each micro-batch's loss checked, and (testing only) a
    poisoned loss at ``ops.testing.nan_at_step``."""

    guard: LossGuard
    faults: Faults | None = None
    batch_wait_s: float = 0.0
    batch_started: float | None = None

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        start = time.perf_counter()
        batches = super().get_batch_samples(epoch_iterator, num_batches, device)
        self.batch_started, self.batch_wait_s = start, time.perf_counter() - start
        return batches

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kwargs: Any) -> Any:
        result = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        if self.faults is not None and self.faults.poison_loss(self.state.global_step + 1):
            if return_outputs:
                return result[0] * float("nan"), result[1]
            return result * float("nan")
        return result

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = super().training_step(model, inputs, *args, **kwargs)
        self.guard.observe(loss, inputs)
        return loss


class GuardCallback(TrainerCallback):
    """At each step end: agree on a non-finite loss; stop (never saving that step) or warn, per the recipe."""

    def __init__(self, guard: LossGuard, mode: str, on_alert: Any):
        self.guard, self.mode, self.on_alert = guard, mode, on_alert

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ranks = self.guard.agree(args.device)
        if not ranks:
            self.guard.nonfinite = None
            return
        step = state.global_step
        if self.mode == "stop":
            control.should_save = False  # the weights took the non-finite update: never a resumable checkpoint
            control.should_training_stop = True
            self.guard.stopped_at, self.guard.ranks = step, ranks
        else:
            self.on_alert(
                "nonfinite_loss",
                step,
                f"loss is not finite at step {step} (ranks {', '.join(map(str, ranks))}); training goes on "
                "(ops.nonfinite_loss: warn)",
            )
            self.guard.nonfinite, self.guard.batch = None, None


def nonfinite_report(guard: LossGuard, output_dir: Path, rank: int, log_history: list[dict[str, Any]]) -> Path:
    """Write what can be saved of a stopped run into ``nonfinite-step-N/``: each rank its offending batch, rank 0
    the report (the step, the ranks, the last good checkpoint, the recent logs). Returns the directory."""
    step = guard.stopped_at or 0
    where = output_dir / f"{contract.NONFINITE_PREFIX}{step}"
    where.mkdir(parents=True, exist_ok=True)
    if guard.batch is not None:
        batch = {k: v.tolist() for k, v in guard.batch.items() if isinstance(v, torch.Tensor)}
        (where / f"batch-rank-{rank}.json").write_text(json.dumps(batch) + "\n", encoding="utf-8")
    if rank == 0:
        last_good = contract.latest_complete_checkpoint(output_dir)
        report = {
            "step": step,
            "ranks": guard.ranks,
            "loss": guard.nonfinite if guard.nonfinite is None else str(guard.nonfinite),
            "last_good_checkpoint": str(last_good) if last_good else None,
            "recent_logs": log_history[-10:],
        }
        (where / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    LOG.debug("non-finite loss report in %s", where)
    return where
