"""The first command runs every static check: each tool a check needs comes with ``pip install -e '.[train]'``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from recipekit.validate.static.toolpackages import TOOL_PACKAGES

ROOT = Path(__file__).resolve().parents[3]
VALIDATE = ROOT / "src/recipekit/validate"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _extra(name: str) -> set[str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the CI runs 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_name(r) for r in project["optional-dependencies"][name]}


def _sources() -> str:
    return "\n".join(path.read_text() for path in sorted(VALIDATE.rglob("*.py")))


def test_every_tool_a_skip_message_names_is_declared() -> None:
    """A check that skips for a missing tool names its package: through install_hint (TOOL_PACKAGES), never by a
    hard-coded ``(pip install X)`` that the train extra would not know about."""
    sources = _sources()
    hard_coded = {_name(m) for m in re.findall(r"\(pip install ([A-Za-z0-9_.\-]+)\)", sources)}
    assert hard_coded <= set(TOOL_PACKAGES.values()), hard_coded
    hinted = set(re.findall(r"install_hint\(['\"]([a-z.\-]+)['\"]\)", sources))
    assert hinted <= set(TOOL_PACKAGES) and sources.count("install_hint(") >= len(TOOL_PACKAGES) + 1


def test_each_declared_tool_belongs_to_a_real_check() -> None:
    ids = set(re.findall(r'Result\(\s*"([a-z]+\.[a-z\-]+)"', _sources()))
    assert set(TOOL_PACKAGES) <= ids, set(TOOL_PACKAGES) - ids


def test_the_train_extra_installs_every_static_check_tool() -> None:
    missing = {_name(p) for p in TOOL_PACKAGES.values()} - _extra("train")
    assert not missing, f"add to [project.optional-dependencies] train: {sorted(missing)}"
    assert {_name(p) for p in TOOL_PACKAGES.values()} <= _extra("test")
