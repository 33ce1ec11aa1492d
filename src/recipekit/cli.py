"""The ``recipekit`` command: parse arguments, call one library function, print. No decisions live here.

Exit codes: 0 success; 1 a validation check failed; 2 the input (recipe, overrides, bundle path) is unusable —
with one line per problem and never a traceback.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from recipekit import __version__
from recipekit.errors import RecipeError

_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


def _console(stderr: bool = False) -> Any:
    """rich, imported only by the commands that draw tables: it costs start-up time `build` need not pay."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _warn(warnings: list[str]) -> None:
    for warning in warnings:
        click.echo(f"{click.style('warning:', fg='yellow')} {warning}", err=True)


def _user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn RecipeError into the list of problems on stderr and exit code 2.

    An ``OSError`` that reaches here (a ``--recipes`` tree that cannot be read, say) is the user's file system
    refusing a path they gave: it is reported the same way, one line naming the path, rather than as a traceback.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except BrokenPipeError:  # stdout closed by the reader (| head): not the user's input
            raise
        except OSError as exc:
            from recipekit.errors import Problem

            where = os.fsdecode(exc.filename) if exc.filename is not None else "path"
            exit_with_problems(
                RecipeError([Problem(where.encode("utf-8", "backslashreplace").decode(), exc.strerror or str(exc))])
            )
        except RecipeError as err:
            exit_with_problems(err)

    return wrapper


def exit_with_problems(err: RecipeError) -> None:
    """Every problem on its own line on stderr, then exit code 2: the one way recipekit reports unusable input.

    One line each whatever text the input smuggled into a key or a message: control and invisible formatting
    characters are printed as their escapes (``\\n``, ``\\u202e``).
    """
    from recipekit.schema import printable

    count = len(err.problems)
    click.echo(f"{click.style('error:', fg='red', bold=True)} {count} problem{'s' if count != 1 else ''}:", err=True)
    for problem in err.problems:
        click.echo(f"  - {printable(str(problem))}", err=True)
    sys.exit(2)


def _finite(param: click.Parameter, value: float | None) -> float | None:
    """A number flag's value, refused when it is NaN (which every range comparison lets through)."""
    if value is not None and value != value:
        raise click.BadParameter("nan is not a number", param=param)
    return value


def _recipes_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--recipes",
        "extra_dirs",
        multiple=True,
        type=click.Path(path_type=Path),
        help="Extra recipe tree searched after recipekit's own and recipekit.toml's, before $RECIPEKIT_RECIPES; "
        "a later tree overrides an earlier one; repeatable.",
    )(func)


def _layers(extra_dirs: tuple[Path, ...]) -> tuple[Path, ...]:
    """Every team layer: recipekit.toml's search path (this directory or a parent), --recipes, $RECIPEKIT_RECIPES."""
    from recipekit.team import layer_dirs

    return layer_dirs(extra_dirs)


class _Commands(click.Group):
    """A group whose heavier commands are imported only when invoked, so `build` does not pay for `validate`."""

    lazy = {
        "validate": ("recipekit.validate.command", "validate_command"),
        "init": ("recipekit.commands", "init_command"),
        "pack": ("recipekit.commands", "pack_command"),
        "verify": ("recipekit.commands", "verify_command"),
        "diff": ("recipekit.commands", "diff_command"),
        "image": ("recipekit.imagecommand", "image_group"),
        "data": ("recipekit.datacommand", "data_group"),
        "runs": ("recipekit.runscommand", "runs_group"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            import importlib

            module, attribute = self.lazy[name]
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)


@click.group(cls=_Commands, context_settings=_SETTINGS)
@click.version_option(__version__, prog_name="recipekit")
def main() -> None:
    """Compile a training recipe into a Volcano launch bundle for Ascend NPU and NVIDIA GPU clusters.

    Recipes are chosen and changed with Hydra overrides: group=option, key=value, +key=value (a new key),
    ~key (delete).

    \b
    Examples:
      recipekit list
      recipekit build recipe=llama3_8b_sft hw=ascend910b
      recipekit plan recipe=llama3_70b_sft cluster.nodes=8 --advise
      recipekit validate bundles/llama3_8b_sft --dry-run
      recipekit image build bundles/llama3_8b_sft --push
    """


@main.command(context_settings={**_SETTINGS, "ignore_unknown_options": True})
@click.argument("overrides", nargs=-1)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Bundle directory (default: bundles/<name>); with -m, the root.",
)
@click.option("--force", is_flag=True, help="Replace OUTPUT even if it is not a recipekit bundle.")
@click.option("--allow-oom", is_flag=True, help="Build even when the plan predicts the run will not fit in memory.")
@click.option(
    "-m",
    "--multirun",
    is_flag=True,
    help="Matrix build: OVERRIDES are a Hydra sweep (a=1,2 range() glob()); one bundle per combination, in "
    "<root>/<name>@<swept values>, then a summary table. Exit 2 if any combination failed.",
)
@_recipes_option
@_user_errors
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
      recipekit build recipe=qwen2.5_14b_sft cluster.nodes=4 parallel=zero3 train.micro_batch_size=2
      recipekit build model=qwen2.5_7b mode=lora hw=h100 -o out/qwen-lora
      recipekit build --recipes ./team-recipes recipe=our_llama_sft
      recipekit build -m recipe=llama3_8b_sft,qwen2.5_7b_pretrain hw=ascend910b,h100
      recipekit build -m 'recipe=glob(*)' train.seed=range(1,4) -o out/matrix
    """
    extra_dirs = _layers(extra_dirs)
    if multirun:
        _build_matrix(overrides, output, force, allow_oom, extra_dirs)
        return
    from recipekit.build import build as build_bundle

    built = build_bundle(overrides, output, extra_dirs=extra_dirs, force=force, allow_oom=allow_oom)
    plan = built.resolved.plan
    _warn(plan.warnings)
    if not built.estimate.fits:
        _warn(
            [
                f"predicted not to fit: {built.estimate.total_gib:.1f} GiB per device of {built.estimate.device_gib:g}"
                " (--allow-oom); see plan.md"
            ]
        )
    click.echo(
        f"{click.style('built', fg='green')} {built.path} ({len(built.files)} files): {plan.layout.nodes} pod(s) × "
        f"{plan.layout.devices_per_pod} device(s), global batch {plan.layout.global_batch_size}, {plan.precision}, "
        f"{'ZeRO-' + str(plan.zero_stage) if plan.zero_stage else 'DDP' if not plan.uses_deepspeed else 'ZeRO-0'}"
        + (f", TP {plan.layout.tensor_parallel} × DP {plan.layout.dp_size}" if plan.layout.tensor_parallel > 1 else "")
    )


def _build_matrix(
    arguments: tuple[str, ...], output: Path | None, force: bool, allow_oom: bool, extra_dirs: tuple[Path, ...]
) -> None:
    from recipekit.matrix import run_matrix, summary

    outcomes = run_matrix(arguments, output, extra_dirs=extra_dirs, force=force, allow_oom=allow_oom)
    for outcome in outcomes:
        _warn([f"[{outcome.combination}] {warning}" for warning in outcome.warnings])
        if outcome.problems:
            click.echo(f"{click.style('error:', fg='red', bold=True)} {outcome.combination}:", err=True)
            for problem in outcome.problems:
                click.echo(f"  - {problem}", err=True)
    click.echo(summary(outcomes))
    if not all(outcome.ok for outcome in outcomes):
        sys.exit(2)


@main.command(context_settings={**_SETTINGS, "ignore_unknown_options": True})
@click.argument("overrides", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (resolved recipe, choices, derived numbers).")
@_recipes_option
@_user_errors
def show(overrides: tuple[str, ...], as_json: bool, extra_dirs: tuple[Path, ...]) -> None:
    """Show the resolved recipe and its derived numbers; writes nothing.

    \b
    Examples:
      recipekit show recipe=llama3_8b_lora hw=a100_80g
      recipekit show recipe=qwen2.5_14b_sft cluster.nodes=4 --json
    """
    import yaml

    from recipekit.build import resolve
    from recipekit.schema import to_data

    resolved = resolve(overrides, _layers(extra_dirs))
    document = {
        "choices": resolved.composed.choices,
        "recipe": to_data(resolved.recipe),
        "plan": resolved.plan.summary(),
        "warnings": resolved.plan.warnings,
    }
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    from recipekit import report

    console = _console()
    console.print(
        yaml.safe_dump({"choices": document["choices"], "recipe": document["recipe"]}, sort_keys=False), markup=False
    )
    console.print(report.render_summary(document["plan"]))
    _warn(resolved.plan.warnings)


@main.command(context_settings={**_SETTINGS, "ignore_unknown_options": True})
@click.argument("overrides", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the estimate (and advice) as JSON.")
@click.option(
    "--advise",
    is_flag=True,
    help="Search ZeRO stage, offload, micro batch, checkpointing and tensor parallelism (and pipeline "
    "parallelism, analysis only, when the recipe sets it) for layouts that fit, fastest first.",
)
@click.option(
    "--price",
    type=click.FloatRange(min=0, max=1e6),
    callback=lambda ctx, param, value: _finite(param, value),
    default=None,
    help="Price of one device for one hour, for the cost figure (default: hw.price_per_device_hour).",
)
@click.option("--top", type=click.IntRange(1, 50), default=5, show_default=True, help="Layouts --advise prints.")
@click.option(
    "--data",
    "manifest",
    type=click.Path(path_type=Path),
    default=None,
    help="A prepared dataset's manifest.json (or its directory): its exact rows and tokens become data.num_rows "
    "and data.num_tokens.",
)
@_recipes_option
@_user_errors
def plan(
    overrides: tuple[str, ...],
    as_json: bool,
    advise: bool,
    price: float | None,
    top: int,
    manifest: Path | None,
    extra_dirs: tuple[Path, ...],
) -> None:
    """Estimate memory per device, compute, time and cost of a recipe, before anything is submitted.

    \b
    Examples:
      recipekit plan recipe=llama3_70b_sft hw=ascend910b cluster.nodes=8
      recipekit plan recipe=llama3_8b_lora hw=a100_80g --json
      recipekit plan recipe=qwen2.5_72b_sft hw=ascend910b --advise
      recipekit plan recipe=llama3_70b_sft parallel.tensor_parallel=8 parallel.pipeline_parallel=2 --price 2.5
      recipekit plan recipe=qwen2.5_7b_pretrain --data /mnt/shared/runs/prepared/4f2a.../manifest.json
    """
    from recipekit import memory, report
    from recipekit.build import resolve
    from recipekit.options import load_parallel_options

    extra_dirs = _layers(extra_dirs)
    document = None
    if manifest is not None:
        from recipekit import prepared

        document = prepared.read(manifest)
        overrides = (*overrides, *prepared.overrides(document))
    resolved = resolve(overrides, extra_dirs, analysis_only=True)
    recipe = resolved.recipe
    if document is not None:
        mismatched = prepared.problems(document, recipe, str(manifest))
        if mismatched:
            raise RecipeError(mismatched)
    estimate = memory.estimate(recipe, resolved.plan, price_per_device_hour=price)
    # the parallel options on disk are candidates only for --advise and for the fix of a layout that does not fit
    options = load_parallel_options(extra_dirs) if advise or not estimate.fits else {}
    advices: list[memory.Advice] = []
    if advise:
        search_pp = recipe.parallel.pipeline_parallel > 1
        advices = memory.advise(recipe, resolved.images, top=top, search_pp=search_pp, parallel_options=options)
    if as_json:
        document: dict[str, Any] = {"estimate": report.estimate_dict(estimate)}
        if advise:
            document["advice"] = report.advice_dict(advices)
        click.echo(json.dumps(document, indent=2))
        return
    console = _console()
    console.print(report.render_estimate(estimate))
    if not estimate.fits:
        problem = memory.fit_problem(estimate, images=resolved.images, parallel_options=options)
        if problem is not None:
            console.print(f"[bold]to fit:[/] {problem.hint}", highlight=False)
    if advise:
        console.print(report.render_advice(advices))
        buildable = [a for a in advices if a.buildable]
        if buildable:  # the fastest layout build accepts: PP (and TP the bundle cannot run) is analysis only
            base = " ".join(overrides)
            console.print(
                f"paste: recipekit build {base} {' '.join(buildable[0].overrides)}".replace("  ", " "), markup=False
            )
        elif advices:
            console.print("no layout above builds (pipeline parallelism is analysis only): nothing to paste")


@main.command(name="list", context_settings=_SETTINGS)
@click.argument("group", required=False)
@_recipes_option
@_user_errors
def list_(group: str | None, extra_dirs: tuple[Path, ...]) -> None:
    """List config groups and their options: descriptions, each group's default (*), where each option comes from.

    An option from a team layer (recipekit.toml, --recipes, $RECIPEKIT_RECIPES) that replaces a same-named option of
    an earlier layer is marked "shadows ...".

    \b
    Examples:
      recipekit list
      recipekit list hw
      recipekit list recipe
      recipekit list cluster --recipes ./team-recipes
    """
    from rich.table import Table
    from rich.text import Text

    from recipekit.compose import check_team_trees
    from recipekit.errors import Problem
    from recipekit.listing import option_rows
    from recipekit.paths import GROUPS
    from recipekit.team import search_layers

    if group is not None and group not in GROUPS:
        raise RecipeError([Problem("group", f"unknown group {group!r}", hint="groups: " + ", ".join(GROUPS))])
    layers = search_layers(extra_dirs)
    problems = check_team_trees([layer.path for layer in layers])
    if problems:
        raise RecipeError(problems)
    table = Table("group", "option", "from", "description", caption="* the group's default")
    for row in option_rows([group] if group else GROUPS, layers):
        origin = row.origin + (f" (shadows {', '.join(row.shadows)})" if row.shadows else "")
        # Text, not str: a team's names and descriptions show as written, never read as rich markup ("[/x]" raises)
        table.add_row(row.group, Text(row.option + (" *" if row.default else "")), Text(origin), Text(row.description))
    _console().print(table)


def run() -> None:
    """The console script: :func:`main`, then skip the interpreter's last garbage collection.

    At exit CPython collects every cycle left by Hydra, OmegaConf, ANTLR and Jinja; measured here that is about
    0.15 s — a fifth of a whole `build`. Freezing the heap leaves those objects to the operating system, which
    reclaims the memory at once. Everything that must happen at exit still does: objects are released by reference
    counting, atexit handlers run, streams are flushed; nothing recipekit writes is pending by then.
    """
    try:
        main()
    finally:
        gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    run()
