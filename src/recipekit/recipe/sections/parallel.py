"""The ``parallel`` section: ZeRO stage or distributed optimizer, offload, the layout's dimensions (tensor with
sequence parallelism, pipeline with virtual stages, context and expert parallelism) and recomputation.

The keys are Megatron-core's knobs in recipekit's words; what each costs is :mod:`recipekit.plan.layout` and
:mod:`recipekit.memory`, the rules they obey :mod:`recipekit.plan.layoutrules`, and which engine builds them the
plan's (today's Transformers Trainer + DeepSpeed builds TP and the ZeRO stages; the rest is analysed by `plan`)."""

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
    """Data parallelism (plain DDP, a DeepSpeed ZeRO stage with optional offload, or Megatron's distributed
    optimizer) and the model-parallel layout (TP with SP, PP with virtual stages, CP, EP), with recomputation."""

    name: str = spec(domain=SHORT_NAME, description="Short name (the option's file name).")
    description: str = spec("", description="One line shown by `recipekit list parallel`.")
    zero_stage: Literal[0, 1, 2, 3] = spec(description="0 = DDP without DeepSpeed; 1-3 = ZeRO stage.")
    offload_optimizer: Literal["none", "cpu", "nvme"] = spec("none", description="Where optimizer states live.")
    offload_param: Literal["none", "cpu", "nvme"] = spec("none", description="Where parameters live (ZeRO-3 only).")
    nvme_path: str | None = spec(None, domain=HOST_PATH, description="Local NVMe directory for nvme offload.")
    gradient_checkpointing: bool = spec(False, description="Recompute activations in backward to save memory.")
    recompute_granularity: Literal["full", "selective"] = spec(
        "full",
        description="What gradient_checkpointing recomputes: full = each layer from its input; selective = the "
        "attention core only (Korthikanti et al. 2022; Megatron's --recompute-granularity selective, analysed by "
        "plan only).",
    )
    distributed_optimizer: bool = spec(
        False,
        description="Megatron-core's distributed optimizer (with zero_stage 0): fp32 master weights and Adam states "
        "sharded over the data-parallel ranks, bf16 weights and fp32 gradients whole (analysed by plan only).",
    )
    overlap_comm: bool = spec(True, description="Overlap gradient reduction with backward (ZeRO).")
    reduce_bucket_size: int = spec(
        500_000_000, gt=0, le=MAX_COUNT, description="Elements per gradient reduction bucket."
    )
    tensor_parallel: int = spec(
        1,
        ge=1,
        le=4096,
        description="Tensor-parallel degree: DeepSpeed AutoTP inside a pod (full training, ZeRO 0-2); world size = "
        "TP × CP × PP × data-parallel size.",
    )
    sequence_parallel: bool = spec(
        False,
        description="Megatron's sequence parallelism: with TP > 1 the activations TP leaves whole (norms, residuals) "
        "are split over the TP ranks along the sequence (analysed by plan only).",
    )
    pipeline_parallel: int = spec(
        1,
        ge=1,
        le=4096,
        description="Pipeline stages, at most the model's layers (analysed by plan only; build needs 1).",
    )
    virtual_pipeline_stages: int = spec(
        1,
        ge=1,
        le=1024,
        description="Model chunks per pipeline rank (Megatron's virtual pipeline size): above 1 the interleaved "
        "1F1B schedule runs, with a bubble divided by it (analysed by plan only).",
    )
    pipeline_schedule: Literal["auto", "1f1b", "interleaved_1f1b", "dualpipe"] = spec(
        "auto",
        description="Megatron-core's schedules (pipeline_parallel/schedules.py): 1f1b, or interleaved_1f1b over "
        "virtual stages; auto: interleaved where there are virtual stages, as Megatron-core picks it. dualpipe: "
        "DeepSeek-V3's bidirectional schedule (arXiv 2412.19437 §3.2.1; not Megatron-core's), analysed only.",
    )
    first_stage_layers: int = spec(
        0,
        ge=0,
        le=10_000,
        description="Decoder layers of the first pipeline stage (it also holds the embedding); 0 = an even split "
        "(Megatron-core's num_layers_in_first_pipeline_stage).",
    )
    last_stage_layers: int = spec(
        0,
        ge=0,
        le=10_000,
        description="Decoder layers of the last pipeline stage (it also holds the head and the loss); 0 = an even "
        "split (Megatron-core's num_layers_in_last_pipeline_stage).",
    )
    context_parallel: int = spec(
        1,
        ge=1,
        le=4096,
        description="Context-parallel degree: each sequence split over CP ranks (2 × CP chunks for causal balance), "
        "keys and values passed around the ring (analysed by plan only).",
    )
    expert_parallel: int = spec(
        1,
        ge=1,
        le=65_536,
        description="Expert-parallel degree of an MoE model: each rank holds experts / EP of every MoE layer "
        "(analysed by plan only; build needs 1).",
    )
    overlap_moe_alltoall: bool = spec(
        False,
        description="Run each micro-batch's expert all-to-all behind another's compute (Megatron-core's "
        "overlap_moe_expert_parallel_comm; DeepSeek-V3's DualPipe does the same): needs EP, virtual stages under PP "
        "and no full recomputation (analysed by plan only).",
    )
    expert_tensor_parallel: int = spec(
        0,
        ge=0,
        le=4096,
        description="Tensor-parallel degree inside each expert; 0 = the TP degree (Megatron's default).",
    )

    def rules(self) -> list[str | tuple[str, str]]:
        broken: list[str | tuple[str, str]] = []
        if self.distributed_optimizer and self.zero_stage:
            broken.append(
                (
                    "distributed_optimizer",
                    f"needs zero_stage 0 (got {self.zero_stage}): Megatron's distributed optimizer shards the "
                    "optimizer itself; DeepSpeed's ZeRO stages are the other way",
                )
            )
        if self.distributed_optimizer and self.offload_optimizer != "none":
            broken.append(("offload_optimizer", "offload is DeepSpeed's; the distributed optimizer has none"))
        if self.pipeline_schedule == "interleaved_1f1b" and self.virtual_pipeline_stages == 1:
            broken.append(("pipeline_schedule", "interleaved_1f1b needs virtual_pipeline_stages > 1"))
        if self.pipeline_schedule in ("1f1b", "dualpipe") and self.virtual_pipeline_stages > 1:
            broken.append(
                (
                    "pipeline_schedule",
                    f"{self.pipeline_schedule} runs no virtual stages (virtual_pipeline_stages "
                    f"{self.virtual_pipeline_stages}): "
                    "interleaved_1f1b or auto",
                )
            )
        if self.recompute_granularity == "selective" and not self.gradient_checkpointing:
            broken.append(("recompute_granularity", "selective needs gradient_checkpointing=true"))
        return broken

    @property
    def schedule(self) -> str:
        """The pipeline schedule that runs: the one asked for, or the one the virtual stages select."""
        if self.pipeline_schedule != "auto":
            return self.pipeline_schedule
        return "interleaved_1f1b" if self.virtual_pipeline_stages > 1 else "1f1b"
