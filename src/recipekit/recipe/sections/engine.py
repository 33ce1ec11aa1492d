"""The ``engine`` section: which training engine the bundle starts, chosen by its ``kind``.

recipekit compiles for training engines and never trains by itself. ``trainer`` is the Hugging Face Trainer on
DeepSpeed (data parallelism and ZeRO, AutoTP inside a pod); ``megatron`` is Megatron-Bridge over Megatron-core
(MindSpeed's adaptation on Ascend), for the layouts ZeRO does not reach: tensor × pipeline × data parallelism with
expert, context and sequence parallelism. What each engine can run is its own rule (plan/engines).
"""

from __future__ import annotations

from typing import Annotated, Literal

from recipekit.recipe.schema import Section, Tagged, spec


class _EngineBase(Section):
    description: str = spec("", description="One line shown by `recipekit list engine`.")


class TrainerEngine(_EngineBase):
    """``transformers.Trainer`` (PEFT for adapters, DeepSpeed for ZeRO and AutoTP) runs the bundle's train.py."""

    kind: Literal["trainer"] = spec(description="The Hugging Face Trainer on DeepSpeed.")


class MegatronEngine(_EngineBase):
    """Megatron-Bridge's own ``pretrain``/``finetune`` entry runs a configuration compiled from the recipe."""

    kind: Literal["megatron"] = spec(description="Megatron-Bridge over Megatron-core.")
    overlap_grad_reduce: bool = spec(
        True, description="Overlap the data-parallel gradient reduction with the backward pass (Megatron's DDP)."
    )
    overlap_param_gather: bool = spec(
        True,
        description="Overlap the distributed optimizer's parameter all-gather with the next forward "
        "(parallel.zero_stage 1 only).",
    )


EngineSpec = Annotated[TrainerEngine | MegatronEngine, Tagged("kind")]
