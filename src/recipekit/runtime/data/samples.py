"""Records → training rows: tokenised with prompt tokens masked, blocked for pretraining, packed, and collated.

Every row carries ``labels``: -100 (the loss's ignore_index) on each token the model must not learn (prompts,
padding, the first token of a packed sample). The functions take and give column batches (``{"input_ids": [...],
...}``), the shape ``datasets.map(batched=True)`` uses: the prepare step (prepare.py) calls them on windows of
:data:`WINDOW` records in input order and stores their rows in shards (shards.py), which hand the very same rows
back to the collator.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..volume.rowledger import ROWS_KEY
from .chat import assistant_spans, conversations, render_chat

IGNORE_INDEX = -100  # label value the loss skips (torch.nn.CrossEntropyLoss ignore_index)
#: Records tokenised together, and samples packed together: the packer fills its bins from this many samples, and
#: pretraining's blocks run across the documents of one window (its shorter tail is dropped).
WINDOW = 1_000


def tokenize_conversations(batch: dict[str, list], tokenizer: Any, fmt: str, max_len: int) -> dict[str, list]:
    """Token ids and labels of each record's conversation, the batch's texts in one tokenizer call: labels are -100
    on every prompt token, ids truncated to max_len; a record whose answer lies wholly beyond max_len is dropped."""
    out: dict[str, list] = {"input_ids": [], "labels": []}
    chats = list(conversations(batch, fmt))
    if not chats:
        return out
    texts = [render_chat(tokenizer, messages) for messages in chats]
    spans = [assistant_spans(tokenizer, messages, text) for messages, text in zip(chats, texts)]
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    for ids, offsets, answer in zip(encoded["input_ids"], encoded["offset_mapping"], spans):
        ids = ids[:max_len]
        learned = _in_spans([start for start, _ in offsets[: len(ids)]], answer)
        if learned.any():
            out["input_ids"].append(ids)
            out["labels"].append(np.where(learned, ids, IGNORE_INDEX).tolist())
    return out


def _in_spans(starts: list[int], spans: list[tuple[int, int]]) -> np.ndarray:
    """Whether each token (by the character it starts at) lies in one of ``spans`` (sorted, disjoint)."""
    positions = np.asarray(starts, dtype=np.int64)
    if not spans:
        return np.zeros(len(positions), dtype=bool)
    lower = np.asarray([s for s, _ in spans], dtype=np.int64)
    upper = np.asarray([e for _, e in spans], dtype=np.int64)
    which = np.searchsorted(lower, positions, side="right") - 1
    return (which >= 0) & (positions < upper[np.maximum(which, 0)])


def tokenize_into_blocks(batch: dict[str, list], tokenizer: Any, block_len: int) -> dict[str, list]:
    """Pretraining rows: documents joined with eos, cut into block_len token blocks.

    The tail shorter than a block at the end of each batch is dropped (at most one block per window).
    """
    stream: list[int] = []
    eos = tokenizer.eos_token_id  # once: the attribute is a vocabulary lookup each time
    for ids in tokenizer([t for t in batch["text"] if t.strip()], add_special_tokens=False)["input_ids"]:
        stream.extend(ids)
        stream.append(eos)
    usable = len(stream) // block_len * block_len
    return {"input_ids": [stream[i : i + block_len] for i in range(0, usable, block_len)]}


def pack_samples(batch: dict[str, list], max_len: int) -> dict[str, list]:
    """Pack samples into rows of at most max_len tokens, best-fit decreasing.

    Each row carries ``position_ids`` that restart at 0 for every sample. With no attention_mask, transformers
    derives a block-diagonal causal mask from them (sdpa, eager, flash), so no token attends to another sample and
    each sample sees the positions it would see alone. The first label of every sample is -100: it would otherwise
    be predicted from the previous sample's last token.
    """
    lengths = [len(ids) for ids in batch["input_ids"]]
    rooms: list[tuple[int, int]] = []  # (free tokens, bin index), sorted: bisect finds the tightest bin that fits
    bins: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        slot = bisect.bisect_left(rooms, (lengths[index], -1))
        if slot == len(rooms):
            bins.append([])
            room, target = max_len, len(bins) - 1
        else:
            room, target = rooms.pop(slot)
        bins[target].append(index)
        bisect.insort(rooms, (room - lengths[index], target))
    out: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": []}
    for members in bins:
        out["input_ids"].append([t for i in members for t in batch["input_ids"][i]])
        out["labels"].append([IGNORE_INDEX if k == 0 else t for i in members for k, t in enumerate(batch["labels"][i])])
        out["position_ids"].append([k for i in members for k in range(lengths[i])])
    return out


@dataclass
class SequenceCollator:
    """Right-pads a batch to its longest row. Labels are -100 on padding.

    Plain rows get an attention_mask (only when padding was added, so unpadded batches keep the fast causal path).
    Packed rows get none, since their mask comes from position_ids; their padding is a separate pseudo-sample.
    """

    pad_token_id: int

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        longest = max(len(row["input_ids"]) for row in rows)
        packed = "position_ids" in rows[0]
        batch: dict[str, list] = {"input_ids": [], "labels": [], "attention_mask": [], "position_ids": []}
        padded = False
        for row in rows:
            ids, pad = row["input_ids"], longest - len(row["input_ids"])
            padded = padded or pad > 0
            batch["input_ids"].append(ids + [self.pad_token_id] * pad)
            batch["labels"].append(list(row.get("labels", ids)) + [IGNORE_INDEX] * pad)
            if packed:
                batch["position_ids"].append(row["position_ids"] + list(range(pad)))
            else:
                batch["attention_mask"].append([1] * len(ids) + [0] * pad)
        keep = ["input_ids", "labels"] + (["position_ids"] if packed else ["attention_mask"] if padded else [])
        collated = {key: torch.tensor(batch[key], dtype=torch.long) for key in keep}
        if ROWS_KEY in rows[0]:  # the row ledger's indices (rowledger.py), popped before the model sees the batch
            collated[ROWS_KEY] = torch.tensor([row[ROWS_KEY] for row in rows], dtype=torch.long)
        return collated
