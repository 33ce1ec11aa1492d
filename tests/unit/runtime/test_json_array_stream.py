"""The streaming reader of a JSON array of records: the same values and lines as parsing the file whole, whatever
block edges cut through, with memory that holds one element and no more of the whitespace than one block."""

from __future__ import annotations

import io
import json
import tracemalloc

import pytest

from recipekit.runtime.data import jsonarray
from recipekit.runtime.data.records import DataError

DOC = (
    '[\n 1, -2.5e-3, "a\\u00e9b\\"\\\\", {"k": [true, false, null]},\n'
    ' "\u4e2d\u6587\U0001f600", 12345678901234567890, 1E+2,\n  [ ] , {}\n]\n'
)


def _read(text: str | bytes, max_bytes: int = 1 << 20, max_element: int = 1 << 20) -> list[jsonarray.Element]:
    data = text.encode() if isinstance(text, str) else text
    return list(jsonarray.elements(io.BytesIO(data), "a.json", max_bytes, max_element))


@pytest.mark.parametrize("block", [1, 2, 3, 5, 7, 64, 1 << 20])
def test_every_block_edge_gives_the_values_and_lines_of_a_whole_parse(block: int, monkeypatch) -> None:
    monkeypatch.setattr(jsonarray, "BLOCK", block)
    found = _read(DOC)
    assert [e.value for e in found] == json.loads(DOC)
    assert [e.line for e in found] == [2, 2, 2, 2, 3, 3, 3, 4, 4]
    assert _read("[]") == [] and _read(" \n [ \n ] \n") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1}', r"a.json:1: not a JSON array"),
        ("[1 2]", r"a.json:1: expected ',' or ']' after an array element"),
        ("[1,\n", r"a.json:2: the file ends inside the JSON array"),
        ("[1] x", r"a.json:1: text after the JSON array's closing ']'"),
        ('[\n {"a" "b"}]', r"a.json:2: not valid JSON \(Expecting ':' delimiter at column 7\); the array cannot be"),
        (b'[\n "\xff"]', r"a.json:2: not UTF-8 text \(byte 5\)"),
        ('["' + "a" * 100 + '"]', r"a.json:1: an array element longer than 0 MiB: over the record limit"),
        ('["' + "\u00e9" * 40 + '"]', r"over the record limit"),  # 40 characters, 80 bytes: bytes count
        ("[" + " " * 200 + "1]", r"a JSON array of more than 0 MiB: over the limit"),
    ],
)
def test_a_broken_array_is_one_line_naming_the_file_and_line(text: str | bytes, message: str, monkeypatch) -> None:
    monkeypatch.setattr(jsonarray, "BLOCK", 7)
    with pytest.raises(DataError, match=message):
        _read(text, max_bytes=150, max_element=64)


def test_an_element_nested_too_deep_is_a_bad_record_not_the_end() -> None:
    deep = "[" * 70 + "]" * 70
    found = _read(f"[{deep}, 2]")
    assert found[0].value is None and "nested more than 64 levels" in (found[0].problem or "")
    assert found[1].value == 2
    with pytest.raises(DataError, match="nested more than 64 levels deep; the array cannot be read past it"):
        _read("[" + "[" * 100_000 + "]" * 100_000 + "]")


class _Spaces(io.RawIOBase):
    """``count`` MiB of spaces between two records, made as they are read."""

    def __init__(self, mib: int) -> None:
        self.parts = [b'[{"a": 1},'] + [b" " * (1 << 20)] * mib + [b'{"a": 2}]']

    def read(self, size: int = -1) -> bytes:
        return self.parts.pop(0) if self.parts else b""


def test_whitespace_and_elements_already_read_are_not_held() -> None:
    tracemalloc.start()
    try:
        found = list(jsonarray.elements(_Spaces(64), "a.json", 1 << 30, 1 << 20))  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [e.value for e in found] == [{"a": 1}, {"a": 2}] and found[1].line == 1
    assert peak < 8 << 20  # a block or two, not the 64 MiB of spaces


def test_a_json_file_of_only_whitespace_is_refused_at_the_array_limit(tmp_path, monkeypatch) -> None:
    import gzip

    from recipekit.runtime.data import sources

    monkeypatch.setenv("RECIPEKIT_LIMIT_JSON_ARRAY_MIB", "1")
    path = tmp_path / "blank.json.gz"
    path.write_bytes(gzip.compress(b" " * (3 << 20)))
    with pytest.raises(DataError, match=r"blank.json.gz: more than 1 MiB of whitespace and no record"):
        sources.find_files(str(path), "alpaca")
    spread = tmp_path / "spread.json"
    spread.write_bytes(b'[{"instruction": "a", "output": "b"},' + b" " * (2 << 20) + b"]")
    (file,) = sources.find_files(str(spread), "alpaca")
    chunk = sources.plan_chunks([file], 1 << 20)[0]
    with pytest.raises(DataError, match=r"a JSON array of more than 1 MiB: over the limit"):
        list(sources.read_chunk(file, chunk, "alpaca"))
