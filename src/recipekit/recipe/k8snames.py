"""Names Kubernetes and Volcano accept, made from recipe names: one spelling for the plan, its documents, the
templates and validate.
"""

from __future__ import annotations

import re

from recipekit.recipe.domains import DNS_LABEL

#: The length limit of a Kubernetes object name (an RFC 1123 label).
MAX_DNS_LABEL = 63

#: The Volcano task of an elastic Job (``cluster.min_nodes``) whose one pod hosts torchrun's c10d rendezvous store
#: (bundle/documents.py says why a pod of its own): ``<job>-rdzv-0``, torchrun's own abbreviation.
RENDEZVOUS_TASK = "rdzv"

#: The labels recipekit puts on the Job and its pods: the run's name (the PodMonitor selects by it) and the tool.
NAME_LABEL = "app.kubernetes.io/name"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
#: The annotation that keeps service meshes out of the pods (bundle/documents.py says why).
SIDECAR_ANNOTATION = "sidecar.istio.io/inject"
#: MindCluster's SuperPoD block annotation on the Job and its pods (hw.superpod_devices).
SUPERPOD_ANNOTATION = "sp-block"
#: Keys of recipekit's own labels and annotations beside the ones above.
RECIPEKIT_PREFIX = "recipekit.io/"
#: The label and annotation keys Volcano's job controller writes on every pod it creates, over whatever the template
#: says (volcano ``pkg/controllers/job/job_controller_util.go`` createJobPod; the keys are volcano-sh/apis
#: ``batch/v1alpha1/labels.go`` and ``scheduling/v1beta1`` KubeGroupNameAnnotationKey).
#: The label Volcano's job controller gives each pod: the name of its task (``worker``, an elastic Job's ``rdzv``).
TASK_SPEC_LABEL = "volcano.sh/task-spec"
VOLCANO_POD_LABELS = (
    "volcano.sh/task-index",
    "volcano.sh/job-name",
    TASK_SPEC_LABEL,
    "volcano.sh/job-namespace",
    "volcano.sh/queue-name",
    "volcano.sh/partition-id",
)
VOLCANO_POD_ANNOTATIONS = (
    "volcano.sh/task-index",
    "volcano.sh/task-spec",
    "scheduling.k8s.io/group-name",
    "volcano.sh/job-name",
    "volcano.sh/queue-name",
    "volcano.sh/job-version",
    "volcano.sh/template-uid",
    "volcano.sh/job-retry-count",
)


def reserved_pod_key(key: str, kind: str) -> str | None:
    """Who already sets the pod ``kind`` ("label" or "annotation") ``key`` (None: nobody, the recipe may)."""
    if key.startswith(RECIPEKIT_PREFIX) or key in (NAME_LABEL, MANAGED_BY_LABEL, SIDECAR_ANNOTATION):
        return "recipekit"
    if key == SUPERPOD_ANNOTATION:
        return "recipekit (hw.superpod_devices)"
    if key in (VOLCANO_POD_LABELS if kind == "label" else VOLCANO_POD_ANNOTATIONS):
        return "Volcano's job controller"
    return None


def is_dns_label(text: str) -> bool:
    """Whether Kubernetes accepts ``text`` as a DNS-1123 label (the schema's own domain, full match)."""
    return DNS_LABEL.problem(text) is None


def k8s_name(text: str, limit: int = MAX_DNS_LABEL) -> str:
    """Make ``text`` a DNS label: lower case, ``[a-z0-9-]``, at most ``limit`` characters, no dash at either end."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[:limit].strip("-")
    return name or "recipe"


def task_env_name(task: str) -> str:
    """Volcano's svc plugin names env vars after the task: upper case, ``-`` → ``_``."""
    return task.replace("-", "_").upper()


def host_volume_name(path: str) -> str:
    """The Job's volume name for a host path (a DNS label derived from the path)."""
    return k8s_name("host-" + path.strip("/").replace("/", "-").replace("_", "-").replace(".", "-"))
