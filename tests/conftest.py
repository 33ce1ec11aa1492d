"""Shared test helper: render a recipe's bundle in memory, the way `recipekit build` does."""

from __future__ import annotations

from collections.abc import Sequence

from recipekit.build import compile_bundle, resolve


def render_files(overrides: Sequence[str], *, allow_oom: bool = False) -> dict[str, bytes]:
    """The files `recipekit build` would write for ``overrides``, in memory."""
    return compile_bundle(resolve(overrides), allow_oom=allow_oom)[0]
