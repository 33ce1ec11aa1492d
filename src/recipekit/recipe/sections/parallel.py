"""The ``parallel`` section: ZeRO stage, offload, tensor, pipeline and expert parallelism, checkpointing."""

from __future__ import annotations

from typing import Literal

from recipekit.recipe.domains import (
    HOST_PATH,
    SHORT_NAME,
)
from recipekit.recipe.schema import Section, spec
from recipekit.recipe.sections.model import MAX_COUNT


# ------------------------------------------------------------------------------------------------------ parallel
class ParallelSpec(Section):
    """Data parallelism (plain DDP or a DeepSpeed ZeRO stage, with optional offload) and tensor parallelism."""

    name: str = spec(domain=SHORT_NAME, description="Short name (the option's file name).")
    description: str = spec("", description="One line shown by `recipekit list parallel`.")
    zero_stage: Literal[0, 1, 2, 3] = spec(description="0 = DDP without DeepSpeed; 1-3 = ZeRO stage.")
    offload_optimizer: Literal["none", "cpu", "nvme"] = spec("none", description="Where optimizer states live.")
    offload_param: Literal["none", "cpu", "nvme"] = spec("none", description="Where parameters live (ZeRO-3 only).")
    nvme_path: str | None = spec(None, domain=HOST_PATH, description="Local NVMe directory for nvme offload.")
    gradient_checkpointing: bool = spec(False, description="Recompute activations in backward to save memory.")
    overlap_comm: bool = spec(True, description="Overlap gradient reduction with backward (ZeRO).")
    reduce_bucket_size: int = spec(
        500_000_000, gt=0, le=MAX_COUNT, description="Elements per gradient reduction bucket."
    )
    tensor_parallel: int = spec(
        1,
        ge=1,
        le=4096,
        description="Tensor-parallel degree: DeepSpeed AutoTP inside a pod (full training, ZeRO 0-2); world size = "
        "TP × data-parallel size.",
    )
    pipeline_parallel: int = spec(
        1,
        ge=1,
        le=4096,
        description="Pipeline stages, at most the model's layers (analysed by plan only; build needs 1).",
    )
    expert_parallel: int = spec(
        1,
        ge=1,
        le=65_536,
        description="Expert-parallel degree of an MoE model: each rank holds experts / EP of every MoE layer "
        "(analysed by plan only; build needs 1).",
    )
