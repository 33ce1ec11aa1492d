"""Which prepared dataset a run needs: a fingerprint of everything that decides the shards' bytes.

Runs whose fingerprints are equal share one prepared dataset (``<data.prepared_dir>/<fingerprint>``): a restart, a
re-submission, another learning rate or another model of the same tokenizer all reuse it. The fingerprint covers

* the data files: each one's name below the data root and size, and its modification time (``data.fingerprint:
  stat``, the default) or the sha256 of its content (``content``);
* the tokenizer: its whole vocabulary and pipeline (the fast tokenizer's JSON), chat template and special ids;
* how rows are made: format, sequence length, packing, the eval fraction (and the seed, when it splits), the input
  bytes per chunk (chunks bound the packing windows) and the layout version (:data:`manifest.VERSION`).

Why size and mtime by default: hashing the content of a multi-terabyte corpus reads all of it on every start (hours
on shared storage) just to learn that nothing changed, and any rewrite of a file updates its mtime (nanoseconds on
every current filesystem). The cost of the cheap check is a needless re-prepare when files are copied without their
times (``cp`` without ``-p``); ``content`` avoids that, and catches the rare rewrite that keeps size and mtime, for
one full read per start. Absolute paths are left out, so the same corpus mounted elsewhere keeps its fingerprint.
The model, the learning rate and ``data.max_bad_records`` are left out too: they do not change what a record becomes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from ..volume import manifest
from .sources import InputFile

#: Hex digits of the fingerprint: the directory name of a prepared dataset.
LENGTH = 20
_READ = 16 << 20


@dataclass(frozen=True)
class Settings:
    """How rows are made from records: the recipe's data section (and seed), as the prepare step reads it."""

    format: str
    max_len: int
    packing: bool
    eval_fraction: float
    seed: int
    chunk_bytes: int
    max_bad_records: int
    check: str  # stat | content

    @property
    def row_kind(self) -> str:
        return "blocks" if self.format == "text" else "packed" if self.packing else "samples"

    def shaping(self) -> dict[str, Any]:
        """The settings that decide the rows (the seed only where it draws the eval split)."""
        data = asdict(self)
        del data["max_bad_records"], data["check"]
        if not self.eval_fraction:
            del data["seed"]
        return data


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 of what decides a fast tokenizer's ids: its pipeline and vocabulary, chat template and special ids."""
    special = {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "pad")}
    content = json.dumps(
        [tokenizer.backend_tokenizer.to_str(), str(tokenizer.chat_template), special, len(tokenizer)], sort_keys=True
    )
    return hashlib.sha256(content.encode()).hexdigest()


def file_entries(files: list[InputFile], check: str) -> list[list[Any]]:
    """[name, size, mtime_ns] per file, or [name, size, sha256] with ``check: content``."""
    if check == "content":
        return [[f.name, f.size, _content(f)] for f in files]
    return [[f.name, f.size, f.mtime_ns] for f in files]


def _content(file: InputFile) -> str:
    digest = hashlib.sha256()
    with file.path.open("rb") as handle:
        while block := handle.read(_READ):
            digest.update(block)
    return digest.hexdigest()


def inputs(settings: Settings, files: list[InputFile], tokenizer: str) -> dict[str, Any]:
    """Everything the fingerprint is a hash of, as a manifest records it."""
    return {
        "version": manifest.VERSION,
        "settings": settings.shaping(),
        "tokenizer": tokenizer,
        "check": settings.check,
        "files": file_entries(files, settings.check),
    }


def fingerprint(described: dict[str, Any]) -> str:
    return hashlib.sha256(manifest.dumps(described)).hexdigest()[:LENGTH]
