"""Presentation of the plan and :mod:`recipekit.memory` results: rich renderables for the terminal, markdown for the
bundle's plan.md, and a JSON-able dict for plan.json and ``--json``.

The dict is what other tools read and what goes into bundles, so it has a fixed key order and every float rounded to
a few significant digits: the same recipe gives byte-identical files on any machine. The terminal and markdown views
format the same numbers for reading and never compute anything themselves. One module a view, over the words they
share: :mod:`~recipekit.bundle.planview.words` (durations, the layout in words, the rows), then
:mod:`~recipekit.bundle.planview.terminal`, :mod:`~recipekit.bundle.planview.planmd`,
:mod:`~recipekit.bundle.planview.planjson` and :mod:`~recipekit.bundle.planview.stages` (a run of several stages).
The package holds the views' entry points as its own names.
"""

from recipekit.bundle.planview.planjson import advice_dict, estimate_dict
from recipekit.bundle.planview.planmd import estimate_markdown
from recipekit.bundle.planview.stages import render_stages, stage_heading, stages_dict
from recipekit.bundle.planview.terminal import advice_lines, render_advice, render_estimate, render_summary

__all__ = [
    "advice_dict",
    "advice_lines",
    "estimate_dict",
    "estimate_markdown",
    "render_advice",
    "render_estimate",
    "render_stages",
    "render_summary",
    "stage_heading",
    "stages_dict",
]
