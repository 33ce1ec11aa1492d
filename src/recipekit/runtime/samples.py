"""Records → training rows: tokenised with prompt tokens masked, blocked for pretraining, packed, and collated.

Every row carries ``labels``: -100 (the loss's ignore_index) on each token the model must not learn (prompts,
padding, the first token of a packed sample). The datasets.map steps fingerprint their output by content, so every
rank and every restart finds the main process's cached result instead of tokenising again.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import datasets
import torch

from .chat import assistant_spans, conversations, render_chat
from .common import RunError, log0

IGNORE_INDEX = -100  # label value the loss skips (torch.nn.CrossEntropyLoss ignore_index)
MAP_BATCH = 1_000  # rows per datasets.map batch; also the window the packer fills its bins from


def encode_conversation(tokenizer: Any, messages: list[dict[str, str]], max_len: int) -> dict[str, list[int]]:
    """Token ids and labels of one conversation: labels are -100 on every prompt token; truncated to max_len."""
    text = render_chat(tokenizer, messages)
    spans = assistant_spans(tokenizer, messages, text)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"][:max_len]
    labels = [
        token if any(s <= start < e for s, e in spans) else IGNORE_INDEX
        for token, (start, _) in zip(ids, encoded["offset_mapping"])
    ]
    return {"input_ids": ids, "labels": labels}


def tokenize_conversations(batch: dict[str, list], tokenizer: Any, fmt: str, max_len: int) -> dict[str, list]:
    """datasets.map function: encode each record; drop those whose answer lies wholly beyond max_len."""
    out: dict[str, list] = {"input_ids": [], "labels": []}
    for messages in conversations(batch, fmt):
        sample = encode_conversation(tokenizer, messages, max_len)
        if any(label != IGNORE_INDEX for label in sample["labels"]):
            out["input_ids"].append(sample["input_ids"])
            out["labels"].append(sample["labels"])
    return out


def tokenize_into_blocks(batch: dict[str, list], tokenizer: Any, block_len: int) -> dict[str, list]:
    """datasets.map function for pretraining: documents joined with eos, cut into block_len token blocks.

    The tail shorter than a block at the end of each map batch is dropped (at most one block per batch).
    """
    stream: list[int] = []
    for ids in tokenizer([t for t in batch["text"] if t.strip()], add_special_tokens=False)["input_ids"]:
        stream += ids + [tokenizer.eos_token_id]
    usable = len(stream) // block_len * block_len
    return {"input_ids": [stream[i : i + block_len] for i in range(0, usable, block_len)]}


def pack_samples(batch: dict[str, list], max_len: int) -> dict[str, list]:
    """datasets.map function: pack samples into rows of at most max_len tokens, best-fit decreasing.

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
        return {key: torch.tensor(batch[key], dtype=torch.long) for key in keep}


def build_datasets(
    raw: datasets.Dataset,
    tokenizer: Any,
    data: Any,
    seed: int,
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """Tokenised (and for pretraining blocked, for SFT optionally packed) train and eval sets, cached by content."""
    workers = _map_workers(len(raw))
    if data.format == "text":
        tokenized = _map(raw, tokenize_into_blocks, tokenizer, workers, block_len=data.max_len)
        if not len(tokenized):
            raise RunError(f"data {data.path} yields no full block of max_len={data.max_len} tokens")
    else:
        tokenized = _map(raw, tokenize_conversations, tokenizer, workers, fmt=data.format, max_len=data.max_len)
        if len(tokenized) < len(raw):
            log0(
                "%d of %d samples dropped: their answer starts beyond max_len=%d",
                len(raw) - len(tokenized),
                len(raw),
                data.max_len,
                level=logging.WARNING,
            )
        if not len(tokenized):
            raise RunError(f"no sample of {data.path} has an answer within max_len={data.max_len}")
    train, evaluation = tokenized, None
    if data.eval_fraction > 0:
        split = tokenized.train_test_split(test_size=data.eval_fraction, seed=seed)
        train, evaluation = split["train"], split["test"]
    if data.format != "text" and data.packing:
        train = _map(train, pack_samples, None, workers, max_len=data.max_len)
        if evaluation is not None:
            evaluation = _map(evaluation, pack_samples, None, workers, max_len=data.max_len)
    return train, evaluation


def _map(
    dataset: datasets.Dataset, function: Any, tokenizer: Any, workers: int | None, **kwargs: Any
) -> datasets.Dataset:
    """``dataset.map(function)``, whose output columns replace the input's, with a fingerprint made of the input's,
    the tokenizer's content and the arguments.

    An explicit fingerprint makes every rank, and every restart, find the main process's cache files, whatever
    the pickling of a tokenizer object happens to produce. ``tokenizer`` (None for token-level steps) is passed on.
    """
    parts = [dataset._fingerprint, function.__name__, json.dumps(kwargs, sort_keys=True)]
    if tokenizer is not None:
        parts.append(_tokenizer_digest(tokenizer))
        kwargs["tokenizer"] = tokenizer
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    return dataset.map(
        function,
        batched=True,
        batch_size=MAP_BATCH,
        remove_columns=dataset.column_names,
        fn_kwargs=kwargs,
        num_proc=workers,
        new_fingerprint=digest,
        desc=function.__name__.replace("_", " "),
    )


def _tokenizer_digest(tokenizer: Any) -> str:
    content = tokenizer.backend_tokenizer.to_str() + str(tokenizer.chat_template)
    return hashlib.sha256(content.encode()).hexdigest()


def _map_workers(rows: int) -> int | None:
    """Worker processes for tokenisation: worth their start-up cost only on large data."""
    return min(8, os.cpu_count() or 1) if rows >= 50_000 else None
