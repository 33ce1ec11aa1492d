"""``python -m recipekit.cli``: the same as the ``recipekit`` command."""

from recipekit.cli import run

run()
