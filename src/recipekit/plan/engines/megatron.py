"""Megatron-Bridge over Megatron-core: tensor × pipeline × data parallelism with expert parallelism, pretraining,
full SFT and LoRA through Bridge's own PEFT. What it cannot run is refused here, each with the rule it breaks.

The rules are Megatron-core's own (``megatron/core/parallel_state.py``, ``transformer_config.py``,
``model_parallel_config.py`` of megatron-core 0.16.1, the version the engine's image pins: images/engines/), stated
before a Job is scheduled rather than found by its first rank:

* a TP rank holds whole attention heads and whole key-value groups (``num_attention_heads % tp``,
  ``num_query_groups % tp``);
* a pipeline stage holds whole layers, the same number on every stage (``num_layers % pp``);
* an expert-parallel group holds whole experts (``num_moe_experts % ep``) and is drawn from the data-parallel ranks;
* the optimizer is Adam with Megatron's DDP (``parallel.zero_stage`` 0) or its distributed optimizer, which shards
  the optimizer states over the data-parallel ranks as ZeRO-1 does (``zero_stage`` 1); DeepSpeed's ZeRO-2/3 and its
  offload are DeepSpeed's, not Megatron's;
* adapters are Bridge's LoRA on Megatron's fused projections; 4-bit QLoRA bases it does not load.
"""

from __future__ import annotations

from recipekit.base.errors import Problem
from recipekit.plan.layout import Layout
from recipekit.recipe.sections import Recipe, adapter_of

#: Megatron's fused projections and the Hugging Face names each one holds (Bridge's LoRA adapts the fused ones:
#: ``megatron.bridge.peft.lora.LoRA.target_modules``).
FUSED_PROJECTIONS = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}


class MegatronEngine:
    """``engine=megatron``: the bundle's ``runtime/megatron`` room starts Bridge's ``pretrain`` or ``finetune``."""

    kind = "megatron"

    def problems(self, recipe: Recipe, layout: Layout, *, analysis_only: bool, tp_across_pods: bool) -> list[Problem]:
        """Optimizer sharding, modes and adapter targets always; the layout's divisibility unless it did not divide
        (``analysis_only`` is then set by the plan: its numbers would mislead)."""
        problems = _optimizer_problems(recipe) + _mode_problems(recipe)
        if not analysis_only:
            problems += _layout_problems(recipe, layout, tp_across_pods)
        return problems

    def uses_deepspeed(self, recipe: Recipe, layout: Layout) -> bool:
        return False


def _optimizer_problems(recipe: Recipe) -> list[Problem]:
    par, problems = recipe.parallel, []
    if par.zero_stage > 1:
        problems.append(
            Problem(
                "parallel.zero_stage",
                f"ZeRO-{par.zero_stage} is DeepSpeed's; Megatron shards the optimizer states over the data-parallel "
                "ranks with its distributed optimizer (ZeRO-1) and splits weights and gradients by TP, PP and EP",
                hint="parallel.zero_stage=1 (the distributed optimizer), or engine=trainer for ZeRO-2/3",
            )
        )
    for key, where in (("offload_optimizer", par.offload_optimizer), ("offload_param", par.offload_param)):
        if where != "none":
            problems.append(
                Problem(
                    f"parallel.{key}",
                    f"{where} offload is DeepSpeed's ZeRO-Offload; the Megatron engine keeps its states on the devices",
                    hint=f"parallel.{key}=none (add TP, PP or EP to fit), or engine=trainer",
                )
            )
    return problems


def _mode_problems(recipe: Recipe) -> list[Problem]:
    mode = recipe.mode
    if mode.kind == "qlora":
        return [
            Problem(
                "mode",
                "qlora loads a 4-bit base through bitsandbytes, which Megatron-Bridge does not",
                hint="mode=lora on the Megatron engine, or engine=trainer for QLoRA",
            )
        ]
    lora = adapter_of(mode)
    if lora is None or lora.target_modules == "all-linear":
        return []
    return _target_problems(list(lora.target_modules))


def _target_problems(targets: list[str]) -> list[Problem]:
    """Every Hugging Face target must map to a Megatron projection, and a fused projection is adapted whole: q_proj
    alone cannot be, since Megatron keeps q, k and v in one linear_qkv."""
    known = {name: fused for fused, names in FUSED_PROJECTIONS.items() for name in names}
    problems = []
    unknown = [t for t in targets if t not in known and t not in FUSED_PROJECTIONS]
    if unknown:
        problems.append(
            Problem(
                "mode.lora.target_modules",
                f"{', '.join(unknown)}: not a projection Megatron's LoRA adapts",
                hint="any of " + ", ".join([*known, *FUSED_PROJECTIONS]) + ", or all-linear",
            )
        )
    for fused, names in FUSED_PROJECTIONS.items():
        named = [n for n in names if n in targets]
        if named and len(named) < len(names):
            missing = [n for n in names if n not in targets]
            problems.append(
                Problem(
                    "mode.lora.target_modules",
                    f"{', '.join(named)} without {', '.join(missing)}: Megatron keeps them in one fused {fused}, "
                    "adapted whole",
                    hint=f"add {', '.join(missing)} (or name {fused})",
                )
            )
    return problems


def _layout_problems(recipe: Recipe, layout: Layout, tp_across_pods: bool) -> list[Problem]:
    model, problems = recipe.model, []
    tp, pp = layout.tensor_parallel, layout.pipeline_parallel
    heads, groups = model.num_attention_heads, model.num_kv_heads
    if heads % tp or groups % tp:
        problems.append(
            Problem(
                "parallel.tensor_parallel",
                f"TP {tp} does not divide {model.name}'s heads: {heads} attention heads / {tp} = {heads / tp:g}, "
                f"{groups} key-value groups / {tp} = {groups / tp:g}; Megatron gives each TP rank whole heads and "
                "whole groups",
            )
        )
    if tp > 1 and layout.devices_per_pod % tp and not tp_across_pods:
        problems.append(
            Problem(
                "parallel.tensor_parallel",
                f"TP {tp} does not divide the {layout.devices_per_pod} devices of one pod: a TP group all-reduces in "
                f"every layer and must stay on the {recipe.hw.intra_node_link}",
            )
        )
    if model.num_layers % pp:
        problems.append(
            Problem(
                "parallel.pipeline_parallel",
                f"PP {pp} does not divide {model.name}'s {model.num_layers} layers "
                f"({model.num_layers} / {pp} = {model.num_layers / pp:g}): Megatron gives each stage as many layers",
            )
        )
    return problems
