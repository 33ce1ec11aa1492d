"""Shared test helpers: resolve a recipe and render its bundle in memory, the way `recipekit build` does."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from recipekit.build import Resolved, compile_bundle, resolve


def render_files(overrides: Sequence[str], *, allow_oom: bool = False) -> dict[str, bytes]:
    """The files `recipekit build` would write for ``overrides``, in memory."""
    return compile_bundle(resolve(overrides), allow_oom=allow_oom)[0]


@pytest.fixture
def resolved_of():
    def _resolve(*overrides: str) -> Resolved:
        return resolve(list(overrides))

    return _resolve
