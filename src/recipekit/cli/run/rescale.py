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
      recipekit rescale bundles/llama3_8b_sft --nodes 2
      recipekit rescale bundles/qwen2.5_72b_sft --nodes 4 -o bundles/qwen72b-4
      cd team-recipes && recipekit rescale ../bundles/our_qwen_sft --nodes 2
    """
    from recipekit.bundle.rescale import rescale

    done = rescale(bundle, nodes, output, extra_dirs=layers(extra_dirs), force=force)
    old, plan = done.source.layout, done.built.resolved.plan
    new = plan.layout
    warn(plan.warnings)
    click.echo(f"{click.style('rescaled', fg='green')} {done.built.path} (same run {plan.run_id})")
    click.echo(
        f"  nodes {old.nodes} → {new.nodes}, world size {old.world_size} → {new.world_size}, accumulation "
        f"{old.gradient_accumulation_steps} → {new.gradient_accumulation_steps}"
    )
    click.echo(f"  global batch {new.global_batch_size} kept: every step takes the same samples")
    click.echo(f"  Job {plan.job_name}, output {plan.output_dir}")
    if plan.zero_stage:
        click.echo(f"  first start: re-shards the newest checkpoint's ZeRO-{plan.zero_stage} partitions, then resumes")
    else:
        click.echo("  first start: resumes the newest checkpoint (whole optimizer states)")
    namespace = done.built.resolved.recipe.cluster.namespace
    path = done.built.path
    if done.same_image:
        from recipekit.handover.imagebuild import carry_pin

        pinned = carry_pin(done.source.path, path)
        click.echo("next (the same image: only the run files and the Job changed, nothing to build):")
        click.echo(f"  image {pinned or plan.image}")
    else:
        click.echo("next (the software stack changed since the bundle was built, so did its image):")
        click.echo(f"  recipekit image build {path} --push")
    click.echo(f"  kubectl delete vcjob {plan.job_name} -n {namespace} --ignore-not-found")
    click.echo(f"  kubectl apply -k {path}")
