"""The Hugging Face Trainer on DeepSpeed: data parallelism with ZeRO 0-3 and offload, tensor parallelism through
DeepSpeed AutoTP inside a pod, LoRA and QLoRA through PEFT. Pipeline, expert and context parallelism, virtual stages
and Megatron's distributed optimizer it does not run (``plan`` analyses them; the Megatron engine builds them).

Its rules are the ones measured on the pinned stack (:mod:`recipekit.plan.parallelism` for TP, PP and EP;
:func:`~recipekit.plan.rules.zero_problems` for ZeRO, offload and QLoRA; :func:`~recipekit.plan.rules.moe_lora_problems`
for PEFT on fused experts); this module is where the plan asks them.
"""

from __future__ import annotations

from recipekit.base.errors import Problem
from recipekit.plan.layout import Layout
from recipekit.plan.parallelism import model_parallel_problems
from recipekit.plan.rules import moe_lora_problems, zero_problems
from recipekit.recipe.sections import Recipe


class TrainerEngine:
    """``engine=trainer``: the bundle's ``runtime/train.py`` drives ``transformers.Trainer`` (and DeepSpeed)."""

    kind = "trainer"
    megatron_kernels = False
    needs_step_count = False
    resize_refusal: str | None = None

    def problems(self, recipe: Recipe, layout: Layout, *, analysis_only: bool, tp_across_pods: bool) -> list[Problem]:
        """ZeRO, offload and PEFT's limits always; the model-parallel layouts it cannot run only for a bundle."""
        problems = zero_problems(recipe) + moe_lora_problems(recipe)
        if not analysis_only:
            problems = model_parallel_problems(recipe, layout, tp_across_pods=tp_across_pods) + problems
        return problems

    def uses_deepspeed(self, recipe: Recipe, layout: Layout) -> bool:
        """For ZeRO, and for tensor parallelism (AutoTP) at any stage."""
        return bool(recipe.parallel.zero_stage) or layout.tensor_parallel > 1

    def runs(self, recipe: Recipe, layout: Layout) -> str:
        tp = layout.tensor_parallel
        return (
            f"TP {tp} runs in the bundle as DeepSpeed AutoTP (ds_config tensor_parallel.autotp_size = {tp}): "
            f"{layout.dp_size} TP groups of {tp} ranks, data-parallel over the groups"
        )
