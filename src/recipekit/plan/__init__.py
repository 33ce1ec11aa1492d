"""Stage 3, the plan: every number and name the bundle uses, computed once from the Recipe (layout, parallelism,
model and data sizes, run identity, placement), and the rules across sections that check them.

Pure arithmetic, apart from :mod:`~recipekit.plan.prepared`, which reads a prepared dataset's manifest when
``recipekit plan --data`` names one.
"""
