"""Sentences about a bundle made from its resolved recipe and plan, never from a preset's free text.

A preset's ``description`` says what the preset chose ("ZeRO-3 with gradient checkpointing"); an override can make
it false (``parallel=zero2``). What the bundle's README and validate's verdict say is derived here instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipekit.bundle.engines import bundle_engine

if TYPE_CHECKING:
    from recipekit.plan.plan import Plan
    from recipekit.recipe.sections import Recipe

_MODES = {"sft": "Full SFT", "lora": "LoRA fine-tuning", "qlora": "QLoRA fine-tuning", "pretrain": "Pre-training"}


def _counted(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def parallelism(recipe: Recipe, plan: Plan) -> str:
    """How the run is split, in one phrase, as its engine says it (bundle/engines). The build's line, the bundle
    README and validate's verdict all say it this way."""
    return bundle_engine(plan).parallelism(recipe, plan)


def describe(recipe: Recipe, plan: Plan) -> str:
    """One sentence: what is trained, on what, how it is split, e.g. "Full SFT of qwen2.5_14b on 2 pods × 8
    ascend910b devices (world size 16), DeepSpeed ZeRO-2, gradient checkpointing, bf16."""
    layout, par = plan.layout, recipe.parallel
    parts = [
        f"{_MODES.get(recipe.mode.kind, recipe.mode.kind)} of {recipe.model.name} on {_counted(layout.nodes, 'pod')} "
        f"× {_counted(layout.devices_per_pod, recipe.hw.name + ' device')} (world size {layout.world_size})",
        parallelism(recipe, plan),
    ]
    if par.offload_optimizer != "none":
        parts.append(f"optimizer offloaded to {par.offload_optimizer}")
    if par.offload_param != "none":
        parts.append(f"parameters offloaded to {par.offload_param}")
    if par.gradient_checkpointing:
        parts.append("gradient checkpointing")
    parts.append(plan.precision)
    if plan.elastic is not None:  # cluster.min_nodes: faults.md "Continuing without a person"
        parts.append(f"elastic down to {_counted(plan.elastic.min_nodes, 'pod')} at the same global batch")
    return ", ".join(parts) + "."


def not_fit(total_gib: float, device_gib: float) -> str:
    """The line every view of an ``--allow-oom`` bundle shows: build's warning, the README's top, validate's verdict."""
    return (
        f"does not fit: {total_gib:.1f} GiB per device predicted, the device has {device_gib:g} GiB (built with "
        "--allow-oom); plan.md says what takes the memory and what would fit"
    )


def pod_requests(recipe: Recipe, plan: Plan) -> str:
    """What each pod asks the scheduler for besides its devices, and where the numbers come from: set in the
    recipe, or the pod's share of the node the hardware option assumes (hw.node_cpus, hw.node_memory_gib) less the
    headroom kept for the kubelet and DaemonSets. A node with less allocatable leaves the PodGroup Pending, so plan,
    build and the bundle README all say it this way."""
    from recipekit.plan.placement import POD_CPU_HEADROOM, POD_MEMORY_HEADROOM

    hw, cluster, layout = recipe.hw, recipe.cluster, plan.layout
    share = (
        "" if layout.devices_per_pod == hw.devices_per_node else f" × {layout.devices_per_pod}/{hw.devices_per_node}"
    )
    sources = []
    if cluster.cpu_per_pod:
        sources.append("CPU from cluster.cpu_per_pod")
    else:
        sources.append(f"CPU {POD_CPU_HEADROOM:.0%} of hw.node_cpus {hw.node_cpus}{share}")
    if cluster.memory_gib_per_pod:
        sources.append("memory from cluster.memory_gib_per_pod")
    else:
        sources.append(f"memory {POD_MEMORY_HEADROOM:.0%} of hw.node_memory_gib {hw.node_memory_gib}{share}")
    if not (cluster.cpu_per_pod and cluster.memory_gib_per_pod):
        sources.append(f"the {hw.name} option's node: set cluster.cpu_per_pod, cluster.memory_gib_per_pod for yours")
    return f"{plan.pod_cpus} CPU and {plan.pod_memory_gib} GiB of memory ({'; '.join(sources)})"
