"""The ``cluster.placement`` section: where the scheduler may put the pods — tolerations of tainted node pools, node
affinity, one pod per node, and Volcano's network-topology-aware scheduling. All off by default: a recipe without
these keys gets a Job without these fields.

Network topology is behind ``network_topology.volcano``, the Volcano release the cluster runs: its Job CRD decides
which fields exist (read in volcano-sh/apis ``pkg/apis/batch/v1alpha1/job.go`` and volcano-sh/volcano
``config/crd/volcano/bases/batch.volcano.sh_jobs.yaml`` at each release tag). The releases and what each added are
data here (:data:`VOLCANO_RELEASES`, :data:`SINCE`), read by the Job's builder and by validate's CRD check alike.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from recipekit.recipe.domains import DNS_SUBDOMAIN, LABEL_KEY, LABEL_VALUE
from recipekit.recipe.schema import Section, spec

#: Volcano releases whose Job CRD recipekit knows (``network_topology.volcano``).
VolcanoRelease = Literal["1.12", "1.13", "1.14", "1.15"]
VOLCANO_RELEASES: tuple[str, ...] = get_args(VolcanoRelease)
#: The first release whose Job CRD has each field: ``spec.networkTopology`` (mode, highestTierAllowed) came in
#: v1.12.0; ``networkTopology.highestTierName`` and the task's ``partitionPolicy`` (whose ``networkTopology`` is the
#: task-level constraint) in v1.14.0 (volcano-sh/apis commit caa5259, "Provides group affinity partitioning").
SINCE = {"networkTopology": "1.12", "highestTierName": "1.14", "partitionPolicy": "1.14"}


def release_has(release: str, field: str) -> bool:
    """Whether Volcano ``release`` (one of :data:`VOLCANO_RELEASES`) defines ``field`` (a key of :data:`SINCE`)."""
    return VOLCANO_RELEASES.index(release) >= VOLCANO_RELEASES.index(SINCE[field])


class TolerationSpec(Section):
    """One toleration of a node taint (Kubernetes ``core/v1 Toleration``): Ascend and GPU pools are usually tainted,
    and a pod that tolerates none of the taints never schedules there."""

    key: str | None = spec(None, domain=LABEL_KEY, description="Taint key; unset: every key (operator Exists).")
    operator: Literal["Exists", "Equal"] = spec(
        "Equal", description="Equal: the taint's value must be `value`; Exists: any value (leave `value` unset)."
    )
    value: str | None = spec(None, domain=LABEL_VALUE, description="Taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = spec(
        None, description="Taint effect tolerated; unset: every effect."
    )
    toleration_seconds: int | None = spec(
        None,
        ge=0,
        le=2**31 - 1,
        description="With effect NoExecute: how long the pod stays bound after the taint appears; unset: forever.",
    )

    def rules(self) -> list[str | tuple[str, str]]:
        broken: list[str | tuple[str, str]] = []
        if self.key is None and self.operator != "Exists":
            broken.append(("operator", "must be Exists when key is unset (a toleration of every taint)"))
        if self.operator == "Exists" and self.value is not None:
            broken.append(("value", "must be unset with operator Exists (it matches any value)"))
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            broken.append(("toleration_seconds", "needs effect NoExecute (the only effect that evicts)"))
        return broken


class NodeRequirementSpec(Section):
    """One node label requirement (Kubernetes ``NodeSelectorRequirement``)."""

    key: str = spec(domain=LABEL_KEY, description="Node label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = spec(
        description="In/NotIn: the label's value is (not) one of `values`; Exists/DoesNotExist: the label is (not) "
        "there; Gt/Lt: the value, an integer, is greater/less than the one value."
    )
    values: list[Annotated[str, LABEL_VALUE]] = spec(
        default_factory=list, description="Values compared (none for Exists/DoesNotExist, one integer for Gt/Lt)."
    )

    def rules(self) -> list[str | tuple[str, str]]:
        count = len(self.values)
        if self.operator in ("In", "NotIn") and count == 0:
            return [("values", f"operator {self.operator} needs one or more values")]
        if self.operator in ("Exists", "DoesNotExist") and count:
            return [("values", f"operator {self.operator} takes no values (got {count})")]
        if self.operator in ("Gt", "Lt") and (count != 1 or not self.values[0].lstrip("-").isdigit()):
            return [("values", f"operator {self.operator} needs exactly one integer value (got {self.values})")]
        return []


class PreferredNodesSpec(Section):
    """Nodes the scheduler prefers (``preferredDuringSchedulingIgnoredDuringExecution``): a weight and requirements
    that must all hold."""

    weight: int = spec(ge=1, le=100, description="Weight of this preference, 1-100.")
    match: list[NodeRequirementSpec] = spec(description="Requirements a preferred node meets, all of them.")

    def rules(self) -> list[str | tuple[str, str]]:
        return [] if self.match else [("match", "needs one or more requirements")]


class NodeAffinitySpec(Section):
    """Node affinity of the pods, besides hw.node_selector: requirements every node must meet and preferences."""

    required: list[NodeRequirementSpec] = spec(
        default_factory=list, description="Requirements every node of the Job meets, all of them (one term)."
    )
    preferred: list[PreferredNodesSpec] = spec(default_factory=list, description="Weighted node preferences.")


class TierSpec(Section):
    """A network topology constraint (Volcano ``NetworkTopologySpec``): the highest HyperNode tier the pods may
    span, by number or (Volcano ≥ 1.14) by the tier's name."""

    mode: Literal["hard", "soft"] = spec(
        "hard", description="hard: never place across a higher tier (the job waits); soft: prefer not to."
    )
    highest_tier_allowed: int | None = spec(
        None, ge=1, le=2**31 - 1, description="Highest HyperNode tier the pods may span (1: the lowest, e.g. a leaf)."
    )
    highest_tier_name: str | None = spec(
        None,
        domain=DNS_SUBDOMAIN,
        description="The same by the tier's name in the cluster's HyperNode tiers (Volcano ≥ 1.14).",
    )

    def rules(self) -> list[str | tuple[str, str]]:
        if self.highest_tier_allowed is not None and self.highest_tier_name is not None:
            return ["highest_tier_allowed and highest_tier_name together: give one (Volcano refuses both)"]
        if self.highest_tier_allowed is None and self.highest_tier_name is None:
            return ["give highest_tier_allowed (a tier number) or highest_tier_name"]
        return []


class PartitionSpec(TierSpec):
    """A task-level constraint (Volcano ≥ 1.14 ``partitionPolicy``): the pods in partitions of ``pods`` pods each,
    task indices in order, each partition placed within one HyperNode of the allowed tier."""

    pods: int = spec(gt=0, le=4096, description="Pods in one partition; it divides cluster.nodes.")


class NetworkTopologySpec(Section):
    """Volcano's network-topology-aware scheduling (HyperNode tiers), at Job level, task level (partitions), or both;
    ``volcano`` names the release the cluster runs, and the Job holds only what that release's CRD defines."""

    volcano: VolcanoRelease = spec(
        description="The Volcano release of the cluster (at least 1.12, where networkTopology came in)."
    )
    job: TierSpec | None = spec(None, description="The whole Job within one HyperNode of this tier.")
    partition: PartitionSpec | None = spec(None, description="Each partition of the pods within one HyperNode.")

    def rules(self) -> list[str | tuple[str, str]]:
        broken: list[str | tuple[str, str]] = []
        if self.job is None and self.partition is None:
            broken.append("give job, partition or both: the constraint to place the pods under")
        for where, tier in (("job", self.job), ("partition", self.partition)):
            if (
                tier is not None
                and tier.highest_tier_name is not None
                and not release_has(self.volcano, "highestTierName")
            ):
                broken.append(
                    (where, f"highest_tier_name needs Volcano ≥ {SINCE['highestTierName']} (volcano: {self.volcano})")
                )
        if self.partition is not None and not release_has(self.volcano, "partitionPolicy"):
            broken.append(
                (
                    "partition",
                    f"task-level network topology needs Volcano ≥ {SINCE['partitionPolicy']} (volcano: {self.volcano})",
                )
            )
        return broken


class PlacementSpec(Section):
    """Where the scheduler may put the pods. Every key is off by default and then leaves the Job as it was."""

    tolerations: list[TolerationSpec] = spec(default_factory=list, description="Node taints the pods tolerate.")
    node_affinity: NodeAffinitySpec = spec(
        default_factory=NodeAffinitySpec, description="Node requirements and preferences besides hw.node_selector."
    )
    one_pod_per_node: Literal["off", "required", "preferred"] = spec(
        "off",
        description="Pod anti-affinity among the Job's pods by node (kubernetes.io/hostname): required never puts "
        "two on one node (MindCluster's vcjob examples do; useful when a pod asks for less than a node); preferred "
        "only spreads them.",
    )
    network_topology: NetworkTopologySpec | None = spec(
        None, description="Volcano network-topology-aware scheduling (HyperNode tiers); unset: none."
    )
