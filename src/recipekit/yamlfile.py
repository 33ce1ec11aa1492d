"""Reading recipekit's own YAML data files (image matrix, option descriptions, parallel options).

PyYAML's pure-Python loader costs several milliseconds per file on every CLI start; its libyaml binding
(``CSafeLoader``, shipped in PyYAML's wheels) parses the same safe subset in a fraction of that. Recipes themselves
are read by Hydra, not here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str) -> Any:
    """``yaml.safe_load``, through libyaml when available."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a SafeLoader (C or Python), never the unsafe one


def read(path: Path) -> Any:
    return load(path.read_text(encoding="utf-8"))
