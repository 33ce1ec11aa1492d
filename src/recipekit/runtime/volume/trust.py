"""Who wrote a file on the shared volume: an HMAC over its files' digests, keyed by the run's Secret.

The shared volume is writable by more than this run (other Jobs of the namespace, people with a shell on it). A
checkpoint there is therefore untrusted input, and resuming one unpickles it (DeepSpeed's checkpoint engine loads its
partitions with ``torch.load(weights_only=False)``). So a directory this run writes (a checkpoint, the prepared data)
carries a signed record: the sha256 of every file in it and an HMAC-SHA256 over that list, keyed by a secret only the
run's pods can read (a Kubernetes Secret the Job mounts; :data:`KEY_ENV` names the file). Someone who can only write
to the volume cannot make a record that verifies. Before a run touches a checkpoint, :func:`verify_directory` checks
the HMAC and re-hashes every file (regular files only, no symlinks, none missing, none extra), reading bytes and never
parsing them.

Standard library only: it is copied into every bundle with the rest of the runtime package, and recipekit's ``data``
commands use it as ``recipekit.runtime.volume.trust``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The environment variable naming the file that holds the run key (the Job mounts the Secret there).
KEY_ENV = "RECIPEKIT_RUN_KEY_FILE"
#: Where the Job mounts the Secret, and the key inside it.
KEY_MOUNT = "/etc/recipekit/run-key"
KEY_NAME = "key"
#: A key shorter than this is refused: it could be guessed.
MIN_KEY_BYTES = 16
#: The record fields the HMAC covers are everything but this one.
HMAC_FIELD = "hmac"
FILES_FIELD = "files"
_CHUNK = 1 << 20


class Untrusted(Exception):
    """A directory that this run cannot prove it wrote, said in one line."""


#: The Kubernetes Secret every recipekit Job of a namespace mounts its run key from: one per namespace, so that
#: prepared data (shared by every run with the same data and tokenizer) verifies for all of them.
SECRET_NAME = "recipekit-run-key"


def load_key(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The run key from the file :data:`KEY_ENV` names; None when the variable is unset.

    A set variable whose file is missing, unreadable, not a regular file or too short is an error: the Job meant to
    have a key and something is wrong with it."""
    env = os.environ if environ is None else environ
    name = env.get(KEY_ENV)
    if not name:
        return None
    path = Path(name)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise Untrusted(f"{KEY_ENV}={name} is not a regular file")
        if info.st_size > 1 << 16:
            raise Untrusted(f"{KEY_ENV}={name} is larger than 64 KiB: not a key")
        key = path.read_bytes().strip()
    except OSError as exc:
        raise Untrusted(f"cannot read the run key {KEY_ENV}={name}: {exc.strerror or exc}") from None
    if len(key) < MIN_KEY_BYTES:
        raise Untrusted(f"the run key in {name} has {len(key)} bytes, fewer than {MIN_KEY_BYTES}: make a longer one")
    return key


def regular_files(directory: Path, exclude: frozenset[str]) -> dict[str, Path]:
    """Every file under ``directory`` by its relative path; a symlink or anything but a file or directory is an
    :class:`Untrusted` error (never followed, never opened)."""
    found: dict[str, Path] = {}
    pending = [directory]
    while pending:
        current = pending.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as exc:
            raise Untrusted(f"cannot list {current}: {exc.strerror or exc}") from None
        for entry in entries:
            path = Path(entry.path)
            relative = path.relative_to(directory).as_posix()
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                raise Untrusted(f"{relative} in {directory.name} is a symlink")
            if stat.S_ISDIR(mode):
                pending.append(path)
            elif stat.S_ISREG(mode):
                if relative not in exclude:
                    found[relative] = path
            else:
                raise Untrusted(f"{relative} in {directory.name} is not a regular file")
    return found


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    # O_NOFOLLOW | O_NONBLOCK: a file swapped for a symlink or a FIFO since it was listed neither redirects nor hangs
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise Untrusted(f"cannot open {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise Untrusted(f"{path} is not a regular file")
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def digests(directory: Path, exclude: frozenset[str] = frozenset()) -> dict[str, str]:
    """sha256 of every regular file under ``directory`` (relative POSIX paths), ``exclude`` left out."""
    return {name: _sha256(path) for name, path in regular_files(Path(directory), exclude).items()}


def _mac(record: Mapping[str, Any], key: bytes) -> str:
    body = {k: v for k, v in record.items() if k != HMAC_FIELD}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac.new(key, text.encode("ascii"), hashlib.sha256).hexdigest()


def sign(record: Mapping[str, Any], key: bytes, files: Mapping[str, str]) -> dict[str, Any]:
    """``record`` with the file digests and the HMAC over both."""
    signed = {k: v for k, v in record.items() if k != HMAC_FIELD}
    signed[FILES_FIELD] = dict(sorted(files.items()))
    signed[HMAC_FIELD] = _mac(signed, key)
    return signed


def check_record(record: Any, key: bytes, where: str) -> dict[str, str]:
    """The file digests of a record whose HMAC verifies; :class:`Untrusted` otherwise."""
    if not isinstance(record, dict) or not isinstance(record.get(HMAC_FIELD), str):
        raise Untrusted(f"{where} has no signed record: it was not written by this run")
    if not is_hex_digest(record[HMAC_FIELD]):  # compare_digest raises on a non-ASCII str
        raise Untrusted(f"{where}: its record's signature is not a sha256 hex digest (forged)")
    if not hmac.compare_digest(record[HMAC_FIELD], _mac(record, key)):
        raise Untrusted(f"{where}: its record's signature does not verify (forged, or written with another run key)")
    files = record.get(FILES_FIELD)
    if not isinstance(files, dict) or not all(is_hex_digest(v) for v in files.values()):
        raise Untrusted(f"{where}: its signed record lists no files")
    return {str(k): v for k, v in files.items()}


_HEX = frozenset("0123456789abcdef")


def is_hex_digest(value: Any) -> bool:
    """``value`` is a sha256 as :func:`sign` writes it: 64 lowercase hex digits."""
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def verify_files(directory: Path, files: Mapping[str, str], exclude: frozenset[str], where: str) -> None:
    """Every file the record lists is there with its digest, and nothing else is (a planted extra file would be
    loaded by name just the same)."""
    present = regular_files(Path(directory), exclude)
    extra = sorted(set(present) - set(files))
    if extra:
        raise Untrusted(f"{where}: {extra[0]} is not in its signed record ({len(extra)} such file(s))")
    missing = sorted(set(files) - set(present))
    if missing:
        raise Untrusted(f"{where}: {missing[0]} is missing ({len(missing)} file(s) of its record)")
    for name in sorted(files):
        if not hmac.compare_digest(_sha256(present[name]), files[name]):
            raise Untrusted(f"{where}: {name} was changed after this run signed it (sha256 differs)")


def verify_directory(directory: Path, record: Any, key: bytes, exclude: frozenset[str], where: str) -> None:
    """The signed ``record`` verifies under ``key`` and matches every byte of ``directory``."""
    verify_files(directory, check_record(record, key, where), exclude, where)


def seal(document: Mapping[str, Any], key: bytes) -> dict[str, Any]:
    """``document`` with an HMAC over the rest of it (the prepared data's manifest: it lists every shard's sha256,
    so the seal covers the shards too)."""
    sealed = {k: v for k, v in document.items() if k != HMAC_FIELD}
    sealed[HMAC_FIELD] = _mac(sealed, key)
    return sealed


def seal_problem(document: Mapping[str, Any], key: bytes) -> str | None:
    """Why ``document``'s seal does not verify under ``key``, or None when it does."""
    found = document.get(HMAC_FIELD)
    if not isinstance(found, str):
        return "it is not signed (prepared without the run key)"
    if not is_hex_digest(found):
        return "its signature is not a sha256 hex digest (forged)"
    if not hmac.compare_digest(found, _mac(document, key)):
        return "its signature does not verify (changed after it was written, or signed with another run key)"
    return None
