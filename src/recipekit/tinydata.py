"""A deterministic, memorisable toy dataset in each input format the bundle's train.py reads.

Tests and the dry run need data that (a) is valid in exactly the shape a real run expects, (b) has variable sample
lengths so padding, truncation and packing are exercised, and (c) is learnable by a two-layer model in a few dozen
steps so "the loss falls" is a real check. Every sample comes from a handful of rule-based tasks over a tiny word list
(repeat a word, count, spell backwards, a fixed fact), so the answer is a function of the prompt and the loss drops
fast. The same ``seed`` and ``n`` always give byte-identical files.

Only the standard library is used: the light CLI imports this module and must not pull in torch or transformers.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

FORMATS = ("alpaca", "messages", "text")

_WORDS = ("red", "blue", "green", "cat", "dog", "fish", "sun", "moon", "tree", "rock", "bird", "star")
_SYSTEM = "You are a careful assistant. Answer with the result only."
_TEXT_FILES = 3  # a text *directory* is split over this many .txt files, to exercise multi-file loading


def write_tiny_dataset(format: str, path: Path, n: int = 64, seed: int = 0) -> Path:
    """Write ``n`` samples of ``format`` to ``path`` and return the path written.

    - ``alpaca``: JSONL with ``instruction``, ``input`` (often empty) and ``output``.
    - ``messages``: JSONL with ``messages`` = [{role, content}, ...]: an optional system turn, one or two exchanges.
    - ``text``: raw text, one paragraph per sample, paragraphs separated by a blank line. ``path`` ending in ``.txt``
      gives one file; ending in ``.jsonl`` gives JSONL with a ``text`` field; anything else is a directory of
      several ``.txt`` files.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown data format {format!r}; expected one of {', '.join(FORMATS)}")
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rng = random.Random(seed)
    path = Path(path)
    if format == "alpaca":
        return _write_jsonl(path, [_alpaca_record(rng) for _ in range(n)])
    if format == "messages":
        return _write_jsonl(path, [{"messages": _conversation(rng)} for _ in range(n)])
    paragraphs = [_paragraph(rng) for _ in range(n)]
    if path.suffix == ".jsonl":
        return _write_jsonl(path, [{"text": p} for p in paragraphs])
    if path.suffix == ".txt":
        return _write_text(path, paragraphs)
    path.mkdir(parents=True, exist_ok=True)
    for index in range(min(_TEXT_FILES, n)):
        _write_text(path / f"part-{index:05d}.txt", paragraphs[index::_TEXT_FILES])
    return path


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
def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _write_text(path: Path, paragraphs: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    return path
