"""Check a prepared dataset against its manifest: every shard file there, of its size, with its sha256.

Training trusts the manifest (shards.py checks only sizes, when it maps a shard), so a shard damaged after it was
written — a bad disk, a partial copy between volumes, someone's stray ``truncate`` — would train on wrong tokens
silently. ``python -m runtime.dataprep --verify`` and ``recipekit data verify`` read every shard file the manifest
lists and compare. Standard library only: recipekit runs this module itself for ``--prepared DIR``.

A problem is one of: ``missing`` (a listed file is not there), ``size`` (not the size the manifest's row and token
counts give: a truncated or extended file, not hashed), ``sha256`` (the right size, other bytes). Files in
``shards/`` that the manifest does not list are ``extra``: reported, but they do no harm (a staging file of a
crashed writer, a shard of an aborted attempt), so they fail nothing.
"""

from __future__ import annotations

import hashlib
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..boundary import jsonfile
from . import manifest, trust

#: Bytes per token of each token type a manifest names (shards.token_dtype), without importing numpy.
ITEMSIZE = {"uint16": 2, "uint32": 4}
_READ = 16 << 20
#: A shard's name in a manifest: a plain file name of shards/ (the prepare step writes ``<split>-<number>``).
_SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

Progress = Callable[[int, int], None]  # (files checked, bytes hashed) so far


def expected_files(found: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """Every shard file a manifest lists, by its path below the dataset directory: (size, sha256)."""
    itemsize = ITEMSIZE[str(found["token_dtype"])]
    files: dict[str, tuple[int, str]] = {}
    for split in manifest.SPLITS:
        for entry in (found["splits"].get(split) or {}).get("shards") or []:
            name = entry["name"]
            if not (isinstance(name, str) and _SHARD_NAME.fullmatch(name)):  # never a path out of shards/
                raise ValueError(f"shard name {ascii(name)[:80]} is not a plain file name")
            rows, tokens = int(entry["rows"]), int(entry["tokens"])
            sizes = {".bin": tokens * itemsize, ".idx": (rows + 1) * 8, ".flg": tokens}
            for suffix, digest in entry["sha256"].items():
                files[f"{manifest.SHARDS}/{entry['name']}{suffix}"] = (sizes[suffix], str(digest))
    return files


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with jsonfile.open_regular(path) as handle:  # a FIFO planted as a shard is refused, not waited on
        while block := handle.read(_READ):
            digest.update(block)
    return digest.hexdigest()


def _size(path: Path) -> int | None:
    """The size of a regular file at ``path`` (a link is not followed), else None."""
    try:
        info = path.lstat()
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def check(directory: Path, progress: Progress = lambda files, hashed: None, key: bytes | None = None) -> dict[str, Any]:
    """The verdict on ``<prepared_dir>/<fingerprint>``: counts, and every problem with its file. A ManifestError when
    the directory holds no usable manifest (nothing to check against). With the run ``key`` the manifest's seal is
    checked first (trust.py): a manifest whose hashes were rewritten with the shards verifies itself otherwise."""
    directory = Path(directory)
    found = manifest.read_manifest(directory)
    seal = trust.seal_problem(found, key) if key is not None else None
    try:
        wanted = expected_files(found)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise manifest.ManifestError(f"{directory / manifest.MANIFEST} lists its shards oddly ({exc!r})") from None
    problems: list[dict[str, str]] = []
    if seal is not None:
        problems.append({"file": manifest.MANIFEST, "problem": "signature", "message": seal})
    hashed = 0
    for number, (name, (size, digest)) in enumerate(sorted(wanted.items()), start=1):
        path = directory / name
        actual = _size(path)
        if actual is None:
            problems.append({"file": name, "problem": "missing", "message": "listed in the manifest, not there"})
        elif actual != size:
            problems.append({"file": name, "problem": "size", "message": f"{actual} bytes, the manifest says {size}"})
        elif sha256_of(path) != digest:
            problems.append({"file": name, "problem": "sha256", "message": "its sha256 is not the manifest's"})
        hashed += actual or 0
        progress(number, hashed)
    shards = directory / manifest.SHARDS
    present = {f"{manifest.SHARDS}/{ascii(p.name)[1:-1]}" for p in shards.iterdir()} if shards.is_dir() else set()
    extra = sorted(present - set(wanted))
    return {
        "event": "verified",
        "directory": str(directory),
        "fingerprint": found.get("fingerprint"),
        "files": len(wanted),
        "bytes": sum(size for size, _ in wanted.values()),
        "ok": not problems,
        "problems": problems,
        "extra": extra,
        "signature": "not checked (no run key)" if key is None else ("verified" if seal is None else "FAILED"),
    }


def lines(report: dict[str, Any]) -> list[str]:
    """The report as text: one line per problem, one per extra file, then the verdict."""
    out = [f"{p['problem']}: {report['directory']}/{p['file']}: {p['message']}" for p in report["problems"]]
    out += [f"extra: {report['directory']}/{name}: not listed in the manifest (harmless)" for name in report["extra"]]
    size = f"{report['files']} shard files ({report['bytes'] / 2**20:,.1f} MiB)"
    extra = f", {len(report['extra'])} extra file(s)" if report["extra"] else ""
    if report.get("signature", "").startswith("not checked"):
        extra += f"; signature not checked (set {trust.KEY_ENV} to the run key to prove who wrote the manifest)"
    if report["ok"]:
        return [*out, f"ok: all {size} match the manifest{extra} ({report['directory']})"]
    return [
        *out,
        f"FAILED: {len(report['problems'])} of {size} do not match the manifest{extra} ({report['directory']}): "
        "delete the directory and prepare the data again",
    ]
