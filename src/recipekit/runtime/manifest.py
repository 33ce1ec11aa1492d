"""The prepared dataset's layout on the shared volume and its manifest: written by the bundle, read by recipekit.

Standard library only, like the contract: the bundle's prepare step (prepare.py) writes these files and recipekit
reads the manifest back (``recipekit plan --data``, ``recipekit data prepare``, ``data verify``), so the names and
the few keys both sides read are written down here once.

``<data.prepared_dir>/<fingerprint>/`` holds:

  shards/          ``<split>-<chunk>.bin`` tokens, ``.idx`` row offsets, ``.flg`` label/boundary flags (shards.py)
  chunks/          one record per finished chunk: its counts, shard hashes and bad records (prepare.py)
  progress/        each worker's running counts, for the progress bar and ETA
  failed.json      why preparing these inputs failed, when it did (data errors are the data's, so they stand)
  manifest.json    written last, atomically: its presence means every shard is complete

Every file is written under a temporary name and renamed into place, so a crash never leaves a file that looks
whole; the manifest is a function of the chunk records alone (no time, no host, no worker count), so any number of
workers writes the same bytes.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

FORMAT = "recipekit-prepared"
#: Bumped whenever the shard layout or the way rows are made changes: it is part of every fingerprint.
VERSION = 1
MANIFEST = "manifest.json"
FAILED = "failed.json"
CHUNKS = "chunks"
SHARDS = "shards"
PROGRESS = "progress"
SPLITS = ("train", "eval")


class ManifestError(ValueError):
    """A manifest that cannot be used, said in one line."""


def dumps(data: Any) -> bytes:
    """Canonical JSON: sorted keys, one form for every writer, so equal content is equal bytes."""
    return (json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` under a name unique to this process, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    with staging.open("wb") as handle:
        handle.write(data)
    os.replace(staging, path)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, dumps(data))


def read_regular_text(path: Path) -> str:
    """A regular file's text; an OSError for anything else (a FIFO planted as manifest.json would block a reader
    forever: it is opened without blocking and refused), or a ValueError for bytes that are not UTF-8."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        return handle.read().decode("utf-8")


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is absent or unreadable (a writer's rename is atomic: never half)."""
    try:
        data = json.loads(read_regular_text(Path(path)))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path`` (a manifest.json, or the directory holding one), checked for format and version."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST
    try:
        data = json.loads(read_regular_text(path))
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ManifestError(f"{path} is not JSON: {exc}") from None
    except RecursionError:
        raise ManifestError(f"{path} is not JSON: nested too deeply") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ManifestError(f"{path} is not a recipekit prepared-data manifest")
    if data.get("version") != VERSION:
        raise ManifestError(
            f"{path} is version {data.get('version')} of the prepared-data layout; this recipekit reads {VERSION}: "
            "prepare the data again"
        )
    return data


def split_counts(manifest: dict[str, Any], split: str = "train") -> tuple[int, int]:
    """(rows, tokens) of one split of a manifest."""
    part = (manifest.get("splits") or {}).get(split) or {}
    return int(part.get("rows", 0)), int(part.get("tokens", 0))
