"""The team-repo and hand-over commands: ``init``, ``cp``, ``pack``, ``verify``, ``diff``. Parse, call one function,
print.

Imported only when one of them runs (see ``cli._Commands.lazy``), so ``build`` never pays for them. Exit codes as
everywhere: 0 success, 2 unusable input with one line per problem; ``diff`` exits 1 when the bundles differ, as
diff(1) does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from recipekit.cli.common import SETTINGS, user_errors


@click.command("init", context_settings=SETTINGS)
@click.argument("name", type=click.Path(path_type=Path))
@user_errors
def init_command(name: Path) -> None:
    """Scaffold a team recipe repo in the new directory NAME: recipekit.toml, example recipes, README, ci.sh.

    \b
    Examples:
      recipekit init team-nlp-recipes
      cd team-nlp-recipes && recipekit build recipe=our_qwen_sft
      cd team-nlp-recipes && ./ci.sh  # builds and validates every preset
    """
    from recipekit.recipe.scaffold import init

    config = init(name)
    click.echo(f"{click.style('created', fg='green')} {config.parent}: {config.name}, recipes/, README.md, ci.sh")
    click.echo(f"next: cd {name} && recipekit list && recipekit build recipe=our_qwen_sft")


@click.command("cp", context_settings=SETTINGS)
@click.argument("option")
@click.argument("name", required=False)
@click.option(
    "--to",
    type=click.Path(path_type=Path, file_okay=False),
    help="Recipe tree to copy into (default: the first search_path of the recipekit.toml here or above).",
)
@click.option("--force", is_flag=True, help="Replace a file of that name in the team repo.")
@user_errors
def cp_command(option: str, name: str | None, to: Path | None, force: bool) -> None:
    """Copy built-in OPTION (GROUP/OPTION: a model, hardware, preset, ...) into the team repo as GROUP/NAME.yaml.

    Without NAME the copy keeps the option's name and takes the built-in option's place for every build in the
    repo (recipekit list marks it "shadows built-in"); with NAME it is a new option beside it. The copy starts with
    a comment naming the recipekit version, the built-in file and its sha256. To drop a key the built-in option
    sets, set it to null in the copy or in an option that extends it (node_selector: {accelerator-type: null}).

    \b
    Examples:
      cd team-nlp-recipes && recipekit cp hw/ascend910b  # same name: shadows it
      cd team-nlp-recipes && recipekit cp recipe/llama3_8b_sft our_llama_sft
      recipekit cp model/qwen2.5_7b our_qwen --to team-recipes/recipes
    """
    from recipekit.recipe.scaffold import copy_option

    copied = copy_option(option, name, to, force=force)
    group = copied.target.parent.name
    try:
        shown = copied.target.relative_to(Path.cwd())
    except ValueError:
        shown = copied.target
    click.echo(f"{click.style('copied', fg='green')} built-in {group}/{copied.source.stem} to {shown}")
    if copied.shadows:
        click.echo(f"it shadows the built-in option in every build here (recipekit list {group})")
    else:
        click.echo(f"use it with {group}={copied.target.stem}")


@click.command("pack", context_settings=SETTINGS)
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="Directory for the archive (default: the current one)."
)
@user_errors
def pack_command(bundle: Path, output: Path | None) -> None:
    """Pack BUNDLE with the recipe files it was composed from into <name>-<digest>.tar.gz, a reproducible archive.

    The bundle must still rebuild byte for byte from those recipe files (pack checks); the same bundle always packs
    to the same bytes.

    \b
    Examples:
      recipekit pack bundles/llama3_8b_sft
      recipekit pack bundles/our_qwen_sft -o handover/  # a team preset's bundle
    """
    from recipekit.handover.package import pack

    packed = pack(bundle, output)
    click.echo(
        f"{click.style('packed', fg='green')} {packed.path}: {packed.bundle_files} bundle files, "
        f"{packed.source_files} recipe sources; sha256 {packed.sha256}"
    )


@click.command("verify", context_settings=SETTINGS)
@click.argument("package", type=click.Path(path_type=Path))
@user_errors
def verify_command(package: Path) -> None:
    """Verify a package: every hash, then a rebuild from its own recipe sources must give the same bytes.

    Needs only the archive and the recipekit version that packed it; never reads the current directory's
    recipekit.toml, --recipes or $RECIPEKIT_RECIPES. Exit 0 verified; 2 with one line per problem.

    \b
    Examples:
      recipekit pack bundles/tiny_sft && recipekit verify tiny_sft-*.tar.gz
    """
    from recipekit.handover.package import verify

    verified = verify(package)
    click.echo(
        f"{click.style('verified', fg='green')} {package}: {verified.bundle_files} bundle files and "
        f"{verified.source_files} recipe sources match their hashes; a rebuild from the packed sources with "
        f"recipekit {verified.recipekit_version} gives the same bytes"
    )


@click.command("diff", context_settings=SETTINGS)
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@user_errors
def diff_command(a: Path, b: Path) -> None:
    """Show what differs between two bundles (directories or packages): recipe keys first, then files.

    Exit 0 identical, 1 different, 2 unusable input.

    \b
    Examples:
      recipekit diff bundles/tiny_sft@ascend910b bundles/tiny_sft@h100  # exit 1
      recipekit pack bundles/tiny_sft && recipekit diff *.tar.gz bundles/tiny_sft

    (`recipekit build -m recipe=llama3_8b_sft hw=ascend910b,h100` makes the first example's two bundles.)
    """
    from recipekit.handover.diff import diff, load_side

    lines = diff(load_side(a), load_side(b))
    if not lines:
        click.echo(f"identical: {a} and {b} have the same recipe and files")
        return
    click.echo("\n".join(lines))
    sys.exit(1)
