"""What a training record must be, and how a bad one is reported: file, line (or row) and field.

Every record is checked before it is tokenised, so a bad one is named precisely enough to fix by hand instead of
making a tokenizer fail on it an hour into the run. Where records come from (JSONL, JSON arrays, text, Parquet,
Arrow; which part of which file) is :mod:`sources`; how many bad ones a run may skip is the prepare step's rule
(``data.max_bad_records``, see :mod:`prepare`). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..boundary.common import RunError
from .chat import ROLES

#: The fields each format's records must have.
REQUIRED = {"alpaca": ("instruction", "output"), "text": ("text",), "messages": ("messages",)}
#: Fields that, when present and not null, must be strings.
STRING_FIELDS = ("instruction", "input", "output", "text")


@dataclass(frozen=True)
class Where:
    """Where a record lies: its file and its 1-based line (JSONL, JSON arrays, text) or 0-based row (Parquet,
    Arrow: the index pandas and pyarrow show)."""

    path: str
    line: int | None = None
    row: int | None = None

    def __str__(self) -> str:
        if self.line is not None:
            return f"{self.path}:{self.line}"
        if self.row is not None:
            return f"{self.path} row {self.row}"
        return self.path

    def key(self) -> tuple[str, int]:
        """Orders locations within one file (the file's own order comes from the chunk that holds them)."""
        return self.path, self.line if self.line is not None else self.row if self.row is not None else -1


class DataError(RunError):
    """Bad training data, located precisely enough to fix by hand: file, line or row, and field."""

    def __init__(
        self,
        path: Any,
        message: str,
        line: int | None = None,
        field: str | None = None,
        *,
        row: int | None = None,
        suffix: str = "",
    ):
        where = path if isinstance(path, Where) else Where(str(path), line, row)
        self.where, self.message, self.field = where, message, field
        super().__init__(f"data error: {where}: {describe(message, field)}{suffix}")


def describe(message: str, field: str | None) -> str:
    return f"field {field!r}: {message}" if field else message


def record_problem(record: Any, fmt: str) -> tuple[str, str | None] | None:
    """Why ``record`` cannot be trained on, as (message, field), or None when it is fine."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}", None
    for field in REQUIRED[fmt]:
        if record.get(field) is None:  # absent or null
            return "missing", field
    for field in STRING_FIELDS:
        if record.get(field) is not None and not isinstance(record[field], str):
            return f"must be a string, got {type(record[field]).__name__}", field
    if fmt == "messages":
        return _messages_problem(record["messages"])
    return None


def _messages_problem(messages: Any) -> tuple[str, str | None] | None:
    if not isinstance(messages, list) or not messages:
        return "must be a non-empty list of {role, content} objects", "messages"
    for index, message in enumerate(messages):
        field = f"messages[{index}]"
        if not isinstance(message, dict):
            return "must be an object with role and content", field
        if message.get("role") not in ROLES:
            return f"role must be one of {', '.join(ROLES)}, got {message.get('role')!r}", f"{field}.role"
        if not isinstance(message.get("content"), str):
            return "missing or not a string", f"{field}.content"
    roles = [m["role"] for m in messages if m["role"] != "system"]
    if not roles or roles[0] != "user":
        return "the first non-system turn must be the user's", "messages"
    if "assistant" not in roles:
        return "no assistant turn: nothing to learn from", "messages"
    return None
