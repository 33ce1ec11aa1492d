"""A LoRA recipe's ``target_modules`` against the model's module tree: what would match, what never can.

PEFT matches each target name against every module path (the path itself or a path ending in ``.<name>``); a name
that matches nothing is dropped, and a list of which nothing matches stops the run with a ValueError, on the cluster,
after the image is pulled and the gang scheduled. The tree is a fact of the architecture, recorded by `recipekit model
import` (``model.modules``, :mod:`recipekit.recipe.measured.moduletree`), so ``build`` refuses such a name here,
with the names the model has and the one meant: ``q_proj`` on Phi-4, whose attention is one fused ``qkv_proj``.

The MoE families whose experts transformers 5 fused into 3-D weights keep their transformers-4 expert names in PEFT
(``gate_proj``/``up_proj``/``down_proj``, Mixtral's ``w1``/``w2``/``w3``): PEFT rewrites them to the fused weights,
and refuses a fused pair named by one half (``gate_proj`` without ``up_proj``). Both rules are checked here too.
An option without a recorded tree (written by hand) is checked on the cluster only.
"""

from __future__ import annotations

import difflib

from recipekit.base.errors import Problem
from recipekit.recipe.sections import ModuleTreeSpec, Recipe, adapter_of

KEY = "mode.lora.target_modules"


def target_problems(recipe: Recipe) -> list[Problem]:
    """Every target of the recipe's LoRA adapter no module of its model matches, and each fused expert pair named
    by one half; empty for all-linear, for a mode without an adapter and for a model without a recorded tree."""
    lora, tree = adapter_of(recipe.mode), recipe.model.modules
    if lora is None or tree is None or not isinstance(lora.target_modules, list):
        return []
    targets = list(dict.fromkeys(lora.target_modules))
    unknown = [t for t in targets if not matches(tree, t)]
    problems = []
    if unknown:
        problems.append(_unknown_problem(recipe.model.name, tree, targets, unknown))
    problems += _half_pairs(recipe.model.name, tree, targets)
    return problems


def matches(tree: ModuleTreeSpec, target: str) -> bool:
    """Whether PEFT would adapt something for ``target``: a module whose path is it or ends in it (inside a layer
    or outside the layers), or an expert name PEFT rewrites to a fused weight."""
    wanted = _generic(target)
    if target in tree.expert_names:
        return True
    inside = {path for kind in tree.layers for path in kind.linear}
    if any(_ends_with(path, wanted) or _ends_with(wanted, path) for path in inside):
        return True  # a target may also spell the layer's own path (layers.3.self_attn.q_proj)
    return any(_ends_with(path, wanted) for path in tree.outside)


def adaptable(tree: ModuleTreeSpec) -> list[str]:
    """The module paths inside the layers, in the order the first kind lists them, each once."""
    return list(dict.fromkeys(path for kind in tree.layers for path in kind.linear))


def _ends_with(path: str, name: str) -> bool:
    return path == name or path.endswith("." + name)


def _generic(name: str) -> str:
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def _unknown_problem(model: str, tree: ModuleTreeSpec, targets: list[str], unknown: list[str]) -> Problem:
    """One problem for every target that matches nothing: the model's modules, and the list that was meant."""
    have = adaptable(tree) + [f"{alias} (experts)" for alias in tree.expert_names]
    leaves = list(dict.fromkeys(path.rsplit(".", 1)[-1] for path in adaptable(tree))) + list(tree.expert_names)
    meant = {name: suggestion(name, leaves) for name in unknown}
    names = unknown[0] if len(unknown) == 1 else f"{', '.join(unknown[:-1])} or {unknown[-1]}"
    message = f"{model} has no module named {names} (its layers have {', '.join(have)})"
    fused = [f"{name} is fused into {meant[name]}" for name in unknown if _fused_into(name, meant[name] or "")]
    if not any(meant.values()):
        return Problem(KEY, message, "name modules the layers have, or all-linear")
    fixed = list(dict.fromkeys(meant.get(t) or t for t in targets if t not in unknown or meant.get(t)))
    hint = "; ".join(fused) + ": " if fused else "did you mean: "
    return Problem(KEY, message, f"{hint}{KEY}=[{','.join(fixed)}], or all-linear")


def suggestion(name: str, leaves: list[str]) -> str | None:
    """The module ``name`` most likely meant: the fused module it is part of (``q_proj`` → ``qkv_proj``,
    ``up_proj`` → ``gate_up_proj``), else the closest spelling."""
    leaf = name.rsplit(".", 1)[-1]
    fused = [candidate for candidate in leaves if _fused_into(leaf, candidate)]
    if fused:
        return fused[0]
    close = difflib.get_close_matches(leaf, leaves, n=1, cutoff=0.7)
    return close[0] if close else None


def _fused_into(part: str, whole: str) -> bool:
    """Whether ``whole`` fuses ``part`` with others: the same last word (``proj``), and ``part``'s words among
    ``whole``'s (``up`` in ``gate_up``) or, for one-letter names, its letter in ``whole``'s one word (``q`` in
    ``qkv``)."""
    if part == whole or "_" not in part or "_" not in whole:
        return False
    *head, last = part.split("_")
    *whole_head, whole_last = whole.split("_")
    if last != whole_last or len(whole_head) == 0:
        return False
    if set(head) < set(whole_head):
        return True
    return len(head) == 1 == len(whole_head) and len(head[0]) == 1 and head[0] in whole_head[0] != head[0]


def _half_pairs(model: str, tree: ModuleTreeSpec, targets: list[str]) -> list[Problem]:
    """Expert names PEFT fuses into one weight, named by only some of them (PEFT refuses them: "Cannot convert PEFT
    target(s) gate_proj without also targeting up_proj because they are fused into gate_up_proj")."""
    groups: dict[str, list[str]] = {}
    for alias, weight in tree.expert_names.items():
        groups.setdefault(weight, []).append(alias)
    problems = []
    for weight, aliases in groups.items():
        given = [a for a in aliases if a in targets]
        if len(aliases) > 1 and 0 < len(given) < len(aliases):
            missing = [a for a in aliases if a not in given]
            problems.append(
                Problem(
                    KEY,
                    f"{', '.join(given)} without {', '.join(missing)}: {model}'s experts hold them fused in one "
                    f"{weight}, which PEFT adapts whole",
                    f"add {', '.join(missing)}, or all-linear",
                )
            )
    return problems
