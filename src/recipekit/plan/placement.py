"""Where the pods go and what they ask for: CPU and memory per pod, MindCluster's SuperPoD block, the host paths
they mount. A request no node can satisfy never schedules (the PodGroup stays Pending with no useful message), so
it is refused here with the numbers.
"""

from __future__ import annotations

import math

from recipekit.base.errors import Problem
from recipekit.plan.layout import Layout
from recipekit.recipe.k8snames import host_volume_name
from recipekit.recipe.sections import HardwareSpec, Recipe

#: Share of a node's allocatable CPU and memory a pod asks for by default (its share of the node's devices): room
#: for the kubelet's reservations, DaemonSets and the page cache the dataloaders lean on.
POD_CPU_HEADROOM = 0.9
POD_MEMORY_HEADROOM = 0.85


def pod_resources(recipe: Recipe, layout: Layout) -> tuple[int, int, list[Problem]]:
    """CPU cores and GiB of host memory each pod asks for: given, or the pod's share of what a node offers.

    A request above the node's allocatable never schedules (the PodGroup stays Pending with no useful message), so
    it is refused here with the numbers.
    """
    hw, cl = recipe.hw, recipe.cluster
    share = layout.devices_per_pod / hw.devices_per_node
    cpus = cl.cpu_per_pod or max(1, math.floor(hw.node_cpus * share * POD_CPU_HEADROOM))
    memory = cl.memory_gib_per_pod or max(1, math.floor(hw.node_memory_gib * share * POD_MEMORY_HEADROOM))
    problems = []
    if cpus > hw.node_cpus:
        problems.append(
            Problem(
                "cluster.cpu_per_pod",
                f"{cpus} cores per pod, but a {hw.name} node offers {hw.node_cpus}",
                hint=f"at most {hw.node_cpus}, or set hw.node_cpus to your nodes' allocatable CPU",
            )
        )
    if memory > hw.node_memory_gib:
        problems.append(
            Problem(
                "cluster.memory_gib_per_pod",
                f"{memory} GiB per pod, but a {hw.name} node offers {hw.node_memory_gib} GiB",
                hint=f"at most {hw.node_memory_gib}, or set hw.node_memory_gib to your nodes' allocatable memory",
            )
        )
    return cpus, memory, problems


def superpod_block_size(hw: HardwareSpec, layout: Layout) -> tuple[int | None, list[Problem]]:
    """MindCluster's ``sp-block`` for SuperPoD hardware: the devices of one logical SuperPoD.

    It must be a multiple of the devices per pod and divide the job's devices; the whole job in one block when it
    fits in a physical SuperPoD, else the largest block that does.
    """
    if hw.superpod_devices is None:
        return None, []
    world, per_pod = layout.world_size, layout.devices_per_pod
    blocks = [b for b in range(per_pod, min(world, hw.superpod_devices) + 1, per_pod) if world % b == 0]
    if not blocks:
        return None, [
            Problem(
                "cluster.nodes",
                f"{world} devices cannot be split into SuperPoD blocks of at most {hw.superpod_devices} devices "
                f"that are multiples of {per_pod} per pod",
            )
        ]
    return blocks[-1], []


def host_volume_problems(hw: HardwareSpec) -> list[Problem]:
    """Two host paths whose volume names collide would make the Job invalid: refuse with both paths named."""
    seen: dict[str, str] = {}
    problems = []
    for path in hw.host_mounts:
        name = host_volume_name(path)
        if name in seen:
            problems.append(
                Problem("hw.host_mounts", f"{seen[name]} and {path} both become volume {name!r}", hint="rename one")
            )
        seen.setdefault(name, path)
    return problems
