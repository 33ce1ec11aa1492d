"""``recipekit rescale``: a built bundle rebuilt for another number of nodes, as the same run.

The bundle names what it was built from (manifest.json's overrides) and what it planned (recipe.yaml's ``plan``).
The rebuild keeps the global batch (plan/rescale.py) and must come out with the same run id: then it has the same
Job name and output directory, and its first start resumes the old run's checkpoints. A different id means the
recipe tree changed since the bundle was built, and the rebuild would silently start another run: it is refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import Problem, RecipeError
from recipekit.base.limits import BUNDLE_FILE, read_regular
from recipekit.bundle.build import Built, build_resolved, resolve
from recipekit.bundle.files import MANIFEST, RECIPE
from recipekit.plan.layout import LAYOUT_KEYS, Layout
from recipekit.plan.rescale import States, rescale_overrides, rescale_problems


@dataclass(frozen=True)
class Source:
    """What a built bundle says about itself: its overrides, run id, layout and ZeRO stage."""

    path: Path
    overrides: list[str]
    run_id: str
    layout: Layout
    states: States
    streaming: bool


@dataclass(frozen=True)
class Rescaled:
    source: Source
    built: Built


def read_source(bundle: Path) -> Source:
    """The bundle's overrides and plan, or a RecipeError saying which file or key is missing."""
    try:  # bounded, regular files only: the bundle may come from another team or a shared volume
        manifest = json.loads(read_regular(bundle / MANIFEST, BUNDLE_FILE))
        recipe_path = str(bundle / RECIPE)
        document = yamlfile.load(yamlfile.decode(read_regular(bundle / RECIPE, BUNDLE_FILE), recipe_path), recipe_path)
    except (ValueError, yaml.YAMLError) as exc:
        problem = Problem(str(bundle), f"not a readable recipekit bundle ({type(exc).__name__}: {exc})")
        raise RecipeError([problem]) from None
    plan = document.get("plan") if isinstance(document, dict) else None
    recipe = document.get("recipe") if isinstance(document, dict) else None
    overrides = manifest.get("overrides") if isinstance(manifest, dict) else None
    numbers = {k: (plan or {}).get(k) for k in LAYOUT_KEYS}
    missing = [f"plan.{k}" for k, v in numbers.items() if not isinstance(v, int)]
    if not isinstance(plan, dict) or not isinstance(plan.get("run_id"), str) or missing:
        raise RecipeError([Problem(f"{bundle}/{RECIPE}", f"no plan with run_id and {', '.join(missing) or 'layout'}")])
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise RecipeError([Problem(f"{bundle}/{MANIFEST}", "no list of overrides to rebuild from")])
    given = {k: int(v) for k, v in numbers.items() if isinstance(v, int)}
    layout = Layout(
        given["nodes"],
        given["devices_per_pod"],
        given["tensor_parallel"],
        given["pipeline_parallel"],
        given["micro_batch_size"],
        given["gradient_accumulation_steps"],
    )
    data: Any = (recipe or {}).get("data") or {}
    par: Any = (recipe or {}).get("parallel") or {}
    states = States(
        int(plan.get("zero_stage") or 0),
        str(par.get("offload_optimizer") or "none"),
        str(par.get("offload_param") or "none"),
    )
    return Source(bundle, overrides, plan["run_id"], layout, states, bool(data.get("streaming")))


def default_output(bundle: Path, nodes: int) -> Path:
    return bundle.parent / f"{bundle.name}@nodes{nodes}"


def rescale(
    bundle: Path,
    nodes: int,
    output: Path | None = None,
    *,
    extra_dirs: Sequence[Path] = (),
    force: bool = False,
) -> Rescaled:
    """Rebuild ``bundle`` on ``nodes`` nodes at its global batch, as the same run; RecipeError when it cannot be."""
    source = read_source(bundle)
    problems = rescale_problems(source.layout, nodes, streaming=source.streaming, states=source.states)
    if nodes == source.layout.nodes:
        problems.append(Problem("--nodes", f"{nodes}: the bundle already runs on {nodes} node(s)"))
    if problems:
        raise RecipeError(problems)
    overrides = rescale_overrides(source.overrides, nodes=nodes, global_batch_size=source.layout.global_batch_size)
    resolved = resolve(overrides, extra_dirs)
    if resolved.plan.run_id != source.run_id:
        raise RecipeError(
            [
                Problem(
                    str(bundle),
                    f"the rebuild is run {resolved.plan.run_id}, the bundle's is {source.run_id}: the recipe tree "
                    "changed since the bundle was built, so it would start another run instead of continuing this one",
                    hint="rescale in the recipe tree (and --recipes) the bundle was built from; `recipekit diff` "
                    "shows what changed between two bundles",
                )
            ]
        )
    built = build_resolved(resolved, output or default_output(bundle, nodes), force=force)
    return Rescaled(source, built)
