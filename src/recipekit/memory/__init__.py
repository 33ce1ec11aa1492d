"""Stage 4, memory: the memory, compute, time and cost of a recipe's plan, the layouts that fit, and the operations
layer's numbers that follow the estimate.

Everything here is arithmetic on the recipe's architecture numbers and the plan's layout, so ``recipekit plan`` can
answer "does it fit, how long, how much" before anything is downloaded or scheduled. Five modules, one job each:

* :mod:`~recipekit.memory.formulas`: constants with their sources and pure functions of numbers and specs (model
  states, activations, buffers, traffic, offload), with the one precision/ZeRO :class:`Regime` of byte widths;
* :mod:`~recipekit.memory.breakdown`: what one device holds, item by item (:class:`MemoryItem`), with how each
  was counted;
* :mod:`~recipekit.memory.estimate`: the :class:`Estimate` of one recipe under one plan;
* :mod:`~recipekit.memory.advise`: variations that fit (:func:`fixes`, :func:`fit_problem`, :func:`advise`), trying
  the parallel options the caller passes in (:func:`recipekit.recipe.paralleloptions.load_parallel_options` reads them);
* :mod:`~recipekit.memory.operations`: the operations layer's timeouts, thresholds, checkpoint sizes and metrics
  ports (numbers only: the documents made of them are the bundle's).

Nothing here reads from disk. The package's ``estimate`` and ``advise`` are the functions (they hide the modules of
the same name as attributes): reach a module's other names with ``from recipekit.memory.estimate import ...``.
"""

from recipekit.memory.advise import Advice, Candidate, advise, candidate, fit_problem, fixes, why_first
from recipekit.memory.breakdown import MemoryItem
from recipekit.memory.estimate import (
    Communication,
    Compute,
    Estimate,
    Offload,
    ThreeD,
    TimeItem,
    dp_group_crosses_nodes,
    estimate,
)
from recipekit.memory.formulas import (
    GB,
    GIB,
    ActivationBytes,
    ModelStates,
    Regime,
    activation_bytes,
    bubble_fraction,
    layer_activation_bytes,
    model_states,
    regime,
    tp_inside_node,
)

__all__ = [
    "GB",
    "GIB",
    "ActivationBytes",
    "Advice",
    "Candidate",
    "Communication",
    "Compute",
    "Estimate",
    "MemoryItem",
    "ModelStates",
    "Offload",
    "Regime",
    "ThreeD",
    "TimeItem",
    "activation_bytes",
    "advise",
    "bubble_fraction",
    "candidate",
    "dp_group_crosses_nodes",
    "estimate",
    "fit_problem",
    "fixes",
    "layer_activation_bytes",
    "model_states",
    "regime",
    "tp_inside_node",
    "why_first",
]
