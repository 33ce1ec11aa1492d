"""Stage 1, the recipe: typed sections and their domains, Hydra composition with team layers, where values came
from. Everything later reads a :class:`~recipekit.recipe.sections.Recipe`; nothing here knows of plans or bundles.
"""
