"""Volcano's network-topology fields by release: what each release's Job CRD adds to the core fields, and what its
admission webhook refuses in them.

Read at the release tags of volcano-sh/volcano (``config/crd/volcano/bases/batch.volcano.sh_jobs.yaml``,
``pkg/webhooks/admission/jobs/validate/admit_job.go``) and volcano-sh/apis (``pkg/apis/batch/v1alpha1/job.go``):

* v1.12, v1.13: ``spec.networkTopology`` with ``mode`` (hard | soft, default hard) and ``highestTierAllowed``
  (an integer, default 1); the webhook checks nothing more.
* v1.14: ``highestTierAllowed`` loses its default and gains ``minimum: 0``; ``highestTierName`` (at most 253
  characters, a DNS-1123 subdomain pattern); the task's ``partitionPolicy`` (``totalPartitions`` and
  ``partitionSize``, both required, ≥ 1; ``minPartitions`` ≥ 0; ``networkTopology``: the task-level constraint). The
  webhook refuses ``highestTierAllowed`` with ``highestTierName``, replicas ≠ totalPartitions × partitionSize, and a
  task ``minAvailable`` ≠ minPartitions × partitionSize.
* v1.15: as v1.14, but ``highestTierName`` keeps only its length limit.

A Job names its release in the annotation :data:`~recipekit.bundle.placement.VOLCANO_RELEASE_ANNOTATION`; one
without it is held to the core fields that every release accepts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from recipekit.bundle.placement import VOLCANO_RELEASE_ANNOTATION
from recipekit.recipe.sections.placement import VOLCANO_RELEASES, release_has
from recipekit.validate.shared.results import Finding

FILE = "volcano-job.yaml"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class Constrained:
    """A scalar field with the CRD's own limits: ``kind`` is a scalar type name of the schema walker (``int32``,
    ``integer``, ``string``); ``enum``, ``minimum``, ``max_length`` and ``pattern`` as the CRD states them."""

    kind: str
    enum: tuple[str, ...] = ()
    minimum: int | None = None
    max_length: int | None = None
    pattern: re.Pattern[str] | None = None

    def problem(self, value: Any) -> str | None:
        """What the CRD refuses in ``value`` (its type already checked), or None."""
        if self.enum and value not in self.enum:
            return f"{value!r} is not one of {', '.join(self.enum)}"
        if self.minimum is not None and value < self.minimum:
            return f"{value} is below the minimum {self.minimum}"
        if self.max_length is not None and len(value) > self.max_length:
            return f"is {len(value)} characters long (at most {self.max_length})"
        if self.pattern is not None and not self.pattern.match(value):
            return f"{value!r} does not match {self.pattern.pattern}"
        return None


def network_topology(release: str) -> dict[str, Any]:
    """The ``NetworkTopologySpec`` of ``release``'s CRD, in the schema walker's notation."""
    fields: dict[str, Any] = {"mode": Constrained("string", enum=("hard", "soft"))}
    if not release_has(release, "highestTierName"):
        fields["highestTierAllowed"] = Constrained("integer")
        return fields
    fields["highestTierAllowed"] = Constrained("integer", minimum=0)
    pattern = _DNS_SUBDOMAIN if release == "1.14" else None
    fields["highestTierName"] = Constrained("string", max_length=253, pattern=pattern)
    return fields


def release_fields(release: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields ``release`` adds to the Job's spec and to each task (none for a Job that names no release)."""
    if release is None or not release_has(release, "networkTopology"):
        return {}, {}
    job = {"networkTopology": network_topology(release)}
    if not release_has(release, "partitionPolicy"):
        return job, {}
    partition = {
        "totalPartitions!": Constrained("int32", minimum=1),
        "partitionSize!": Constrained("int32", minimum=1),
        "minPartitions": Constrained("int32", minimum=0),
        "networkTopology": network_topology(release),
    }
    return job, {"partitionPolicy": partition}


def job_release(job: Any) -> tuple[str | None, list[Finding]]:
    """The Volcano release ``job`` names in its annotation (None when it names none), or a finding for one recipekit
    does not know."""
    meta = job.get("metadata") if isinstance(job, dict) else None
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    release = annotations.get(VOLCANO_RELEASE_ANNOTATION) if isinstance(annotations, dict) else None
    if release is None:
        return None, []
    if release not in VOLCANO_RELEASES:
        where = f"metadata.annotations.{VOLCANO_RELEASE_ANNOTATION}"
        return None, [
            Finding(FILE, where, f"{release!r} is not a known Volcano release", "known: " + ", ".join(VOLCANO_RELEASES))
        ]
    return str(release), []


def webhook_findings(job: Any) -> list[Finding]:
    """What the v1.14+ webhook refuses in network topology and partitions (earlier releases check neither)."""
    spec = job.get("spec") if isinstance(job, dict) else None
    if not isinstance(spec, dict):
        return []
    out = _tier_findings(spec.get("networkTopology"), "spec.networkTopology")
    tasks = spec.get("tasks")
    for i, task in enumerate(tasks if isinstance(tasks, list) else []):
        policy = task.get("partitionPolicy") if isinstance(task, dict) else None
        if isinstance(policy, dict):
            out += _partition_findings(task, policy, f"spec.tasks[{i}]")
    return out


def _tier_findings(topology: Any, where: str) -> list[Finding]:
    if isinstance(topology, dict) and "highestTierAllowed" in topology and topology.get("highestTierName"):
        return [Finding(FILE, where, "must not specify 'highestTierAllowed' and 'highestTierName' simultaneously")]
    return []


def _partition_findings(task: dict[str, Any], policy: dict[str, Any], where: str) -> list[Finding]:
    total, size, replicas = (
        _count(policy, "totalPartitions"),
        _count(policy, "partitionSize"),
        _count(task, "replicas"),
    )
    minimum = task.get("minAvailable")
    out = _tier_findings(policy.get("networkTopology"), f"{where}.partitionPolicy.networkTopology")
    if total <= 0 or size <= 0 or replicas < 0:
        return out  # the CRD's types and minimums are the schema check's
    if replicas != total * size:
        message = f"replicas {replicas} ≠ totalPartitions {total} × partitionSize {size}"
        out.append(Finding(FILE, f"{where}.partitionPolicy", message))
    elif isinstance(minimum, int) and minimum != policy.get("minPartitions", 0) * size:
        message = f"minAvailable {minimum} ≠ minPartitions {policy.get('minPartitions', 0)} × partitionSize {size}"
        out.append(Finding(FILE, f"{where}.minAvailable", message))
    return out


def _count(record: dict[str, Any], key: str) -> int:
    """``record[key]`` as a count (-1 when it is missing or not an integer: the schema check reports that)."""
    value = record.get(key, 0 if key == "replicas" else None)
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
