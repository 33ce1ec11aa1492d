"""The Trainer engine's documents: the ``transformers.TrainingArguments`` that ``runtime/train.py`` passes (in
recipe.yaml's ``training_arguments``) and, under DeepSpeed, ds_config.json — both from the plan's numbers, so that
the batch values the Trainer and DeepSpeed each check cannot disagree.
"""

from __future__ import annotations

from typing import Any

from recipekit.bundle.engines.documents import EngineDocuments
from recipekit.bundle.files import DS_CONFIG, TRAIN_MODULE
from recipekit.plan.layout import Layout
from recipekit.plan.parallelism import STAGE3_PREFETCH_FACTOR
from recipekit.plan.plan import Plan, Precision
from recipekit.recipe.sections import Recipe


class TrainerBundle:
    """``engine=trainer``: ``runtime.train`` with the Trainer's arguments (and ds_config under DeepSpeed)."""

    kind = "trainer"

    def documents(self, recipe: Recipe, plan: Plan) -> EngineDocuments:
        """``runtime.train``'s arguments, its ds_config and DeepSpeed's accelerator variable."""
        deepspeed = plan.uses_deepspeed
        arguments = trainer_arguments(
            recipe, plan.output_dir, plan.layout, plan.precision, plan.total_steps, plan.warmup_steps, deepspeed
        )
        return EngineDocuments(
            module=TRAIN_MODULE,
            recipe_sections={"training_arguments": arguments},
            files={DS_CONFIG: deepspeed_config(recipe, plan.layout, plan.precision)} if deepspeed else {},
            env={"DS_ACCELERATOR": recipe.hw.ds_accelerator} if deepspeed else {},
        )

    def parallelism(self, recipe: Recipe, plan: Plan) -> str:
        """DDP, or DeepSpeed's ZeRO stage, with AutoTP's TP × DP when it tensor-parallelises."""
        if plan.zero_stage:
            phrase = f"DeepSpeed ZeRO-{plan.zero_stage}"
        else:
            phrase = "DeepSpeed ZeRO-0" if plan.uses_deepspeed else "DDP (no DeepSpeed)"
        layout = plan.layout
        if layout.tensor_parallel > 1:
            phrase += f" + AutoTP tensor parallelism: TP {layout.tensor_parallel} × DP {layout.dp_size}"
        return phrase


def deepspeed_config(recipe: Recipe, layout: Layout, precision: Precision) -> dict[str, Any]:
    """The ds_config: batch values equal to the Trainer's (DeepSpeed and the Trainer both check them).

    With tensor parallelism it carries DeepSpeed AutoTP (``tensor_parallel.autotp_size``) and no
    ``train_batch_size``: the Trainer's check and DeepSpeed's both count every rank of a TP group as if it saw its
    own batch (``world_size × micro × accumulation``), while the global batch is micro × accumulation × the
    data-parallel size; left out, DeepSpeed derives its figure and the Trainer has nothing to compare.
    ``stage3_gather_16bit_weights_on_model_save`` then asks Accelerate to gather the TP-sliced weights whole when
    the Trainer saves the model, so the output loads without DeepSpeed (despite its name it is read for TP too).
    """
    par, tr, hidden = recipe.parallel, recipe.train, recipe.model.hidden_size
    zero: dict[str, Any] = {
        "stage": par.zero_stage,
        "overlap_comm": par.overlap_comm,
        "contiguous_gradients": True,
        "reduce_bucket_size": par.reduce_bucket_size,
    }
    if par.zero_stage in (1, 2):
        zero.update(allgather_partitions=True, allgather_bucket_size=par.reduce_bucket_size, reduce_scatter=True)
    if par.zero_stage == 3:
        zero.update(
            stage3_prefetch_bucket_size=int(STAGE3_PREFETCH_FACTOR * hidden * hidden),
            stage3_param_persistence_threshold=10 * hidden,
            stage3_max_live_parameters=1_000_000_000,
            stage3_max_reuse_distance=1_000_000_000,
            sub_group_size=1_000_000_000,
            # Without this the saved model holds empty placeholders instead of weights.
            stage3_gather_16bit_weights_on_model_save=True,
        )
    for key, where in (("offload_optimizer", par.offload_optimizer), ("offload_param", par.offload_param)):
        if where == "cpu":
            zero[key] = {"device": "cpu", "pin_memory": True}
        elif where == "nvme":
            zero[key] = {"device": "nvme", "nvme_path": par.nvme_path, "pin_memory": True}

    tp = layout.tensor_parallel
    if tp > 1:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {} if tp > 1 else {"train_batch_size": layout.global_batch_size}
    config |= {
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.gradient_accumulation_steps,
        "gradient_clipping": tr.max_grad_norm,
        "zero_optimization": zero,
        "steps_per_print": 1_000_000,  # the Trainer logs; DeepSpeed's own step prints are noise
        "wall_clock_breakdown": False,
    }
    if tp > 1:
        config["tensor_parallel"] = {"autotp_size": tp}
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "loss_scale_window": 1000,
            "initial_scale_power": 16,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    if par.offload_optimizer != "none":
        # ZeRO-Offload runs DeepSpeed's CPU Adam; "auto" lets the Trainer fill the values from its arguments.
        config["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    return config


def trainer_arguments(
    recipe: Recipe,
    output_dir: str,
    layout: Layout,
    precision: Precision,
    total_steps: int | None,
    warmup: int | float,
    deepspeed: bool,
) -> dict[str, Any]:
    """``transformers.TrainingArguments`` keyword arguments, exactly as train.py passes them."""
    tr, par, hw, data = recipe.train, recipe.parallel, recipe.hw, recipe.data
    micro = layout.micro_batch_size
    args: dict[str, Any] = {
        "output_dir": output_dir,
        "run_name": recipe.name,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": layout.gradient_accumulation_steps,
        "learning_rate": tr.learning_rate,
        "lr_scheduler_type": tr.lr_scheduler,
        "warmup_steps": warmup,
        "weight_decay": tr.weight_decay,
        "max_grad_norm": tr.max_grad_norm,
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "optim": hw.optimizer,
        "logging_steps": tr.logging_steps,
        "logging_first_step": True,
        "save_strategy": "steps",
        "save_steps": tr.save_steps,
        "save_total_limit": tr.save_total_limit,
        "seed": tr.seed,
        "report_to": [r for r in tr.report_to if r != "none"] or "none",
        "dataloader_num_workers": tr.dataloader_workers,
        "activation_checkpointing": par.gradient_checkpointing,
        "ddp_backend": hw.comm_backend,
        "ddp_timeout": recipe.cluster.connect_timeout_s,
        "ddp_find_unused_parameters": False,
        "remove_unused_columns": False,
        "include_num_input_tokens_seen": True,
        # A NaN/inf loss is logged as it is; the runtime's loss guard stops the run on it (ops.nonfinite_loss).
        "logging_nan_inf_filter": False,
    }
    if tr.max_steps:
        args["max_steps"] = tr.max_steps
    elif data.streaming and total_steps:  # an iterable dataset has no length: the Trainer needs the step count
        args["max_steps"] = total_steps
    else:
        args["num_train_epochs"] = tr.epochs
    if data.streaming:
        # Every rank reads the stream and keeps its share (runtime/data/stream.py): no dispatch from rank 0, and no
        # DataLoader workers, which would each read the whole stream again (the reader keeps the chunk counts that
        # resumption needs in the training process).
        args["accelerator_config"] = {"dispatch_batches": False}
        args["dataloader_num_workers"] = 0
        args["ignore_data_skip"] = True  # the stream starts at the checkpoint's row itself
    if par.gradient_checkpointing:
        args["activation_checkpointing_kwargs"] = {"use_reentrant": False}
    if deepspeed:
        args["deepspeed"] = DS_CONFIG
    if data.eval_fraction > 0:
        args.update(eval_strategy="steps", eval_steps=tr.save_steps, per_device_eval_batch_size=micro)
    return args
