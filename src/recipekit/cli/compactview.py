"""``recipekit show --compact``: the resolved recipe as one ``key=value`` line per leaf key.

The full listing is YAML nested four levels deep; this view is the key reference one greps (``| grep batch``) and
copies overrides from. Strings that Hydra reads as written are printed bare; anything else (spaces, quotes, an empty
string, lists and mappings) as JSON, which Hydra's override grammar also reads for these values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from recipekit.recipe.overrides import recipe_keys

_BARE = re.compile(r"^[A-Za-z0-9_./:@+\-]+$")
_RESERVED = {"null", "true", "false", "nan", "inf", "-inf"}


def value_text(value: Any) -> str:
    """``value`` as the right-hand side of an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and _BARE.match(value) and value.lower() not in _RESERVED and not _numeric(value):
        return value
    return json.dumps(value, ensure_ascii=False)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def leaves(data: Mapping[str, Any], keys: Collection[str], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf: the sections are walked; a key of ``keys`` (the schema's leaf keys) is a
    leaf even when its value is a mapping (``hw.env``: its own keys may hold dots and slashes)."""
    for key, value in data.items():
        if isinstance(value, Mapping) and value and f"{prefix}{key}" not in keys:
            yield from leaves(value, keys, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def compact_lines(recipe: Mapping[str, Any]) -> list[str]:
    """One ``key=value`` line per leaf key of the resolved recipe, in the recipe's order."""
    return [f"{key}={value_text(value)}" for key, value in leaves(recipe, set(recipe_keys()))]
