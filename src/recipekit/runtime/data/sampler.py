"""The training order's sampler (the permutation itself is order.py) and the Trainer that uses it.

Resuming is exact: the order is a function of (seed, epoch, position) alone — not of a random generator's state —
so after a restart the Trainer's own fast-forward (``skip_first_batches``: global_step × gradient accumulation
batches of the current epoch, skipped as indices, no row read) lands on the very sample that followed the
checkpoint. Accelerate shards the batches over the ranks as it does for any sampler (batch i to rank i mod world).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from transformers import Trainer

from ..boundary.order import BLOCK, Permutation


class ResumableSampler(torch.utils.data.Sampler):
    """Row indices of one epoch in the permutation's order; ``set_epoch`` (the Trainer calls it) picks the epoch."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def order(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Positions [start, stop) of this epoch's order."""
        stop = self.size if stop is None else min(stop, self.size)
        return Permutation(self.size, self.seed, self.epoch)(np.arange(start, stop, dtype=np.uint64))

    def __iter__(self) -> Iterator[int]:
        permutation = Permutation(self.size, self.seed, self.epoch)
        for begin in range(0, self.size, BLOCK):
            yield from permutation(np.arange(begin, min(begin + BLOCK, self.size), dtype=np.uint64)).tolist()


class PreparedTrainer(Trainer):
    """The Trainer, drawing training rows in :class:`ResumableSampler`'s order (``data_seed`` or ``seed``)."""

    row_sampler: ResumableSampler | None = None

    def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler | None:
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        self.row_sampler = ResumableSampler(len(dataset), seed)  # its epoch names the rows' epoch (rowledger.py)
        return self.row_sampler
