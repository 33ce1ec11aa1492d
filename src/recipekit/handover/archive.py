"""Deterministic tar.gz archives, and a reader that trusts nothing it is handed.

Writing: the same entries always give the same bytes — sorted names, regular files only, mtime 0, uid/gid 0, empty
owner names, modes 0644 (0755 for executables), POSIX pax format, and a gzip header without file name or time
(``mtime=0``, level 9). The same zlib compresses the same input to the same bytes; another zlib build (zlib-ng)
may not, so a package's identity is its archive's bytes as written, and ``verify`` checks content, never a repack.

Reading: an archive from another team is input, not code. Everything happens in memory, never through
``tarfile.extract``: the decompressed size and the entry count are bounded (a gzip bomb stops at the bound), a
truncated stream or trailing bytes are errors, and only regular files with a clean relative name are accepted — no
links, devices, absolute paths, ``..``, backslashes or duplicates. Each problem is one :class:`RecipeError` line.
"""

from __future__ import annotations

import gzip
import io
import posixpath
import tarfile
import zlib
from collections.abc import Collection, Mapping

from recipekit.base.errors import Problem, RecipeError
from recipekit.base.limits import ARCHIVE_MEMBER

#: Bounds on what is read back: a bundle and its recipe sources are well under a megabyte.
MAX_BYTES = 256 * 1024 * 1024
MAX_ENTRIES = 10_000


def write_targz(entries: Mapping[str, bytes], executable: Collection[str] = ()) -> bytes:
    """A tar.gz of ``entries`` (name → bytes), byte-identical for identical entries."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            data = entries[name]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o755 if name in executable else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.type = tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, compresslevel=9, mtime=0) as stream:
        stream.write(raw.getvalue())
    return packed.getvalue()


def read_targz(data: bytes, what: str) -> dict[str, bytes]:
    """The regular files of a tar.gz (name → bytes); :class:`RecipeError` naming ``what`` for anything unsafe."""
    raw = _gunzip(data, what)
    entries: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for count, member in enumerate(tar):
                if count >= MAX_ENTRIES:
                    raise _bad(what, f"more than {MAX_ENTRIES} entries")
                name = member.name
                if member.isdir():
                    _check_name(name.rstrip("/"), what)
                    continue
                if not member.isreg() or member.issparse():
                    raise _bad(
                        what, f"entry {name!r} is not a regular file (links, devices and sparse files are refused)"
                    )
                _check_name(name, what)
                if member.size > ARCHIVE_MEMBER.bytes:  # as its header claims, before a byte of it is read
                    raise ARCHIVE_MEMBER.refuse(what, f"entry {name!r} has {member.size:,} bytes")
                if name in entries:
                    raise _bad(what, f"entry {name!r} appears twice")
                stream = tar.extractfile(member)
                content = stream.read() if stream is not None else b""
                if len(content) != member.size:
                    raise _bad(what, "truncated (an entry ends early)")
                entries[name] = content
    except tarfile.TarError as exc:
        raise _bad(what, f"not a readable tar archive ({exc})") from None
    if not entries:
        raise _bad(what, "empty archive")
    return entries


def _gunzip(data: bytes, what: str) -> bytes:
    if data[:2] != b"\x1f\x8b":
        raise _bad(what, "not a gzip file (a recipekit package is a .tar.gz)")
    inflater = zlib.decompressobj(wbits=31)
    try:
        raw = inflater.decompress(data, MAX_BYTES + 1)
    except zlib.error as exc:
        raise _bad(what, f"corrupt gzip data ({exc})") from None
    if len(raw) > MAX_BYTES:
        raise _bad(what, f"decompresses to more than {MAX_BYTES // 2**20} MiB")
    if not inflater.eof:
        raise _bad(what, "truncated (the gzip stream ends early)")
    if inflater.unused_data:
        raise _bad(what, "unexpected bytes after the gzip stream")
    return raw


def _check_name(name: str, what: str) -> None:
    clean = posixpath.normpath(name)
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or "\x00" in name
        or clean != name
        or clean == ".."
        or clean.startswith("../")
        or ":" in name.split("/", 1)[0]
    ):
        raise _bad(what, f"unsafe entry name {name!r} (absolute, '..', or not normalised)")


def _bad(what: str, message: str) -> RecipeError:
    return RecipeError([Problem(what, message)])
