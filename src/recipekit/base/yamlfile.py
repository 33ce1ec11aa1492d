"""Reading YAML that recipekit did not write — team recipe trees, a bundle's recipe.yaml — without being hurt by it.

A safe loader is not enough for hostile files. YAML aliases share one node, so 700 bytes of nested aliases (a
"billion laughs" alias bomb) construct quickly but expand to 10⁹ items the moment anything walks them: OmegaConf
(inside Hydra) copies every value, and an error message that prints the value hangs just the same. Deep nesting
overflows the recursion of every consumer; a 5000-digit number is refused by Python's own int() with a traceback;
non-UTF-8 bytes raise from deep inside Hydra. So every file is first *scanned* as a stream of parser events —
libyaml's parser keeps its own stack and never recurses — counting the size the document would have with every
alias expanded, its nesting depth and the length of its numbers, and refused with the file and line named before
anything is constructed. Only then is it loaded, through libyaml's ``CSafeLoader`` when PyYAML ships it (a fraction
of the pure-Python loader's start-up cost).

Hydra reads team recipe files itself; :mod:`recipekit.recipe.compose` scans each of them with :func:`read` first.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: Largest file read (a recipe option is a few hundred bytes; recipe.yaml of a bundle a few KiB).
MAX_BYTES = 1 << 20
#: Deepest nesting of mappings and sequences (a recipe is 4 levels deep).
MAX_DEPTH = 64
#: Most nodes a document may hold with every alias expanded (a whole bundle's recipe.yaml has a few hundred).
MAX_NODES = 100_000
#: Longest plain scalar that reads as a number (Python refuses to convert integers of more than 4300 digits).
MAX_NUMBER_CHARS = 100

_NUMBER_LIKE = re.compile(r"[-+]?\.?[0-9][0-9_.:eE+-]*")


class UnsafeYAML(yaml.YAMLError):
    """A YAML text refused before construction: where (source and line) and why, on one line."""

    def __init__(self, source: str, message: str, line: int | None = None) -> None:
        self.source, self.line = source, line
        self.message = message
        super().__init__(f"{source}{f':{line}' if line else ''}: {message}")

    def __str__(self) -> str:
        return str(self.args[0])


def check(text: str, source: str = "<yaml>") -> None:
    """Raise :class:`UnsafeYAML` unless ``text`` is safe to construct and to walk (see the module's docstring).

    One pass over the parser's events: each collection's size with aliases expanded is the sum of its items', an
    alias costs the size its anchor's node had, so the expanded size is known exactly without expanding anything.
    """
    try:
        _scan(yaml.parse(text, Loader=_LOADER), source)
    except UnsafeYAML:
        raise
    except yaml.YAMLError as exc:
        raise UnsafeYAML(source, f"not valid YAML: {one_line(exc)}", _line(exc)) from None


def one_line(exc: yaml.YAMLError) -> str:
    """A YAML error's problem on one line (PyYAML's own text spans several, with a context and a caret)."""
    problem = getattr(exc, "problem", None) or str(exc)
    return " ".join(str(problem).split())


def _line(exc: yaml.YAMLError) -> int | None:
    mark = getattr(exc, "problem_mark", None)
    return mark.line + 1 if mark is not None else None


def _scan(events: Any, source: str) -> None:
    stack: list[int] = []  # expanded size of each open collection
    sizes: dict[Any, int] = {}  # anchor → expanded size of its (finished) node
    anchors: list[Any] = []  # anchor of each open collection
    total = 0
    for event in events:
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(stack) >= MAX_DEPTH:
                raise UnsafeYAML(source, f"nested more than {MAX_DEPTH} levels deep", line)
            stack.append(1)
            anchors.append(event.anchor)
            continue
        if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            size, anchor = stack.pop(), anchors.pop()
        elif isinstance(event, yaml.ScalarEvent):
            size, anchor = 1, event.anchor
            value = event.value
            plain = not event.style  # None from the Python parser, '' from libyaml
            if plain and len(value) > MAX_NUMBER_CHARS and _NUMBER_LIKE.fullmatch(value):
                raise UnsafeYAML(
                    source, f"a number of {len(value)} characters (at most {MAX_NUMBER_CHARS}; quote text)", line
                )
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor not in sizes:
                what = "refers to its own enclosing node" if event.anchor in anchors else "has no anchor before it"
                raise UnsafeYAML(source, f"alias *{event.anchor} {what}", line)
            size, anchor = sizes[event.anchor], None
        else:  # stream and document events
            continue
        if anchor is not None:
            sizes[anchor] = size
        if stack:
            stack[-1] += size
            size = stack[-1]
        else:
            total += size
            size = total
        if size > MAX_NODES:
            raise UnsafeYAML(
                source,
                f"expands to more than {MAX_NODES} values through its aliases (an alias bomb?); write the values out",
                line,
            )


def load(text: str, source: str = "<yaml>") -> Any:
    """``yaml.safe_load`` of a :func:`check` ed text, through libyaml when available; every error is an
    :class:`UnsafeYAML` naming ``source`` and the line."""
    check(text, source)
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a SafeLoader (C or Python), never the unsafe one
    except yaml.YAMLError as exc:
        raise UnsafeYAML(source, f"not valid YAML: {one_line(exc)}", _line(exc)) from None
    except ValueError as exc:  # a constructor's own conversion (a date out of range, ...)
        raise UnsafeYAML(source, f"a value YAML cannot construct: {exc}") from None


def decode(data: bytes, source: str) -> str:
    """``data`` as UTF-8 text, or :class:`UnsafeYAML` naming the first bad byte."""
    if len(data) > MAX_BYTES:
        raise UnsafeYAML(source, f"is {len(data)} bytes (at most {MAX_BYTES} for a YAML file recipekit reads)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UnsafeYAML(
            source, f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})", line
        ) from None


def read(path: Path) -> Any:
    """The YAML file at ``path``, checked and loaded. ``OSError`` when it cannot be read; :class:`UnsafeYAML` (a
    ``yaml.YAMLError``) when it is too big, not UTF-8 or unsafe; ``yaml.YAMLError`` when it is not YAML."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    return load(decode(data, str(path)), str(path))
