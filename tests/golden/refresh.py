"""Rewrite the golden bundles from the current code: `python tests/golden/refresh.py`. Review with `git diff`."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.conftest import render_files  # noqa: E402
from tests.golden.cases import GOLDEN_DIR, UNCHECKED, cases  # noqa: E402


def main() -> None:
    shutil.rmtree(GOLDEN_DIR, ignore_errors=True)
    for name, overrides in cases().items():
        target = GOLDEN_DIR / name
        target.mkdir(parents=True)
        for file, data in render_files(overrides).items():
            if file not in UNCHECKED:
                (target / file).write_bytes(data)
        print(f"refreshed {target.relative_to(Path.cwd()) if target.is_relative_to(Path.cwd()) else target}")


if __name__ == "__main__":
    main()
