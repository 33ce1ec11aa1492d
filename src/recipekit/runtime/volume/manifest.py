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
from pathlib import Path
from typing import Any

from ..boundary import jsonfile

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
    """Write ``data`` to ``path`` under a name unique to this host and process, then rename it into place (never
    through a link planted on the volume: :mod:`..boundary.jsonfile`)."""
    jsonfile.replace(path, data)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, dumps(data))


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is absent or unreadable (a writer's rename is atomic: never half)."""
    try:
        data = jsonfile.read(Path(path))
    except (OSError, ValueError):  # jsonfile's refusals are ValueErrors
        return None
    return data if isinstance(data, dict) else None


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path`` (a manifest.json, or the directory holding one), checked for format and version."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST
    try:
        data = jsonfile.read(path)
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}") from None
    except jsonfile.UntrustedJSON as exc:
        raise ManifestError(str(exc)) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ManifestError(f"{path} is not a recipekit prepared-data manifest")
    if data.get("version") != VERSION:
        raise ManifestError(
            f"{path} is version {data.get('version')} of the prepared-data layout; this recipekit reads {VERSION}: "
            "prepare the data again"
        )
    return data


def split_counts(manifest: dict[str, Any], split: str = "train") -> tuple[int, int]:
    """(rows, tokens) of one split of a manifest; :class:`ManifestError` when they are not counts."""
    splits = manifest.get("splits") or {}
    part = (splits.get(split) if isinstance(splits, dict) else None) or {}
    rows: Any = part.get("rows", 0) if isinstance(part, dict) else None
    tokens: Any = part.get("tokens", 0) if isinstance(part, dict) else None
    if not (_is_count(rows) and _is_count(tokens)):
        raise ManifestError(f"the {split} split's rows and tokens are {rows!r:.40} and {tokens!r:.40}, not counts")
    return rows, tokens


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
