"""What crosses between recipekit and a run, written down once: file names, exit codes, FLOPs, checkpoints and resume,
metrics.jsonl's records, recipe.yaml as the run reads it, metric names, the training order, the runtime's one error.

A bundle never imports recipekit, so what build time (the planner, the validator, the report) and run time (the
launcher, train.py) must agree on lives here, below every other runtime room: recipekit imports these modules as
``recipekit.runtime.boundary``, every bundle carries them as ``runtime/boundary/``, and both sides run the same code.
Checkpoints and resume, one rule in two modules, have an inner room: :mod:`~recipekit.runtime.boundary.resume`.
"""
