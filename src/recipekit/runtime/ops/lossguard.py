"""The loss guard's state and its report, engine-neutral (torch only): what a rank saw of a step's losses, the ranks'
verdict (one all-reduce per step) and ``nonfinite-step-N/``. The Trainer feeds it from its training step (guard.py);
the Megatron room from Bridge's step-end event (runtime/megatron/ops.py). guard.py says why a step must stop.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from ..boundary import filenames, jsonfile
from ..boundary.common import LOG
from ..boundary.resume import checkpointdirs


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
