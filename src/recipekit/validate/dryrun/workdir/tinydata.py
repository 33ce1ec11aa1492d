"""A deterministic, memorisable toy dataset in each input format the bundle's train.py reads.

Tests and the dry run need data that (a) is valid in exactly the shape a real run expects, (b) has variable sample
lengths so padding, truncation and packing are exercised, and (c) is learnable by a two-layer model in a few dozen
steps so "the loss falls" is a real check. Every sample comes from a handful of rule-based tasks over a tiny word list
(repeat a word, count, spell backwards, a fixed fact), so the answer is a function of the prompt and the loss drops
fast. The same ``seed`` and ``n`` always give byte-identical files, in every file layout, holding the same records.

Only the standard library is used for JSON and text: the light CLI imports this module and must not pull in torch
or transformers. Parquet and Arrow files are written with pyarrow, imported only for them.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMATS = ("alpaca", "messages", "text")
#: File layouts by suffix; a path without one of them is a directory of several files.
LAYOUTS = (".jsonl", ".json", ".parquet", ".arrow", ".txt")
#: Layouts also written gzip-compressed, as ``<layout>.gz``.
COMPRESSIBLE = (".jsonl", ".json", ".txt")

_WORDS = ("red", "blue", "green", "cat", "dog", "fish", "sun", "moon", "tree", "rock", "bird", "star")
_SYSTEM = "You are a careful assistant. Answer with the result only."
_PARTS = 3  # a data *directory* is split over this many files, to exercise multi-file loading


def write_tiny_dataset(format: str, path: Path, n: int = 64, seed: int = 0) -> Path:
    """Write ``n`` samples of ``format`` to ``path`` and return the path written.

    - ``alpaca``: records with ``instruction``, ``input`` (often empty) and ``output``.
    - ``messages``: records with ``messages`` = [{role, content}, ...]: an optional system turn, one or two exchanges.
    - ``text``: documents of a few sentences; as records, a ``text`` field.

    The suffix of ``path`` picks the layout: ``.jsonl`` (JSON lines), ``.json`` (one JSON array, indented as
    ``alpaca_data.json`` is), ``.parquet``, ``.arrow`` (Arrow IPC stream, as datasets.save_to_disk writes) or, for
    text, ``.txt`` (documents separated by a blank line). Any other path becomes a directory of several files:
    ``part-NNNNN.txt`` for text, ``part-NNNNN.jsonl`` otherwise, the samples dealt round-robin. ``.jsonl.gz``,
    ``.json.gz`` and ``.txt.gz`` write those layouts gzip-compressed, with no time stamp in the header (mtime 0), so
    the compressed bytes are as deterministic as the plain ones.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown data format {format!r}; expected one of {', '.join(FORMATS)}")
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    path = Path(path)
    layout = _layout(path)
    if layout == ".txt" and format != "text":
        raise ValueError(f"a .txt file holds text documents, not {format} records")
    records = tiny_records(format, n, seed)
    if layout in LAYOUTS:
        return _write(path, records)
    path.mkdir(parents=True, exist_ok=True)
    suffix = ".txt" if format == "text" else ".jsonl"
    for index in range(min(_PARTS, n)):
        _write(path / f"part-{index:05d}{suffix}", records[index::_PARTS])
    return path


def tiny_records(format: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """The ``n`` records every layout of ``write_tiny_dataset(format, ..., n, seed)`` holds, in file order."""
    rng = random.Random(seed)
    if format == "alpaca":
        return [_alpaca_record(rng) for _ in range(n)]
    if format == "messages":
        return [{"messages": _conversation(rng)} for _ in range(n)]
    return [{"text": _paragraph(rng)} for _ in range(n)]


# ----------------------------------------------------------------------------------------------------- tasks
def _repeat(rng: random.Random) -> tuple[str, str, str]:
    word, times = rng.choice(_WORDS), rng.randint(1, 12)
    return "Repeat the word the given number of times.", f"{word} {times}", " ".join([word] * times)


def _count(rng: random.Random) -> tuple[str, str, str]:
    start = rng.randint(0, 20)
    stop = start + rng.randint(1, 24)
    return f"Count from {start} to {stop}.", "", " ".join(str(i) for i in range(start, stop + 1))


def _backwards(rng: random.Random) -> tuple[str, str, str]:
    words = rng.sample(_WORDS, rng.randint(1, 4))
    return "Spell each word backwards.", " ".join(words), " ".join(w[::-1] for w in words)


def _fact(rng: random.Random) -> tuple[str, str, str]:
    return "Name the three colours you know.", "", "red blue green"


_TASKS: tuple[Callable[[random.Random], tuple[str, str, str]], ...] = (_repeat, _count, _backwards, _fact)


def _task(rng: random.Random) -> tuple[str, str, str]:
    return rng.choice(_TASKS)(rng)


def _alpaca_record(rng: random.Random) -> dict[str, str]:
    instruction, given, answer = _task(rng)
    return {"instruction": instruction, "input": given, "output": answer}


def _conversation(rng: random.Random) -> list[dict[str, str]]:
    turns = [{"role": "system", "content": _SYSTEM}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 2)):
        instruction, given, answer = _task(rng)
        prompt = f"{instruction}\n{given}" if given else instruction
        turns += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    return turns


def _paragraph(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(1, 6)):
        word, colour = rng.choice(_WORDS[3:]), rng.choice(_WORDS[:3])
        start = rng.randint(0, 9)
        sentences.append(f"the {word} is {colour}. {' '.join(str(i) for i in range(start, start + 5))}.")
    return " ".join(sentences)


# ----------------------------------------------------------------------------------------------------- files
def _layout(path: Path) -> str:
    """The layout suffix of ``path``: its suffix, or the one before ``.gz`` when that is a compressible layout."""
    if path.suffix == ".gz" and Path(path.stem).suffix in COMPRESSIBLE:
        return Path(path.stem).suffix
    return path.suffix


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    layout = _layout(path)
    if layout in (".parquet", ".arrow"):
        _write_columnar(path, records)
        return path
    if layout == ".txt":
        text = "\n\n".join(r["text"] for r in records) + "\n"
    elif layout == ".json":
        text = json.dumps(records, ensure_ascii=False, indent=4) + "\n"
    else:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def _write_columnar(path: Path, records: list[dict[str, Any]]) -> None:
    """Parquet (row groups of 16 records) or an Arrow IPC stream (batches of 16): several units to split on."""
    import pyarrow as pa

    table = pa.Table.from_pylist(records)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path, row_group_size=16)
        return
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=16):
            writer.write_batch(batch)
