"""The Megatron engine's document: recipe.yaml's ``megatron`` section, the configuration the bundle's
``runtime/megatron`` room applies to Megatron-Bridge's own base recipe before calling Bridge's ``pretrain`` or
``finetune`` (its schema, with the reader both sides share: ``runtime/boundary/megatronview.py``).

Every number comes from the plan, as the Trainer's arguments do, and the optimizer is the one the Trainer runs for
the same recipe (Adam with decoupled weight decay, β = (0.9, 0.999), ε = 1e-8, the same clipping, warm-up and
decay), so that moving a recipe from one engine to the other changes how it is distributed, not what it trains.
"""

from __future__ import annotations

import math
from typing import Any

from recipekit.bundle.engines.documents import EngineDocuments
from recipekit.bundle.files import RUNTIME
from recipekit.plan.engines.megatron import FUSED_PROJECTIONS
from recipekit.plan.plan import Plan
from recipekit.recipe.sections import MegatronEngine, Recipe, adapter_of

#: The room's entry, started by torchrun in each process as the Trainer's ``runtime.train`` is.
MEGATRON_MODULE = f"{RUNTIME}.megatron.train"
#: Megatron-Bridge's mixed-precision recipes by the plan's precision (fp32: none).
MIXED_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp32": None}
#: The Trainer's schedule names → Megatron's decay styles (both warm up linearly from 0 first).
DECAY_STYLE = {"cosine": "cosine", "linear": "linear", "constant_with_warmup": "constant"}


class MegatronBundle:
    """``engine=megatron``: ``runtime.megatron.train`` with recipe.yaml's ``megatron`` document."""

    kind = "megatron"

    def documents(self, recipe: Recipe, plan: Plan) -> EngineDocuments:
        """The room's document; nothing else (no ds_config, no DeepSpeed variables)."""
        return EngineDocuments(module=MEGATRON_MODULE, recipe_sections={"megatron": megatron_document(recipe, plan)})

    def parallelism(self, recipe: Recipe, plan: Plan) -> str:
        """Megatron's dimensions, outermost last as its rank order nests them, and its optimizer sharding."""
        layout = plan.layout
        sizes = [f"TP {layout.tensor_parallel}", f"PP {layout.pipeline_parallel}", f"DP {layout.dp_size}"]
        if layout.context_parallel > 1:
            sizes.append(f"CP {layout.context_parallel}")
        if layout.expert_parallel > 1:
            sizes.append(f"EP {layout.expert_parallel}")
        extras = [f"{layout.virtual_stages} virtual stages"] * (layout.virtual_stages > 1)
        extras += ["sequence parallel"] * layout.sequence_parallel
        optimizer = "distributed optimizer" if recipe.parallel.distributed_optimizer else "DDP"
        return f"Megatron {' × '.join(sizes)}, " + ", ".join([*extras, optimizer])


def megatron_document(recipe: Recipe, plan: Plan) -> dict[str, Any]:
    """recipe.yaml's ``megatron`` section for ``recipe`` laid out as ``plan``."""
    engine, tr, layout = recipe.engine, recipe.train, plan.layout
    assert isinstance(engine, MegatronEngine), "the plan chose the Megatron engine for this recipe"
    assert plan.total_steps is not None, "the Megatron engine's plan has its step count (plan/engines/megatron.py)"
    distributed_optimizer = recipe.parallel.distributed_optimizer
    lora = adapter_of(recipe.mode)
    return {
        "recipekit": {
            "entry": "pretrain" if recipe.mode.kind == "pretrain" else "finetune",
            "output_dir": plan.output_dir,
            "export_hf": True,
        },
        "model": _model(recipe, plan),
        "train": {
            "micro_batch_size": layout.micro_batch_size,
            "global_batch_size": layout.global_batch_size,
            "train_iters": plan.total_steps,
            "eval_iters": 0,
            "exit_signal_handler": True,
        },
        "optimizer": {
            "optimizer": "adam",
            "lr": tr.learning_rate,
            "min_lr": 0.0,
            "weight_decay": tr.weight_decay,
            "adam_beta1": 0.9,
            "adam_beta2": 0.999,
            "adam_eps": 1e-8,
            "clip_grad": tr.max_grad_norm,
            "use_distributed_optimizer": distributed_optimizer,
        },
        "scheduler": {
            "lr_warmup_iters": _warmup_iters(plan),
            "lr_decay_iters": plan.total_steps,
            "lr_decay_style": DECAY_STYLE[tr.lr_scheduler],
        },
        "ddp": {
            "use_distributed_optimizer": distributed_optimizer,
            "overlap_grad_reduce": engine.overlap_grad_reduce,
            "overlap_param_gather": engine.overlap_param_gather and distributed_optimizer,
            "grad_reduce_in_fp32": True,
        },
        "checkpoint": {
            "save_interval": tr.save_steps,
            "most_recent_k": tr.save_total_limit,
            "ckpt_format": "torch_dist",
        },
        # MindSpeed maps the nccl backend onto HCCL on Ascend (its adaptor patches torch.distributed), so both
        # families name nccl here; the dry run's substitutions make it gloo.
        "dist": {
            "distributed_backend": "nccl",
            "distributed_timeout_minutes": math.ceil(recipe.cluster.connect_timeout_s / 60),
        },
        "rng": {"seed": tr.seed},
        "logger": {"log_interval": tr.logging_steps},
        "peft": None if lora is None else _lora(lora.target_modules, lora.r, lora.alpha, lora.dropout),
        "mixed_precision": MIXED_PRECISION[plan.precision],
    }


def _model(recipe: Recipe, plan: Plan) -> dict[str, Any]:
    """The layout's dimensions as Megatron-core names them, recomputation, and the MoE layer's dispatch."""
    layout, par, model = plan.layout, recipe.parallel, recipe.model
    selective = par.gradient_checkpointing and par.recompute_granularity == "selective"
    full = par.gradient_checkpointing and not selective
    values: dict[str, Any] = {
        "tensor_model_parallel_size": layout.tensor_parallel,
        "pipeline_model_parallel_size": layout.pipeline_parallel,
        "virtual_pipeline_model_parallel_size": layout.virtual_stages if layout.virtual_stages > 1 else None,
        "expert_model_parallel_size": layout.expert_parallel,
        "expert_tensor_parallel_size": layout.expert_tp if model.moe else None,
        "context_parallel_size": layout.context_parallel,
        "sequence_parallel": layout.sequence_parallel,
        "seq_length": recipe.data.max_len,
        "transformer_impl": "transformer_engine",
        "recompute_granularity": "selective" if selective else "full" if full else None,
        "recompute_method": "uniform" if full else None,
        "recompute_num_layers": 1 if full else None,
    }
    if layout.first_stage_layers:  # an edge stage of its own length: the other stages split the rest evenly
        values["num_layers_in_first_pipeline_stage"] = layout.first_stage_layers
    if layout.last_stage_layers:
        values["num_layers_in_last_pipeline_stage"] = layout.last_stage_layers
    if selective:
        values["recompute_modules"] = ["core_attn"]
    if model.moe:
        values |= {
            "moe_token_dispatcher_type": "alltoall" if layout.expert_parallel > 1 else "allgather",
            "moe_grouped_gemm": True,
            "moe_aux_loss_coeff": model.router_aux_loss_coef if model.router_aux_loss else 0.0,
        }
    return values


def _warmup_iters(plan: Plan) -> int:
    """The plan's warm-up in steps (a ratio while the step count was unknown, which this engine does not allow)."""
    warmup, total = plan.warmup_steps, plan.total_steps or 0
    return warmup if isinstance(warmup, int) else math.ceil(warmup * total)


def _lora(targets: Any, rank: int, alpha: int, dropout: float) -> dict[str, Any]:
    """Bridge's LoRA on Megatron's fused projections: each Hugging Face name becomes the projection that holds it
    (the plan refused a fused projection named in part)."""
    if targets == "all-linear":
        modules = list(FUSED_PROJECTIONS)
    else:
        fused_of = {name: fused for fused, names in FUSED_PROJECTIONS.items() for name in names}
        modules = [m for m in FUSED_PROJECTIONS if m in targets or any(fused_of.get(t) == m for t in targets)]
    return {"scheme": "lora", "target_modules": modules, "dim": rank, "alpha": alpha, "dropout": dropout}
