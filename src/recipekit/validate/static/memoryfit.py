"""What validate's verdict adds to "bundle OK": a bundle built with ``--allow-oom`` is predicted not to fit.

Every check can pass on such a bundle (its files agree with each other); the prediction in its plan.json is
what says the run will die of out-of-memory. It is a warning, not a failure: the user asked for the bundle.
"""

from __future__ import annotations

from recipekit.bundle.files import PLAN_JSON
from recipekit.bundle.summary import not_fit
from recipekit.runtime.boundary import jsonfile
from recipekit.validate.shared.loader import Bundle


def fit_warnings(bundle: Bundle) -> list[str]:
    """The not-fit line when plan.json predicts the run does not fit (nothing when it fits or cannot be read)."""
    raw = bundle.raw.get(PLAN_JSON)
    if raw is None:
        return []
    try:
        memory = jsonfile.loads(raw, PLAN_JSON)["memory_gib"]
        if memory["fits"] is False:
            return [not_fit(float(memory["total"]), float(memory["device"]))]
    except (ValueError, KeyError, TypeError):
        return []  # an unreadable plan.json is the structure checks' to report
    return []
