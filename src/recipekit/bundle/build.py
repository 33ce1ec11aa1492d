"""The build pipeline, end to end: overrides → compose → Recipe → Plan → estimate → operations → documents → files
(a Compiled record) → bundle on disk.

Each step lives in its own module; this one only strings them together, so the CLI and the tests drive exactly
the same path. Nothing here imports torch, transformers or deepspeed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from recipekit import memory
from recipekit.base.errors import Problem, RecipeError
from recipekit.base.paths import GROUPS
from recipekit.bundle.documents import Documents, make_documents
from recipekit.bundle.render import render
from recipekit.bundle.write import built_for, recipe_changes, write_bundle
from recipekit.image.matrix import ImageMatrix, load_images
from recipekit.memory.operations import Operations, operations
from recipekit.plan.plan import Plan, make_plan
from recipekit.recipe.compose import Composed, PartialComposition, compose, default_name, group_options
from recipekit.recipe.overrides import slips, unknown_override_keys
from recipekit.recipe.paralleloptions import load_parallel_options
from recipekit.recipe.sections import Recipe, parse_recipe

#: Where bundles go when no -o is given: ./bundles/<recipe name>.
DEFAULT_OUTPUT_ROOT = Path("bundles")


@dataclass(frozen=True)
class Resolved:
    """A recipe taken as far as the plan: what ``show`` prints and ``build`` renders."""

    composed: Composed
    recipe: Recipe
    plan: Plan
    images: ImageMatrix
    #: The team recipe trees searched besides recipekit's own (their parallel options are fit suggestions too).
    extra_dirs: tuple[Path, ...] = ()
    #: What the user should know about how the recipe was named (:func:`unmistakable_name`).
    notes: tuple[str, ...] = ()


def resolve(
    overrides: Sequence[str],
    extra_dirs: Sequence[Path] = (),
    *,
    analysis_only: bool = False,
    composer: Callable[[list[str], Sequence[Path]], Composed] = compose,
) -> Resolved:
    """Compose, validate and plan; raises RecipeError with every problem of the first stage that has any.

    ``composer`` stands in for :func:`compose` where a matrix build already composed the recipe. A problem with a
    key a team YAML file set names that file and line (:mod:`recipekit.recipe.locate`).
    """
    overrides, slipped = slips(overrides, lambda group: group_options(group, extra_dirs), GROUPS)
    typos = unknown_override_keys(overrides, GROUPS)
    mistyped = {override for override, _ in typos}
    early = slipped + [problem for _, problem in typos]
    try:
        composed = composer([o for o in overrides if o not in mistyped], extra_dirs)
    except PartialComposition as err:
        raise RecipeError(early + err.problems + _schema_problems(err.composed, err.refused_keys)) from None
    except RecipeError as err:
        raise RecipeError(early + err.problems) from None
    if early:
        raise RecipeError(early + _schema_problems(composed, set()))
    composed, notes = unmistakable_name(composed, overrides, extra_dirs)
    try:
        recipe = parse_recipe(composed.raw)
        images = load_images()
        plan = make_plan(recipe, images, analysis_only=analysis_only)
    except RecipeError as err:
        if not extra_dirs:
            raise
        from recipekit.recipe.locate import locate

        raise RecipeError(locate(err.problems, overrides, extra_dirs)) from None
    return Resolved(composed, recipe, plan, images, tuple(Path(d) for d in extra_dirs), notes)


def unmistakable_name(
    composed: Composed, overrides: Sequence[str], extra_dirs: Sequence[Path]
) -> tuple[Composed, tuple[str, ...]]:
    """A recipe without a preset is named after its model and mode (``llama3_8b_sft``): where a preset has that
    name, the bundle would be taken for the preset's (``bundles/llama3_8b_sft`` from a bare ``build`` is ZeRO-2 with
    the default batch, the preset ZeRO-3), so it is named after its hardware too (``llama3_8b_sft_ascend910b``),
    with a note saying so. A name the user set, or a preset's own, is kept."""
    choices = composed.choices
    if choices.get("recipe") is not None or composed.raw.get("name") != default_name(choices):
        return composed, ()
    if any(o.lstrip("+~").split("=", 1)[0] == "name" for o in overrides):
        return composed, ()
    name = str(composed.raw["name"])
    if name not in group_options("recipe", extra_dirs):
        return composed, ()
    renamed = f"{name}_{choices.get('hw')}"
    note = (
        f"no recipe= preset given: named {renamed}, not after the preset {name} (which sets its own layout and "
        f"batch); add recipe={name} for the preset, or name=NAME"
    )
    return replace(composed, raw={**composed.raw, "name": renamed}), (note,)


def _schema_problems(composed: Composed, refused: set[str]) -> list[Problem]:
    """The recipe's own problems, found while another stage's are reported: each independent of those (a problem in
    a section whose group choice or key was refused may follow from the refusal, so none there is reported)."""
    try:
        parse_recipe(composed.raw)
    except RecipeError as err:
        return [p for p in err.problems if not any(p.key == r or p.key.startswith(r + ".") for r in refused)]
    return []


@dataclass(frozen=True)
class Compiled:
    """A bundle in memory: the resolved recipe, the estimate, the operations numbers and the documents it was made
    of, and its files (the manifest last). What ``build`` writes and what the dry run reads its re-planned numbers
    from, so that no one parses the bundle's own bytes back."""

    resolved: Resolved
    estimate: memory.Estimate
    operations: Operations
    documents: Documents
    files: dict[str, bytes]

    @property
    def plan(self) -> Plan:
        return self.resolved.plan


@dataclass(frozen=True)
class Built:
    """A bundle written to ``path``; ``replaced``: how the recipe of the bundle it replaced differed (``--force``)."""

    compiled: Compiled
    path: Path
    replaced: tuple[str, ...] = ()

    @property
    def resolved(self) -> Resolved:
        return self.compiled.resolved

    @property
    def files(self) -> dict[str, bytes]:
        return self.compiled.files

    @property
    def estimate(self) -> memory.Estimate:
        return self.compiled.estimate


def build(
    overrides: Sequence[str],
    output: Path | None = None,
    *,
    extra_dirs: Sequence[Path] = (),
    force: bool = False,
    allow_oom: bool = False,
    origin: Sequence[dict[str, Any]] | None = None,
) -> Built:
    """Build the bundle for ``overrides`` into ``output`` (default ./bundles/<name>), atomically.

    A recipe predicted not to fit in device memory is refused (naming the largest item and the cheapest change
    that fits) unless ``allow_oom``: finding out from an OOM after the image is built and the gang scheduled costs
    far more than this estimate.
    """
    return build_resolved(resolve(overrides, extra_dirs), output, force=force, allow_oom=allow_oom, origin=origin)


def build_resolved(
    resolved: Resolved,
    output: Path | None = None,
    *,
    force: bool = False,
    allow_oom: bool = False,
    origin: Sequence[dict[str, Any]] | None = None,
) -> Built:
    """The second half of :func:`build`, for a recipe already resolved (a matrix build names its output from it).

    The manifest records the team layers' ``origin``: None detects it from the resolved layers (git); ``verify``
    passes the one it unpacked, so that its rebuild in a temporary directory gives the same bytes.
    """
    if origin is None and resolved.extra_dirs:
        from recipekit.recipe.origin import origin as detect_origin

        origin = detect_origin(resolved.extra_dirs)
    if origin:
        resolved = replace(resolved, composed=replace(resolved.composed, origin=tuple(origin)))
    compiled = compile_bundle(resolved, allow_oom=allow_oom)
    target = output if output is not None else DEFAULT_OUTPUT_ROOT / resolved.recipe.name
    hardware = resolved.recipe.hw.name
    changes = recipe_changes(target, compiled.files)
    if changes and not force and built_for(target) in (None, hardware):  # other hardware: write_bundle says so
        raise RecipeError(
            [
                Problem(
                    str(target),
                    f"holds the bundle of another recipe ({', '.join(changes)})",
                    "pass --force to replace it, or -o DIR to keep both",
                )
            ]
        )
    path = write_bundle(compiled.files, target, force=force, hardware=hardware)
    return Built(compiled, path, tuple(changes))


def compile_bundle(resolved: Resolved, *, allow_oom: bool = False) -> Compiled:
    """The bundle's files in memory, after the memory check ``build`` applies; writes nothing.

    The operations layer's numbers follow the estimate (the hang watchdog's timeout is a multiple of the planned step
    time), so they are computed here, between the estimate and the renderer; the documents are built once, from all
    three.
    """
    estimate = memory.estimate(resolved.recipe, resolved.plan)
    if not estimate.fits and not allow_oom:
        options = load_parallel_options(resolved.extra_dirs)
        problem = memory.fit_problem(estimate, images=resolved.images, parallel_options=options)
        if problem is not None:
            raise RecipeError([replace(problem, hint=f"{problem.hint}; or build it anyway with --allow-oom")])
    ops = operations(resolved.recipe, resolved.plan, estimate)
    documents = make_documents(resolved.recipe, resolved.plan, ops)
    files = render(resolved.recipe, resolved.plan, documents, resolved.composed, estimate, ops)
    return Compiled(resolved, estimate, ops, documents, files)
