"""The training order's sampler (the permutation itself is order.py) and the Trainer that uses it.

Resuming is exact: the order is a function of (seed, epoch, position) alone — not of a random generator's state —
so after a restart the Trainer's own fast-forward (``skip_first_batches``: global_step × gradient accumulation
batches of the current epoch, skipped as indices, no row read) lands on the very sample that followed the
checkpoint. Accelerate shards the batches over the ranks as it does for any sampler (batch i to rank i mod world).

A batch skipped after a non-finite loss (``ops.nonfinite_loss: skip``) is left out of its epoch's order on every
later attempt: the positions after it move up, and the epoch's last positions are filled with rows the epoch has
already trained on, so every epoch keeps its length and the Trainer's step arithmetic (and its fast-forward) holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from transformers import Trainer

from ..boundary.order import BLOCK, Permutation

#: One skipped batch: its epoch and the positions ``[start, stop)`` of the epoch's order it took (recovery.jsonl).
Skip = tuple[int, int, int]


def step_positions(step: int, steps_per_epoch: int, rows_per_step: int, size: int) -> Skip:
    """The epoch of optimizer step ``step`` (from 1) and the positions of its batch in that epoch's order: every
    epoch has ``steps_per_epoch`` steps of ``rows_per_step`` consecutive positions (all ranks' micro-batches)."""
    per_epoch = max(1, steps_per_epoch)
    epoch, within = divmod(step - 1, per_epoch)
    start = min(within * rows_per_step, size)
    return epoch, start, min(start + rows_per_step, size)


def without(positions: np.ndarray, start: int, stop: int, size: int) -> np.ndarray:
    """Positions of an order that leaves out ``[start, stop)``: those after it move up, and the last ``stop - start``
    are filled with the positions just before the gap (just after it when the gap opens the epoch)."""
    width = stop - start
    p = positions.astype(np.int64)
    keep = size - width
    fill = start - width if start >= width else stop
    moved = np.where(p < start, p, np.where(p < keep, p + width, fill + (p - keep)))
    return (moved % max(1, size)).astype(np.uint64)


class ResumableSampler(torch.utils.data.Sampler):
    """Row indices of one epoch in the permutation's order; ``set_epoch`` (the Trainer calls it) picks the epoch.
    ``skipped``: the batches a non-finite loss left out, oldest first (each in the order in effect when it was)."""

    def __init__(self, size: int, seed: int, skipped: tuple[Skip, ...] = ()):
        self.size, self.seed, self.epoch = size, seed, 0
        self.skipped = skipped

    def positions(self, positions: np.ndarray) -> np.ndarray:
        """The positions of the plain order that ``positions`` of this epoch's order (skips applied) stand for."""
        for epoch, start, stop in reversed(self.skipped):
            if epoch == self.epoch:
                positions = without(positions, start, stop, self.size)
        return positions

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def order(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Positions [start, stop) of this epoch's order."""
        stop = self.size if stop is None else min(stop, self.size)
        return Permutation(self.size, self.seed, self.epoch)(self.positions(np.arange(start, stop, dtype=np.uint64)))

    def __iter__(self) -> Iterator[int]:
        permutation = Permutation(self.size, self.seed, self.epoch)
        for begin in range(0, self.size, BLOCK):
            block = np.arange(begin, min(begin + BLOCK, self.size), dtype=np.uint64)
            yield from permutation(self.positions(block)).tolist()


class PreparedTrainer(Trainer):
    """The Trainer, drawing training rows in :class:`ResumableSampler`'s order (``data_seed`` or ``seed``)."""

    row_sampler: ResumableSampler | None = None
    skipped_batches: tuple[Skip, ...] = ()  # ops.nonfinite_loss: skip (recovery.jsonl's skip records)

    def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler | None:
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        # its epoch names the rows' epoch (rowledger.py)
        self.row_sampler = ResumableSampler(len(dataset), seed, self.skipped_batches)
        return self.row_sampler
