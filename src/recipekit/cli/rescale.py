"""``recipekit rescale``: continue a run on fewer (or more) nodes, at the same global batch."""

from __future__ import annotations

from pathlib import Path

import click

from recipekit.cli.common import SETTINGS, layers, recipes_option, user_errors, warn


@click.command(context_settings=SETTINGS)
@click.argument("bundle", type=click.Path(path_type=Path, file_okay=False))
@click.option("--nodes", type=click.IntRange(1, 100_000), required=True, help="The node count to continue on.")
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="Where the new bundle goes (default: BUNDLE@nodesN)."
)
@click.option("--force", is_flag=True, help="Replace OUTPUT even if it is not a recipekit bundle.")
@recipes_option
@user_errors
def rescale_command(bundle: Path, nodes: int, output: Path | None, force: bool, extra_dirs: tuple[Path, ...]) -> None:
    """Rebuild BUNDLE for another number of nodes as the same run, after a node is lost for good.

    The global batch is kept: gradient accumulation is raised (or lowered) to hold it, so every step consumes the
    same samples in the same order. The new bundle has the same run id, Job name and output directory, and its
    first start resumes the newest checkpoint: whole states load at any size, ZeRO partitions are re-sharded
    first. A node count at which the global batch does not divide is refused with the arithmetic and the counts
    that work. Run it in the recipe tree the bundle was built from: a rebuild that comes out as another run is
    refused.

    \b
    Examples:
      recipekit rescale bundles/llama3_8b_sft --nodes 1
      recipekit rescale bundles/qwen2.5_72b_sft --nodes 6 -o bundles/qwen72b-6nodes
      recipekit rescale bundles/our_sft --nodes 3 --recipes ./team-recipes
    """
    from recipekit.bundle.rescale import rescale

    done = rescale(bundle, nodes, output, extra_dirs=layers(extra_dirs), force=force)
    old, plan = done.source.layout, done.built.resolved.plan
    new = plan.layout
    warn(plan.warnings)
    click.echo(
        f"{click.style('rescaled', fg='green')} {done.built.path}: {old.nodes} → {new.nodes} node(s), world size "
        f"{old.world_size} → {new.world_size}, accumulation {old.gradient_accumulation_steps} → "
        f"{new.gradient_accumulation_steps}, global batch {new.global_batch_size} kept"
    )
    click.echo(f"same run {plan.run_id}: Job {plan.job_name}, output {plan.output_dir}")
    if plan.zero_stage:
        click.echo(
            f"its first start re-shards the newest checkpoint's ZeRO-{plan.zero_stage} partitions for world size "
            f"{new.world_size} (DeepSpeed universal checkpoint, written beside it), then resumes"
        )
    else:
        click.echo("its first start resumes the newest checkpoint: whole optimizer states load at any world size")
    namespace = done.built.resolved.recipe.cluster.namespace
    click.echo(f"then: recipekit image build {done.built.path} --push  (its recipe.yaml differs, so does its image)")
    click.echo(
        f"and: kubectl delete vcjob {plan.job_name} -n {namespace} --ignore-not-found && "
        f"kubectl apply -f {done.built.path}/volcano-job.yaml"
    )
