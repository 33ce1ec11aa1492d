"""Streamed training data (``data.streaming``): chunks tokenised while training, for a corpus with no room for shards.

Some corpora do not fit the shared volume, or live only behind an object-storage FUSE mount. For them the input is
read during training instead of being prepared first: :class:`StreamDataset` walks the input chunks (sources.py)
epoch after epoch, makes each chunk into rows in memory with the very code the prepare step uses
(:class:`prepare.ChunkRows`: the same tokenising, masking and packing, so a streamed row equals the prepared row)
and yields them as the collator takes them. It never ends: the Trainer stops at ``max_steps``.

* **Order.** Epoch e visits the chunks in the order of a permutation keyed by (seed, e) (sampler.py's Feistel
  network) and each chunk's rows in a permutation keyed by (seed, chunk, e): a function of the position alone, as
  the prepared order is, but shuffled only within a chunk (a chunk is 64 MiB of input by default).
* **Distribution.** Every rank reads and tokenises the whole stream and keeps its share: the Trainer's
  IterableDatasetShard gives rank r the r-th micro-batch of each ``world × micro`` rows. Accelerate's default,
  rank 0 reading and dispatching, would concatenate the ranks' batches, which differ in padded length for SFT; and
  either way one process's tokenising rate bounds the whole job's. No DataLoader workers: each would read the whole
  stream again (the plan renders ``dataloader_num_workers: 0``).
* **Resumption.** The rows a chunk yields are a function of the chunk alone, so each chunk's count is recorded once
  known, and rank 0 writes the counts into every checkpoint (``filenames.STREAM_STATE_FILE``, by
  :class:`StreamStateCallback`). A resumed run starts at row ``step × rows per step``: whole chunks are skipped by
  their recorded counts, and only the chunk the row falls in is tokenised again. The Trainer's own skip, which
  would read the stream from its start, is off (``ignore_data_skip``).
* **Bad records.** ``data.max_bad_records`` counts across the stream (each chunk once, also across epochs and
  resumes); one more stops the run with the prepare step's message (file, line or row, field).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from ..boundary import filenames
from ..boundary.common import RunError
from ..boundary.order import Permutation
from ..volume import manifest
from .fingerprint import Settings
from .prepare import ChunkRows, verdict
from .records import DataError
from .shards import read_row
from .sources import InputFile, plan_chunks

#: What a chunk's entry in the stream state keeps: its rows and what the bad-record rule needs.
KEPT = ("rows", "records", "bad", "bad_examples", "dropped")
STATE_FORMAT = "recipekit-stream"
STATE_VERSION = 1


class StreamDataset(torch.utils.data.IterableDataset):
    """The training rows of ``files``, made chunk by chunk as they are needed, from row ``start_row`` on.

    ``known`` holds chunk entries of an earlier run (:meth:`state`): chunks it counts are skipped unread.
    ``tokenised`` counts the chunks this process made into rows (what a resume avoids)."""

    def __init__(
        self,
        files: list[InputFile],
        settings: Settings,
        tokenizer: Any,
        dtype: str,
        *,
        start_row: int = 0,
        known: dict[int, dict[str, Any]] | None = None,
    ):
        super().__init__()
        self.files, self.settings, self.tokenizer, self.dtype = files, settings, tokenizer, dtype
        self.chunks = plan_chunks(files, settings.chunk_bytes)
        self.start_row = start_row
        self.known: dict[int, dict[str, Any]] = dict(known or {})
        self.tokenised = 0

    def chunk_order(self, epoch: int) -> list[int]:
        """The chunk indices epoch ``epoch`` visits, in order."""
        size = len(self.chunks)
        return Permutation(size, self.settings.seed, epoch)(np.arange(size, dtype=np.uint64)).tolist()

    def row_order(self, chunk: int, rows: int, epoch: int) -> np.ndarray:
        """The order of a chunk's rows in ``epoch``: keyed by the chunk as well, so chunks are not shuffled alike."""
        key = int.from_bytes(hashlib.blake2b(f"{self.settings.seed}:{chunk}".encode(), digest_size=8).digest(), "big")
        return Permutation(rows, key, epoch)(np.arange(rows, dtype=np.uint64))

    def __iter__(self) -> Iterator[dict[str, list[int]]]:
        worker = torch.utils.data.get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise RunError("a streamed dataset reads in one process: set dataloader_num_workers to 0 or 1")
        skip, epoch = self.start_row, 0
        while True:
            for index in self.chunk_order(epoch):
                entry = self.known.get(index)
                if entry is not None and skip >= entry["rows"]:
                    skip -= entry["rows"]
                    continue
                kind, arrays, rows = self._make(index)
                if skip >= rows:
                    skip -= rows
                    continue
                for row in self.row_order(index, rows, epoch)[skip:].tolist():
                    yield read_row(kind, *arrays, row)
                skip = 0
            if not sum(self.known[index]["rows"] for index in range(len(self.chunks))):
                if self.settings.format == "text":
                    raise RunError(f"the data yields no full block of max_len={self.settings.max_len} tokens")
                raise RunError(f"no sample has an answer within max_len={self.settings.max_len} tokens")
            epoch += 1

    def _make(self, index: int) -> tuple[str, tuple[np.ndarray, np.ndarray, np.ndarray | None], int]:
        """Chunk ``index`` as rows: its kind, arrays and count; its entry recorded, the bad-record limit applied."""
        chunk = self.chunks[index]
        file = self.files[chunk.file]
        made = ChunkRows(file, chunk, self.settings, self.tokenizer, self.dtype, lambda records, tokens: None)
        try:
            record = made.run()
        except DataError as exc:  # the file cannot be read on: fatal whatever max_bad_records says
            raise RunError(str(exc)) from None
        self.tokenised += 1
        writer = made.writers[manifest.SPLITS[0]]
        entry = {"chunk": index, "file": file.name, "part": chunk.part, **record, "rows": writer.rows}
        self.known[index] = {key: entry[key] for key in ("chunk", "status", *KEPT)}
        problem = verdict(list(self.known.values()), self.settings, len(self.chunks))
        if problem is not None:
            raise problem
        return self.settings.row_kind, writer.arrays(), writer.rows

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the stream: every chunk's count known so far (a function of the chunk)."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "chunks": len(self.chunks),
            "known": {str(index): entry for index, entry in sorted(self.known.items())},
        }


def known_chunks(checkpoint: Path | None, chunks: int) -> dict[int, dict[str, Any]] | None:
    """The chunk entries a checkpoint recorded, or None when it has none usable (of another input, or older)."""
    if checkpoint is None:
        return None
    state = manifest.read_json(checkpoint / filenames.STREAM_STATE_FILE)
    if not state or state.get("format") != STATE_FORMAT or state.get("chunks") != chunks:
        return None
    return {int(index): entry for index, entry in (state.get("known") or {}).items()}


class StreamStateCallback(TrainerCallback):
    """Rank 0 writes the stream's chunk counts into each checkpoint, after the Trainer's own files."""

    def __init__(self, dataset: StreamDataset):
        self.dataset = dataset

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        checkpoint = Path(args.output_dir) / f"{filenames.CHECKPOINT_PREFIX}{state.global_step}"
        if checkpoint.is_dir():
            manifest.write_json(checkpoint / filenames.STREAM_STATE_FILE, self.dataset.state())


class ResumeRandomState(TrainerCallback):
    """Restores the checkpoint's random state before the first step of a resumed streaming run.

    The Trainer restores it itself only after skipping batches (or at an epoch's start); with ``ignore_data_skip``
    it would not, and dropout would draw other masks than the unbroken run. So it is done here, at the point the
    Trainer's own skip would do it: after the first step's batches are drawn, before the step begins."""

    def __init__(self, trainer: Any, checkpoint: str):
        self.trainer, self.checkpoint = trainer, checkpoint

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.checkpoint:
            self.trainer._load_rng_state(self.checkpoint)  # the Trainer's own restore (no public name for it)
            self.checkpoint = ""
