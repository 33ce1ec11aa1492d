"""Reading JSON that this process did not just write — a manifest, a package index, a line of training data — without
a traceback. Standard library only: the runtime uses it in the pods, and recipekit's build side reuses it.

``json.loads`` fails in three ways a user cannot act on: ``RecursionError`` for text nested deeper than Python's
stack (100,000 ``[`` are 100 KB), ``UnicodeDecodeError`` for bytes that are not UTF-8, and a ``JSONDecodeError``
whose message names no file. And a document nested just below that limit loads, then overflows whichever consumer
walks it recursively (``repr``, ``json.dumps``, ``copy.deepcopy``). So every such text goes through :func:`loads`:
at most :data:`MAX_BYTES` for a file, at most :data:`MAX_DEPTH` levels deep, and any failure is one
:class:`UntrustedJSON` line naming the source. It is a ``ValueError``, so callers that already turn a
``ValueError`` into their own one-line message keep doing so.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

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
    if nesting(value) > max_depth:
        raise UntrustedJSON(source, too_deep(max_depth))
    return value


def too_deep(max_depth: int = MAX_DEPTH) -> str:
    """The reason given for JSON nested deeper than ``max_depth`` (or than Python's stack)."""
    return f"JSON nested more than {max_depth} levels deep"


def read(path: Path, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON file at ``path``: ``OSError`` when it cannot be read, :class:`UntrustedJSON` when it is larger than
    ``max_bytes`` or refused by :func:`loads`. Reads at most ``max_bytes + 1`` bytes, whatever the file claims.
    Only a regular file is read: it is opened without blocking, so a FIFO planted on a shared volume is an
    ``OSError`` rather than a reader waiting forever (a device or directory too)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        parts, total = [], 0  # a MiB at a time: memory follows the file, not the bound
        while total <= max_bytes and (block := handle.read(min(1 << 20, max_bytes + 1 - total))):
            parts.append(block)
            total += len(block)
        data = b"".join(parts)
    if len(data) > max_bytes:
        raise UntrustedJSON(str(path), f"larger than {max_bytes} bytes, the most recipekit reads of a JSON file")
    return loads(data, str(path), max_depth)
