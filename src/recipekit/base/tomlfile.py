"""Reading a TOML file recipekit did not write (a team's ``recipekit.toml``) without a traceback.

``tomllib`` parses nested arrays and inline tables by recursion, so 100 KB of ``[`` raise ``RecursionError`` — and
since every command below that directory reads the file, one such file broke them all. A document nested just
below Python's limit loads, then overflows whatever prints it. So the file is bounded in size
(:data:`recipekit.base.limits.TOML_FILE`, raised with its variable) and depth, and every failure is one
:class:`~recipekit.base.errors.RecipeError` line naming the file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from recipekit.base.errors import Problem, RecipeError
from recipekit.base.limits import TOML_FILE, read_regular
from recipekit.runtime.boundary.jsonfile import nesting

#: Deepest nesting of tables and arrays (recipekit.toml uses 2: a list of paths).
MAX_DEPTH = 16


def read(path: Path) -> dict[str, Any]:
    """The TOML file at ``path`` as a dict; a one-line RecipeError when it is unreadable, not a regular file, over
    :data:`~recipekit.base.limits.TOML_FILE`, not UTF-8, not TOML or nested more than :data:`MAX_DEPTH` levels deep."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]

    where = str(path)
    data = read_regular(path, TOML_FILE)  # a regular file within the limit: no FIFO, no /dev/zero
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError([Problem(where, f"is not UTF-8 text (byte offset {exc.start})")]) from None
    try:
        document = tomllib.loads(text)
    except RecursionError:
        raise RecipeError([Problem(where, f"nested more than {MAX_DEPTH} levels deep")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError([Problem(where, f"not valid TOML: {' '.join(str(exc).split())}")]) from None
    if nesting(document) > MAX_DEPTH:
        raise RecipeError([Problem(where, f"nested more than {MAX_DEPTH} levels deep")])
    return document
