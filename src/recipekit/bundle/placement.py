"""``cluster.placement`` spelled as the Volcano Job and its pod template spell it: tolerations, node affinity, pod
anti-affinity by node, ``spec.networkTopology`` and the task's ``partitionPolicy``.

Every function returns nothing for a recipe without the keys, so such a Job is byte-for-byte the Job it was. A Job
with network topology is annotated with the Volcano release it was written for (:data:`VOLCANO_RELEASE_ANNOTATION`):
validate checks it against that release's CRD, and a cluster admin sees what it needs.
"""

from __future__ import annotations

from typing import Any

from recipekit.recipe.sections import Recipe
from recipekit.recipe.sections.placement import (
    NodeAffinitySpec,
    NodeRequirementSpec,
    PlacementSpec,
    TierSpec,
    TolerationSpec,
)

#: Job annotation naming the Volcano release whose CRD the Job's network topology follows.
VOLCANO_RELEASE_ANNOTATION = "recipekit.io/volcano-release"
#: The node label pod anti-affinity spreads over: one node, one pod.
HOSTNAME_TOPOLOGY_KEY = "kubernetes.io/hostname"


def job_annotations(placement: PlacementSpec) -> dict[str, str]:
    """The Job's annotation naming its Volcano release (none without network topology)."""
    topology = placement.network_topology
    return {} if topology is None else {VOLCANO_RELEASE_ANNOTATION: topology.volcano}


def job_network_topology(placement: PlacementSpec) -> dict[str, Any]:
    """``spec.networkTopology`` of the Job (empty without a Job-level constraint)."""
    topology = placement.network_topology
    if topology is None or topology.job is None:
        return {}
    return {"networkTopology": _tier(topology.job)}


def task_partition_policy(placement: PlacementSpec, replicas: int) -> dict[str, Any]:
    """The task's ``partitionPolicy``: ``replicas`` pods in partitions of ``pods``, each under its own network
    topology constraint (empty without one). Volcano labels pod ``i`` with partition ``i // pods``."""
    topology = placement.network_topology
    if topology is None or topology.partition is None:
        return {}
    part = topology.partition
    return {
        "partitionPolicy": {
            "totalPartitions": replicas // part.pods,
            "partitionSize": part.pods,
            "networkTopology": _tier(part),
        }
    }


def _tier(tier: TierSpec) -> dict[str, Any]:
    spelled: dict[str, Any] = {"mode": tier.mode}
    if tier.highest_tier_allowed is not None:
        spelled["highestTierAllowed"] = tier.highest_tier_allowed
    if tier.highest_tier_name is not None:
        spelled["highestTierName"] = tier.highest_tier_name
    return spelled


def pod_placement(recipe: Recipe, pod_labels: dict[str, str]) -> dict[str, Any]:
    """The pod spec's ``tolerations`` and ``affinity`` (empty when the recipe asks for neither); the anti-affinity
    selects the Job's own pods by ``pod_labels``."""
    placement = recipe.cluster.placement
    fields: dict[str, Any] = {}
    if placement.tolerations:
        fields["tolerations"] = [_toleration(t) for t in placement.tolerations]
    affinity = {**_node_affinity(placement.node_affinity), **_anti_affinity(placement.one_pod_per_node, pod_labels)}
    if affinity:
        fields["affinity"] = affinity
    return fields


def _toleration(toleration: TolerationSpec) -> dict[str, Any]:
    spelled: dict[str, Any] = {"operator": toleration.operator}
    for key, value in (
        ("key", toleration.key),
        ("value", toleration.value),
        ("effect", toleration.effect),
        ("tolerationSeconds", toleration.toleration_seconds),
    ):
        if value is not None:
            spelled[key] = value
    return spelled


def _requirements(requirements: list[NodeRequirementSpec]) -> list[dict[str, Any]]:
    return [
        {"key": r.key, "operator": r.operator, **({"values": list(r.values)} if r.values else {})} for r in requirements
    ]


def _node_affinity(spec: NodeAffinitySpec) -> dict[str, Any]:
    affinity: dict[str, Any] = {}
    if spec.required:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": _requirements(spec.required)}]
        }
    if spec.preferred:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": p.weight, "preference": {"matchExpressions": _requirements(p.match)}} for p in spec.preferred
        ]
    return {"nodeAffinity": affinity} if affinity else {}


def _anti_affinity(one_pod_per_node: str, pod_labels: dict[str, str]) -> dict[str, Any]:
    if one_pod_per_node == "off":
        return {}
    term = {"labelSelector": {"matchLabels": dict(pod_labels)}, "topologyKey": HOSTNAME_TOPOLOGY_KEY}
    if one_pod_per_node == "required":
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
        }
    }
