"""One chunk of input → its shards and its chunk record; every chunk record → the manifest.

A chunk (sources.py) is prepared in input order: records are read and checked, tokenised with prompt tokens
masked (samples.py) a window of :data:`~samples.WINDOW` records at a time, split into train and eval, packed or cut
into blocks, and written as one shard per split (shards.py). Everything that decides a row is a function of the
chunk's bytes and the settings — which worker does it, and when, never enters — so the shards are byte-identical
whether one worker prepares the data or a thousand.

* A bad record (unreadable, or missing or mistyped fields) is skipped and counted; the chunk records the first few
  with their file, line (or row) and field. Past ``data.max_bad_records`` in all, preparing fails with the earliest
  one named (workers.py decides, from the chunk records). A chunk that alone exceeds the limit stops early.
* The eval split is drawn per sample (SFT) or block (pretraining) from a hash of the seed, the chunk and the
  sample's place in it: the same split for any number of workers, drawn before packing, so no eval sample shares a
  row with training data.
* Samples are packed a window at a time in input order (best fit decreasing within the window), as the in-process
  path packed its datasets.map batches; pretraining blocks run across the documents of a window.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..boundary.common import RunError
from ..volume import manifest
from .fingerprint import Settings
from .records import DataError, describe
from .samples import WINDOW, pack_samples, tokenize_conversations, tokenize_into_blocks
from .shards import SUFFIXES, SplitWriter
from .sources import FIELDS, Chunk, InputFile, read_chunk

#: Bad records each chunk record keeps (with their locations); the count is always complete.
EXAMPLES_PER_CHUNK = 5
#: Bad records a manifest, or a failure, lists.
EXAMPLES = 20

Progress = Callable[[int, int], None]  # (records, tokens) added since the last call


def chunk_record_path(directory: Path, chunk: Chunk) -> Path:
    return directory / manifest.CHUNKS / f"{chunk.index:06d}.json"


def shard_name(split: str, chunk: Chunk) -> str:
    return f"{split}-{chunk.index:06d}"


def usable_record(directory: Path, chunk: Chunk, settings: Settings) -> dict[str, Any] | None:
    """This chunk's record from an earlier run, when it still stands: done with every shard file in place, or
    failed for a reason the data alone decides (an aborted chunk only under the same ``max_bad_records``)."""
    record = manifest.read_json(chunk_record_path(directory, chunk))
    if record is None or record.get("chunk") != chunk.index:
        return None
    status = record.get("status")
    if status == "failed" or (status == "aborted" and record.get("limit") == settings.max_bad_records):
        return record
    if status != "done":
        return None
    shards = directory / manifest.SHARDS
    for entry in (record.get("splits") or {}).values():
        for suffix in SUFFIXES:
            if suffix in entry.get("sha256", {}) and not (shards / f"{entry['name']}{suffix}").is_file():
                return None
    return record


class ChunkPreparer:
    """Prepares chunks of one dataset into ``directory`` with ``tokenizer``; one per worker process."""

    def __init__(self, directory: Path, files: list[InputFile], settings: Settings, tokenizer: Any, dtype: str):
        self.directory, self.files, self.settings = directory, files, settings
        self.tokenizer, self.dtype = tokenizer, dtype

    def prepare(self, chunk: Chunk, progress: Progress = lambda records, tokens: None) -> dict[str, Any]:
        """Prepare ``chunk``, write its shards and then its record (which marks it finished); return the record."""
        try:
            rows = ChunkRows(self.files[chunk.file], chunk, self.settings, self.tokenizer, self.dtype, progress)
            record = self._base(chunk) | rows.run()
            if record["status"] == "done":
                shards = self.directory / manifest.SHARDS
                record["splits"] = {
                    split: writer.write(shards, shard_name(split, chunk))
                    for split, writer in rows.writers.items()
                    if writer.rows
                }
        except DataError as exc:  # the file itself cannot be read on (a broken JSON array, a damaged Parquet file)
            record = self._base(chunk) | {"status": "failed", "message": str(exc)}
        manifest.write_json(chunk_record_path(self.directory, chunk), record)
        return record

    def _base(self, chunk: Chunk) -> dict[str, Any]:
        return {"chunk": chunk.index, "file": self.files[chunk.file].name, "part": chunk.part}


class ChunkRows:
    """One chunk made into rows, held in memory as one :class:`~shards.SplitWriter` per split: the prepare step
    writes them as the chunk's shards, the stream (stream.py) hands them to the Trainer. One code path for both is
    what keeps a streamed row identical, token for token and mask for mask, to the prepared one."""

    def __init__(
        self, file: InputFile, chunk: Chunk, settings: Settings, tokenizer: Any, dtype: str, progress: Progress
    ):
        self.file, self.chunk, self.progress = file, chunk, progress
        self.settings, self.fmt, self.tokenizer = settings, settings.format, tokenizer
        self.writers = {split: SplitWriter(settings.row_kind, dtype) for split in manifest.SPLITS}
        self.pending: dict[str, list[tuple[list[int], list[int]]]] = {split: [] for split in manifest.SPLITS}
        self.window: list[dict[str, Any]] = []
        self.records = self.bad = self.dropped = self.ordinal = 0
        self.examples: list[dict[str, str]] = []

    def run(self) -> dict[str, Any]:
        """Read, check, tokenise and pack the chunk into ``writers``; return what the chunk record says about it
        (status ``done``, or ``aborted`` when its bad records alone exceed ``max_bad_records``). A file that cannot
        be read on raises DataError."""
        limit = self.settings.max_bad_records
        for item in read_chunk(self.file, self.chunk, self.fmt):
            self.records += 1
            problem = item.checked(self.fmt)
            if problem is not None:
                self.bad += 1
                if len(self.examples) < EXAMPLES_PER_CHUNK:
                    self.examples.append({"where": str(item.locate()), "message": describe(*problem)})
                if self.bad > limit:
                    return self._record("aborted") | {"limit": limit}
                continue
            self.window.append(item.record)
            if len(self.window) == WINDOW:
                self._flush_window()
        self._flush_window()
        for split in manifest.SPLITS:
            self._pack(split, final=True)
        return self._record("done")

    def _record(self, status: str) -> dict[str, Any]:
        return {
            "status": status,
            "records": self.records,
            "bad": self.bad,
            "bad_examples": self.examples,
            "dropped": self.dropped,
        }

    def _split(self) -> str:
        """train or eval for the next sample (SFT) or block (pretraining), drawn by hash: see the module docstring."""
        ordinal, self.ordinal = self.ordinal, self.ordinal + 1
        fraction = self.settings.eval_fraction
        if not fraction:
            return "train"
        key = f"{self.settings.seed}:{self.chunk.index}:{ordinal}".encode()
        draw = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64
        return "eval" if draw < fraction else "train"

    def _flush_window(self) -> None:
        if not self.window:
            return
        batch = {field: [record.get(field) for record in self.window] for field in FIELDS[self.fmt]}
        count, self.window = len(self.window), []
        tokenizer, max_len = self.tokenizer, self.settings.max_len
        if self.fmt == "text":
            blocks = tokenize_into_blocks(batch, tokenizer, max_len)["input_ids"]
            chosen: dict[str, list[list[int]]] = {split: [] for split in manifest.SPLITS}
            for block in blocks:
                chosen[self._split()].append(block)
            for split, rows in chosen.items():
                self.writers[split].add({"input_ids": rows})
            self.progress(count, sum(len(b) for b in blocks))
            return
        encoded = tokenize_conversations(batch, tokenizer, self.fmt, max_len)
        self.dropped += count - len(encoded["input_ids"])
        plain: dict[str, dict[str, list]] = {split: {"input_ids": [], "labels": []} for split in manifest.SPLITS}
        for ids, labels in zip(encoded["input_ids"], encoded["labels"]):
            split = self._split()
            if self.settings.packing:
                self.pending[split].append((ids, labels))
            else:
                plain[split]["input_ids"].append(ids)
                plain[split]["labels"].append(labels)
        for split in manifest.SPLITS:
            if self.settings.packing:
                self._pack(split)
            else:
                self.writers[split].add(plain[split])
        self.progress(count, sum(len(ids) for ids in encoded["input_ids"]))

    def _pack(self, split: str, final: bool = False) -> None:
        """Pack full windows of pending samples (and, at the chunk's end, the rest)."""
        pending = self.pending[split]
        while len(pending) >= WINDOW or (final and pending):
            window, pending[:] = pending[:WINDOW], pending[WINDOW:]
            samples = {"input_ids": [ids for ids, _ in window], "labels": [labels for _, labels in window]}
            self.writers[split].add(pack_samples(samples, self.settings.max_len))


# ---------------------------------------------------------------------------------------------------- the manifest
def verdict(records: list[dict[str, Any]], settings: Settings, total: int) -> RunError | None:
    """Why the data cannot be used, judged from the chunk records at hand (any subset of the ``total``: a failure
    shows early), or None. The earliest problem in input order is the one named."""
    ordered = sorted(records, key=lambda r: r["chunk"])
    for record in ordered:
        if record.get("status") == "failed":
            return RunError(record["message"])
    bad = sum(int(r.get("bad", 0)) for r in ordered)
    if bad > settings.max_bad_records:
        first = next(example for r in ordered for example in r.get("bad_examples", []))
        if not settings.max_bad_records:
            return RunError(
                f"data error: {first['where']}: {first['message']} (data.max_bad_records is 0: a bad record is "
                "fatal; raise it to skip and count them)"
            )
        aborted = any(r.get("status") == "aborted" for r in ordered)
        return RunError(
            f"data error: {first['where']}: {first['message']} ({bad}{'+' if aborted else ''} bad records"
            f"{' so far' if aborted or len(ordered) < total else ''}, more than data.max_bad_records="
            f"{settings.max_bad_records})"
        )
    return None


def assemble(
    described: dict[str, Any],
    fingerprint: str,
    files: list[InputFile],
    records: list[dict[str, Any]],
    settings: Settings,
    dtype: str,
) -> dict[str, Any]:
    """The manifest, from every chunk's record; a RunError when the data cannot be trained on."""
    problem = verdict(records, settings, len(records))
    if problem is not None:
        raise problem
    ordered = sorted(records, key=lambda r: r["chunk"])
    per_file = {f.name: 0 for f in files}
    for record in ordered:
        per_file[record["file"]] += int(record["records"])
    for file in files:
        if not per_file[file.name]:
            raise DataError(file.path, "holds no records (only blank lines)")
    splits: dict[str, Any] = {}
    for split in manifest.SPLITS:
        shards = [r["splits"][split] for r in ordered if split in r.get("splits", {})]
        splits[split] = {
            "rows": sum(s["rows"] for s in shards),
            "tokens": sum(s["tokens"] for s in shards),
            "shards": shards,
        }
        if settings.row_kind != "blocks":
            splits[split]["learned"] = sum(s["learned"] for s in shards)
    if not splits["train"]["rows"]:
        if settings.format == "text":
            raise RunError(f"the data yields no full block of max_len={settings.max_len} tokens")
        raise RunError(f"no sample has an answer within max_len={settings.max_len} tokens")
    return {
        "format": manifest.FORMAT,
        "version": manifest.VERSION,
        "fingerprint": fingerprint,
        "inputs": described,
        "row_kind": settings.row_kind,
        "token_dtype": dtype,
        "max_len": settings.max_len,
        "chunks": len(ordered),
        "records": {
            "read": sum(int(r["records"]) for r in ordered),
            "bad": sum(int(r["bad"]) for r in ordered),
            "dropped": sum(int(r["dropped"]) for r in ordered),
        },
        "bad_examples": [example for r in ordered for example in r["bad_examples"]][:EXAMPLES],
        "splits": splits,
    }
