"""Megatron-Bridge over Megatron-core: tensor × pipeline × data parallelism with expert and context parallelism,
sequence parallelism and virtual pipeline stages; pretraining, full SFT and LoRA through Bridge's own PEFT. What it
cannot run is refused here, each with the reason.

The layout rules every layout obeys, whoever builds it (heads per TP rank, layers per stage and virtual stage,
experts per EP rank, SP needing TP, CP's sequence chunks), are Megatron-core's and live in
:mod:`recipekit.plan.layoutrules`; the plan applies them to every recipe. This engine adds what is its own:

* the optimizer is Adam with Megatron's DDP, or its distributed optimizer (``parallel.distributed_optimizer``),
  which shards the fp32 master weights and Adam's moments over the data-parallel ranks; DeepSpeed's ZeRO stages and
  offload are DeepSpeed's, not Megatron's;
* adapters are Bridge's LoRA on Megatron's fused projections; 4-bit QLoRA bases it does not load;
* DualPipe is DeepSeek's own schedule, not Megatron-core's (a first or last stage of its own length is
  Megatron-core's ``num_layers_in_first_pipeline_stage`` / ``..._last_...``, which the document carries);
* Bridge trains for a number of iterations, so the run's step count must be known at build;
* a TP group stays inside a pod (its all-reduces run every layer).
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
    megatron_kernels = True
    needs_step_count = True
    resize_refusal: str | None = (
        "the megatron engine resumes its distributed checkpoints at the layout they were saved with: recipekit "
        "does not continue its runs at another world size"
    )

    def problems(self, recipe: Recipe, layout: Layout, *, analysis_only: bool, tp_across_pods: bool) -> list[Problem]:
        """Optimizer sharding, modes and adapter targets always; what the room does not compile for yet, and a TP
        group across pods, for a bundle (``plan`` still analyses them)."""
        problems = _optimizer_problems(recipe) + _mode_problems(recipe)
        if not analysis_only:
            problems += _schedule_problems(recipe) + _layout_problems(recipe, layout, tp_across_pods)
        return problems

    def uses_deepspeed(self, recipe: Recipe, layout: Layout) -> bool:
        return False

    def runs(self, recipe: Recipe, layout: Layout) -> str:
        sizes = [f"TP {layout.tensor_parallel}", f"CP {layout.context_parallel}", f"PP {layout.pipeline_parallel}"]
        sizes.append(f"DP {layout.dp_size}")
        schedule = layout.schedule.replace("_", " ") + (
            f", {layout.virtual_stages} virtual stages" if layout.virtual_stages > 1 else ""
        )
        experts = f"; EP {layout.expert_parallel} (all-to-all dispatch)" if layout.expert_parallel > 1 else ""
        return f"runs in the bundle on Megatron-core (Megatron-Bridge): {' × '.join(sizes)}, {schedule}{experts}"


def _optimizer_problems(recipe: Recipe) -> list[Problem]:
    par, problems = recipe.parallel, []
    if par.zero_stage:
        problems.append(
            Problem(
                "parallel.zero_stage",
                f"ZeRO-{par.zero_stage} is DeepSpeed's; Megatron shards the optimizer states over the data-parallel "
                "ranks with its distributed optimizer and splits weights and gradients by TP, PP and EP",
                hint="parallel=distopt (zero_stage 0, distributed_optimizer true), or engine=trainer for ZeRO",
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


def _schedule_problems(recipe: Recipe) -> list[Problem]:
    """What the room's document cannot say: DualPipe, an unknown step count, an eval split."""
    par, problems = recipe.parallel, []
    if par.pipeline_schedule == "dualpipe":
        problems.append(
            Problem(
                "parallel.pipeline_schedule",
                "DualPipe is DeepSeek's own schedule; Megatron-core runs 1F1B and interleaved 1F1B",
                hint="parallel.pipeline_schedule=auto (interleaved with virtual stages)",
            )
        )
    if recipe.data.eval_fraction > 0:
        problems.append(
            Problem(
                "data.eval_fraction",
                "the Megatron engine trains on the prepared rows and holds out no evaluation split yet",
                hint="data.eval_fraction=0",
            )
        )
    if recipe.data.streaming:
        problems.append(
            Problem(
                "data.streaming",
                "the Megatron engine reads the prepared shards (its samples are fixed per step before training)",
                hint="data.streaming=false",
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
    tp = layout.tensor_parallel
    if tp == 1 or layout.devices_per_pod % tp == 0 or tp_across_pods:
        return []
    return [
        Problem(
            "parallel.tensor_parallel",
            f"TP {tp} does not divide the {layout.devices_per_pod} devices of one pod: a TP group all-reduces in "
            f"every layer and must stay on the {recipe.hw.intra_node_link}",
        )
    ]
