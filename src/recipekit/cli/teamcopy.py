"""``recipekit cp GROUP/OPTION [NAME]``: copy a built-in option or preset into the team repo to edit it, as torchtune's
``tune cp`` copies a recipe or config. Parse, call :func:`recipekit.recipe.scaffold.copy_option`, print.

Exit codes: 0 copied; 2 an unknown group or option, no team repo here, or a file that is already there (one line each).
"""

from __future__ import annotations

from pathlib import Path

import click

from recipekit.cli.common import SETTINGS, user_errors


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
      cd team-nlp-recipes && recipekit cp hw/ascend910b            # the team's own 910B option, same name
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
