"""The ``cluster`` section: where the Volcano Job runs (nodes, queue, namespace, volume, registry) and MindCluster's
fault rescheduling.
"""

from __future__ import annotations

from typing import Annotated, Literal

from recipekit.recipe.domains import (
    ABSOLUTE_PATH,
    ANNOTATION_KEY,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    IFNAMES,
    IMAGE_REGISTRY,
    INDEX_URL,
    LABEL_KEY,
    LABEL_VALUE,
    MOUNT_PATH,
    SHORT_NAME,
)
from recipekit.recipe.k8snames import reserved_pod_key
from recipekit.recipe.schema import Section, spec
from recipekit.recipe.sections.placement import PlacementSpec

#: Kubernetes' limit on an object's annotations, keys and values together (apimachinery ``ValidateAnnotations``).
MAX_ANNOTATION_BYTES = 256 * 1024
#: Room kept for the annotations recipekit and Volcano put on the same pods (a few hundred bytes in practice).
ANNOTATION_ROOM_BYTES = 4 * 1024


# ------------------------------------------------------------------------------------------------------- cluster
class MindClusterSpec(Section):
    """Huawei MindCluster's fault rescheduling on Ascend (its Volcano plugin, device plugin, NodeD, ClusterD): the
    vcjob labels that switch it on. Off by default: a cluster without MindCluster gets none of them. What each label
    does, with its source, is in docs/faults.md."""

    fault_scheduling: Literal["off", "grace", "force"] = spec(
        "off",
        description="Job-level fault rescheduling (vcjob label fault-scheduling): grace deletes the job's pods "
        "gracefully (SIGTERM: train.py saves a checkpoint within the pod's grace period) before rescheduling them "
        "away from the faulty NPU or node; force deletes them at once (resume from the last periodic checkpoint); "
        "off emits no label.",
    )
    fault_retry_times: int | None = spec(
        None,
        ge=0,
        le=100,
        description="vcjob label fault-retry-times: how often MindCluster reschedules the job after a service-plane "
        "(software) fault. It retries any non-zero exit, a configuration error too: unset (default) leaves those to "
        "the Job's exit-code policies.",
    )


class ClusterSpec(Section):
    """Where the Job runs: Volcano queue, namespace, nodes, image registry and shared volume."""

    name: str = spec(domain=SHORT_NAME, description="Short name (the option's file name).")
    description: str = spec("", description="One line shown by `recipekit list cluster`.")
    namespace: str = spec("default", domain=DNS_LABEL, description="Kubernetes namespace of the Job (DNS-1123 label).")
    queue: str = spec(
        "default", domain=DNS_SUBDOMAIN, description="Volcano queue (must exist and be open; DNS-1123 subdomain)."
    )
    nodes: int = spec(1, gt=0, le=4096, description="Pods, one per node.")
    min_nodes: int | None = spec(
        None,
        gt=0,
        le=4096,
        description="Elastic: the fewest pods the run continues on when nodes are lost for good, at the same "
        "global batch (torchrun's --nnodes MIN:MAX, the Job's minAvailable); it grows back to `nodes` when they "
        "return. Unset: the Job always runs on `nodes` (gang-scheduled, restarted whole).",
    )
    elastic_wait_s: int = spec(
        30,
        gt=0,
        le=3600,
        description="Elastic (with min_nodes): seconds the pods that are left wait, once min_nodes have joined a "
        "new round, for pods that may still come (torchrun's rendezvous last_call_timeout, 30 by default). Longer "
        "lets a replacement that starts within it rejoin at full size instead of the run shrinking and then growing "
        "again; shorter continues sooner.",
    )
    devices_per_pod: int | None = spec(
        None, gt=0, le=64, description="Devices each pod asks for (default: a whole node)."
    )
    image_registry: str = spec(
        domain=IMAGE_REGISTRY, description="Registry host[:port]/path the bundle's image is pushed to."
    )
    pvc_claim: str = spec(
        domain=DNS_SUBDOMAIN,
        description="PersistentVolumeClaim with models, data and checkpoints (DNS-1123 subdomain).",
    )
    mount_path: str = spec(
        "/mnt/shared",
        domain=MOUNT_PATH,
        description="Where the claim is mounted in each pod: absolute, clear of /workspace, /dev/shm and system dirs.",
    )
    output_dir: str = spec(
        domain=ABSOLUTE_PATH, description="Checkpoints and final model: an absolute path under mount_path."
    )
    priority_class: str | None = spec(
        None, domain=DNS_SUBDOMAIN, description="Kubernetes PriorityClass of the pods (DNS-1123 subdomain)."
    )
    service_account: str | None = spec(
        None,
        domain=DNS_SUBDOMAIN,
        description="ServiceAccount the pods run as (serviceAccountName; DNS-1123 subdomain, in the Job's namespace); "
        "unset: the namespace's default.",
    )
    image_pull_secrets: list[Annotated[str, DNS_SUBDOMAIN]] = spec(
        default_factory=list,
        description="Secrets in the Job's namespace the kubelet pulls the image with (the pods' imagePullSecrets; "
        "DNS-1123 subdomains): made by the cluster's admins, never part of the bundle.",
    )
    pod_labels: dict[Annotated[str, LABEL_KEY], Annotated[str, LABEL_VALUE]] = spec(
        default_factory=dict,
        description="Extra labels on every pod (team, cost centre; Kubernetes label keys and values), beside "
        "recipekit's, Volcano's and hw.pod_labels, which they may not change.",
    )
    pod_annotations: dict[Annotated[str, ANNOTATION_KEY], str] = spec(
        default_factory=dict,
        description="Extra annotations on every pod (Kubernetes annotation keys; at most 256 KiB in all), beside "
        "recipekit's and Volcano's, which they may not change.",
    )
    task_name: str = spec(
        "worker", domain=DNS_LABEL, description="Volcano task name (DNS-1123 label); pods read VC_<TASK>_HOSTS."
    )
    master_port: int = spec(29500, ge=1024, le=65535, description="Fixed rendezvous port on the first pod.")
    max_retry: int = spec(3, ge=1, le=1000, description="Job restarts Volcano allows before failing the Job.")
    mindcluster: MindClusterSpec = spec(
        default_factory=MindClusterSpec, description="MindCluster fault rescheduling on Ascend (off by default)."
    )
    placement: PlacementSpec = spec(
        default_factory=PlacementSpec,
        description="Tolerations, node affinity, one pod per node, Volcano network topology (all off by default).",
    )
    shm_gib: int = spec(64, gt=0, le=65_536, description="Size of the /dev/shm memory volume per pod.")
    cpu_per_pod: int | None = spec(
        None,
        gt=0,
        le=65_536,
        description="CPU cores requested per pod (default: the pod's share of hw.node_cpus, 90%).",
    )
    memory_gib_per_pod: int | None = spec(
        None,
        gt=0,
        le=1_048_576,
        description="Host memory requested per pod, GiB (default: the pod's share of hw.node_memory_gib, 85%).",
    )
    socket_ifname: str | None = spec(
        None, domain=IFNAMES, description="NIC(s) for HCCL/NCCL/gloo bootstrap: eth0, or a list eth0,eth1."
    )
    connect_timeout_s: int = spec(1800, ge=120, le=7200, description="Collective connect timeout, seconds.")
    pip_index_url: str = spec(
        "https://pypi.org/simple",
        domain=INDEX_URL,
        description="Package index the image's pip uses (a PyPI mirror; build arg).",
    )
    pip_extra_index_url: str | None = spec(
        None, domain=INDEX_URL, description="Extra package index for the image's pip (build arg)."
    )
    torch_index_url: str | None = spec(
        None,
        domain=INDEX_URL,
        description=(
            "Index torch comes from (Ascend, CPU): the PyTorch CPU index or a mirror of it, never a PyPI mirror "
            "(no +cpu build on x86_64, only the CUDA build on aarch64); None: the image family's."
        ),
    )
    base_image_registry: str | None = spec(
        None,
        domain=IMAGE_REGISTRY,
        description="Registry (and path) mirroring the base image's registry: FROM becomes <this>/<repository>:<tag>.",
    )

    def rules(self) -> list[str | tuple[str, str]]:
        problems: list[str | tuple[str, str]] = []
        topology = self.placement.network_topology
        partition = topology.partition if topology is not None else None
        if partition is not None and self.nodes % partition.pods:
            problems.append(
                (
                    "placement.network_topology.partition.pods",
                    f"{partition.pods} pods per partition do not divide the {self.nodes} nodes "
                    "(Volcano needs replicas = partitions × pods)",
                )
            )
        return problems + self._pod_identity_rules()

    def _pod_identity_rules(self) -> list[str | tuple[str, str]]:
        """No pull Secret twice; no label or annotation that recipekit or Volcano sets (theirs would win, silently);
        the annotations within Kubernetes' 256 KiB (``ValidateAnnotations``: the keys' and values' lengths)."""
        problems: list[str | tuple[str, str]] = []
        twice = sorted({name for name in self.image_pull_secrets if self.image_pull_secrets.count(name) > 1})
        if twice:
            problems.append(("image_pull_secrets", f"{', '.join(twice)} listed twice"))
        for field, kind, keys in (
            ("pod_labels", "label", self.pod_labels),
            ("pod_annotations", "annotation", self.pod_annotations),
        ):
            for key in keys:
                owner = reserved_pod_key(key, kind)
                if owner is not None:
                    problems.append((f"{field}.{key}", f"is a pod {kind} {owner} sets: choose another key"))
        size = sum(len(k.encode()) + len(v.encode()) for k, v in self.pod_annotations.items())
        if size > MAX_ANNOTATION_BYTES - ANNOTATION_ROOM_BYTES:
            problems.append(
                (
                    "pod_annotations",
                    f"{size} bytes of keys and values; Kubernetes allows {MAX_ANNOTATION_BYTES} per pod, of which "
                    f"{ANNOTATION_ROOM_BYTES} are left to recipekit's and Volcano's",
                )
            )
        return problems
