"""The generated reference pages (docs/reference/) are what scripts/gen_reference.py writes from today's code.

A recipe key, option, command flag or exit code that changes without a refresh fails here with a short diff and
the one command that refreshes the pages.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_reference", module)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def test_committed_reference_pages_are_current() -> None:
    diffs = GEN.stale()
    hint = f"\nthe reference pages are stale: run `{GEN.REFRESH}` and commit docs/reference/"
    assert not diffs, "".join(diffs) + hint


def test_generation_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The terminal the generator runs in does not change the help pages."""
    first = GEN.generate()
    monkeypatch.setenv("COLUMNS", "40")
    assert GEN.generate() == first


def test_a_stale_page_is_reported(tmp_path: Path) -> None:
    """The check can fail: a page edited by hand (or a key added without a refresh) gives a diff naming the page."""
    for name, text in GEN.generate().items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    page = tmp_path / "recipe-keys.md"
    page.write_text(page.read_text(encoding="utf-8").replace("`train.seed`", "`train.sed`"), encoding="utf-8")
    diffs = GEN.stale(tmp_path)
    assert len(diffs) == 1 and "recipe-keys.md" in diffs[0] and "train.sed" in diffs[0]


def test_the_pages_hold_what_the_code_defines() -> None:
    """Spot checks that the generator reads the sources, not a copy: a key, an option, a flag, an exit code."""
    pages = GEN.generate()
    from recipekit.runtime.boundary import exitcodes

    assert "`train.micro_batch_size`" in pages["recipe-keys.md"]
    assert "`mode.quant.double_quant`" in pages["recipe-keys.md"]
    assert "`ascend910b` *" in pages["groups.md"]
    assert "--allow-oom" in pages["cli.md"] and "## recipekit data prepare" in pages["cli.md"]
    assert (
        f"| {exitcodes.EXIT_STALLED} | `stalled` |" in pages["exit-codes.md"]
        and "| TerminateJob |" in pages["exit-codes.md"]
    )
    assert "`qwen2.5_14b`" in pages["models.md"]
