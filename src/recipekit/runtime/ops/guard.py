"""The loss guard and the Trainer that feeds it: a NaN/inf loss is found at the step it happens, on every rank.

The Trainer reports a loss only every ``logging_steps`` (and its ``logging_nan_inf_filter``, which the plan turns
off, would hide a non-finite one behind the running mean, at a device sync per micro-batch); a divergence would go
on poisoning the weights and, worse, be saved as the newest checkpoint, which ``--resume auto`` then continues from.
So :class:`OpsTrainer` flags a non-finite loss of every micro-batch on the device, and :class:`GuardCallback`
all-reduces the flags once per step, so every rank stops at the same step.

With ``ops.nonfinite_loss: stop`` or ``skip`` the step's checkpoint is not saved (its weights took the non-finite
update), the run stops, and train.py writes ``nonfinite-step-N/`` (a report naming the last good checkpoint, each
rank's offending batch) and exits ``exitcodes.EXIT_NONFINITE``. Under ``stop`` the Job's exitCode policy ends the
Job (TerminateJob): a restart would replay the same keyed data order into the same NaN until ``maxRetry``. Under
``skip`` the Job restarts from the last good checkpoint and the resume leaves the step's batch out (a ``skip``
record in recovery.jsonl; sampler.py). With ``warn`` it is a warning with the step.

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

from ..boundary import filenames, jsonfile
from ..boundary.common import LOG
from ..boundary.resume import checkpointdirs
from ..volume.rowledger import ROWS_KEY, RowLedger
from .faults import Faults


class LossGuard:
    """What this rank saw of the current step: whether a micro-batch loss was not finite, and the step's batches.

    The check stays on the device until the step ends (one flag per step), so it adds no synchronisation per
    micro-batch; :meth:`agree` all-reduces it once per step.
    """

    def __init__(self) -> None:
        self.flag: torch.Tensor | None = None
        self.seen: list[tuple[torch.Tensor, Any]] = []  # (loss, inputs) of the current step's micro-batches
        self.nonfinite: list[float] = []  # this rank's non-finite losses of the step the run stopped at
        self.batch: Any = None
        self.stopped_at: int | None = None
        self.ranks: list[int] = []
        self.steps_per_epoch: int | None = None  # of the stopped run (to place the step's batch in its epoch)

    def observe(self, loss: torch.Tensor, inputs: Any) -> None:
        bad = ~torch.isfinite(loss.detach()).all()
        self.flag = bad if self.flag is None else self.flag | bad
        self.seen.append((loss.detach(), inputs))

    def agree(self, device: torch.device) -> list[int]:
        """The ranks that saw a non-finite loss this step (every rank gets the same list)."""
        mine = self.flag.float().to(device) if self.flag is not None else torch.zeros((), device=device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flags = torch.zeros(torch.distributed.get_world_size(), device=device)
            flags[torch.distributed.get_rank()] = mine
            torch.distributed.all_reduce(flags)
            return [i for i, f in enumerate(flags.tolist()) if f > 0]
        return [0] if float(mine) > 0 else []

    def keep_offending(self) -> None:
        """Keep this rank's non-finite losses and the first batch that produced one (for the report)."""
        for loss, inputs in self.seen:
            value = float(loss.float().mean())
            if not math.isfinite(value):
                self.nonfinite.append(value)
                self.batch = inputs if self.batch is None else self.batch

    def reset(self) -> None:
        self.flag, self.seen = None, []


class OpsTrainer(Trainer):
    """The Trainer, with each step's batch wait timed, each micro-batch's loss checked, and (testing only) a
    poisoned loss at ``ops.testing.nan_at_step`` and each micro-batch's rows in the ledger."""

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
        if self.faults is not None and self.faults.poison_loss(self.state.global_step + 1):
            if return_outputs:
                return result[0] * float("nan"), result[1]
            return result * float("nan")
        return result

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
        ranks = self.guard.agree(args.device)
        step = state.global_step
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


def nonfinite_report(guard: LossGuard, output_dir: Path, rank: int, log_history: list[dict[str, Any]]) -> Path:
    """Write what can be saved of a stopped run into ``nonfinite-step-N/``: each rank its offending batch, rank 0
    the report (the step, the ranks, the last good checkpoint, the recent logs). Returns the directory."""
    step = guard.stopped_at or 0
    where = output_dir / f"{filenames.NONFINITE_PREFIX}{step}"
    if guard.batch is not None:
        batch = {k: v.tolist() for k, v in guard.batch.items() if isinstance(v, torch.Tensor)}
        jsonfile.replace_text(where / f"batch-rank-{rank}.json", json.dumps(batch) + "\n")
    if rank == 0:
        last_good = checkpointdirs.latest_complete_checkpoint(output_dir)
        report = {
            "step": step,
            "ranks": guard.ranks,
            "losses_rank_0": [str(v) for v in guard.nonfinite],
            "last_good_checkpoint": str(last_good) if last_good else None,
            "recent_logs": log_history[-10:],
        }
        jsonfile.replace_text(where / "report.json", json.dumps(report, indent=2, default=str) + "\n")
    LOG.debug("non-finite loss report in %s", where)
    return where
