"""Shared test helpers: resolve a recipe and render its bundle in memory, the way `recipekit build` does."""

from __future__ import annotations

from typing import Sequence

import pytest

from recipekit.build import Resolved, resolve
from recipekit.render import render


def render_files(overrides: Sequence[str]) -> dict[str, bytes]:
    resolved = resolve(overrides)
    return render(resolved.recipe, resolved.plan, resolved.composed)


@pytest.fixture
def resolved_of():
    def _resolve(*overrides: str) -> Resolved:
        return resolve(list(overrides))

    return _resolve
