"""Shard rows as Megatron samples: which row sample ``i`` of a run is, and the tensors Bridge's forward step takes.

Sample ``i`` of the run is row ``order(epoch)(i mod rows)`` of the train split, ``epoch = i // rows``: the keyed
permutation the Trainer's sampler draws from (boundary/order.py, seeded alike), so step ``k`` of either engine trains
on the same rows. A row becomes Megatron's convention: ``tokens`` the row's ids, ``labels[t]`` the next id,
``loss_mask[t]`` 1 where that next token is learned (its label in the row is not -100: the last token, SFT prompts
and a packed sample's first token are not), everything padded to ``seq_length`` with a zero mask. The loss is then
the Trainer's: the mean over the learned tokens of the global batch. Packed rows also carry their ``position_ids``
(restarting at every sample) and a block-diagonal causal ``attention_mask`` (True where masked): the local attention
honours it; on Transformer Engine the THD form (cu_seqlens) would be faster and is not produced here.

No Bridge import (provider.py has the hook), so the tests check it with torch alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..boundary.order import Permutation
from ..data.samples import IGNORE_INDEX


class OrderedRows(torch.utils.data.Dataset):
    """``samples`` rows of ``split`` in the keyed order of each epoch, as Megatron samples of ``seq_length``."""

    def __init__(self, split: Any, samples: int, seed: int, seq_length: int, pad_id: int):
        self.split, self.samples, self.seed = split, samples, seed
        self.seq_length, self.pad_id = seq_length, pad_id
        self._orders: dict[int, Permutation] = {}

    def __len__(self) -> int:
        return self.samples

    def row_of(self, index: int) -> int:
        size = len(self.split)
        epoch, position = divmod(index, size)
        order = self._orders.get(epoch)
        if order is None:
            order = self._orders[epoch] = Permutation(size, self.seed, epoch)
        return int(order(np.array([position], dtype=np.uint64))[0])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return megatron_sample(self.split[self.row_of(index)], self.seq_length, self.pad_id)


def megatron_sample(row: dict[str, list[int]], seq_length: int, pad_id: int) -> dict[str, torch.Tensor]:
    """One shard row (shards.read_row: ids, HF labels, packed positions) as Megatron's tokens/labels/loss_mask."""
    ids = row["input_ids"][:seq_length]
    count = len(ids)
    hf_labels = row.get("labels", ids)[:seq_length]
    tokens = torch.full((seq_length,), pad_id, dtype=torch.long)
    tokens[:count] = torch.tensor(ids, dtype=torch.long)
    labels = torch.full((seq_length,), pad_id, dtype=torch.long)
    loss_mask = torch.zeros(seq_length, dtype=torch.float)
    if count > 1:
        labels[: count - 1] = torch.tensor(ids[1:], dtype=torch.long)
        learned = torch.tensor([label != IGNORE_INDEX for label in hf_labels[1:]], dtype=torch.float)
        loss_mask[: count - 1] = learned
    positions = row.get("position_ids")
    if positions is None:
        return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": torch.arange(seq_length)}
    position_ids = torch.zeros(seq_length, dtype=torch.long)
    position_ids[:count] = torch.tensor(positions[:seq_length], dtype=torch.long)
    position_ids[count:] = torch.arange(seq_length - count)  # the padding: a pseudo-sample of its own
    sample = torch.cumsum((position_ids == 0).long(), dim=0)
    causal = torch.ones(seq_length, seq_length, dtype=torch.bool).tril()
    allowed = causal & (sample[:, None] == sample[None, :])
    return {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": position_ids,
        "attention_mask": (~allowed).unsqueeze(0),
    }
