"""``recipekit restart BUNDLE --from checkpoint-N | --fresh``: write the kustomize overlay of a restart of the bundle's
run (recipekit.handover.restart) and print the kubectl lines that start it. Parse, call, print.

Exit codes: 0 written; 2 unusable input (not a bundle, a malformed checkpoint name, a checkpoint that is not in a
reachable output directory, an overlay path that is something else), one line each.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import click

from recipekit.cli.common import SETTINGS, fail, user_errors


@click.command("restart", context_settings=SETTINGS)
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--from", "start_from", metavar="checkpoint-N", help="Continue from this checkpoint of the run.")
@click.option("--fresh", is_flag=True, help="Start over from step 0; the run's checkpoints are set aside, not deleted.")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Directory of the overlay (default: <bundle>-restart beside the bundle; replaced by the next restart).",
)
@user_errors
def restart_command(bundle: Path, start_from: str | None, fresh: bool, output: Path | None) -> None:
    """Restart BUNDLE's run from one of its checkpoints, or fresh: write the overlay that makes the new Job.

    A Volcano Job cannot be changed and the run files are fixed by their digest, so the restart is a new Job: a
    kustomize overlay of the bundle that adds the restart request to the trainer's environment. The pods apply it
    once (newer checkpoints set aside under recipekit-superseded/, never deleted), later pod restarts resume as
    always, and `recipekit runs history` lists it.

    \b
    Examples:
      recipekit restart bundles/tiny_sft --from checkpoint-4
      recipekit restart bundles/tiny_sft --fresh -o restarts/tiny_sft
    """
    from recipekit.handover.restart import write_restart

    if (start_from is None) == (not fresh):
        fail("give --from checkpoint-N or --fresh (one of them)")
    written = write_restart(bundle, start_from or "fresh", output)
    request = written.request
    what = "fresh: from step 0" if request.start_from is None else f"from {request.start_from}"
    click.echo(f"restart {request.id}: {what}")
    click.echo(textwrap.fill(written.checked, width=80, initial_indent="  ", subsequent_indent="  "))
    click.echo("wrote the overlay (kustomize: the bundle as built, the Job with the request):")
    click.echo(f"  {written.overlay}")
    click.echo("replace the running Job (a Volcano Job cannot be changed):")
    for line in written.kubectl_lines():
        click.echo(f"  {line}")
    click.echo("the pods apply it once and record it:")
    click.echo(f"  recipekit runs history {written.output_dir}")
