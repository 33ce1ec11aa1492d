"""The training data: which files, every record checked before any tokenisation, loaded as one Arrow dataset.

A bad record is reported as a DataError that names the file, the line and the field, precisely enough to fix by
hand, instead of a tokenizer failing on it an hour into the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

from .chat import ROLES
from .common import RunError


class DataError(RunError):
    """Bad training data, located precisely enough to fix by hand: file, line and field."""

    def __init__(self, path: Path | str, message: str, line: int | None = None, field: str | None = None):
        where = f"{path}:{line}" if line else str(path)
        what = f"field {field!r}: {message}" if field else message
        super().__init__(f"data error: {where}: {what}")


def data_files(path: Path, fmt: str) -> list[Path]:
    """The files a data path stands for: the file itself, or a directory's .jsonl (and, for text, .txt) files."""
    if not path.exists():
        raise DataError(path, "does not exist")
    if path.is_file():
        return [path]
    suffixes = (".jsonl", ".txt") if fmt == "text" else (".jsonl",)
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in suffixes)
    if not files:
        raise DataError(path, f"directory holds no {' or '.join(suffixes)} files")
    return files


def validate_data_file(path: Path, fmt: str) -> int:
    """Check every record of a JSONL file before any tokenisation; return the record count or raise DataError.

    A raw .txt file is only checked for content (it has no records; 0 is returned).
    """
    if path.stat().st_size == 0:
        raise DataError(path, "file is empty")
    if fmt == "text" and path.suffix == ".txt":
        return 0
    count = 0
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(path, f"not UTF-8 text (byte {exc.start + 1})", number) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(path, f"not valid JSON ({exc.msg} at column {exc.colno})", number) from None
            if not isinstance(record, dict):
                raise DataError(path, f"expected a JSON object, got {type(record).__name__}", number)
            _validate_record(record, fmt, path, number)
            count += 1
    if not count:
        raise DataError(path, "holds no records (only blank lines)")
    return count


def _validate_record(record: dict[str, Any], fmt: str, path: Path, line: int) -> None:
    required = {"alpaca": ("instruction", "output"), "text": ("text",), "messages": ("messages",)}[fmt]
    for field in required:
        if field not in record:
            raise DataError(path, "missing", line, field)
    for field in ("instruction", "input", "output", "text"):
        if field in record and record[field] is not None and not isinstance(record[field], str):
            raise DataError(path, f"must be a string, got {type(record[field]).__name__}", line, field)
    if fmt == "messages":
        _validate_messages(record["messages"], path, line)


def _validate_messages(messages: Any, path: Path, line: int) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(path, "must be a non-empty list of {role, content} objects", line, "messages")
    for index, message in enumerate(messages):
        field = f"messages[{index}]"
        if not isinstance(message, dict):
            raise DataError(path, "must be an object with role and content", line, field)
        if message.get("role") not in ROLES:
            raise DataError(
                path, f"role must be one of {', '.join(ROLES)}, got {message.get('role')!r}", line, f"{field}.role"
            )
        if not isinstance(message.get("content"), str):
            raise DataError(path, "missing or not a string", line, f"{field}.content")
    roles = [m["role"] for m in messages if m["role"] != "system"]
    if not roles or roles[0] != "user":
        raise DataError(path, "the first non-system turn must be the user's", line, "messages")
    if "assistant" not in roles:
        raise DataError(path, "no assistant turn: nothing to learn from", line, "messages")


def load_raw_dataset(data: Any, cache_dir: Path) -> datasets.Dataset:
    """Validate the data files, then load them as one memory-mapped Arrow dataset cached under ``cache_dir``."""
    files = data_files(Path(data.path), data.format)
    for path in files:
        validate_data_file(path, data.format)
    parts = []
    jsonl = [str(p) for p in files if p.suffix != ".txt"]
    text = [str(p) for p in files if p.suffix == ".txt"]
    if jsonl:
        records = datasets.load_dataset("json", data_files=jsonl, split="train", cache_dir=str(cache_dir))
        parts.append(records.select_columns(["text"]) if text else records)
    if text:  # a paragraph (text between blank lines) is one document
        parts.append(
            datasets.load_dataset(
                "text", data_files=text, sample_by="paragraph", split="train", cache_dir=str(cache_dir)
            )
        )
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
