"""``recipekit build``, ``show`` and ``plan``: compose a recipe, plan it, and write, print or estimate the bundle."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from recipekit.base.errors import RecipeError
from recipekit.cli.common import SETTINGS, finite, layers, recipes_option, rich_console, user_errors, warn

if TYPE_CHECKING:  # the CLI imports a stage where a command runs it
    from rich.console import Console

    from recipekit.bundle.build import Resolved
    from recipekit.memory import Advice
    from recipekit.recipe.sections import ParallelSpec


@click.command(context_settings={**SETTINGS, "ignore_unknown_options": True})
@click.argument("overrides", nargs=-1)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Bundle directory (default: bundles/<name>); with -m, the root.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace OUTPUT when it holds a bundle of another recipe (what changed is printed) or is no bundle.",
)
@click.option("--allow-oom", is_flag=True, help="Build even when the plan predicts the run will not fit in memory.")
@click.option(
    "-m",
    "--multirun",
    is_flag=True,
    help="Matrix build: OVERRIDES are a Hydra sweep (a=1,2 range() glob()); one bundle per combination, in "
    "<root>/<name>@<swept values>, then a summary table. Exit 2 if any combination failed.",
)
@recipes_option
@user_errors
def build(
    overrides: tuple[str, ...],
    output: Path | None,
    force: bool,
    allow_oom: bool,
    multirun: bool,
    extra_dirs: tuple[Path, ...],
) -> None:
    """Build the bundle for a recipe. OVERRIDES: Hydra overrides (group=option, key=value, +key=value, ~key).

    \b
    Examples:
      recipekit build recipe=llama3_8b_sft hw=ascend910b
      recipekit build recipe=qwen2.5_14b_sft cluster.nodes=4 train.epochs=1
      recipekit build model=qwen2.5_7b mode=lora hw=h100 -o bundles/qwen-lora
      recipekit build parallel=zero2 parallel.tensor_parallel=2 -o bundles/tp2
      recipekit build --recipes team-recipes/recipes recipe=our_qwen_sft
      recipekit build -m recipe=llama3_8b_sft,qwen3_8b_sft hw=ascend910b,h100
      recipekit build -m 'recipe=glob(*)' 'train.seed=range(1,3)' -o bundles/sweep
    """
    extra_dirs = layers(extra_dirs)
    if multirun:
        _build_matrix(overrides, output, force, allow_oom, extra_dirs)
        return
    from recipekit.bundle.build import build as build_bundle
    from recipekit.bundle.summary import parallelism

    built = build_bundle(overrides, output, extra_dirs=extra_dirs, force=force, allow_oom=allow_oom)
    plan, recipe = built.resolved.plan, built.resolved.recipe
    from recipekit.cli.terminal import echo_wrapped

    for note in built.resolved.notes:
        echo_wrapped(f"note: {note}", err=True)
    warn(plan.warnings)
    if not built.estimate.fits:
        from recipekit.bundle.summary import not_fit

        warn([not_fit(built.estimate.total_gib, built.estimate.device_gib)])
    from recipekit.bundle.summary import pod_requests
    from recipekit.cli.terminal import shown_path

    click.echo(
        f"{click.style('built', fg='green')} {shown_path(built.path)} ({len(built.files)} files) for {recipe.hw.name}"
    )
    echo_wrapped(
        f"{plan.layout.nodes} pod(s) × {plan.layout.devices_per_pod} device(s), "
        f"global batch {plan.layout.global_batch_size}, {plan.precision}, {parallelism(recipe, plan)}",
        indent=2,
    )
    echo_wrapped(f"each pod requests {pod_requests(recipe, plan)}", indent=2)
    if plan.elastic is not None:
        sizes = ", ".join(f"{w}→{a}" for w, a in sorted(plan.elastic.accumulation.items()))
        echo_wrapped(
            f"elastic: continues on {plan.elastic.min_nodes} to {plan.layout.nodes} pods, nobody acting "
            f"(world size → accumulation: {sizes})",
            indent=2,
        )
    if built.replaced:
        echo_wrapped(f"replaced the bundle of another recipe: {', '.join(built.replaced)}")


def _build_matrix(
    arguments: tuple[str, ...], output: Path | None, force: bool, allow_oom: bool, extra_dirs: tuple[Path, ...]
) -> None:
    from recipekit.bundle.sweep import run_matrix, summary

    outcomes = run_matrix(arguments, output, extra_dirs=extra_dirs, force=force, allow_oom=allow_oom)
    for outcome in outcomes:
        warn([f"[{outcome.combination}] {warning}" for warning in outcome.warnings])
        if outcome.problems:
            click.echo(f"{click.style('error:', fg='red', bold=True)} {outcome.combination}:", err=True)
            for problem in outcome.problems:
                click.echo(f"  - {problem}", err=True)
    click.echo(summary(outcomes))
    if not all(outcome.ok for outcome in outcomes):
        sys.exit(2)


@click.command(context_settings={**SETTINGS, "ignore_unknown_options": True})
@click.argument("overrides", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (resolved recipe, choices, derived numbers).")
@click.option("--compact", is_flag=True, help="Print the resolved recipe as key=value, one leaf key a line.")
@click.option(
    "--internals",
    is_flag=True,
    help="Also print what model import measured (model.params, flops, activations, modules, config).",
)
@recipes_option
@user_errors
def show(
    overrides: tuple[str, ...], as_json: bool, compact: bool, internals: bool, extra_dirs: tuple[Path, ...]
) -> None:
    """Show the resolved recipe and its derived numbers; writes nothing.

    The model's measured internals (exact counts, FLOPs, activations, module tree, its config.json) are left out
    unless --internals; --json holds everything.

    \b
    Examples:
      recipekit show recipe=llama3_8b_lora hw=a100_80g
      recipekit show recipe=qwen2.5_14b_sft cluster.nodes=4 --json
      recipekit show recipe=qwen2.5_14b_sft --compact | grep batch
      recipekit show recipe=qwen2.5_14b_sft --compact --internals | grep flops
    """
    import yaml

    from recipekit.bundle.build import resolve
    from recipekit.recipe.schema import to_data

    resolved = resolve(overrides, layers(extra_dirs))
    document = {
        "choices": resolved.composed.choices,
        "recipe": to_data(resolved.recipe),
        "plan": resolved.plan.summary(),
        "warnings": resolved.plan.warnings,
    }
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    recipe = document["recipe"] if internals else _without_internals(document["recipe"])
    left_out = "" if internals else f"# left out: model.{', '.join(MODEL_INTERNALS)} (--internals)"
    if compact:
        from recipekit.cli.compactview import compact_lines
        from recipekit.cli.terminal import echo_wrapped

        for line in compact_lines(recipe):  # piped: one key=value a line, for grep; on a terminal, between words
            echo_wrapped(line, terminal_only=True, hanging=4)
        if left_out:  # stderr: stdout stays one key=value a line, for grep
            click.echo(left_out, err=True)
        return
    from recipekit.bundle import planview

    # plain, whole lines: PyYAML folds at 80 columns and rich at the terminal's width, both mid-value
    chosen = {"choices": document["choices"], "recipe": recipe}
    click.echo(yaml.safe_dump(chosen, sort_keys=False, width=2**31 - 1, allow_unicode=True), nl=False)
    if left_out:
        click.echo(left_out)
    rich_console().print(planview.render_summary(document["plan"]))
    warn(resolved.plan.warnings)


#: What `model import` measured: the plan reads it, a person reading the recipe rarely does (`show --internals`).
MODEL_INTERNALS = ("params", "flops", "activations", "modules", "config")


def _without_internals(recipe: dict[str, Any]) -> dict[str, Any]:
    model = {key: value for key, value in recipe["model"].items() if key not in MODEL_INTERNALS}
    return {**recipe, "model": model}


@click.command(context_settings={**SETTINGS, "ignore_unknown_options": True})
@click.argument("overrides", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the estimate (and advice) as JSON.")
@click.option(
    "--advise",
    is_flag=True,
    help="Search ZeRO stage, offload, micro batch, checkpointing and tensor parallelism for layouts that fit, "
    "fastest first; with Megatron-core's layouts too (see --all-layouts).",
)
@click.option(
    "--all-layouts",
    is_flag=True,
    help="With --advise: also search the layouts only Megatron-core runs (PP with virtual stages, SP, CP, EP, the "
    "distributed optimizer; analysis only). On by itself where the recipe uses one or nothing else fits.",
)
@click.option(
    "--price",
    type=click.FloatRange(min=0, max=1e6),
    callback=lambda ctx, param, value: finite(param, value),
    default=None,
    help="Price of one device for one hour, for the cost figure (default: hw.price_per_device_hour).",
)
@click.option("--top", type=click.IntRange(1, 50), default=5, show_default=True, help="Layouts --advise prints.")
@click.option(
    "--stage",
    "stages",
    multiple=True,
    metavar="OVERRIDES",
    help="Another stage of the run (repeatable): overrides added to OVERRIDES, quoted as one argument, e.g. a "
    "long-context stage. Each stage is estimated; time, device-hours and cost are summed.",
)
@click.option(
    "--data",
    "manifest",
    type=click.Path(path_type=Path),
    default=None,
    help="A prepared dataset's manifest.json (or its directory): its exact rows and tokens become data.num_rows "
    "and data.num_tokens.",
)
@recipes_option
@user_errors
def plan(
    overrides: tuple[str, ...],
    as_json: bool,
    advise: bool,
    all_layouts: bool,
    price: float | None,
    top: int,
    stages: tuple[str, ...],
    manifest: Path | None,
    extra_dirs: tuple[Path, ...],
) -> None:
    """Estimate memory per device, compute, time and cost of a recipe, before anything is submitted.

    Exit 0 when it fits, 1 when it does not (DOES NOT FIT, with the cheapest change that fits), 2 unusable input.

    \b
    Examples:
      recipekit plan recipe=llama3_70b_sft hw=ascend910b cluster.nodes=8
      recipekit plan recipe=llama3_8b_lora hw=a100_80g --json
      recipekit plan recipe=qwen2.5_72b_sft hw=ascend910b --advise
      recipekit plan recipe=llama3_70b_sft parallel.pipeline_parallel=2
      recipekit plan recipe=qwen2.5_7b_pretrain --data /mnt/shared/prepared/4f2a
      recipekit plan recipe=llama3_70b_sft hw=h100 --advise --all-layouts
      recipekit plan recipe=qwen3_8b_sft --stage "data.max_len=8192"
    """
    from recipekit import memory
    from recipekit.bundle import planview
    from recipekit.recipe.paralleloptions import load_parallel_options

    extra_dirs = layers(extra_dirs)
    if stages:
        _plan_stages(overrides, stages, price, as_json, extra_dirs)
        return
    overrides, resolved = _resolve_planned(overrides, extra_dirs, manifest)
    recipe = resolved.recipe
    estimate = memory.estimate(recipe, resolved.plan, price_per_device_hour=price)
    # the parallel options on disk are candidates only for --advise and for the fix of a layout that does not fit
    options = load_parallel_options(extra_dirs) if advise or not estimate.fits else {}
    advices = _advices(resolved, options, top=top, all_layouts=all_layouts) if advise else []
    if as_json:
        output: dict[str, Any] = {"estimate": planview.estimate_dict(estimate)}
        if advise:
            output["advice"] = planview.advice_dict(advices)
        click.echo(json.dumps(output, indent=2))
        sys.exit(0 if estimate.fits else 1)
    console = rich_console()
    console.print(planview.render_estimate(estimate), soft_wrap=False)  # notes broken between words
    from recipekit.bundle.summary import pod_requests
    from recipekit.cli.terminal import echo_wrapped

    echo_wrapped(f"pod requests: {pod_requests(recipe, resolved.plan)}")
    if not estimate.fits:
        problem = memory.fit_problem(estimate, images=resolved.images, parallel_options=options)
        if problem is not None:
            from recipekit.cli.terminal import styled

            console.print(styled(("to fit:", "bold"), f" {problem.hint}"))
    if advise:
        _print_advice(console, advices, resolved, options, overrides)
    if not estimate.fits:
        sys.exit(1)


def _resolve_planned(
    overrides: tuple[str, ...], extra_dirs: tuple[Path, ...], manifest: Path | None
) -> tuple[tuple[str, ...], Resolved]:
    """The recipe ``plan`` estimates, resolved for analysis, with its overrides: with ``--data``, the prepared
    data's overrides added and the recipe checked against the manifest."""
    from recipekit.bundle.build import resolve

    if manifest is None:
        return overrides, resolve(overrides, extra_dirs, analysis_only=True)
    from recipekit.plan import prepared

    document = prepared.read(manifest)
    overrides = (*overrides, *prepared.overrides(document))
    resolved = resolve(overrides, extra_dirs, analysis_only=True)
    mismatched = prepared.problems(document, resolved.recipe, str(manifest))
    if mismatched:
        raise RecipeError(mismatched)
    return overrides, resolved


def _advices(resolved: Resolved, options: Mapping[str, ParallelSpec], *, top: int, all_layouts: bool) -> list[Advice]:
    """``--advise``: the layouts that fit, fastest first; Megatron-core's too with ``--all-layouts``, when the
    recipe's own layout is one, or when nothing the bundle builds fits."""
    from recipekit import memory
    from recipekit.plan.layoutrules import megatron_features

    recipe = resolved.recipe
    search_all = all_layouts or bool(megatron_features(recipe, resolved.plan.layout))
    advices = memory.advise(recipe, resolved.images, top=top, search_pp=search_all, parallel_options=options)
    if not advices and not search_all:  # nothing the bundle builds fits: what would, with Megatron-core
        advices = memory.advise(recipe, resolved.images, top=top, search_pp=True, parallel_options=options)
    return advices


def _print_advice(
    console: Console,
    advices: list[Advice],
    resolved: Resolved,
    options: Mapping[str, ParallelSpec],
    overrides: tuple[str, ...],
) -> None:
    """The advised layouts, their overrides a plain line each, and the fastest one ``build`` accepts, to paste."""
    from recipekit import memory
    from recipekit.bundle import planview

    console.print(planview.render_advice(advices, why=memory.why_first(advices)))
    for line in planview.advice_lines(advices):  # plain: a line of overrides is never wrapped or cut
        click.echo(line)
    buildable = [a for a in advices if a.buildable]
    if advices and not buildable:  # Megatron-core's layouts lead: the fastest the bundle builds, to paste
        buildable = memory.advise(resolved.recipe, resolved.images, top=1, parallel_options=options)
    if buildable:  # the fastest layout build accepts: PP (and TP the bundle cannot run) is analysis only
        from recipekit.recipe.overrides import merge

        click.echo(f"paste: recipekit build {' '.join(merge(overrides, buildable[0].overrides))}")
    elif advices:
        console.print("no layout recipekit tried builds (Megatron-core's layouts are analysis only)")


def _plan_stages(
    base: tuple[str, ...], stages: tuple[str, ...], price: float | None, as_json: bool, extra_dirs: tuple[Path, ...]
) -> None:
    """``plan --stage``: the base recipe and each stage (its overrides added to the base's), estimated each, with
    their sums. Exit 1 when a stage does not fit."""
    import shlex

    from recipekit import memory
    from recipekit.bundle import planview
    from recipekit.bundle.build import resolve
    from recipekit.memory.stages import Stage, summed

    planned = []
    for extra in ((), *(tuple(shlex.split(stage)) for stage in stages)):
        resolved = resolve((*base, *extra), extra_dirs, analysis_only=True)
        est = memory.estimate(resolved.recipe, resolved.plan, price_per_device_hour=price)
        planned.append(Stage(extra, est))
    run = summed(planned)
    if as_json:
        click.echo(json.dumps(planview.stages_dict(run), indent=2))
    else:
        console = rich_console()
        for number, stage in enumerate(run.stages, 1):
            console.print(planview.stage_heading(number, stage))
            console.print(planview.render_estimate(stage.estimate))
        console.print(planview.render_stages(run))
    if not run.fits:
        sys.exit(1)
