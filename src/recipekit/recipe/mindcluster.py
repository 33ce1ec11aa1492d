"""MindCluster fault rescheduling on Ascend: the vcjob labels that ask for it, from ``cluster.mindcluster``.

MindCluster's Volcano plugin (``ascend-for-volcano``) reads these labels from the Job's PodGroup, which Volcano's job
controller creates with the Job's own labels. Read in Ascend/mind-cluster (late 2026):
``component/ascend-for-volcano/internal/rescheduling/type.go`` (``fault-scheduling``: grace | force | off;
``fault-retry-times``; ``grace-over-time`` of the scheduler's configuration, default 900 s, 2–3600) and the
scheduling user guide's PodGroup label table (MindCluster 7.3.0, ``dlug_api_024``). Nothing here is emitted while
``fault_scheduling`` is ``off`` and ``fault_retry_times`` unset, so a cluster without MindCluster sees no change.
"""

from __future__ import annotations

from recipekit.base.errors import Problem
from recipekit.recipe.sections import Recipe

#: The PodGroup (= the vcjob's) label that switches job-level fault rescheduling on.
FAULT_SCHEDULING_LABEL = "fault-scheduling"
#: The label with how many times a service-plane (software) fault reschedules the job (0–100).
FAULT_RETRY_LABEL = "fault-retry-times"


def job_labels(recipe: Recipe) -> dict[str, str]:
    """The vcjob labels ``cluster.mindcluster`` asks for (none when it is off)."""
    mc = recipe.cluster.mindcluster
    labels: dict[str, str] = {}
    if mc.fault_scheduling != "off":
        labels[FAULT_SCHEDULING_LABEL] = mc.fault_scheduling
    if mc.fault_retry_times is not None:
        labels[FAULT_RETRY_LABEL] = str(mc.fault_retry_times)
    return labels


def problems(recipe: Recipe) -> list[Problem]:
    """MindCluster runs on Ascend clusters only: its labels on a GPU Job would be read by nobody."""
    mc = recipe.cluster.mindcluster
    if recipe.hw.vendor != "ascend" and (mc.fault_scheduling != "off" or mc.fault_retry_times is not None):
        return [
            Problem(
                "cluster.mindcluster",
                f"MindCluster fault rescheduling is for Ascend clusters; hw {recipe.hw.name} is {recipe.hw.vendor}",
                hint="leave cluster.mindcluster at its defaults (off) on other hardware",
            )
        ]
    return []
