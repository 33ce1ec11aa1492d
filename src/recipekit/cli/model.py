"""The ``recipekit model`` commands: turn a Hugging Face config.json into a model option.

``recipekit model import CONFIG`` reads the config (or a model directory's config.json) locally, builds the model on
the meta device with transformers and writes a model option with its architecture numbers and exact parameter
counts (:mod:`recipekit.recipe.modelimport`). Inside a team repo (a ``recipekit.toml`` above the working directory) the
option goes to the repo's first recipe tree, ``<search_path[0]>/model/<name>.yaml``; elsewhere ``-o`` says where.

Exit codes: 0 written; 2 the config was refused (remote code, an encoder-decoder, encoder-only or multimodal model
without a causal text model, an unknown or unsupported architecture, a config transformers cannot build) or the
destination is unusable (one line, no traceback).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import click

from recipekit.cli.common import SETTINGS, fail
from recipekit.recipe.schema import printable

if TYPE_CHECKING:
    from recipekit.recipe.sections import FlopsSpec


@click.group("model", context_settings=SETTINGS)
def model_group() -> None:
    """Model options from Hugging Face configs.

    \b
    Examples:
      recipekit model import /mnt/shared/models/Qwen3-8B -o qwen3_8b.yaml
      recipekit model import config.json -o my_model.yaml --name my_model
    """


def default_name(config: Path) -> str:
    """A short option name from the model directory's name: Qwen3-30B-A3B → qwen3_30b_a3b."""
    stem = config.name if config.is_dir() else config.resolve().parent.name
    name = re.sub(r"[^a-z0-9.]+", "_", stem.lower()).strip("_.")
    return name[:63].strip("_.") or "model"


def destination(name: str, output: Path | None) -> Path:
    """``output``, or the team repo's ``model/<name>.yaml``; an error when neither is there."""
    if output is not None:
        return output
    from recipekit.recipe.team import find_config, read_config

    found = find_config(Path.cwd())
    if found is None:
        fail("not inside a team repo (no recipekit.toml above this directory): say where with -o PATH")
    return read_config(found).search_path[0] / "model" / f"{name}.yaml"


@model_group.command("import", context_settings=SETTINGS)
@click.argument("config", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the option here (default: team repo).")
@click.option("--name", help="Option name (default: from the model directory's name).")
@click.option(
    "--name-or-path",
    "name_or_path",
    help="Weights in the pod (default: ${cluster.mount_path}/models/<directory name>, on the pods' volume).",
)
@click.option("--description", help="Title of the option's description line (default: --name, else the directory).")
@click.option("--random", "random_init", is_flag=True, help="init: random (a tiny twin: random weights, no files).")
@click.option("--force", is_flag=True, help="Replace an existing option file.")
def import_command(
    config: Path,
    output: Path | None,
    name: str | None,
    name_or_path: str | None,
    description: str | None,
    random_init: bool,
    force: bool,
) -> None:
    """Write a model option from CONFIG (a config.json or a model directory), with exact parameter counts.

    The model is built on the meta device (shapes, no weights) by transformers from the config alone, after every
    count in it (a multimodal model's text config too) is checked; no remote code runs. The counts per part
    (embedding, attention, MLP, experts, router, norms, head) are stored in the option, so `recipekit build` and
    `plan` use them without importing torch. The FLOPs are torch's FLOP counter's on the meta device; where a module
    cannot run there, on the CPU within a budget of 8 GiB (the depth-cut model's weights and gradients, a short
    sequence's activations: checked before anything is allocated), and over it counted analytically (a note says
    why).

    \b
    Examples:
      cd team-recipes && recipekit model import /mnt/shared/models/Qwen3-30B-A3B
      recipekit model import Mixtral-8x7B-v0.1/config.json -o mixtral_8x7b.yaml
    """
    from recipekit.base.errors import RecipeError
    from recipekit.recipe.modelimport import ImportProblem, describe, import_config, option_yaml
    from recipekit.recipe.schema import validate
    from recipekit.recipe.sections import ModelSpec

    label = config.name if config.is_dir() else config.resolve().parent.name
    title = description or name or label  # the name the user chose is the one `recipekit list model` should show
    name = name or default_name(config)
    target = destination(name, output)
    if target.exists() and not force:
        fail(f"{target} exists (use --force to replace it)")
    try:
        imported = import_config(config)
    except ImportProblem as exc:
        fail(str(exc))
    except RecipeError as err:  # import_config turns its own into ImportProblem; this is the last guard
        fail("; ".join(str(p) for p in err.problems))
    option = {
        "name": name,
        "description": describe(imported.option, title),
        "name_or_path": name_or_path or "${cluster.mount_path}/models/" + label,
        "init": "random" if random_init else "pretrained",
        **imported.option,
    }
    text = option_yaml(option)
    import yaml

    try:
        validate(ModelSpec, yaml.safe_load(text), root="model")
    except RecipeError as err:
        fail("; ".join(str(p) for p in err.problems))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {target}: {exc.strerror or exc}")
    counts, flops = imported.option["params"], imported.option["flops"]
    for note in imported.notes:
        click.echo(f"note: {printable(note)}")
    click.echo(f"wrote {target}: {imported.architecture}")
    click.echo(f"  {counts.total:,} parameters ({counts.active:,} active)")
    context = int(imported.option["max_position_embeddings"])
    click.echo(f"  GFLOP per training token by sequence length ({flops.counted_by}):")
    click.echo("    " + "   ".join(_flops_at(flops, length, context) for length in flops_lengths(context)))


#: The sequence lengths training runs usually choose; the import states FLOPs at those within the model's context.
COMMON_LENGTHS = (2048, 4096, 8192, 32768)


def flops_lengths(context: int) -> list[int]:
    """The lengths `model import` states the FLOPs at: the common training lengths within the model's context, and
    the context itself (where the model names one)."""
    from recipekit.recipe.modelimport import UNBOUNDED_POSITIONS

    lengths = [length for length in COMMON_LENGTHS if length < context]
    return lengths + ([context] if context < UNBOUNDED_POSITIONS else [])


def _flops_at(flops: FlopsSpec, length: int, context: int) -> str:
    figure = f"{length:,}: {flops.train_at(length) / 1e9:,.2f}"
    return figure + " (context)" if length == context else figure
