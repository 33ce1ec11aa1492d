"""The commands that act on a run: on the cluster (``submit``, ``status``, ``logs``, ``cancel``), after it
(``restart``, ``rescale``), and what it left (``runs history``, ``report``, ``compare``).

An inner room of the CLI because these share their object, a run of a built bundle, not a stage: each module parses
its command's flags, calls one library function (:mod:`recipekit.cluster`, :mod:`recipekit.handover`,
:mod:`recipekit.runs`) and prints.
"""
