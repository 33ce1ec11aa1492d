"""The shard format: training rows as memory-mapped token arrays, written once, read by every rank without a copy.

One shard is one split ("train" or "eval") of one input chunk, in three files:

* ``<name>.bin`` — every row's token ids, end to end, as uint16 when the vocabulary fits (ids < 65,536) else uint32;
* ``<name>.idx`` — uint64 row offsets into the tokens: row i is tokens[idx[i]:idx[i+1]] (rows + 1 entries);
* ``<name>.flg`` — one uint8 per token for SFT rows: bit 0 set where the label is the token (learned), clear where it
  is -100 (prompt, a packed sample's first token); bit 1 set where a packed sample begins. Pretraining blocks have
  no flags: their labels are their ids.

That is enough to hand back exactly the rows the tokenising functions made (samples.py): ``labels`` are the ids
where bit 0 is set, else -100; a packed row's ``position_ids`` restart at 0 at every bit-1 token. Reading a row costs
a slice of three memory maps, whatever the corpus size; nothing is loaded at start-up but the manifest. The layout
learns from Megatron's indexed datasets (token file + index file, memory-mapped) and MosaicML streaming's shards
(many files listed with their hashes in one index), with labels reduced to the one bit SFT needs.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from pathlib import Path
from typing import Any

import numpy as np

from ..boundary.common import RunError
from ..volume import manifest
from .samples import IGNORE_INDEX

#: What a row holds: pretraining blocks (ids), SFT samples (ids, labels), packed SFT rows (ids, labels, positions).
ROW_KINDS = ("blocks", "samples", "packed")
LEARNED, STARTS = 1, 2
SUFFIXES = (".bin", ".idx", ".flg")


def token_dtype(largest_id: int) -> str:
    """The narrowest token type that holds every id up to ``largest_id``."""
    return "uint16" if largest_id < 2**16 else "uint32"


class SplitWriter:
    """The rows of one split of one chunk, gathered as arrays and written as one shard."""

    def __init__(self, kind: str, dtype: str):
        if kind not in ROW_KINDS:
            raise ValueError(f"unknown row kind {kind!r}")
        self.kind, self.dtype = kind, np.dtype(dtype)
        self.ids: list[np.ndarray] = []
        self.flags: list[np.ndarray] = []
        self.lengths: list[int] = []

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def add(self, rows: dict[str, list]) -> None:
        """Append rows given as columns (``input_ids``, and ``labels``/``position_ids`` for SFT)."""
        lengths = [len(ids) for ids in rows["input_ids"]]
        if not lengths:
            return
        total = sum(lengths)
        ids = np.fromiter(itertools.chain.from_iterable(rows["input_ids"]), dtype=np.int64, count=total)
        if ids.min(initial=0) < 0 or ids.max(initial=0) > np.iinfo(self.dtype).max:
            raise ValueError(f"token ids outside {self.dtype.name}")
        self.ids.append(ids.astype(self.dtype))
        self.lengths.extend(lengths)
        if self.kind == "blocks":
            return
        labels = np.fromiter(itertools.chain.from_iterable(rows["labels"]), dtype=np.int64, count=total)
        learned = labels == ids
        if not (learned | (labels == IGNORE_INDEX)).all():
            raise ValueError("a label is neither its token nor -100: such rows cannot be stored as flags")
        flags = learned.astype(np.uint8)
        if self.kind == "packed":
            positions = np.fromiter(itertools.chain.from_iterable(rows["position_ids"]), dtype=np.int64, count=total)
            starts = positions == 0
            offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
            if not starts[offsets].all() or not (positions == _positions(starts)).all():
                raise ValueError("packed positions must count up from 0 in every sample")
            flags |= starts.astype(np.uint8) << 1
        self.flags.append(flags)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The shard's contents as its files hold them: tokens, row offsets and flags (None for blocks)."""
        tokens = np.concatenate(self.ids) if self.ids else np.zeros(0, self.dtype)
        offsets = np.zeros(self.rows + 1, dtype=np.uint64)
        offsets[1:] = np.cumsum(self.lengths)
        if self.kind == "blocks":
            return tokens, offsets, None
        return tokens, offsets, np.concatenate(self.flags) if self.flags else np.zeros(0, np.uint8)

    def write(self, directory: Path, name: str) -> dict[str, Any]:
        """Write the shard's files (each atomically) and return its manifest entry; nothing for an empty split."""
        tokens, offsets, flags = self.arrays()
        files = {".bin": tokens.tobytes(), ".idx": offsets.tobytes()}
        if flags is not None:
            files[".flg"] = flags.tobytes()
        entry: dict[str, Any] = {"name": name, "rows": self.rows, "tokens": int(tokens.size), "sha256": {}}
        for suffix, data in files.items():
            manifest.write_atomic(directory / f"{name}{suffix}", data)
            entry["sha256"][suffix] = hashlib.sha256(data).hexdigest()
        if self.kind != "blocks":
            entry["learned"] = int(np.count_nonzero(np.concatenate(self.flags) & LEARNED)) if self.flags else 0
        return entry


def _positions(starts: np.ndarray) -> np.ndarray:
    """Position ids that restart at 0 at every True of ``starts`` (the first element must be True)."""
    index = np.arange(starts.size)
    first = np.flatnonzero(starts)
    return index - first[np.searchsorted(first, index, side="right") - 1]


def read_row(kind: str, tokens: np.ndarray, offsets: np.ndarray, flags: np.ndarray | None, row: int) -> dict:
    """Row ``row`` of a shard's arrays (memory-mapped files, or :meth:`SplitWriter.arrays`) as the collator takes
    it: ``input_ids``, and ``labels`` (and ``position_ids`` for packed rows) rebuilt from the flags."""
    begin, end = int(offsets[row]), int(offsets[row + 1])
    ids = tokens[begin:end].astype(np.int64)
    out = {"input_ids": ids.tolist()}
    if flags is None:
        return out
    bits = flags[begin:end]
    out["labels"] = np.where(bits & LEARNED, ids, IGNORE_INDEX).tolist()
    if kind == "packed":
        out["position_ids"] = _positions((bits & STARTS) > 0).tolist()
    return out


class ShardDataset:
    """One split of a prepared dataset as a map-style dataset: ``dataset[i]`` is row i as the collator takes it.

    Shards are memory-mapped on first use, in each process that reads them (DataLoader workers included: the maps
    are not pickled), and their sizes checked against the manifest then, so start-up reads nothing but the manifest.
    """

    def __init__(self, directory: Path, listing: dict[str, Any], split: str):
        self.directory = Path(directory) / manifest.SHARDS
        self.kind, self.dtype = listing["row_kind"], np.dtype(listing["token_dtype"])
        self.shards = list((listing["splits"].get(split) or {}).get("shards") or [])
        self.ends = list(itertools.accumulate(int(s["rows"]) for s in self.shards))
        self.tokens = sum(int(s["tokens"]) for s in self.shards)
        self._maps: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": {}}

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        shard = bisect.bisect_right(self.ends, index)
        local = index - (self.ends[shard - 1] if shard else 0)
        return read_row(self.kind, *self._map(shard), local)

    def _map(self, shard: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if shard not in self._maps:
            entry = self.shards[shard]
            rows, tokens = int(entry["rows"]), int(entry["tokens"])
            expected = {".bin": tokens * self.dtype.itemsize, ".idx": (rows + 1) * 8}
            if self.kind != "blocks":
                expected[".flg"] = tokens
            for suffix, size in expected.items():
                path = self.directory / f"{entry['name']}{suffix}"
                actual = path.stat().st_size if path.is_file() else None
                if actual != size:
                    raise RunError(
                        f"prepared shard {path} is {'missing' if actual is None else f'{actual} bytes'}, the "
                        f"manifest says {size}: delete {self.directory.parent} to prepare the data again"
                    )
            name = self.directory / entry["name"]
            self._maps[shard] = (
                np.memmap(f"{name}.bin", dtype=self.dtype, mode="r"),
                np.memmap(f"{name}.idx", dtype=np.uint64, mode="r"),
                np.memmap(f"{name}.flg", dtype=np.uint8, mode="r") if self.kind != "blocks" else None,
            )
        return self._maps[shard]
