"""The loss guard's state and its reports, engine-neutral (torch only): what a rank saw of a step's losses, the
ranks' verdict (one all-reduce per step, which also tells every rank each rank's loss), ``nonfinite-step-N/`` for a
NaN/inf loss and ``loss-spike-step-N/`` for a spike. The Trainer feeds it from its training step (guard.py); the
Megatron room from the step function it hands Bridge (each micro-batch's loss from Bridge's loss function, each
batch's token ids from the data iterator) and agrees at Bridge's step-end event (runtime/megatron/ops.py). guard.py
says why a step must stop.

A loss spike is the alerts' (alerts.py ``loss_jump``: the logged loss rose more than ``loss_spike_ratio`` over the
previous logged one). The logged loss is every rank's mean, so it cannot say whose batch rose; the guard can: it
keeps each rank's loss of the steps since the last log and this rank's micro-batches, and at the alert every rank
writes the fingerprints of its batches (sha256 of their token ids) and rank 0 the ranks' losses, highest first.
No batch is copied from the device unless a spike is reported.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..boundary import filenames, jsonfile
from ..boundary.common import LOG
from ..boundary.resume import checkpointdirs

#: The label of a position that trains nothing (transformers' ignore index).
LABEL_IGNORED = -100
#: Loss-spike reports one process writes at most (a noisy run's alert may fire often; the alert still counts each).
MAX_SPIKE_REPORTS = 10


@dataclass(frozen=True)
class StepLosses:
    """One step as the guard saw it: each rank's loss, its label tokens, and this rank's micro-batches' token ids.

    A rank's loss is the sum of its micro-batch losses as the engine scales them (the Trainer divides each token's
    loss by the step's tokens over every rank: a rank's share, not its mean; Megatron's loss function sums its
    tokens' losses), None for a rank that has none (a pipeline stage before the last); its tokens are the label
    tokens that loss is over. ``batches``: the token ids of this rank's micro-batches (a pipeline stage reads them
    whether or not it computes the loss)."""

    step: int
    losses: list[float | None]
    tokens: list[int | None]
    batches: list[Any]

    def per_token(self) -> list[float | None]:
        """Each rank's loss per label token: comparable across ranks whatever their token counts (the shares'
        common scale cancels); the loss itself where tokens are not known."""
        return [
            None if loss is None else loss / tokens if tokens else loss
            for loss, tokens in zip(self.losses, self.tokens)
        ]

    def highest(self) -> list[int]:
        """The ranks with a loss, highest loss per token first."""
        ranked = [(loss, rank) for rank, loss in enumerate(self.per_token()) if loss is not None]
        return [rank for _, rank in sorted(ranked, key=lambda pair: (-_sortable(pair[0]), pair[1]))]


def _sortable(loss: float) -> float:
    return math.inf if math.isnan(loss) else loss


class LossGuard:
    """What this rank saw of the current step: whether a micro-batch loss was not finite, the step's losses and
    batches; and the steps since the last logged one (:attr:`window`, for a spike's report).

    The check stays on the device until the step ends (one flag and one loss sum per step), so it adds no
    synchronisation per micro-batch; :meth:`agree` all-reduces them once per step.
    """

    def __init__(self) -> None:
        self.flag: torch.Tensor | None = None
        #: (loss, inputs, label tokens where the engine counted them) of the current step's micro-batches
        self.seen: list[tuple[torch.Tensor, Any, torch.Tensor | None]] = []
        self.batches: list[torch.Tensor | None] = []  # the token ids of this rank's micro-batches of the step
        self.nonfinite: list[float] = []  # this rank's non-finite losses of the step the run stopped at
        self.batch: Any = None
        self.stopped_at: int | None = None
        self.ranks: list[int] = []
        self.steps_per_epoch: int | None = None  # of the stopped run (to place the step's batch in its epoch)
        self.window: collections.deque[StepLosses] = collections.deque(maxlen=1)  # keep_steps sets the interval
        self.spike_reports = 0

    def observe(self, loss: torch.Tensor, inputs: Any, tokens: torch.Tensor | None = None) -> None:
        """A micro-batch's loss on this rank, with its inputs (the Trainer's: their labels are counted, their token
        ids kept) or the label ``tokens`` the engine counted (Megatron's loss function; its batches come apart,
        :meth:`observe_batch`)."""
        bad = ~torch.isfinite(loss.detach()).all()
        self.flag = bad if self.flag is None else self.flag | bad
        self.seen.append((loss.detach(), inputs, tokens))
        if inputs is not None:
            self.batches.append(_token_ids(inputs))

    def observe_batch(self, ids: torch.Tensor | None) -> None:
        """The token ids of a micro-batch this rank read, where its loss is another stage's (or observed apart)."""
        self.batches.append(ids)

    def agree(self, device: torch.device, step: int) -> list[int]:
        """The ranks that saw a non-finite loss at ``step`` (every rank gets the same list); the step's losses of
        every rank join :attr:`window`."""
        mine = torch.zeros(4, device=device)  # flag, loss sum, micro-batches seen, label tokens (0: not known)
        if self.flag is not None:
            mine[0] = self.flag.float().to(device)
        if self.seen:
            mine[1] = torch.stack([loss.float().sum() for loss, _, _ in self.seen]).sum().to(device)
            mine[2] = len(self.seen)
            counts = [_label_tokens(inputs, tokens) for _, inputs, tokens in self.seen]
            if all(count is not None for count in counts):  # counted where they are: no copy, no sync
                mine[3] = torch.stack([c.float().to(device) for c in counts if c is not None]).sum()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            table = torch.zeros(torch.distributed.get_world_size(), 4, device=device)
            table[torch.distributed.get_rank()] = mine
            torch.distributed.all_reduce(table)
            rows = table.tolist()
        else:
            rows = [mine.tolist()]
        losses = [loss if seen > 0 else None for _, loss, seen, _ in rows]
        tokens = [int(count) if seen > 0 and count > 0 else None for _, _, seen, count in rows]
        self.window.append(StepLosses(step, losses, tokens, list(self.batches)))
        return [i for i, (flag, _, _, _) in enumerate(rows) if flag > 0]

    def keep_steps(self, steps: int) -> None:
        """Keep the last ``steps`` steps in :attr:`window` (the engine's logging interval: a spike's report covers
        the steps the logged loss averaged)."""
        self.window = collections.deque(self.window, maxlen=max(1, steps))

    def keep_offending(self) -> None:
        """Keep this rank's non-finite losses and the first batch that produced one (for the report)."""
        for loss, inputs, _ in self.seen:
            value = float(loss.float().mean())
            if not math.isfinite(value):
                self.nonfinite.append(value)
                self.batch = inputs if self.batch is None else self.batch

    def reset(self) -> None:
        self.flag, self.seen, self.batches = None, [], []


def _label_tokens(inputs: Any, tokens: torch.Tensor | None) -> torch.Tensor | None:
    """A micro-batch's label tokens: as the engine counted them, else its labels that train (None: not known)."""
    if tokens is not None:
        return tokens.sum()
    if isinstance(inputs, dict) and isinstance(inputs.get("labels"), torch.Tensor):
        return (inputs["labels"] != LABEL_IGNORED).sum()
    return None


def _token_ids(inputs: Any) -> torch.Tensor | None:
    """A micro-batch's token ids, the one tensor of it the window keeps (where they stay: no copy, no sync)."""
    ids = inputs.get("input_ids") if isinstance(inputs, dict) else None
    return ids if isinstance(ids, torch.Tensor) else None


def batch_fingerprint(ids: torch.Tensor | None) -> dict[str, Any]:
    """A micro-batch as a fingerprint: the sha256 of its token ids (as int64, row-major) and their count."""
    if ids is None:
        return {"sha256": None, "tokens": None}
    data = ids.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "tokens": int(ids.numel())}


def spike_report(guard: LossGuard, step: int, message: str, output_dir: Path, rank: int) -> Path | None:
    """Write ``loss-spike-step-N/`` for the spike reported at logged step ``step``: each rank its micro-batches'
    fingerprints for the steps since the previous log, rank 0 ``report.json`` with every rank's loss at each of
    those steps (highest first). None once :data:`MAX_SPIKE_REPORTS` are written, and None when the output
    directory refuses the report (a link or another file planted on the shared volume where it goes: a warning,
    and training goes on, as for a report past the cap; the alert fires either way)."""
    if guard.spike_reports >= MAX_SPIKE_REPORTS or not guard.window:
        return None
    guard.spike_reports += 1
    where = output_dir / f"{filenames.LOSS_SPIKE_PREFIX}{step}"
    try:
        _write_spike_report(guard, step, message, where, rank)
    except OSError as exc:
        LOG.warning("loss spike at step %d: its report was not written (%s); training goes on", step, exc)
        return None
    return where


def _write_spike_report(guard: LossGuard, step: int, message: str, where: Path, rank: int) -> None:
    steps = list(guard.window)
    batches = {str(s.step): [batch_fingerprint(ids) for ids in s.batches] for s in steps}
    if any(ids is not None for s in steps for ids in s.batches):
        jsonfile.replace_text(where / f"batches-rank-{rank}.json", json.dumps(batches, indent=1) + "\n")
    if rank == 0:
        report = {
            "step": step,
            "message": message,
            "steps": [
                {
                    "step": s.step,
                    "losses": plain_losses(s.losses),
                    "tokens": s.tokens,
                    "highest_ranks": s.highest(),
                }
                for s in steps
            ],
            "batches": "batches-rank-R.json: rank R's micro-batches of each step, sha256 of their token ids",
        }
        jsonfile.replace_text(where / "report.json", json.dumps(report, indent=2) + "\n")


def plain_losses(losses: list[float | None]) -> list[float | str | None]:
    """Losses as JSON holds them: a non-finite one as its name."""
    return [loss if loss is None or math.isfinite(loss) else str(loss) for loss in losses]


def nonfinite_report(
    guard: LossGuard,
    output_dir: Path,
    rank: int,
    log_history: list[dict[str, Any]],
    last_good: Path | None = None,
) -> Path:
    """Write what can be saved of a stopped run into ``nonfinite-step-N/``: each rank its offending batch, rank 0
    the report (the step, the ranks, the last good checkpoint, the recent logs). Returns the directory.
    ``last_good``: the engine's newest resumable checkpoint (default: the Trainer's newest complete one)."""
    step = guard.stopped_at or 0
    where = output_dir / f"{filenames.NONFINITE_PREFIX}{step}"
    if guard.batch is not None:
        batch = {k: v.tolist() for k, v in guard.batch.items() if isinstance(v, torch.Tensor)}
        jsonfile.replace_text(where / f"batch-rank-{rank}.json", json.dumps(batch) + "\n")
    if rank == 0:
        last_good = last_good or checkpointdirs.latest_complete_checkpoint(output_dir)
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
