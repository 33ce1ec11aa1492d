"""The bundle's documents, built once from the recipe, the plan's numbers and the operations layer: the engine's own
(the Trainer's arguments and ds_config: :mod:`recipekit.bundle.engines`), the runtime environment, the pip pins,
launch.json and the Volcano Job — plain dicts the renderer only serialises.

Every number comes from the plan (and the timeouts and ports from the operations layer, which follows the estimate);
what is decided here is only how each consumer spells it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from recipekit import __version__
from recipekit.bundle import placement, trackers
from recipekit.bundle.engines import EngineDocuments, bundle_engine
from recipekit.bundle.files import POD_COMMAND, RUN_FILES_MOUNT, WORKDIR
from recipekit.bundle.runfiles import pod_volume
from recipekit.image.matrix import ARCH_LABEL, pip_packages
from recipekit.memory.operations import Operations
from recipekit.plan.plan import Plan
from recipekit.recipe import mindcluster
from recipekit.recipe.k8snames import (
    MANAGED_BY_LABEL,
    NAME_LABEL,
    RENDEZVOUS_TASK,
    SIDECAR_ANNOTATION,
    SUPERPOD_ANNOTATION,
    TASK_SPEC_LABEL,
    host_volume_name,
    task_env_name,
)
from recipekit.recipe.schema import to_data
from recipekit.recipe.sections import Recipe
from recipekit.runtime.boundary import exitcodes, filenames
from recipekit.runtime.boundary.recipeview import (
    AlertsView,
    FaultsView,
    MetricsView,
    OperationsView,
    PreflightView,
    WatchdogView,
    read_section,
)
from recipekit.runtime.volume import trust

#: Seconds Kubernetes waits after SIGTERM before SIGKILL: time for train.py to write its last checkpoint.
TERMINATION_GRACE_S = 600
#: Seconds between torchrun's SIGKILL of its workers and the kubelet's SIGKILL of the pod.
SHUTDOWN_MARGIN_S = 60
#: How long the launcher waits for the first pod's DNS name (the svc plugin's records lag the pods by seconds).
MASTER_DNS_WAIT_S = 120
#: Pod annotation that keeps service meshes out: a sidecar would hold the rendezvous port's traffic and keep pods
#: alive after training ends.
NO_SIDECAR = {SIDECAR_ANNOTATION: "false"}
#: The rendezvous pod's resources: torch imported and one TCPStore serving a few keys per agent and round.
RENDEZVOUS_RESOURCES = {"cpu": "1", "memory": "2Gi"}
#: The prefix of every metrics port's name (a Kubernetes port name: at most 15 characters).
METRICS_PORT_NAME = "metrics"


@dataclass(frozen=True)
class Documents:
    """What the bundle's files carry besides the plan's numbers, each built once (:func:`make_documents`)."""

    env: dict[str, str]  # launch.json's environment: the runtime's, then the operations layer's collective timeouts
    pip_packages: list[str]
    engine: EngineDocuments  # what the engine's entrypoint reads (the Trainer's arguments, its ds_config)
    launch: dict[str, Any]
    job: dict[str, Any]
    #: recipe.yaml's ``operations`` section, in the very type the runtime reads it as (runtime/boundary/recipeview.py)
    operations: OperationsView


def make_documents(recipe: Recipe, plan: Plan, ops: Operations) -> Documents:
    """The documents of ``recipe`` laid out as ``plan`` with the operations layer's numbers (``ops``): its collective
    timeouts join the environment (a key the runtime or ``hw.env`` sets keeps its value), its metrics ports the
    Job's container, and its thresholds recipe.yaml's ``operations`` section."""
    engine = bundle_engine(plan).documents(recipe, plan)
    tracking = trackers.tracker_env(recipe, plan.output_dir, plan.run_id)
    env = dict(sorted({**ops.env, **engine.env, **tracking, **runtime_env(recipe)}.items()))
    return Documents(
        env=env,
        pip_packages=pip_packages(recipe, plan.family, plan.uses_deepspeed),
        engine=engine,
        launch=launch_spec(recipe, plan, env, engine.module),
        job=volcano_job(recipe, plan, ops.metrics_ports),
        operations=operations_view(recipe, plan, ops),
    )


def operations_view(recipe: Recipe, plan: Plan, ops: Operations) -> OperationsView:
    """recipe.yaml's ``operations``: what the runtime's preflight, watchdog, alerts, exporter and fault injection
    read, built as the runtime's own view types so that the two sides cannot disagree on a key."""
    spec = recipe.ops
    return OperationsView(
        preflight=PreflightView(
            enabled=spec.preflight_mode != "off",
            mode=spec.preflight_mode,
            timeout_s=spec.preflight_timeout_s,
            allreduce_sizes_mb=list(spec.allreduce_sizes_mb),
            allreduce_iterations=spec.allreduce_iterations,
            link=ops.link,
            link_gbps=ops.link_gbps,
            bandwidth_warn_gbps=round(ops.bandwidth_warn_gbps, 3),
            devices_per_pod=plan.layout.devices_per_pod,
            expected_versions=ops.expected_versions,
            checkpoint_bytes=ops.checkpoint_bytes,
            storage_needed_bytes=ops.storage_needed_bytes,
            collective_hint=ops.collective_hint,
            p2p_size_mb=spec.p2p_size_mb,
            p2p_iterations=spec.p2p_iterations,
            p2p_max_rounds=spec.p2p_max_rounds,
            p2p_slow_fraction=spec.p2p_slow_fraction,
            storage_probe_mb=spec.storage_probe_mb,
            checkpoint_save_limit_s=spec.checkpoint_save_limit_s,
            burn_in_s=spec.burn_in_s,
            burn_in_slow_fraction=spec.burn_in_slow_fraction,
            burn_in_tflops=round(ops.burn_in_tflops, 3),
        ),
        watchdog=WatchdogView(
            planned_step_time_s=round(ops.planned_step_time_s, 3),
            startup_timeout_s=ops.startup_timeout_s,
            stall_timeout_s=ops.stall_timeout_s,
            steady_timeout_s=ops.steady_timeout_s,
        ),
        metrics=MetricsView(ports=list(ops.metrics_ports), ranks=spec.metrics_ranks, bind=spec.metrics_bind),
        alerts=AlertsView(
            loss_spike_ratio=spec.loss_spike_ratio,
            grad_norm_jump_ratio=spec.grad_norm_jump_ratio,
            mfu_target=round(ops.mfu_target, 6),
            mfu_low_steps=spec.mfu_low_steps,
            checkpoint_save_limit_s=spec.checkpoint_save_limit_s,
            device_utilisation_min=spec.device_utilisation_min,
            nonfinite_loss=spec.nonfinite_loss,
        ),
        testing=read_section(FaultsView, to_data(spec.testing), "ops.testing"),
    )


def metrics_port_names(ports: tuple[int, ...]) -> list[str]:
    """The container port name of each metrics port, as the Job declares and the PodMonitor scrapes them."""
    return [f"{METRICS_PORT_NAME}-{i}" for i in range(len(ports))]


def runtime_env(recipe: Recipe) -> dict[str, str]:
    """Environment the launcher exports (each overridable from the pod spec): collective timeouts, NICs, tunings; the
    engine's own variables join them (bundle/engines)."""
    hw, cl = recipe.hw, recipe.cluster
    env: dict[str, str] = {}
    if hw.comm_backend == "hccl":
        env["HCCL_CONNECT_TIMEOUT"] = str(cl.connect_timeout_s)
        if cl.socket_ifname:
            env["HCCL_SOCKET_IFNAME"] = cl.socket_ifname
    elif hw.comm_backend == "nccl":
        if cl.socket_ifname:
            env["NCCL_SOCKET_IFNAME"] = cl.socket_ifname
    if cl.socket_ifname:
        env["GLOO_SOCKET_IFNAME"] = cl.socket_ifname
    if recipe.model.name_or_path.startswith("/"):
        env["HF_HUB_OFFLINE"] = "1"
    # After SIGTERM torchrun waits this long for train.py's last checkpoint before SIGKILL (default 30 s); it must
    # end before the kubelet's own grace period does.
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(TERMINATION_GRACE_S - SHUTDOWN_MARGIN_S)
    # The run key signs each checkpoint and the prepared data: only what this run wrote is resumed (docs/trust.md).
    env[trust.KEY_ENV] = f"{trust.KEY_MOUNT}/{trust.KEY_NAME}"
    env.update(hw.env)
    return dict(sorted(env.items()))


def launch_spec(recipe: Recipe, plan: Plan, env: dict[str, str], module: str) -> dict[str, Any]:
    """launch.json: everything the pod's launcher needs, as data (run.sh itself holds no recipe value), CANN's
    set_env.sh scripts the launcher sources among it (the image family's; none where the image has no CANN).

    The launcher (runtime/launch.py) checks Volcano's variables against these numbers, waits for the master's DNS
    name, exports ``env`` (each key overridable from the pod spec) and runs torchrun. Keeping this data out of shell
    text means no recipe value is ever parsed by a shell, and validate and the dry run read and write JSON.
    """
    return {
        "job_name": plan.job_name,
        "run_id": plan.run_id,
        "task_name": plan.task_name,
        "task_env": plan.task_env,
        "nodes": plan.layout.nodes,
        "nproc_per_node": plan.layout.devices_per_pod,
        "master_port": plan.master_port,
        "master_dns_wait_s": MASTER_DNS_WAIT_S,
        "device": recipe.hw.torch_device,
        "env": env,
        "module": module,
        "args": ["--resume", "auto"],
        "cann_env": list(plan.family.cann_env),
        # an elastic run's range and restart budget (plan/rescale.py); absent: torchrun's static rendezvous
        **(
            {
                "elastic": {
                    "min_nodes": plan.elastic.min_nodes,
                    "max_restarts": recipe.cluster.max_retry,
                    "last_call_s": recipe.cluster.elastic_wait_s,
                    # the task whose pod hosts the rendezvous store (_rendezvous_task)
                    "rendezvous": {"task_name": RENDEZVOUS_TASK, "task_env": task_env_name(RENDEZVOUS_TASK)},
                }
            }
            if plan.elastic
            else {}
        ),
    }


def job_labels(plan: Plan) -> dict[str, str]:
    """The labels of the Job and its pods that name the run (the PodMonitor selects by the name label)."""
    return {NAME_LABEL: plan.job_name, MANAGED_BY_LABEL: "recipekit"}


def volcano_job(recipe: Recipe, plan: Plan, metrics_ports: tuple[int, ...] = ()) -> dict[str, Any]:
    """The ``batch.volcano.sh/v1alpha1`` Job: gang-scheduled, env+svc plugins, restart on eviction or failure; the
    trainer container declares the rendezvous port and the metrics ports (``ops.metrics_port``)."""
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": _job_metadata(recipe, plan),
        "spec": _job_spec(recipe, plan, _pod_spec(recipe, plan, metrics_ports)),
    }


def run_key_command(namespace: str) -> str:
    """The one command that makes the run key in ``namespace``: what the README, ``validate`` and ``submit`` name.

    The bundle never holds the key (whoever has a bundle would hold it), so ``kubectl apply -k`` of a bundle does
    not create the Secret its pods mount; it is made once per namespace, and every run there shares it (prepared data
    is shared by runs of the same data and tokenizer, and verifies for all of them)."""
    return (
        f"kubectl -n {shlex.quote(namespace)} create secret generic {trust.SECRET_NAME} "
        '--from-literal=key="$(openssl rand -hex 32)"'
    )


#: The pod volume of the checkpoints' node-local hot tier (``train.hot_checkpoints``).
HOT_VOLUME = "hot-checkpoints"


def _pod_storage(recipe: Recipe, plan: Plan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the trainer's mounts of them: /dev/shm, the shared volume, the run key, the host paths
    the hardware needs, the NVMe scratch directory of an NVMe offload, the checkpoints' hot tier, and the run files
    (the bundle's ConfigMap)."""
    hw, cl, par = recipe.hw, recipe.cluster, recipe.parallel
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{cl.shm_gib}Gi"}},
        {"name": "shared", "persistentVolumeClaim": {"claimName": cl.pvc_claim}},
        # The run key (docs/trust.md): a pod without it does not start, rather than run unable to resume safely.
        {"name": "run-key", "secret": {"secretName": trust.SECRET_NAME, "defaultMode": 0o400}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "shared", "mountPath": cl.mount_path},
        {"name": "run-key", "mountPath": trust.KEY_MOUNT, "readOnly": True},
    ]
    for path, kind in hw.host_mounts.items():
        name = host_volume_name(path)
        volumes.append({"name": name, "hostPath": {"path": path, "type": kind}})
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
    if par.nvme_path and "nvme" in (par.offload_optimizer, par.offload_param):
        volumes.append({"name": "nvme", "hostPath": {"path": par.nvme_path, "type": "DirectoryOrCreate"}})
        mounts.append({"name": "nvme", "mountPath": par.nvme_path})
    hot = recipe.train.hot_checkpoints
    if hot.medium != "none":  # the checkpoints' node-local hot tier (runtime/volume/hottier.py)
        source: dict[str, Any] = {"hostPath": {"path": hot.host_path, "type": "DirectoryOrCreate"}}
        if hot.medium == "emptyDir":
            source = {"emptyDir": {"sizeLimit": f"{hot.size_gib}Gi"} if hot.size_gib else {}}
        volumes.append({"name": HOT_VOLUME, **source})
        mounts.append({"name": HOT_VOLUME, "mountPath": hot.mount_path})
    run_files, run_files_mount = pod_volume(plan.job_name)  # the bundle's ConfigMap, read-only (bundle/runfiles.py)
    return [*volumes, run_files], [*mounts, run_files_mount]


def _trainer_container(
    recipe: Recipe, plan: Plan, mounts: list[dict[str, Any]], metrics_ports: tuple[int, ...]
) -> dict[str, Any]:
    """The one container of every pod: run.sh from the mounted run files, its ports, its devices and memory."""
    hw = recipe.hw
    resources: dict[str, Any] = {"cpu": str(plan.pod_cpus), "memory": f"{plan.pod_memory_gib}Gi"}
    if hw.device_resource:
        resources[hw.device_resource] = str(plan.layout.devices_per_pod)
    container = {
        "name": "trainer",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(POD_COMMAND),  # the image's launcher: nothing of the ConfigMap runs unchecked
        "workingDir": WORKDIR,
        "ports": [
            {"name": "rendezvous", "containerPort": plan.master_port, "protocol": "TCP"},
            *(
                {"name": name, "containerPort": port, "protocol": "TCP"}
                for name, port in zip(metrics_port_names(metrics_ports), metrics_ports)
            ),
        ],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": mounts,
    }
    env = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{annotation}']"}}}
        for name, annotation in sorted(hw.device_env_from_annotation.items())
    ]
    env += trackers.secret_env(recipe)  # the trackers' credentials, from their Secret (never in the bundle)
    if env:
        container["env"] = env
    return container


def _pod_spec(recipe: Recipe, plan: Plan, metrics_ports: tuple[int, ...]) -> dict[str, Any]:
    """The pods' spec: no kubelet restarts, a grace period for the last checkpoint, the image's architecture."""
    hw, cl = recipe.hw, recipe.cluster
    volumes, mounts = _pod_storage(recipe, plan)
    pod_spec: dict[str, Any] = {
        # Volcano, not the kubelet, restarts: a lone restarted rank could never rejoin a static rendezvous.
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "containers": [_trainer_container(recipe, plan, mounts, metrics_ports)],
        "volumes": volumes,
    }
    # The image is built for one CPU architecture: a pod on a node of another fails with "exec format error".
    pod_spec["nodeSelector"] = {**hw.node_selector, ARCH_LABEL: hw.arch, **hw.arch_node_selector.get(hw.arch, {})}
    # cluster.placement: tolerations, node affinity, one pod per node (nothing when unset)
    # one trainer per node avoids the other trainers, not an elastic Job's rendezvous pod: the task's own pods
    pod_spec.update(placement.pod_placement(recipe, {**job_labels(plan), TASK_SPEC_LABEL: plan.task_name}))
    if cl.priority_class:
        pod_spec["priorityClassName"] = cl.priority_class
    # who the pods are: the service account they run as and the Secrets their image is pulled with (none by default)
    if cl.service_account:
        pod_spec["serviceAccountName"] = cl.service_account
    if cl.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in cl.image_pull_secrets]
    return pod_spec


def _job_spec(recipe: Recipe, plan: Plan, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The Job's spec: Volcano's scheduler, the gang, the plugins the launcher reads, the lifecycle policies."""
    hw, cl = recipe.hw, recipe.cluster
    annotations = {**cl.pod_annotations, **NO_SIDECAR}  # a recipe may not set recipekit's keys (ClusterSpec)
    if plan.superpod_block is not None:
        annotations[SUPERPOD_ANNOTATION] = str(plan.superpod_block)
    # an elastic Job's gang: its fewest workers and the rendezvous pod they meet at
    spec: dict[str, Any] = {
        "schedulerName": "volcano",
        "minAvailable": plan.elastic.min_nodes + 1 if plan.elastic else plan.layout.nodes,
        **({"minSuccess": plan.elastic.min_nodes} if plan.elastic else {}),
        "queue": cl.queue,
        "maxRetry": cl.max_retry,
        # Ranks resolve each other before any pod is Ready (none is until training runs).
        "plugins": {"env": [], "svc": ["--publish-not-ready-addresses"]},
        "policies": _policies(recipe, plan),
        "tasks": [
            {
                "name": plan.task_name,
                "replicas": plan.layout.nodes,
                "template": {
                    "metadata": {
                        "labels": {**job_labels(plan), **hw.pod_labels, **cl.pod_labels},
                        "annotations": annotations,
                    },
                    "spec": pod_spec,
                },
                **({"minAvailable": plan.elastic.min_nodes} if plan.elastic else {}),
                **placement.task_partition_policy(cl.placement, plan.layout.nodes),
            },
            *([_rendezvous_task(plan, pod_spec)] if plan.elastic else []),
        ],
        **placement.job_network_topology(cl.placement),
    }
    if cl.priority_class:
        spec["priorityClassName"] = cl.priority_class
    return spec


def _rendezvous_task(plan: Plan, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """An elastic Job's second task: one pod that hosts torchrun's c10d rendezvous store (the image's launcher with
    ``--serve-rendezvous``, runtime/rendezvous.py), where every worker pod's agent meets.

    Why a pod of its own: torchrun's default host of the store is the first worker pod's agent, so losing that pod
    loses the store, every other agent fails, and the Job restarts (RestartJob) where it should have gone on without
    it; a Volcano ``master`` task plays this part in the pytorch plugin, and this is Volcano's ``minSuccess`` case
    of a service task that runs until the workers succeed. It asks for no device (so it schedules wherever the image
    runs, not only on a node with a free card), carries none of the recipe's pod labels and annotations (they are the
    trainers'), mounts the run files and nothing of the shared volume or the run key, and is reclaimed by Volcano
    when the Job completes."""
    trainer = pod_spec["containers"][0]
    mounts = [m for m in trainer["volumeMounts"] if m["mountPath"] == RUN_FILES_MOUNT]
    names = {m["name"] for m in mounts}
    container: dict[str, Any] = {
        "name": RENDEZVOUS_TASK,
        "image": trainer["image"],
        "imagePullPolicy": trainer["imagePullPolicy"],
        "command": list(POD_COMMAND),
        "args": [filenames.SERVE_RENDEZVOUS],
        "workingDir": WORKDIR,
        "ports": [{"name": "rendezvous", "containerPort": plan.master_port, "protocol": "TCP"}],
        "resources": {"requests": dict(RENDEZVOUS_RESOURCES), "limits": dict(RENDEZVOUS_RESOURCES)},
        "volumeMounts": mounts,
    }
    kept = ("restartPolicy", "nodeSelector", "tolerations", "priorityClassName", "serviceAccountName",
            "imagePullSecrets")  # fmt: skip
    spec = {key: pod_spec[key] for key in kept if key in pod_spec}
    spec.update(
        terminationGracePeriodSeconds=10,
        containers=[container],
        volumes=[v for v in pod_spec["volumes"] if v["name"] in names],
    )
    return {
        "name": RENDEZVOUS_TASK,
        "replicas": 1,
        "minAvailable": 1,
        "template": {"metadata": {"labels": job_labels(plan), "annotations": dict(NO_SIDECAR)}, "spec": spec},
    }


def _policies(recipe: Recipe, plan: Plan) -> list[dict[str, Any]]:
    """What Volcano does when a pod ends. The first matching policy wins: the exitCode policies (the runtime
    contract's table) before PodFailed's.

    An elastic Job (``cluster.min_nodes``) is not restarted when a pod is evicted (its node drained or lost):
    Volcano's job controller recreates the pod, which waits in Pending for capacity while torchrun's agents continue
    on the pods that are left, and it rejoins when it is scheduled (plan/rescale.py). It completes once ``minSuccess``
    pods (its fewest) succeeded, not when every replica did: a replica still Pending never will."""
    evicted = [] if plan.elastic else [{"event": "PodEvicted", "action": "RestartJob"}]
    return [
        *exitcodes.exit_code_policies(recipe.ops.nonfinite_loss),
        *evicted,
        {"event": "PodFailed", "action": "RestartJob"},
        {"event": "TaskCompleted", "action": "CompleteJob"},
    ]


def _job_metadata(recipe: Recipe, plan: Plan) -> dict[str, Any]:
    """The Job's name, namespace and labels (MindCluster reads the device labels on the Job as well as its pods)."""
    metadata: dict[str, Any] = {
        "name": plan.job_name,
        "namespace": recipe.cluster.namespace,
        "labels": {
            **job_labels(plan),
            **recipe.hw.pod_labels,
            "recipekit.io/version": __version__,
            "recipekit.io/run": plan.run_id,
            # MindCluster's fault rescheduling (cluster.mindcluster; none by default), read from the PodGroup, which
            # Volcano labels with the Job's labels
            **mindcluster.job_labels(recipe),
        },
    }
    annotations = placement.job_annotations(recipe.cluster.placement)
    if plan.superpod_block is not None:
        annotations = {SUPERPOD_ANNOTATION: str(plan.superpod_block), **annotations}
    if annotations:
        metadata["annotations"] = annotations
    return metadata
