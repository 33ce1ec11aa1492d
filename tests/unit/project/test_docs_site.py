"""The docs site holds together: every page is in the nav, the README stays short, and no paragraph is written twice.

The links themselves are checked by `mkdocs build --strict` (.ci/run); these checks are the ones MkDocs cannot make.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
#: Prose shorter than this may repeat (a one-line pointer such as "More in [development](...)").
MIN_PARAGRAPH = 120


def _nav_pages(entries: Any) -> list[str]:
    pages: list[str] = []
    for entry in entries:
        if isinstance(entry, str):
            pages.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = _nav_pages(config["nav"])
    on_disk = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))
    missing = [page for page in on_disk if page not in listed]
    assert not missing, f"add these pages to the nav of mkdocs.yml: {missing}"
    assert not [page for page in listed if not (DOCS / page).is_file()], "nav entries without a page"
    assert len(listed) == len(set(listed)), "a page listed twice in the nav"


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines: move detail into docs/"


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs: blocks between blank lines, outside code fences, tables and headings, whitespace-folded."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    found = []
    for block in re.split(r"\n\s*\n", text):
        if block.lstrip().startswith(("|", "#", "<!--")):
            continue
        folded = " ".join(block.split())
        if len(folded) >= MIN_PARAGRAPH:
            found.append(folded)
    return found


def test_no_paragraph_is_written_twice() -> None:
    """README.md and docs/ (the hand-written pages): each paragraph lives in one place and is linked elsewhere."""
    pages = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "reference" not in p.parts)]
    seen: dict[str, list[str]] = defaultdict(list)
    for page in pages:
        for paragraph in _paragraphs(page.read_text(encoding="utf-8")):
            seen[paragraph].append(str(page.relative_to(ROOT)))
    repeated = {p[:80]: where for p, where in seen.items() if len(where) > 1}
    assert not repeated, f"paragraphs written twice: {repeated}"


def test_the_duplicate_check_can_fail() -> None:
    paragraph = "A paragraph long enough to count as prose for the duplicate check, " * 3
    assert _paragraphs(f"{paragraph}\n\n```\ncode\n```\n\n{paragraph}") == [" ".join(paragraph.split())] * 2
