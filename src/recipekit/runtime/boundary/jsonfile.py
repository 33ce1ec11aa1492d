"""Reading JSON that this process did not just write — a manifest, a package index, a line of training data — without
a traceback. Standard library only: the runtime uses it in the pods, and recipekit's build side reuses it.

``json.loads`` fails in three ways a user cannot act on: ``RecursionError`` for text nested deeper than Python's
stack (100,000 ``[`` are 100 KB), ``UnicodeDecodeError`` for bytes that are not UTF-8, and a ``JSONDecodeError``
whose message names no file. And a document nested just below that limit loads, then overflows whichever consumer
walks it recursively (``repr``, ``json.dumps``, ``copy.deepcopy``). So every such text goes through :func:`loads`:
at most :data:`MAX_BYTES` for a file, at most :data:`MAX_DEPTH` levels deep, and any failure is one
:class:`UntrustedJSON` line naming the source. It is a ``ValueError``, so callers that already turn a
``ValueError`` into their own one-line message keep doing so.

Its second half is the writers' side of :func:`open_regular` (:func:`append`, :func:`replace`): every write of a run
to the shared volume goes through it, never through a link, never into a FIFO, a device or someone else's file.
"""

from __future__ import annotations

import io
import json
import os
import socket
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

#: Largest JSON file read (a bundle manifest is a few KiB; a prepared manifest with thousands of shards, some MiB).
MAX_BYTES = 64 << 20
#: Deepest nesting of arrays and objects (recipekit's own files are under 8 deep; a chat record about 5).
MAX_DEPTH = 64


class UntrustedJSON(ValueError):
    """A JSON text that was refused: its source and why (``reason``), on one line."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source, self.reason = source, reason

    def __str__(self) -> str:
        return str(self.args[0])


def nesting(value: Any) -> int:
    """How deep ``value`` nests lists and dicts (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in node)
    return deepest


def loads(data: str | bytes, source: str, max_depth: int = MAX_DEPTH) -> Any:
    """``data`` parsed as JSON; :class:`UntrustedJSON` naming ``source`` when it is not UTF-8, not JSON or nested
    more than ``max_depth`` levels deep."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
            raise UntrustedJSON(source, reason) from None
    try:
        value = json.loads(data)
    except RecursionError:
        raise UntrustedJSON(source, too_deep(max_depth)) from None
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno} column {exc.colno}" if exc.lineno > 1 else f"column {exc.colno}"
        raise UntrustedJSON(source, f"not valid JSON ({exc.msg} at {at})") from None
    except ValueError as exc:  # a number longer than int() converts
        raise UntrustedJSON(source, f"not valid JSON ({' '.join(str(exc).split())[:120]})") from None
    if data.count("[") + data.count("{") > max_depth and nesting(value) > max_depth:  # fewer brackets: not as deep
        raise UntrustedJSON(source, too_deep(max_depth))
    return value


def too_deep(max_depth: int = MAX_DEPTH) -> str:
    """The reason given for JSON nested deeper than ``max_depth`` (or than Python's stack)."""
    return f"JSON nested more than {max_depth} levels deep"


def open_regular(path: Path, within: Path | None = None) -> BinaryIO:
    """``path`` opened for reading, checked on the opened file (not a stat of its path, which a writer could swap
    after): a regular file, opened without blocking (a FIFO is refused rather than waited on; a device or directory
    too), and, given ``within``, lying inside that directory once every link is followed (a link out of a run's
    directory to ``/proc`` or another user's file is refused). ``OSError`` naming the path otherwise."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory naming only the descriptor
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    handle = os.fdopen(fd, "rb")
    try:
        if within is not None:
            opened = Path(os.path.realpath(f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else path))
            if not opened.is_relative_to(Path(os.path.realpath(within))):
                raise OSError(f"{path} leads out of {within} (to {opened})")
    except BaseException:
        handle.close()
        raise
    return handle


def read_at_most(handle: BinaryIO, most: int) -> bytes:
    """At most ``most + 1`` bytes of ``handle``, a MiB at a time: memory follows the file, not the bound
    (``read(most + 1)`` claims the whole bound before a byte is read), and grows in one buffer (a list of chunks
    joined at the end would hold the file twice)."""
    buffer = io.BytesIO()
    while buffer.tell() <= most and (block := handle.read(min(1 << 20, most + 1 - buffer.tell()))):
        buffer.write(block)
    return buffer.getvalue()


def read(path: Path, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, within: Path | None = None) -> Any:
    """The JSON file at ``path``: ``OSError`` when it cannot be read or :func:`open_regular` refuses it,
    :class:`UntrustedJSON` when it is larger than ``max_bytes`` or refused by :func:`loads`. Reads at most
    ``max_bytes + 1`` bytes, whatever the file claims."""
    with open_regular(path, within) as handle:
        data = read_at_most(handle, max_bytes)
    if len(data) > max_bytes:
        raise UntrustedJSON(str(path), f"larger than {max_bytes} bytes, the most recipekit reads of a JSON file")
    return loads(data, str(path), max_depth)


@dataclass(frozen=True)
class Lines:
    """What :func:`read_lines` found: each JSON value with its line number, each refused line with its reason, and
    whether the file went on past the bounds (``cut``: the reason it stopped)."""

    values: list[tuple[int, Any]]
    refused: list[tuple[int, str]]
    cut: str | None


def read_lines(
    path: Path,
    *,
    max_bytes: int,
    max_line_bytes: int,
    max_lines: int,
    within: Path | None = None,
    keep: Callable[[Any], Any] = lambda value: value,
) -> Lines:
    """A JSON-lines file read line by line: at most ``max_bytes`` bytes and ``max_lines`` lines (the rest is left
    unread and said in ``cut``), a line longer than ``max_line_bytes`` refused without being held whole, each line
    parsed by :func:`loads` (depth-bounded). ``keep`` maps each parsed value to what is kept (None: dropped), so a
    reader holds only what it uses. An empty line is skipped; a last line without its newline (a write in
    progress) is read like the others."""
    values: list[tuple[int, Any]] = []
    refused: list[tuple[int, str]] = []
    read_bytes, number, cut = 0, 0, None
    with open_regular(path, within) as handle:
        while True:
            if number >= max_lines or read_bytes >= max_bytes:
                cut = f"only the first {number:,} lines ({read_bytes:,} bytes) were read" if handle.read(1) else None
                break
            line = handle.readline(min(max_line_bytes, max_bytes - read_bytes) + 1)
            if not line:
                break
            number += 1
            read_bytes += len(line)
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # skip the rest of the long line, a MiB at a time
                    line = handle.readline(1 << 20)
                    read_bytes += len(line)
                refused.append((number, f"longer than {max_line_bytes:,} bytes"))
                continue
            if not line.strip():
                continue
            try:
                kept = keep(loads(line, f"{path} line {number}"))
            except UntrustedJSON as exc:
                refused.append((number, exc.reason))
                continue
            except ValueError as exc:  # keep's own refusal: a field of the wrong type
                refused.append((number, str(exc)))
                continue
            if kept is not None:
                values.append((number, kept))
    return Lines(values, refused, cut)


# ------------------------------------------------------------------------------------------------------- writing
# Writing to the shared volume without following a link: the writers' side of open_regular.
#
# Anyone who can write to the volume can plant a name where a run is about to write: a symlink
# (``attempt-ends/rank-3.jsonl`` → a file elsewhere that the pod's user may write, which every failing rank would then
# append to), a hard link to another file, a FIFO (a writer would block on it forever), a device. The readers refuse
# those; so does every write of a run to its output directory, through here:
#
# * the directory written into is opened without following a link (``O_DIRECTORY | O_NOFOLLOW``; a missing one is
#   created first, its last component never through a link) and must be owned by this process's user or by root: a
#   directory someone else owns is theirs to rearrange;
# * the file is opened relative to that directory's descriptor, never through a link and without blocking or becoming
#   a terminal (``O_NOFOLLOW | O_NOCTTY | O_NONBLOCK``), and must then be a regular file this user owns with no other
#   name (one hard link): a planted file is refused, not written to;
# * a replacement (:func:`replace`) is written to a staging file of its own (``O_CREAT | O_EXCL``) in that directory
#   and renamed over the name: a rename replaces a link, it never writes through one.
#
# Each refusal is an ``OSError`` naming the path; the callers that must never stop training (the records) swallow it as
# they swallow a full disk. Standard library only: shipped in every bundle.

#: How every file of the volume is opened for writing: never through a link, never as a terminal, never blocking.
SAFE_FLAGS = os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
#: The users whose directories a run writes into: itself, and root (a mount point an admin made).
_TRUSTED_OWNERS = frozenset({0})


@contextmanager
def own_directory(path: Path, create: bool = True) -> Iterator[int]:
    """A descriptor of the directory ``path`` (created with its parents first when ``create``), opened without
    following a link and owned by this user or root; ``OSError`` naming it otherwise."""
    path = Path(path)
    if create:
        path.mkdir(parents=True, exist_ok=True)  # an existing link passes here, and is refused just below
    try:
        fd = os.open(path, _DIRECTORY_FLAGS)
    except OSError as exc:
        raise OSError(exc.errno, f"{path}: not a directory of this run (a link, or not a directory)") from None
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid() and owner not in _TRUSTED_OWNERS:
            raise OSError(f"{path}: owned by user {owner}, not by this run's user {os.geteuid()}: not written to")
        yield fd
    finally:
        os.close(fd)


def _check_own_file(fd: int, path: Path) -> None:
    """The opened file is a regular file of this user's with no second name, or ``OSError``."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{path}: not a regular file (a FIFO, device or directory): not written to")
    if info.st_uid != os.geteuid():
        raise OSError(f"{path}: owned by user {info.st_uid}, not by this run's user {os.geteuid()}: not written to")
    if info.st_nlink != 1:
        raise OSError(f"{path}: has {info.st_nlink} names (a hard link): not written to")


def append(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Append ``data`` to ``path`` in one ``write`` on an append-mode descriptor (lines of two writers never
    interleave), creating it when absent; a link, FIFO, device or someone else's file there is refused."""
    path = Path(path)
    with own_directory(path.parent) as parent:
        fd = os.open(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | SAFE_FLAGS, mode, dir_fd=parent)
        try:
            _check_own_file(fd, path)
            os.write(fd, data)
        finally:
            os.close(fd)


@contextmanager
def replacing(path: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A file handle whose content becomes ``path``'s, atomically, when the block ends without an exception (a
    reader sees the old file or the new one): it writes a staging file of its own, unique to this host and process,
    renamed over ``path`` at the end, whatever ``path`` is (a link there is replaced, never followed)."""
    path = Path(path)
    staging = f"{path.name}.tmp-{socket.gethostname()}-{os.getpid()}"
    with own_directory(path.parent) as parent:
        try:
            os.unlink(staging, dir_fd=parent)  # a leftover (or a planted link): unlink never follows one
        except FileNotFoundError:
            pass
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | SAFE_FLAGS, mode, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                yield handle
            os.replace(staging, path.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            try:
                os.unlink(staging, dir_fd=parent)
            except OSError:
                pass
            raise


def replace(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Make ``data`` the whole content of ``path`` atomically (:func:`replacing`)."""
    with replacing(path, mode) as handle:
        handle.write(data)


def replace_text(path: Path, text: str) -> None:
    """:func:`replace` of UTF-8 text."""
    replace(path, text.encode("utf-8"))


def remove(path: Path) -> None:
    """Remove the name ``path`` (a file or a link; never what a link points to) inside a directory of this run."""
    path = Path(path)
    with own_directory(path.parent, create=False) as parent:
        os.unlink(path.name, dir_fd=parent)
