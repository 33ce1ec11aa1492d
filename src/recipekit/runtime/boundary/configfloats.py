"""Non-finite numbers in a model's config, written as transformers writes them: ``{"__float__": "Infinity"}``.

A config may hold a limit of ±inf (Mamba-2's ``time_step_limit``, and the hybrids built on it). JSON has no such
number; Python's json module writes a bare ``Infinity`` that strict readers refuse, so transformers' own
``to_json_string`` writes a tagged object instead and decodes it when it reads a config.json file, but not in
``from_dict``. A model option's ``config`` mapping is stored tagged (the bundle's JSON stays JSON), and the runtime
untags it before it builds the config.
"""

from __future__ import annotations

import math
from typing import Any

TAG = "__float__"
_TAGS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def tag_floats(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its tagged object (lists and mappings walked)."""
    if isinstance(value, float) and not math.isfinite(value):
        return {TAG: "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    if isinstance(value, dict):
        return {key: tag_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [tag_floats(item) for item in value]
    return value


def untag_floats(value: Any) -> Any:
    """``value`` with every tagged object replaced by its float: what transformers reads from a config.json file."""
    if isinstance(value, dict):
        if set(value) == {TAG} and value[TAG] in _TAGS:
            return _TAGS[value[TAG]]
        return {key: untag_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [untag_floats(item) for item in value]
    return value
