"""Stage 4, memory: the memory, compute, time and cost of a recipe's plan, the layouts that fit, and the operations
layer's numbers that follow the estimate.

Everything here is arithmetic on the recipe's architecture numbers and the plan's layout, so ``recipekit plan`` can
answer "does it fit, how long, how much" before anything is downloaded or scheduled. Modules, one job each, in the
order the stage uses them:

* :mod:`~recipekit.memory.formulas`: constants with their sources, the one precision/ZeRO :class:`Regime` of byte
  widths, model states and ZeRO's buffers; beside it, pure functions of numbers and specs too:
  :mod:`~recipekit.memory.activations` (what autograd keeps), :mod:`~recipekit.memory.traffic` (what a step moves:
  data-parallel, offload, TP) and :mod:`~recipekit.memory.pipeline` (the schedule's bubble, micro-batches in flight);
* :mod:`~recipekit.memory.breakdown`: what one device holds, item by item (:class:`MemoryItem`), with how each
  was counted;
* :mod:`~recipekit.memory.estimate`: the :class:`Estimate` of one recipe under one plan, with
  :mod:`~recipekit.memory.overlap` (what compute hides), :mod:`~recipekit.memory.parallel3d` (TP, CP, PP) and
  :mod:`~recipekit.memory.experts` (an MoE model's EP) for its parts; :mod:`~recipekit.memory.stages` sums
  the estimates of a run's stages;
* :mod:`~recipekit.memory.advise`: variations that fit (:func:`fixes`, :func:`fit_problem`, :func:`advise`), trying
  the parallel options the caller passes in (:func:`recipekit.recipe.paralleloptions.load_parallel_options` reads them)
  over the layouts :mod:`~recipekit.memory.layoutsearch` yields;
* :mod:`~recipekit.memory.operations`: the operations layer's timeouts, thresholds, checkpoint sizes and metrics
  ports (numbers only: the documents made of them are the bundle's).

Nothing here reads from disk at import (advise reads the built-in Megatron engine option when a candidate
first moves to it). The package's ``estimate`` and ``advise`` are the functions (they hide the modules of
the same name as attributes): reach a module's other names with ``from recipekit.memory.estimate import ...``.
"""

from recipekit.memory.activations import ActivationBytes, activation_bytes, layer_activation_bytes
from recipekit.memory.advise import Advice, Candidate, advise, candidate, fit_problem, fixes, why_first
from recipekit.memory.breakdown import MemoryItem
from recipekit.memory.estimate import (
    Communication,
    Compute,
    Estimate,
    Offload,
    TimeItem,
    dp_group_crosses_nodes,
    estimate,
)
from recipekit.memory.formulas import GB, GIB, ModelStates, Regime, model_states, regime
from recipekit.memory.parallel3d import ThreeD
from recipekit.memory.pipeline import bubble_fraction
from recipekit.memory.traffic import tp_inside_node

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
