"""A prepared dataset's manifest, read on recipekit's side: its exact counts as recipe values, checked against a recipe.

The bundle's prepare step writes the manifest (runtime/volume/manifest.py, shared with recipekit, standard library
only). ``recipekit plan --data MANIFEST`` turns its training rows and tokens into the overrides ``data.num_rows`` and
``data.num_tokens``, so the schedule and the time and cost figures come from the one place they always come from —
the recipe, through the plan (:mod:`recipekit.plan.datasize`) — and a bundle built with the same overrides carries them.
A manifest prepared with other row settings than the recipe's would give wrong numbers, so it is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipekit.base.errors import Problem, RecipeError
from recipekit.recipe.sections import Recipe
from recipekit.runtime.volume import manifest


def read(path: Path) -> dict[str, Any]:
    """The manifest at ``path`` (its file or its directory); a one-line RecipeError when it is unusable."""
    try:
        document = manifest.read_manifest(path)
    except manifest.ManifestError as exc:
        raise RecipeError([Problem("--data", str(exc))]) from None
    try:
        manifest.split_counts(document, "train")  # counts that are not numbers are refused here, naming the file
    except manifest.ManifestError as exc:
        raise RecipeError([Problem("--data", f"{path}: {exc}")]) from None
    return document


def overrides(document: dict[str, Any]) -> list[str]:
    """The recipe overrides that carry a manifest's exact counts of the training split."""
    rows, tokens = manifest.split_counts(document, "train")
    return [f"data.num_rows={rows}", f"data.num_tokens={tokens}"]


def problems(document: dict[str, Any], recipe: Recipe, source: str) -> list[Problem]:
    """Where the manifest's row settings differ from ``recipe``'s: its counts would not be this run's."""
    made = (document.get("inputs") or {}).get("settings") or {}
    data = recipe.data
    wanted = {
        "format": data.format,
        "max_len": data.max_len,
        "packing": bool(data.packing) and data.format != "text",
        "eval_fraction": data.eval_fraction,
        "chunk_bytes": max(1, int(data.shard_mib * 2**20)),
    }
    names = {"chunk_bytes": "shard_mib"}
    found = []
    for key, value in wanted.items():
        if key in made and made[key] != value:
            field = names.get(key, key)
            theirs = f"{made[key] / 2**20:.6g}" if key == "chunk_bytes" else made[key]
            ours = f"{data.shard_mib:.6g}" if key == "chunk_bytes" else value
            found.append(
                Problem(
                    f"data.{field}",
                    f"{source} was prepared with {field}={theirs}, the recipe has {ours}",
                    hint="prepare with this recipe's bundle (recipekit data prepare), or plan the recipe it was for",
                )
            )
    return found
