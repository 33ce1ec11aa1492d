"""Matrix builds: ``recipekit build -m recipe=a,b hw=x,y`` — one bundle per combination of a Hydra sweep.

The sweep is Hydra's multirun grammar, expanded by :func:`~recipekit.recipe.compose.expand_sweep` (the cartesian product
in argument order). Each combination builds exactly as ``recipekit build <its overrides>`` would — same checks, same
bytes — into its own directory under the output root (default ``bundles/``)::

    <recipe name>[@<value>...]     e.g. bundles/llama3_8b_sft@h100, bundles/tiny_sft@cpu@train.seed=2

where each swept argument adds its value (a group's option, or ``key=value``); a swept ``recipe`` names the
directory by its option instead of the recipe's name, so two presets can never share one. A combination that
fails is reported with all its problems and the rest still build; the summary table ends the output.

Combinations share work. Those with the same group choices are composed once, their swept values applied to a
copy as Hydra applies command-line values (:func:`~recipekit.recipe.compose.compose_variants`); templates are compiled
and the libraries imported once, in this process, before the work is forked to a pool of two processes (both cores of
a build machine) that inherits them.
"""

from __future__ import annotations

import math
import multiprocessing
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipekit.base.errors import Problem, RecipeError
from recipekit.bundle.build import DEFAULT_OUTPUT_ROOT, build_resolved, resolve
from recipekit.recipe.compose import Composed, compose, compose_variants, expand_sweep, preload
from recipekit.recipe.overrides import Override

#: Processes that build in parallel: the 2 cores of the build machines recipekit is sized for.
JOBS = 2
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


@dataclass(frozen=True)
class Combination:
    index: int
    overrides: list[str]
    #: The part of the output directory after the recipe name ("@h100@train.seed=2"), and the swept recipe option
    #: that replaces the name, if any.
    suffix: str
    recipe_option: str | None
    #: Overrides composed once for all combinations that share them, and the values applied to a copy after.
    base: tuple[str, ...]
    tail: tuple[str, ...]

    @property
    def label(self) -> str:
        return " ".join(self.overrides)


@dataclass(frozen=True)
class Outcome:
    """One combination's result, as the summary table shows it."""

    combination: str
    path: str | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    devices: str = ""
    fit: str = ""
    image: str = ""  # the image the bundle's Job runs: one per software stack (image/stack.py)

    @property
    def ok(self) -> bool:
        return self.path is not None


def combinations(arguments: Sequence[str], extra_dirs: Sequence[Path] = ()) -> list[Combination]:
    """The sweep's combinations with their output names and shared compositions; RecipeError if it is unusable."""
    sweep = expand_sweep(arguments, extra_dirs)
    value_swept = [i for i, (s, g) in enumerate(zip(sweep.swept, sweep.group)) if s and not g]
    first_tail = value_swept[0] if value_swept else len(sweep.swept)
    found: list[Combination] = []
    seen: dict[tuple[str | None, str], str] = {}
    problems: list[Problem] = []
    for index, overrides in enumerate(sweep.combinations):
        parts, recipe_option = [], None
        for position, override in enumerate(overrides):
            parsed = Override.parse(override)
            bare, value = parsed.key, parsed.value or ""
            if bare == "recipe" and sweep.swept[position]:
                recipe_option = value
            elif sweep.swept[position] and bare != "name":
                parts.append(value if sweep.group[position] else f"{bare}={value}")
        suffix = "".join(f"@{_UNSAFE.sub('_', part)}" for part in parts)
        label = " ".join(overrides)
        clash = seen.setdefault((recipe_option, suffix), label)
        if clash != label:
            problems.append(Problem(label, f"would share its output directory with {clash}"))
        base = tuple(o for i, o in enumerate(overrides) if i < first_tail or sweep.group[i])
        tail = tuple(o for i, o in enumerate(overrides) if i >= first_tail and not sweep.group[i])
        found.append(Combination(index, list(overrides), suffix, recipe_option, base, tail))
    if problems:
        raise RecipeError(problems)
    return found


def run_matrix(
    arguments: Sequence[str],
    output_root: Path | None = None,
    *,
    extra_dirs: Sequence[Path] = (),
    force: bool = False,
    allow_oom: bool = False,
    jobs: int = JOBS,
) -> list[Outcome]:
    """Build every combination of the sweep ``arguments``; the outcomes in combination order.

    Raises :class:`RecipeError` only when the sweep itself is unusable (nothing is built then).
    """
    found = combinations(arguments, extra_dirs)
    root = Path(output_root) if output_root is not None else DEFAULT_OUTPUT_ROOT
    origin = None
    if extra_dirs:
        from recipekit.recipe.origin import origin as detect_origin

        origin = detect_origin(extra_dirs)  # once, not once per bundle
    tasks = [(group, root, tuple(extra_dirs), force, allow_oom, origin) for group in _share(found, jobs)]
    _warm_up()
    if jobs <= 1 or len(tasks) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        results = [_run(task) for task in tasks]
    else:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(tasks))) as pool:
            results = list(pool.imap_unordered(_run, tasks))
    outcomes = dict(pair for result in results for pair in result)
    return [outcomes[c.index] for c in found]


def _share(found: list[Combination], jobs: int) -> list[list[Combination]]:
    """Combinations grouped by what they compose. With several processes a group bigger than an eighth of the work
    is split, so that no process is left with most of it — into pieces of at least 8: each piece costs one more
    composition, which takes about as long as building 6 bundles from one."""
    groups: dict[tuple[str, ...], list[Combination]] = {}
    for combination in found:
        groups.setdefault(combination.base, []).append(combination)
    size = len(found) if jobs <= 1 else max(8, math.ceil(len(found) / (jobs * 4)))
    return [members[i : i + size] for members in groups.values() for i in range(0, len(members), size)]


def _warm_up() -> None:
    """Import and compile in this process what every combination needs, so forked workers inherit it."""
    from recipekit.bundle import render

    preload()
    environment = render._environment()
    for name in environment.list_templates(extensions=["j2"]):
        if "/" not in name:
            environment.get_template(name)


def _run(task: tuple[Any, ...]) -> list[tuple[int, Outcome]]:
    members, root, extra_dirs, force, allow_oom, origin = task
    shared = compose_variants(members[0].base, [(c.overrides, c.tail) for c in members], extra_dirs)
    return [
        (c.index, _build_one(c, pre, root, extra_dirs, force, allow_oom, origin)) for c, pre in zip(members, shared)
    ]


def _build_one(
    combination: Combination,
    pre: Composed | None,
    root: Path,
    extra_dirs: tuple[Path, ...],
    force: bool,
    allow_oom: bool,
    origin: Any,
) -> Outcome:
    def composer(overrides: list[str], dirs: Sequence[Path]) -> Composed:
        return pre if pre is not None and overrides == combination.overrides else compose(overrides, dirs)

    try:
        resolved = resolve(combination.overrides, extra_dirs, composer=composer)
        name = combination.recipe_option or resolved.recipe.name
        target = root / f"{name}{combination.suffix}"
        if target.resolve().parent != root.resolve():  # ``--force`` replaces only directories inside the root
            raise RecipeError([Problem(str(target), f"bundle name {name!r} leaves the output root {root}")])
        built = build_resolved(resolved, target, force=force, allow_oom=allow_oom, origin=origin)
    except RecipeError as err:
        return Outcome(combination.label, problems=[str(p) for p in err.problems])
    plan, estimate = built.resolved.plan, built.estimate
    fit = f"{'fits' if estimate.fits else 'OVER'} {estimate.total_gib:.1f}/{estimate.device_gib:g} GiB"
    return Outcome(
        combination.label,
        path=str(built.path),
        warnings=list(plan.warnings),
        devices=f"{plan.layout.nodes}×{plan.layout.devices_per_pod} = {plan.layout.world_size}",
        fit=fit,
        image=plan.image,
    )


def summary(outcomes: Sequence[Outcome], relative_to: Path | None = None) -> str:
    """The closing table: combination, result, devices, plan fit; then the counts."""
    base = relative_to or Path.cwd()

    def shown(path: str) -> str:
        try:
            return str(Path(path).relative_to(base))
        except ValueError:
            return path

    rows = [("combination", "result", "devices", "plan fit")]
    for outcome in outcomes:
        if outcome.ok:
            result = f"built {shown(outcome.path or '')}"
        else:
            more = len(outcome.problems) - 1
            first = outcome.problems[0] if len(outcome.problems[0]) <= 60 else outcome.problems[0][:57] + "..."
            result = f"FAILED {first}" + (f" (+{more} more)" if more > 0 else "")
        rows.append((outcome.combination, result, outcome.devices or "-", outcome.fit or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in [*widths, len("plan fit")]))
    failed = sum(not o.ok for o in outcomes)
    plural = "s" if len(outcomes) != 1 else ""
    lines.append(f"{len(outcomes)} combination{plural}: {len(outcomes) - failed} built, {failed} failed")
    lines.extend(images_line(outcomes))
    return "\n".join(lines)


def distinct_images(outcomes: Sequence[Outcome]) -> list[str]:
    """The images the built bundles run, each once, in build order: one per software stack."""
    return list(dict.fromkeys(o.image for o in outcomes if o.ok and o.image))


def images_line(outcomes: Sequence[Outcome]) -> list[str]:
    """How many images the built bundles need (the run files travel beside them), and which."""
    images = distinct_images(outcomes)
    if not images:
        return []
    built = sum(o.ok for o in outcomes)
    head = (
        f"{len(images)} image{'s' if len(images) != 1 else ''} to build for {built} bundle{'s' if built != 1 else ''}"
    )
    return [f"{head} (one per software stack):"] + [f"  {image}" for image in images]
