"""A ``.json`` file holding one array of records, read as a stream: one element at a time, never the whole file.

An array used to be read whole and then parsed, so its memory followed its size: a 1 MiB gzip holding 1 GiB of
spaces cost more than 1 GB before a record was found. Here the decompressed text is read a block at a time; the
whitespace and the elements already yielded are dropped, so what is held is one element (at most the record limit,
as one line of JSON lines is) and one block. The whole array is still bounded, by the bytes read: a decompression
bomb ends with one line at the array limit instead of running for as long as it inflates.

``json.JSONDecoder.raw_decode`` parses each element from the buffer. A buffer cut inside an element fails to
parse (an unterminated string, a missing delimiter at its very end) or parses a number or literal short; both are
told from a real error by where they happen, at the buffer's end, and then the buffer is grown (doubled, so a large
element is parsed a bounded number of times) until the element parses, the file ends or the element is over the
record limit. Standard library only.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from ..boundary import jsonfile
from .records import DataError

#: Decompressed bytes read at a time.
BLOCK = 1 << 20
#: How near the buffer's end a parse may stop or fail and still be a cut element rather than a real one: the longest
#: token that can end early (``\\uXXXX``, a number's ``e-``, ``false``) is shorter than this.
_MARGIN = 16
_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Element:
    """One element of the array: its value (None when refused), why it was refused, and the line it begins on."""

    value: Any
    problem: str | None
    line: int


class _Text:
    """The file's text from the first element not yet consumed to as far as was read, with its line and column."""

    def __init__(self, handle: BinaryIO, path: str, max_bytes: int, max_element: int) -> None:
        self.handle, self.path, self.max_bytes, self.max_element = handle, path, max_bytes, max_element
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.text, self.pos, self.read_bytes, self.ended = "", 0, 0, False
        self.line, self.column = 1, 0  # where text[0] lies: its line, and the characters before it on that line
        self.mark, self.mark_line = 0, 1  # the last position asked for, and its line: lines are counted once

    def line_at(self, position: int) -> int:
        """The line ``text[position]`` lies on; positions asked in order cost one count of the text between."""
        if position < self.mark:
            return self.line + self.text.count("\n", 0, position)
        self.mark_line += self.text.count("\n", self.mark, position)
        self.mark = position
        return self.mark_line

    def more(self, wanted: int | None = None) -> bool:
        """Drop what is consumed, then read at least ``wanted`` more bytes (a block when not given; fewer only when
        the file ends); False at the end."""
        if self.ended:
            return False
        wanted = BLOCK if wanted is None else wanted
        self._drop()
        pieces, got, blank = [self.text], 0, not self.text
        while got < wanted and not self.ended:
            block = self.handle.read(BLOCK)
            got += len(block)
            self.read_bytes += len(block)
            self.ended = not block
            if blank and not self.decoder.getstate()[0]:
                block = self._past_space(block)  # whitespace between elements is counted, never decoded or held
                blank = not block
            if self.read_bytes > self.max_bytes:
                raise DataError(
                    self.path,
                    f"a JSON array of more than {self.max_bytes >> 20} MiB: over the limit (write it as JSON lines, "
                    "or raise it with RECIPEKIT_LIMIT_JSON_ARRAY_MIB=N)",
                )
            try:
                pieces.append(self.decoder.decode(block, final=self.ended))
            except UnicodeDecodeError as exc:
                offset = self.read_bytes - len(block) + exc.start
                line = self.line + sum(piece.count("\n") for piece in pieces) + block.count(b"\n", 0, exc.start)
                raise DataError(self.path, f"not UTF-8 text (byte {offset + 1})", line) from None
        self.text = "".join(pieces)  # joined once: appending block by block would copy a large element each time
        return True

    def _past_space(self, block: bytes) -> bytes:
        """``block`` without its leading whitespace, whose lines and columns are counted (the text held is empty)."""
        rest = block.lstrip(b" \t\n\r")
        gone = block[: len(block) - len(rest)]
        newlines = gone.count(b"\n")
        self.line += newlines
        self.column = len(gone) - gone.rfind(b"\n") - 1 if newlines else self.column + len(gone)
        self.mark, self.mark_line = 0, self.line
        return rest

    def _drop(self) -> None:
        gone = self.text[: self.pos]
        newlines = gone.count("\n")
        self.line += newlines
        self.column = self.pos - gone.rfind("\n") - 1 if newlines else self.column + self.pos
        if self.mark >= self.pos:
            self.mark -= self.pos
        else:
            self.mark, self.mark_line = 0, self.line
        self.text, self.pos = self.text[self.pos :], 0

    def next_mark(self) -> str:
        """The next character that is not whitespace ("" at the end of the file), reading on as needed."""
        while True:
            self.pos = _SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.text) or not self.more():
                return self.text[self.pos : self.pos + 1]

    def over(self, end: int) -> bool:
        """Whether ``text[pos:end]`` is more than the element limit in UTF-8 bytes (a character is 1 to 4 bytes, so
        the bytes are counted only when the characters alone cannot tell)."""
        chars = end - self.pos
        return chars > self.max_element or (chars * 4 > self.max_element and self._bytes(end) > self.max_element)

    def _bytes(self, end: int) -> int:
        return len(self.text[self.pos : end].encode("utf-8"))

    def too_long(self) -> DataError:
        return DataError(
            self.path,
            f"an array element longer than {self.max_element >> 20} MiB: over the record limit (raise it with "
            "RECIPEKIT_LIMIT_RECORD_MIB=N, or write the data as JSON lines)",
            self.line_at(self.pos),
        )


def elements(handle: BinaryIO, path: str, max_bytes: int, max_element: int) -> Iterator[Element]:
    """The elements of the JSON array ``handle`` holds, in order. A DataError (one line, naming ``path`` and the line)
    for text that is not one array, an element past ``max_element`` bytes or more than ``max_bytes`` read in all;
    an element nested past :data:`jsonfile.MAX_DEPTH` is yielded refused (a bad record, not the end of the file)."""
    text = _Text(handle, path, max_bytes, max_element)
    if text.next_mark() != "[":
        raise DataError(path, "not a JSON array (a .json file holds one array of records, or JSON lines)", 1)
    text.pos += 1
    closed = text.next_mark() == "]"
    while not closed:
        line = text.line_at(text.pos)
        value = _element(text)
        problem = jsonfile.too_deep() if jsonfile.nesting(value) > jsonfile.MAX_DEPTH else None
        yield Element(None if problem else value, problem, line)
        mark = text.next_mark()
        if mark == ",":
            text.pos += 1
            if text.next_mark() == "":
                raise DataError(path, "the file ends inside the JSON array (no closing ']')", text.line_at(text.pos))
        elif mark == "]":
            closed = True
        else:
            raise DataError(path, "expected ',' or ']' after an array element", text.line_at(text.pos))
    text.pos += 1
    if text.next_mark():
        raise DataError(path, "text after the JSON array's closing ']'", text.line_at(text.pos))


def _element(text: _Text) -> Any:
    """The element beginning at ``text.pos``, read on until it is whole; ``text.pos`` moves past it."""

    while True:
        try:
            value, after = _DECODER.raw_decode(text.text, text.pos)
        except json.JSONDecodeError as exc:
            cut = exc.pos >= len(text.text) - _MARGIN or exc.msg.startswith("Unterminated string")
            if not (cut and _grow(text)):
                column = exc.colno + (text.column if exc.lineno == 1 else 0)
                why = f"not valid JSON ({exc.msg} at column {column}); the array cannot be read past it"
                raise DataError(text.path, why, text.line + exc.lineno - 1) from None
            continue
        except (RecursionError, ValueError) as exc:  # nested past Python's stack; a number int() refuses
            why = jsonfile.too_deep() if isinstance(exc, RecursionError) else f"not valid JSON ({exc})"
            raise DataError(text.path, f"{why}; the array cannot be read past it", text.line_at(text.pos)) from None
        if after < len(text.text) - _MARGIN or not _grow(text):
            if text.over(after):
                raise text.too_long()
            text.pos = after
            return value


def _grow(text: _Text) -> bool:
    """Read on for the element at ``text.pos`` (doubling what is held of it); False at the end of the file."""
    if text.ended:
        return False
    if text.over(len(text.text)):
        raise text.too_long()
    held = len(text.text) - text.pos
    return text.more(min(max(BLOCK, held), max(BLOCK, text.max_element + 2 * _MARGIN - held)))
