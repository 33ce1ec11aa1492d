"""Write recipes/model/<option>.yaml for every entry of catalog.yaml with `recipekit model import`."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from click.testing import CliRunner

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def import_args(option: str, entry: list, output: Path) -> list[str]:
    """The `recipekit model import` arguments that write ``option`` to ``output``."""
    title, name_or_path, random_init = entry
    args = ["model", "import", str(HERE / option), "-o", str(output), "--name", option, "--force"]
    args += ["--name-or-path", name_or_path, "--description", title]
    return args + (["--random"] if random_init else [])


def catalog() -> dict[str, list]:
    return yaml.safe_load((HERE / "catalog.yaml").read_text())


def main() -> int:
    from recipekit.cli import main as cli

    for option, entry in catalog().items():
        result = CliRunner().invoke(cli, import_args(option, entry, ROOT / "recipes" / "model" / f"{option}.yaml"))
        print(result.output.strip())
        if result.exit_code:
            return result.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
