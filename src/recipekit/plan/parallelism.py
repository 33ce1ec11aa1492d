"""Tensor and pipeline parallelism: which layouts the bundle's backend runs, and why the others are refused.

The bundle trains with the Transformers Trainer on DeepSpeed. Tensor parallelism comes from DeepSpeed's AutoTP,
asked for by the ds_config alone (``"tensor_parallel": {"autotp_size": N}``): at ``deepspeed.initialize`` it
replaces the Hugging Face model's linear layers by column- and row-parallel ones (the model's own TP plan), and
Accelerate's data loader gives every rank of a TP group the same batch. Measured with the pinned stack (deepspeed
0.19, transformers 5.24, accelerate 1.15): Llama and Qwen2 train with TP 2 and TP 2 × DP 2 at ZeRO 0, 1 and 2
(with and without optimizer offload), with the loss of the run without TP, and resume exactly. The refusals below
are what did not work, each with what failed.

Pipeline parallelism stays analysis only: the Trainer has no pipeline schedule for a Hugging Face model. So does
expert parallelism: Hugging Face's MoE blocks run every expert of the layer on each rank. An MoE model with TP is
refused: AutoTP has no split for transformers' fused 3-D expert parameters. Context and sequence parallelism,
virtual pipeline stages, Megatron's distributed optimizer, FP8 and selective recomputation are Megatron-core's
(:func:`recipekit.plan.layoutrules.megatron_features`): analysed, not built by this engine. The rules every layout
obeys whoever builds it (heads per TP rank, layers per stage, experts per EP rank) are
:mod:`recipekit.plan.layoutrules`'.

A leaf of the planning stage (the plan applies :func:`model_parallel_problems`; the estimate asks
:func:`buildable` to say whether the 3D layout it analyses is one the bundle runs). Pure.
"""

from __future__ import annotations

from recipekit.base.errors import Problem
from recipekit.plan.layout import Layout
from recipekit.recipe.sections import Recipe
from recipekit.runtime.boundary import recipeview

#: ZeRO stages AutoTP trains with through the Trainer. ZeRO-3 is not among them: transformers loads a ZeRO-3 model
#: under ``deepspeed.zero.Init`` and that path raises NotImplementedError for a ds_config with ``tensor_parallel``
#: (``transformers.integrations.deepspeed._apply_weight_conversions_to_state_dict``).
AUTOTP_ZERO_STAGES = (0, 1, 2)

PIPELINE_NEEDS = (
    "pipeline parallelism is analysis only: the bundle's Trainer/DeepSpeed backend has no pipeline schedule for a "
    "Hugging Face model (it would need the model rewritten as DeepSpeed's PipelineModule layer list, or "
    "Megatron-LM / torchtitan pipeline stages)"
)

#: ZeRO-3 prefetch bucket in elements per hidden² (Transformers' value for "auto"): ds_config and the memory
#: estimate use it.
STAGE3_PREFETCH_FACTOR = 0.9


EXPERTS_NEED = (
    "expert parallelism is analysis only: the bundle trains the Hugging Face model, whose MoE block computes every "
    "expert of the layer on each rank from its own (fused) weights; splitting the experts over ranks needs an "
    "all-to-all token dispatch the model does not have (DeepSpeed-MoE's deepspeed.moe.layer.MoE with expert groups, "
    "or Megatron-LM / torchtitan expert parallelism)"
)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _words(values: list[int]) -> str:
    return ", ".join(str(v) for v in values[:-1]) + (" or " if len(values) > 1 else "") + str(values[-1])


def model_parallel_problems(recipe: Recipe, layout: Layout, *, tp_across_pods: bool = False) -> list[Problem]:
    """Why the bundle cannot run ``layout``'s tensor/pipeline parallelism for ``recipe``; empty when it can.

    TP needs full training (not LoRA), ZeRO 0-2 and a TP that divides the devices of one pod (TP's all-reduces run
    every layer and must stay on the intra-node link; ``tp_across_pods`` lifts this for the dry run, whose pods are
    processes of one machine); whole heads per rank are every engine's rule (:mod:`recipekit.plan.layoutrules`).
    """
    problems = _unbuilt_problems(recipe, layout)
    tp = layout.tensor_parallel
    if tp == 1:
        return problems
    return problems + _tensor_parallel_problems(recipe, layout, tp_across_pods)


#: What this engine does not build of Megatron-core's layout: the key, the value that builds, and why not.
MEGATRON_ONLY = {
    "parallel.context_parallel": ("1", "context parallelism splits attention's sequence over ranks (ring attention)"),
    "parallel.sequence_parallel": ("false", "sequence parallelism needs Megatron's sequence-parallel layers"),
    "parallel.virtual_pipeline_stages": ("1", "virtual stages are a pipeline schedule's, and there is none"),
    "parallel.pipeline_schedule": ("auto", "DualPipe is DeepSeek's own engine's schedule"),
    "parallel.distributed_optimizer": ("false", "the distributed optimizer is Megatron-core's (ZeRO-1 is this one's)"),
    "train.precision": ("bf16", "FP8 matrix multiplies need Transformer Engine's layers"),
    "parallel.recompute_granularity": ("full", "the Trainer's gradient checkpointing recomputes whole layers"),
}


def _megatron_only(recipe: Recipe, layout: Layout) -> list[Problem]:
    """Megatron-core's dimensions and options other than PP and EP, which this engine does not run."""
    par = recipe.parallel
    used = {
        "parallel.context_parallel": f"CP {layout.context_parallel}" if layout.context_parallel > 1 else "",
        "parallel.sequence_parallel": "sequence parallelism" if layout.sequence_parallel else "",
        "parallel.virtual_pipeline_stages": f"{layout.virtual_stages} virtual stages" * (layout.virtual_stages > 1),
        "parallel.pipeline_schedule": "DualPipe" * (layout.schedule == "dualpipe"),
        "parallel.distributed_optimizer": "the distributed optimizer" if par.distributed_optimizer else "",
        "train.precision": "fp8" if recipe.train.precision == "fp8" else "",
        "parallel.recompute_granularity": "selective recomputation"
        if par.gradient_checkpointing and par.recompute_granularity == "selective"
        else "",
    }
    return [
        Problem(
            key,
            f"{what}: analysis only: {MEGATRON_ONLY[key][1]}",
            hint=f"{key}={MEGATRON_ONLY[key][0]} to build; `recipekit plan` still analyses it",
        )
        for key, what in used.items()
        if what
    ]


def _unbuilt_problems(recipe: Recipe, layout: Layout) -> list[Problem]:
    """Pipeline, expert parallelism and Megatron-core's other options: analysed by ``plan``, not built yet."""
    problems: list[Problem] = _megatron_only(recipe, layout)
    pp = layout.pipeline_parallel
    if pp > 1:
        problems.append(
            Problem(
                "parallel.pipeline_parallel",
                f"PP {pp}: {PIPELINE_NEEDS}",
                hint="set parallel.pipeline_parallel=1 to build; `recipekit plan` still analyses it",
            )
        )
    if recipe.parallel.expert_parallel > 1:
        problems.append(
            Problem(
                "parallel.expert_parallel",
                f"EP {recipe.parallel.expert_parallel}: {EXPERTS_NEED}",
                hint="set parallel.expert_parallel=1 to build; `recipekit plan` still analyses it",
            )
        )
    return problems


def _tensor_parallel_problems(recipe: Recipe, layout: Layout, tp_across_pods: bool) -> list[Problem]:
    """What AutoTP cannot run: MoE experts, LoRA adapters, ZeRO-3, a TP across pods."""
    problems: list[Problem] = []
    tp = layout.tensor_parallel
    par, model, hw = recipe.parallel, recipe.model, recipe.hw
    if model.moe:
        problems.append(
            Problem(
                "parallel.tensor_parallel",
                f"TP {tp} with the MoE model {model.name}: DeepSpeed AutoTP splits nn.Linear layers, and "
                "transformers keeps each MoE layer's experts as fused 3-D parameters it has no split for",
                hint="parallel.tensor_parallel=1 (ZeRO-3 partitions the experts over the data-parallel ranks)",
            )
        )
    if recipeview.trains_adapter(recipe.mode.kind):
        problems.append(
            Problem(
                "parallel.tensor_parallel",
                f"TP {tp} with mode {recipe.mode.kind}: DeepSpeed AutoTP replaces the linear layers PEFT has wrapped "
                "with its adapters, and DeepSpeed then fails mapping the parameters to ZeRO's groups (KeyError); "
                "there is no supported path for LoRA under AutoTP yet",
                hint=f"mode=sft with TP {tp}, or {recipe.mode.kind} with parallel.tensor_parallel=1",
            )
        )
    if par.zero_stage not in AUTOTP_ZERO_STAGES:
        problems.append(
            Problem(
                "parallel.zero_stage",
                f"ZeRO-{par.zero_stage} with TP {tp}: transformers loads a ZeRO-3 model under deepspeed.zero.Init, "
                "and that path refuses a ds_config with tensor_parallel (NotImplementedError)",
                hint=f"parallel=zero1 or zero2 (TP {tp} already divides weights, gradients and optimizer "
                f"states by {tp})",
            )
        )
    per_pod = layout.devices_per_pod
    if per_pod % tp and not tp_across_pods:
        fits = [d for d in _divisors(per_pod) if d > 1]
        problems.append(
            Problem(
                "parallel.tensor_parallel",
                f"TP {tp} does not divide the {per_pod} devices of one pod (a {hw.name} node has "
                f"{hw.devices_per_node}): a TP group all-reduces activations in every layer and must stay on the "
                f"intra-node link ({hw.intra_node_link}, {hw.intra_node_gbps:g} GB/s), not cross the "
                f"{hw.inter_node_link} ({hw.inter_node_gbps:g} GB/s)",
                hint=f"TP {_words(fits)}" if fits else "one device per pod leaves no room for TP: TP 1",
            )
        )
    return problems


def buildable(recipe: Recipe, layout: Layout) -> bool:
    """Whether the bundle runs ``layout``'s TP × PP for ``recipe`` (what ``plan`` marks as analysis only if not)."""
    return not model_parallel_problems(recipe, layout)
