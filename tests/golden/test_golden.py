"""Each preset's bundle equals its golden copy byte for byte; on a difference, the diff shows what changed.

Refresh after an intended change with `python tests/golden/refresh.py` and review the result with `git diff`.
"""

from __future__ import annotations

import difflib

import pytest

from tests.conftest import render_files
from tests.golden.cases import GOLDEN_DIR, UNCHECKED, cases


@pytest.mark.parametrize("name", sorted(cases()))
def test_bundle_matches_golden(name: str) -> None:
    golden = GOLDEN_DIR / name
    assert golden.is_dir(), f"no golden bundle for {name}: run python tests/golden/refresh.py"
    files = {k: v for k, v in render_files(cases()[name]).items() if k not in UNCHECKED}
    expected = {p.name: p.read_bytes() for p in sorted(golden.iterdir())}
    assert sorted(files) == sorted(expected), "file list changed"
    diffs = []
    for file, data in files.items():
        if data != expected[file]:
            diff = difflib.unified_diff(
                expected[file].decode().splitlines(),
                data.decode().splitlines(),
                f"golden/{name}/{file}",
                f"built/{file}",
                lineterm="",
                n=2,
            )
            diffs.append("\n".join(diff))
    assert not diffs, "bundle differs from golden (refresh: python tests/golden/refresh.py):\n" + "\n".join(diffs)
