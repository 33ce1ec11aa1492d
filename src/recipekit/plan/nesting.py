"""How a layout's process groups lie on the hardware: which stay inside a node (or a SuperPoD) and which cross the
network, and what bandwidth one device of each group gets.

Megatron-core numbers the ranks with TP innermost, then CP, DP and PP outermost (``parallel_state.py``,
``order="tp-cp-ep-dp-pp"``, EP left out of the dense groups), and draws the experts' groups from the same ranks as
expert-TP, EP, expert-DP, PP. Pods hold consecutive ranks (devices per pod each), so a group whose members lie within
one pod's ranks talks over the intra-node link; one that spans pods crosses the network, where the pod's NICs are
shared by the groups that have members in it. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipekit.plan.layout import Layout
from recipekit.recipe.sections import HardwareSpec


@dataclass(frozen=True)
class Group:
    """One kind of process group of a layout and where its members lie."""

    name: str  # TP, CP, DP, PP, EP, expert TP, expert DP
    size: int
    span: int  # consecutive ranks one group's members lie within
    inside: str  # "node", "SuperPoD" or "network"
    link: str
    gbps: float  # what one member sends in a ring collective, GB/s: the intra-node link, or its share of the network
    alltoall_gbps: float  # in an all-to-all, where every member of the pod sends across at once

    @property
    def crosses_nodes(self) -> bool:
        return self.inside != "node"


def _group(name: str, size: int, stride: int, layout: Layout, hw: HardwareSpec) -> Group:
    """A group of ``size`` members ``stride`` ranks apart."""
    span, per_pod = size * stride if size > 1 else 1, layout.devices_per_pod
    if span <= per_pod and per_pod % span == 0:
        return Group(name, size, span, "node", hw.intra_node_link, hw.intra_node_gbps, hw.intra_node_gbps)
    # A ring crosses each pod's network once per pass: the pod's NICs carry one member's share of the ring for each
    # group with members in the pod. An all-to-all sends from every device at once: each gets its NIC's share.
    members_per_pod = max(1, min(size, per_pod // stride))
    ring = hw.inter_node_gbps * members_per_pod / per_pod
    superpod = hw.superpod_devices
    inside = "SuperPoD" if superpod and span <= superpod and superpod % span == 0 else "network"
    return Group(name, size, span, inside, hw.inter_node_link, ring, hw.inter_node_gbps / per_pod)


def groups(layout: Layout, hw: HardwareSpec) -> dict[str, Group]:
    """The layout's groups by name, innermost first (the dense ones, then the experts' where it has EP)."""
    tp, cp, dp, pp = layout.tensor_parallel, layout.context_parallel, layout.dp_size, layout.pipeline_parallel
    found = {
        "TP": _group("TP", tp, 1, layout, hw),
        "CP": _group("CP", cp, tp, layout, hw),
        "DP": _group("DP", dp, tp * cp, layout, hw),
        "PP": _group("PP", pp, tp * cp * dp, layout, hw),
    }
    if cp > 1:  # the gradients' group: CP's ranks hold the same weights (Megatron's data-parallel-with-CP group)
        found["DP×CP"] = _group("DP×CP", dp * cp, tp, layout, hw)
    if layout.expert_parallel > 1:
        etp, ep = layout.expert_tp, layout.expert_parallel
        found["EP"] = _group("EP", ep, etp, layout, hw)
        found["expert DP"] = _group("expert DP", layout.expert_dp_size, etp * ep, layout, hw)
    return found


def describe(found: dict[str, Group]) -> str:
    """One line: each group of more than one member, its size and where it lies."""
    where = {"node": "in a node", "SuperPoD": "in a SuperPoD", "network": "across nodes"}
    shown = [g for g in found.values() if g.size > 1 and g.name != "DP×CP"]
    return ", ".join(f"{g.name} {g.size} {where[g.inside]}" for g in shown) or "one device"
