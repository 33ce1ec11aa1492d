"""The base image matrix (``images/``): per hardware family, the base image and every pinned version.

Loading is I/O and happens once, in the caller; checking a family against torch_npu's published compatibility table
is pure and is used both by ``build`` (an incompatible pin stops the build) and by ``validate`` (a hand-edited
Dockerfile is caught).
"""

from __future__ import annotations

from pathlib import Path

from recipekit import yamlfile
from recipekit.errors import Problem
from recipekit.paths import IMAGES_DIR
from recipekit.schema import Section, spec, validate


class ImageFamily(Section):
    """One row of images/matrix.yaml."""

    description: str = spec("", description="What the family is for.")
    base_image: str = spec(description="Base image repository.")
    base_tag: str = spec(description="Base image tag (for Ascend it starts with the CANN version).")
    cann: str | None = spec(description="CANN version inside the base image (Ascend only).")
    python: str = spec(description="Python version of the base image.")
    torch: str = spec(description="Pinned torch version.")
    torch_npu: str | None = spec(description="Pinned torch_npu version (Ascend only).")
    torch_index: str = spec(description="pip index the torch wheel comes from (CPU wheel for Ascend).")
    cann_env: list[str] = spec(description="set_env.sh scripts run.sh sources, the first that exists wins.")
    bitsandbytes: str = spec(description="pip requirement for 4-bit loading (QLoRA) on this family.")
    packages: dict[str, str] = spec(description="The Python training stack, name -> exact version.")

    @property
    def base(self) -> str:
        return f"{self.base_image}:{self.base_tag}"


class ImageMatrix(Section):
    """All families plus torch_npu's compatibility table (torch_npu -> (torch, CANN))."""

    families: dict[str, ImageFamily] = spec(description="images/matrix.yaml: family name -> pinned image.")
    torch_npu_table: dict[str, tuple[str, str]] = spec(description="images/torch_npu.yaml: torch_npu -> (torch, CANN).")


def load_images(directory: Path = IMAGES_DIR) -> ImageMatrix:
    """images/ as typed records; a malformed file is a RecipeError naming the key, like a bad recipe."""
    matrix = yamlfile.read(directory / "matrix.yaml")
    table = yamlfile.read(directory / "torch_npu.yaml")
    return validate(
        ImageMatrix,
        {
            "families": (matrix or {}).get("families"),
            "torch_npu_table": {str(k): [str(v) for v in row] for k, row in table.items()},
        },
        root="images",
    )


def compatibility_problems(name: str, family: ImageFamily, table: dict[str, tuple[str, str]]) -> list[Problem]:
    """torch_npu pins torch exactly and needs one CANN: anything else fails at import time on the cluster."""
    key = f"images/matrix.yaml families.{name}"
    if family.torch_npu is None:
        return []
    row = table.get(family.torch_npu)
    if row is None:
        return [
            Problem(
                key,
                f"torch_npu {family.torch_npu} is not in torch_npu's compatibility table",
                hint="releases: " + ", ".join(table),
            )
        ]
    torch, cann = row
    problems = []
    if family.torch != torch:
        problems.append(
            Problem(key, f"torch_npu {family.torch_npu} needs torch {torch}, the matrix pins {family.torch}")
        )
    if family.cann != cann:
        problems.append(
            Problem(key, f"torch_npu {family.torch_npu} needs CANN {cann}, the base image has {family.cann}")
        )
    if family.cann and not family.base_tag.startswith(family.cann + "-"):
        problems.append(Problem(key, f"base tag {family.base_tag} does not carry CANN {family.cann}"))
    return problems
