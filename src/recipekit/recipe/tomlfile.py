"""Reading a TOML file recipekit did not write (a team's ``recipekit.toml``) without a traceback.

``tomllib`` parses nested arrays and inline tables by recursion, so 100 KB of ``[`` raise ``RecursionError`` — and
since every command below that directory reads the file, one such file broke them all. A document nested just
below Python's limit loads, then overflows whatever prints it. So the file is bounded in size and depth, and every
failure is one :class:`~recipekit.errors.RecipeError` line naming the file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from recipekit.errors import Problem, RecipeError
from recipekit.runtime.jsonfile import nesting

#: Largest file read (a recipekit.toml is a few lines).
MAX_BYTES = 1 << 20
#: Deepest nesting of tables and arrays (recipekit.toml uses 2: a list of paths).
MAX_DEPTH = 16


def read(path: Path) -> dict[str, Any]:
    """The TOML file at ``path`` as a dict; a one-line RecipeError when it is unreadable, too big, not UTF-8, not
    TOML or nested more than :data:`MAX_DEPTH` levels deep."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]

    where = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise RecipeError([Problem(where, f"cannot be read ({exc.strerror or exc})")]) from None
    if len(data) > MAX_BYTES:
        raise RecipeError([Problem(where, f"is larger than {MAX_BYTES} bytes, the most recipekit reads of TOML")])
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
