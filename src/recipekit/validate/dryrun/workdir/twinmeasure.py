"""The child process that measures a tiny twin's config.json as `recipekit model import` would.

Run as ``python -m`` this module with the config.json's path; one JSON line on stdout, ``{"option": {...}}`` (the
option's fields: architecture numbers, exact counts and the counter's FLOPs) or ``{"problem": "..."}``.

A child because measuring builds the model on the meta device with torch and transformers, which recipekit's own
process never imports (:mod:`~recipekit.validate.dryrun.workdir.twinmodel` says where the twin comes from).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from recipekit.recipe import modelimport
from recipekit.recipe.schema import to_data


def measure(path: Path) -> dict[str, Any]:
    """The answer for the config.json at ``path``."""
    try:
        imported = modelimport.import_config(path)
    except modelimport.ImportProblem as exc:
        return {"problem": f"its tiny twin cannot be measured ({exc})"}
    return {"option": {key: to_data(value) for key, value in imported.option.items()}}


def main() -> None:
    sys.stdout.write("\n" + json.dumps(measure(Path(sys.argv[1]))) + "\n")


if __name__ == "__main__":
    main()
