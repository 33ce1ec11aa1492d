"""``recipekit rescale``: a built bundle rebuilt for another number of nodes, as the same run.

The bundle names what it was built from (manifest.json's overrides) and what it planned (recipe.yaml's ``plan``).
The rebuild keeps the global batch (plan/rescale.py) and must come out with the same run id: then it has the same
Job name and output directory, and its first start resumes the old run's checkpoints. A different id means the
recipe tree changed since the bundle was built, and the rebuild would silently start another run: it is refused.
The node count is no part of the image (image/stack.py): the rebuild names the same image, and only its run files
(the ConfigMap) and the Job differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import Problem, RecipeError
from recipekit.base.limits import BUNDLE_FILE, read_regular
from recipekit.bundle.build import Built, Resolved, build_resolved, resolve
from recipekit.bundle.files import MANIFEST, RECIPE
from recipekit.plan.layout import Layout
from recipekit.plan.rescale import MAX_NODES, States, rescale_overrides, rescale_problems
from recipekit.runtime.boundary import jsonfile


@dataclass(frozen=True)
class Source:
    """What a built bundle says about itself: its overrides, run id, layout and ZeRO stage."""

    path: Path
    overrides: list[str]
    run_id: str
    layout: Layout
    states: States
    streaming: bool
    document: dict[str, Any]  # recipe.yaml as read: what the rebuild must keep (moved_places)


@dataclass(frozen=True)
class Rescaled:
    source: Source
    built: Built

    @property
    def source_image(self) -> str | None:
        """The image the bundle's plan named (recipe.yaml ``plan.image``)."""
        plan = self.source.document.get("plan")
        image = plan.get("image") if isinstance(plan, dict) else None
        return image if isinstance(image, str) else None

    @property
    def same_image(self) -> bool:
        """The rebuild runs the image the bundle did: the software stack is unchanged (only the run files and the
        Job are new), so no image is built or pushed for it."""
        return self.source_image == self.built.resolved.plan.image


#: recipe.yaml's plan numbers a rescale reads, with the largest each may be (larger ones are not a plan recipekit
#: wrote: refused before any arithmetic or search runs on them).
PLAN_BOUNDS = {
    "nodes": MAX_NODES,
    "devices_per_pod": 1 << 10,
    "tensor_parallel": 1 << 16,
    "pipeline_parallel": 1 << 16,
    "micro_batch_size": 1 << 20,
    "gradient_accumulation_steps": 1 << 20,
}
#: What the rebuild must keep as the bundle has it: the run's identity and its place on the volume. A manifest
#: whose overrides move any of them (say ``cluster.output_dir``) would rebuild a Job that looks for its checkpoints
#: elsewhere, under the same run id.
PLAN_PLACE = ("run_id", "job_name", "output_dir", "prepared_dir")
CLUSTER_PLACE = ("namespace", "pvc_claim", "mount_path", "output_dir", "task_name")


def read_source(bundle: Path) -> Source:
    """The bundle's overrides and plan, or a RecipeError naming each file, key and what it should be."""
    try:  # bounded, regular files only: the bundle may come from another team or a shared volume
        manifest = jsonfile.loads(read_regular(bundle / MANIFEST, BUNDLE_FILE), str(bundle / MANIFEST))
        recipe_path = str(bundle / RECIPE)
        document = yamlfile.load(yamlfile.decode(read_regular(bundle / RECIPE, BUNDLE_FILE), recipe_path), recipe_path)
    except (ValueError, yaml.YAMLError) as exc:
        problem = Problem(str(bundle), f"not a readable recipekit bundle ({type(exc).__name__}: {exc})")
        raise RecipeError([problem]) from None
    plan = document.get("plan") if isinstance(document, dict) else None
    recipe = document.get("recipe") if isinstance(document, dict) else None
    overrides = manifest.get("overrides") if isinstance(manifest, dict) else None
    where = f"{bundle}/{RECIPE}"
    if not isinstance(plan, dict) or not isinstance(plan.get("run_id"), str):
        raise RecipeError([Problem(where, "no plan with a run_id")])
    problems = [
        Problem(f"{where}: plan.{key}", f"{_shown(plan.get(key))}: expected a whole number from 1 to {most:,}")
        for key, most in PLAN_BOUNDS.items()
        if not _whole(plan.get(key), 1, most)
    ]
    if not _whole(plan.get("zero_stage") or 0, 0, 3):
        problems.append(Problem(f"{where}: plan.zero_stage", f"{_shown(plan.get('zero_stage'))}: expected 0 to 3"))
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        problems.append(Problem(f"{bundle}/{MANIFEST}", "no list of overrides to rebuild from"))
    if problems:
        raise RecipeError(problems)
    assert isinstance(overrides, list)
    n = {key: int(plan[key]) for key in PLAN_BOUNDS}
    layout = Layout(
        n["nodes"],
        n["devices_per_pod"],
        n["tensor_parallel"],
        n["pipeline_parallel"],
        n["micro_batch_size"],
        n["gradient_accumulation_steps"],
    )
    data: Any = (recipe or {}).get("data") if isinstance(recipe, dict) else None
    par: Any = (recipe or {}).get("parallel") if isinstance(recipe, dict) else None
    data, par = data if isinstance(data, dict) else {}, par if isinstance(par, dict) else {}
    offload = (str(par.get("offload_optimizer") or "none")[:64], str(par.get("offload_param") or "none")[:64])
    states = States(int(plan.get("zero_stage") or 0), *offload)
    return Source(bundle, overrides, plan["run_id"], layout, states, data.get("streaming") is True, document)


def _whole(value: Any, least: int, most: int) -> bool:
    return type(value) is int and least <= value <= most


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def moved_places(source: Source, resolved: Resolved) -> list[Problem]:
    """Each key of the run's identity or place on the volume that the rebuild would change."""
    plan: Any = source.document.get("plan") or {}
    recipe: Any = source.document.get("recipe")
    cluster: Any = recipe.get("cluster") if isinstance(recipe, dict) else None
    cluster = cluster if isinstance(cluster, dict) else {}
    rebuilt_plan, rebuilt_cluster = resolved.plan, resolved.recipe.cluster
    pairs = [(f"plan.{k}", plan.get(k), getattr(rebuilt_plan, k)) for k in PLAN_PLACE]
    pairs += [(f"recipe.cluster.{k}", cluster.get(k), getattr(rebuilt_cluster, k)) for k in CLUSTER_PLACE]
    return [
        Problem(
            f"{source.path}/{MANIFEST}: overrides",
            f"the rebuild's {key} is {_shown(new)}, the bundle's {_shown(old)}: a rescale keeps the run where it is "
            "(its identity and its place on the volume)",
            hint="rescale the bundle as it was built; a manifest whose overrides disagree with its recipe.yaml was "
            "edited after the build",
        )
        for key, old, new in pairs
        if old != new
    ]


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
    moved = moved_places(source, resolved)
    if moved:
        raise RecipeError(moved)
    built = build_resolved(resolved, output or default_output(bundle, nodes), force=force)
    return Rescaled(source, built)
