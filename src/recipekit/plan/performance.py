"""The performance settings a run gets, one line each: what is set, to what, where it lives, and who applies it.

What ``plan`` lists under "Performance settings" and the bundle's plan.md repeats: the settings that decide how
fast a step runs without changing what it trains. Each names the recipe key it comes from and the bundle file that
carries it, so a reader can check it in the bundle and change it in the recipe. A setting the bundle does not
enable yet is listed as such, with why, rather than left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from recipekit.plan.plan import Plan
    from recipekit.recipe.sections import Recipe


@dataclass(frozen=True)
class PerformanceSetting:
    """One setting: its name, the value the run gets, and where that value lives and is applied."""

    name: str
    value: str
    where: str


def performance_settings(recipe: Recipe, plan: Plan) -> tuple[PerformanceSetting, ...]:
    """The run's performance settings, common ones first, then the engine's."""
    settings = [_fp32_matmul(recipe)]
    settings += _megatron(recipe, plan) if recipe.engine.kind == "megatron" else _trainer(recipe, plan)
    return tuple(settings)


def _fp32_matmul(recipe: Recipe) -> PerformanceSetting:
    mode = recipe.hw.fp32_matmul
    where = "hw.fp32_matmul; set at start by runtime/matmulmode.py"
    return PerformanceSetting("fp32 matmuls", mode.upper() if mode else "full fp32", where)


def _trainer(recipe: Recipe, plan: Plan) -> list[PerformanceSetting]:
    par, tr = recipe.parallel, recipe.train
    workers = PerformanceSetting(
        "data loader workers",
        f"{tr.dataloader_workers} per process",
        "train.dataloader_workers; TrainingArguments dataloader_num_workers (pinned memory: the Trainer's default)",
    )
    if plan.uses_deepspeed and par.zero_stage > 0:
        overlap = PerformanceSetting(
            "communication overlap",
            "on" if par.overlap_comm else "off",
            "parallel.overlap_comm; ds_config.json zero_optimization.overlap_comm",
        )
    else:
        overlap = PerformanceSetting("communication overlap", "DDP's bucketed all-reduce", "the Trainer's DDP")
    return [workers, overlap]


def _megatron(recipe: Recipe, plan: Plan) -> list[PerformanceSetting]:
    engine = recipe.engine
    distributed = recipe.parallel.distributed_optimizer
    settings = [
        PerformanceSetting(
            "gradient reduce overlap",
            "on" if getattr(engine, "overlap_grad_reduce", False) else "off",
            "engine.overlap_grad_reduce; recipe.yaml megatron.ddp.overlap_grad_reduce",
        ),
        PerformanceSetting(
            "parameter gather overlap",
            "on" if getattr(engine, "overlap_param_gather", False) and distributed else "off",
            "engine.overlap_param_gather (with parallel.distributed_optimizer); megatron.ddp.overlap_param_gather",
        ),
    ]
    if recipe.hw.vendor == "nvidia":
        settings.append(
            PerformanceSetting(
                "Transformer Engine", "on", "recipe.yaml megatron.model.transformer_impl; the image's TE 2.12.0"
            )
        )
    elif recipe.hw.vendor == "ascend":
        settings.append(
            PerformanceSetting(
                "fused attention, RMSNorm, rotary, SwiGLU",
                "not enabled by the bundle yet",
                "MindSpeed's --use-flash-attn, --use-fused-rmsnorm, --use-fused-rotary-pos-emb, --use-fused-swiglu "
                "are not in the room's document",
            )
        )
    return settings
