"""The Plan: every number and name the bundle uses, computed once from the Recipe. Pure: no I/O, no clock.

A value that appears in two bundle files (world size in the Job and in launch.json, batch sizes in ds_config.json and
in the Trainer arguments, the master port in launch.json and the Job's container port, the FLOPs per token in the
estimate and in the run's MFU) is computed here and rendered into both, so the files cannot drift apart. The layout
arithmetic is :mod:`recipekit.plan.layout`. The Plan holds numbers and names only: the documents built from them
(ds_config, Trainer arguments, launch data, the Volcano Job) are :mod:`recipekit.bundle.documents`, built once after
the estimate and the operations layer.

Every rule that needs more than one section is checked (:mod:`recipekit.plan.rules`, ``placement``, ``ops``,
``identity``), all of them before giving up, and each error shows its arithmetic:
``train.global_batch_size: 100 is not divisible by micro_batch_size (2) × data-parallel size (16) = 32``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from recipekit.base.errors import Collector, Problem
from recipekit.image.matrix import ImageFamily, ImageMatrix, compatibility_problems, recipe_problems
from recipekit.image.stack import image_reference
from recipekit.plan.adapters import target_problems
from recipekit.plan.datasize import DataSize, data_size
from recipekit.plan.datasize import steps_per_epoch as steps_per_epoch_of
from recipekit.plan.engines import engine_of
from recipekit.plan.identity import run_names
from recipekit.plan.layout import Layout, recipe_layout
from recipekit.plan.layoutrules import depth_problems, layout_rule_problems
from recipekit.plan.modelsize import count_params, lora_params, model_flops
from recipekit.plan.ops import operations_problems
from recipekit.plan.placement import host_volume_problems, pod_resources, superpod_block_size
from recipekit.plan.rescale import Elastic, elastic_of
from recipekit.plan.rules import (
    data_problems,
    layout_problems,
    mount_problems,
    pod_label_problems,
    streaming_problems,
    volume_problems,
)
from recipekit.recipe import mindcluster
from recipekit.recipe.k8snames import task_env_name
from recipekit.recipe.measured import modelflops
from recipekit.recipe.sections import HardwareSpec, Recipe
from recipekit.runtime.boundary import flopcount, recipeview

Precision = Literal["bf16", "fp16", "fp32", "fp8"]


# ------------------------------------------------------------------------------------------------------ precision
def resolve_precision(requested: str, hw: HardwareSpec) -> tuple[Precision, list[Problem]]:
    """``auto`` → bf16 where the hardware has it, else fp16 where it has that, else fp32; an explicit precision the
    hardware lacks is a problem. The one statement of these rules (validate applies it to a built bundle too)."""
    precision: Precision
    if requested == "auto":
        precision = "bf16" if hw.supports_bf16 else "fp16" if hw.supports_fp16 else "fp32"
    else:
        precision = requested  # type: ignore[assignment]
    problems = []
    if precision == "bf16" and not hw.supports_bf16:
        problems.append(
            Problem("train.precision", f"bf16 requested, but {hw.name} has no bf16", hint="use fp16 or auto")
        )
    if precision == "fp16" and not hw.supports_fp16:
        problems.append(
            Problem("train.precision", f"fp16 requested, but {hw.name} has no fp16", hint="use bf16, fp32 or auto")
        )
    if precision == "fp8" and not (hw.peak_tflops_fp8 and hw.supports_bf16):
        problems.append(
            Problem(
                "train.precision",
                f"fp8 requested, but {hw.name} has no FP8 (hw.peak_tflops_fp8 is unset)",
                hint="use bf16 or auto; FP8 needs Hopper-class hardware (hw=h100, h800, h200)",
            )
        )
    return precision, problems


# ---------------------------------------------------------------------------------------------------------- FLOPs
@dataclass(frozen=True)
class Flops:
    """What one training token costs and the peak it is measured against (definitions: runtime.boundary.flopcount)."""

    params_total: int  # what memory is counted from
    params_active: int  # what one token runs through (MoE: top-k experts): what the FLOPs are counted from
    params_trainable: int
    model_per_token: float  # MFU's numerator
    hardware_per_token: float  # HFU's: with the recomputation activation checkpointing adds
    peak_tflops: float  # per device, at the plan's precision
    attention_per_token: float = 0.0  # the dense S×S attention term of model_per_token (a causal count halves it)


def recipe_flops(recipe: Recipe, precision: Precision) -> Flops:
    """FLOPs per token at ``data.max_len`` tokens: the model option's counter-measured numbers (``model.flops``).

    Full training counts the forward and backward pass with every weight training; LoRA the frozen base's forward
    and activation gradients plus 6 × the adapters (their forward and both gradients, what the counter counts for a
    linear layer); HFU adds the decoder layers' forward (and the adapters') that activation checkpointing runs again.
    An MoE model's FLOPs are its top-k experts', its memory all of them. The runtime's MFU divides by these very
    numbers (recipe.yaml ``plan.flops``) and the report reads them from plan.json: one definition for all three."""
    model, mode, hw = recipe.model, recipe.mode, recipe.hw
    counts = count_params(model)
    full = not recipeview.trains_adapter(mode.kind)
    trainable = counts.total if full else lora_params(model, mode.lora)  # type: ignore[union-attr]
    measured, seq = model_flops(model), recipe.data.max_len
    if full:
        per_token, recomputed = measured.train_at(seq), measured.recompute_at(seq)
        attention = measured.train_per_position * seq
    else:
        adapters = modelflops.FORWARD_PER_PARAM + modelflops.INPUT_GRAD_PER_PARAM + modelflops.WEIGHT_GRAD_PER_PARAM
        per_token = measured.frozen_at(seq) + adapters * trainable
        recomputed = measured.recompute_at(seq) + modelflops.FORWARD_PER_PARAM * trainable
        attention = measured.frozen_per_position * seq
    if recipe.parallel.recompute_granularity == "selective":
        recomputed = measured.recompute_per_position * seq
    return Flops(
        params_total=counts.total,
        params_active=counts.active,
        params_trainable=trainable,
        model_per_token=float(per_token),
        hardware_per_token=float(per_token + (recomputed if recipe.parallel.gradient_checkpointing else 0)),
        peak_tflops=flopcount.peak_tflops(
            precision, bf16=hw.peak_tflops_bf16, fp16=hw.peak_tflops_fp16, fp8=hw.peak_tflops_fp8
        ),
        attention_per_token=float(attention),
    )


# ----------------------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Plan:
    """What the renderer needs, already decided. Field names are the words the bundle files use."""

    job_name: str
    run_id: str
    task_name: str
    task_env: str  # VC_<TASK_ENV>_HOSTS / VC_<TASK_ENV>_NUM
    layout: Layout
    engine: str  # the training engine that runs it (plan/engines)
    uses_deepspeed: bool  # whether that engine trains under DeepSpeed (its memory regime, variables and pins)
    precision: Precision
    comm_backend: str
    zero_stage: int
    steps_per_epoch: int | None
    total_steps: int | None
    warmup_steps: int | float
    master_port: int
    output_dir: str
    prepared_dir: str  # prepared data: <prepared_dir>/<fingerprint>, shared by runs with equal inputs
    data: DataSize
    pod_cpus: int
    pod_memory_gib: int
    superpod_block: int | None  # MindCluster's sp-block: devices of one logical SuperPoD
    flops: Flops
    image: str
    image_family: str
    family: ImageFamily
    elastic: Elastic | None = None  # cluster.min_nodes: the sizes the run continues on (plan/rescale.py)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The derived numbers, as written into recipe.yaml (train.py reads them) and shown by ``recipekit show``."""
        return {
            "job_name": self.job_name,
            "run_id": self.run_id,
            **self.layout.numbers(),
            "precision": self.precision,
            "comm_backend": self.comm_backend,
            "zero_stage": self.zero_stage,
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "master_port": self.master_port,
            "output_dir": self.output_dir,
            "prepared_dir": self.prepared_dir,
            "data": self.data.summary(),
            "flops": asdict(self.flops),
            "image": self.image,
            **({"elastic": self.elastic.summary()} if self.elastic else {}),
        }

    @property
    def master_host(self) -> str:
        """The first pod's DNS name, where every rank meets: Volcano's svc plugin names pod i of task T of job J
        ``J-T-i`` in the headless service ``J``."""
        return f"{self.job_name}-{self.task_name}-0.{self.job_name}"


@dataclass(frozen=True)
class Schedule:
    """How long the run trains: optimizer steps per epoch (known once the data's size is), in all, and of warm-up."""

    steps_per_epoch: int | None
    total_steps: int | None
    warmup_steps: int | float  # a ratio while the step count is unknown
    warnings: tuple[str, ...]


def schedule(recipe: Recipe, layout: Layout, size: DataSize) -> Schedule:
    """The step counts of ``recipe`` on ``layout`` over ``size`` rows (``train.max_steps`` wins over epochs)."""
    tr = recipe.train
    steps_per_epoch = steps_per_epoch_of(size.rows, layout) if size.rows else None
    total_steps = tr.max_steps or (math.ceil(steps_per_epoch * tr.epochs) if steps_per_epoch else None)
    warmup: int | float = math.ceil(tr.warmup_ratio * total_steps) if total_steps else tr.warmup_ratio
    warnings = []
    if total_steps and tr.save_steps > total_steps:
        warnings.append(
            f"train.save_steps ({tr.save_steps}) > total steps ({total_steps}): no checkpoint before the end"
        )
    return Schedule(steps_per_epoch, total_steps, warmup, tuple(warnings))


def image_family_of(recipe: Recipe, images: ImageMatrix) -> tuple[ImageFamily | None, list[Problem]]:
    """The recipe's image family from the matrix, with what it cannot run (torch_npu's table, the recipe's needs)."""
    hw = recipe.hw
    family = images.families.get(hw.image_family)
    if family is None:
        hint = "families: " + ", ".join(images.families)
        return None, [Problem("hw.image_family", f"unknown image family {hw.image_family!r}", hint=hint)]
    problems = compatibility_problems(hw.image_family, family, images.torch_npu_table)
    return family, problems + recipe_problems(hw.image_family, family, recipe)


def make_plan(
    recipe: Recipe,
    images: ImageMatrix,
    *,
    analysis_only: bool = False,
    tp_across_pods: bool = False,
) -> Plan:
    """Derive every number and name of the bundle from ``recipe``; raise one RecipeError with all problems.

    ``analysis_only`` accepts tensor/pipeline parallel layouts the bundle's backend cannot run, for ``recipekit
    plan`` (:mod:`recipekit.plan.parallelism` says which it can). ``tp_across_pods`` lets a TP group span pods: only for
    the dry run, whose pods are processes of one machine. The bundle's documents are not built here
    (:func:`recipekit.bundle.documents.make_documents` builds them once, after the estimate and the operations
    layer), so each candidate ``plan --advise`` tries costs its checks and numbers only.
    """
    errors, hw, cl = Collector(), recipe.hw, recipe.cluster
    engine = engine_of(recipe)
    layout = _checked_layout(recipe, errors, analysis_only=analysis_only, tp_across_pods=tp_across_pods)
    errors.extend(target_problems(recipe))
    errors.extend(mount_problems(recipe) + volume_problems(recipe) + mindcluster.problems(recipe))
    errors.extend(pod_label_problems(recipe))
    precision, problems = resolve_precision(recipe.train.precision, hw)
    errors.extend(problems + data_problems(recipe))
    size = data_size(recipe.data)
    steps = schedule(recipe, layout, size)
    errors.extend(streaming_problems(recipe, layout, steps.total_steps))
    if engine.needs_step_count and steps.total_steps is None:
        errors.add(
            "train.max_steps",
            f"the {engine.kind} engine trains for a number of steps fixed at build, and the data's size is unknown",
            hint="set train.max_steps, or data.num_samples (estimate) or data.num_rows (exact)",
        )
    problems, notes = operations_problems(recipe, layout, steps.total_steps)
    errors.extend(problems)
    names, problems = run_names(recipe, layout, precision)
    errors.extend(problems)
    pod_cpus, pod_memory_gib, problems = pod_resources(recipe, layout)
    errors.extend(problems)
    superpod_block, problems = superpod_block_size(hw, layout)
    errors.extend(problems + host_volume_problems(hw))
    elastic, problems = elastic_of(recipe, layout, engine.resize_refusal)
    errors.extend(problems)
    family, problems = image_family_of(recipe, images)
    errors.extend(problems)
    errors.raise_if_any()
    assert family is not None
    plan = Plan(
        job_name=names.job_name,
        run_id=names.run_id,
        task_name=cl.task_name,
        task_env=task_env_name(cl.task_name),
        layout=layout,
        engine=engine.kind,
        uses_deepspeed=engine.uses_deepspeed(recipe, layout),
        precision=precision,
        comm_backend=hw.comm_backend,
        zero_stage=recipe.parallel.zero_stage,
        steps_per_epoch=steps.steps_per_epoch,
        total_steps=steps.total_steps,
        warmup_steps=steps.warmup_steps,
        master_port=cl.master_port,
        output_dir=names.output_dir,
        prepared_dir=names.prepared_dir,
        data=size,
        pod_cpus=pod_cpus,
        pod_memory_gib=pod_memory_gib,
        superpod_block=superpod_block,
        flops=recipe_flops(recipe, precision),
        image="",
        image_family=hw.image_family,
        family=family,
        elastic=elastic,
        warnings=[*steps.warnings, *notes],
    )
    # the image of the plan's software stack, shared by every bundle of it (image/stack.py)
    return replace(plan, image=image_reference(recipe, hw.image_family, family, plan.uses_deepspeed))


def _checked_layout(recipe: Recipe, errors: Collector, *, analysis_only: bool, tp_across_pods: bool) -> Layout:
    """The recipe's layout, its problems (its own, the engine's and Megatron-core's rules) added to ``errors``."""
    layout, problems = recipe_layout(recipe)
    errors.extend(problems)
    errors.extend(layout_problems(recipe, layout))
    # a layout that does not even divide is not checked for what its model-parallel groups could run
    unchecked = analysis_only or bool(problems)
    errors.extend(engine_of(recipe).problems(recipe, layout, analysis_only=unchecked, tp_across_pods=tp_across_pods))
    errors.extend(
        layout_rule_problems(recipe, layout) if not problems else depth_problems(recipe.model, layout.pipeline_parallel)
    )
    return layout
