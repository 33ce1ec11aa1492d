"""The base image matrix (``images/``): per hardware family, the base image and every pinned version.

Loading is I/O and happens once, in the caller; checking a family against torch_npu's published compatibility table
is pure and is used both by ``build`` (an incompatible pin stops the build) and by ``validate`` (a hand-edited
Dockerfile is caught).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from recipekit.errors import Problem
from recipekit.paths import IMAGES_DIR


class ImageFamily(BaseModel):
    """One row of images/matrix.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    base_image: str
    base_tag: str
    cann: str | None = Field(description="CANN version inside the base image (Ascend only).")
    python: str
    torch: str
    torch_npu: str | None
    torch_index: str = Field(description="pip index the torch wheel comes from (CPU wheel for Ascend).")
    cann_env: list[str] = Field(description="set_env.sh scripts run.sh sources, the first that exists wins.")
    bitsandbytes: str = Field(description="pip requirement for 4-bit loading (QLoRA) on this family.")
    packages: dict[str, str] = Field(description="The Python training stack, name -> exact version.")

    @property
    def base(self) -> str:
        return f"{self.base_image}:{self.base_tag}"


class ImageMatrix(BaseModel):
    """All families plus torch_npu's compatibility table (torch_npu -> (torch, CANN))."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    families: dict[str, ImageFamily]
    torch_npu_table: dict[str, tuple[str, str]]


def load_images(directory: Path = IMAGES_DIR) -> ImageMatrix:
    matrix = yaml.safe_load((directory / "matrix.yaml").read_text(encoding="utf-8"))
    table = yaml.safe_load((directory / "torch_npu.yaml").read_text(encoding="utf-8"))
    return ImageMatrix(
        families=matrix["families"],
        torch_npu_table={str(k): (str(v[0]), str(v[1])) for k, v in table.items()},
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
