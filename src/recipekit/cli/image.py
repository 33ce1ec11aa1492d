"""The ``recipekit image`` commands: parse flags, call :mod:`recipekit.handover.imagebuild`, print.

Exit codes: 0 built (and pushed); 1 the engine's build or push failed (the failing step and its last lines are
shown); 2 the request or the bundle is unusable, or no engine is reachable (with the equivalent docker command).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from recipekit.base.errors import RecipeError
from recipekit.cli.common import SETTINGS, exit_with_problems


@click.group("image", context_settings=SETTINGS)
def image_group() -> None:
    """Build and push a bundle's image. It needs a Docker-API engine (without one: exit 2, naming it).

    \b
    Examples:
      recipekit image build bundles/llama3_8b_sft --push
    """


@image_group.command("build", context_settings=SETTINGS)
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--tag", help="Image reference (default: the bundle's, a hash of its software stack).")
@click.option("--push", is_flag=True, help="Push after building and pin the Job's image by its registry digest.")
@click.option("--platform", help="Target platform (default: linux/<hw.arch>, the nodes'; another one is refused).")
@click.option("--build-arg", "build_args", multiple=True, metavar="K=V", help="Dockerfile ARG (mirrors); repeatable.")
@click.option("--engine", help="Docker-API engine URL, e.g. unix:///run/podman/podman.sock (default: DOCKER_HOST).")
def build_command(
    bundle: Path,
    tag: str | None,
    push: bool,
    platform: str | None,
    build_args: tuple[str, ...],
    engine: str | None,
) -> None:
    """Build BUNDLE's image through a Docker-API engine (Docker, or `podman system service`); record it in the bundle.

    The build is streamed step by step. After --push the registry's digest goes into manifest.json and the Job
    runs `name@sha256:...`, so a moved tag can never change what the pods run. The image holds the software stack
    only (the run files travel in the bundle's ConfigMap) and its tag is a digest of that stack: when the engine or,
    with --push, the registry already holds it, nothing is built (another bundle of the same stack built it). It
    needs a Docker-API engine (without one: exit 2, naming it).

    \b
    Examples:
      recipekit image build bundles/llama3_8b_sft --push
      recipekit image build bundles/tiny_sft --build-arg PIP_INDEX_URL=https://m/
      recipekit image build bundles/tiny_sft --engine unix:///run/podman.sock
    """
    from recipekit.handover import imagebuild

    try:
        req = imagebuild.request(bundle, tag=tag, platform=platform, build_args=build_args, push=push, engine=engine)
        client = imagebuild.connect(req)
    except RecipeError as err:
        exit_with_problems(err)
    found = imagebuild.already_built(client, req)
    try:
        if found is not None:
            where = "the registry" if found.digest else "the engine"
            click.echo(f"{req.tag}: {where} already holds this software stack's image; nothing to build", err=True)
            built = found
        else:
            click.echo(f"building {req.tag} for {req.platform} from {req.bundle}", err=True)
            built = imagebuild.build(client, req, echo=lambda line: click.echo(line, err=True))
        if push and built.digest is None:
            click.echo(f"pushing {req.tag}", err=True)
            built = imagebuild.push(client, req, built, echo=lambda line: click.echo(line, err=True))
    except imagebuild.BuildFailed as failed:
        click.echo(f"{click.style('error:', fg='red', bold=True)} {failed.message}", err=True)
        if failed.step:
            click.echo(f"failing step: {failed.step}", err=True)
        if failed.tail:
            click.echo("its last lines:", err=True)
            for line in failed.tail:
                click.echo(f"  | {line}", err=True)
        sys.exit(1)
    try:
        imagebuild.record(req.bundle, built)
    except RecipeError as err:
        exit_with_problems(err)
    if built.pinned:
        click.echo(f"{click.style('pushed', fg='green')} {built.pinned}; volcano-job.yaml now runs it by digest")
    else:
        click.echo(
            f"{click.style('built', fg='green')} {built.reference} ({built.image_id[:19]}); not pushed, so the Job "
            "still names the tag (--push pins it by digest)"
        )
