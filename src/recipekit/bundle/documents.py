"""The bundle's documents, built once from the recipe, the plan's numbers and the operations layer: ds_config, the
Trainer arguments, the runtime environment, the pip pins, launch.json and the Volcano Job — plain dicts the renderer
only serialises.

Every number comes from the plan (and the timeouts and ports from the operations layer, which follows the estimate);
what is decided here is only how each engine spells it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipekit import __version__
from recipekit.bundle import placement
from recipekit.bundle.files import DS_CONFIG, POD_COMMAND, TRAIN_MODULE, WORKDIR
from recipekit.bundle.runfiles import pod_volume
from recipekit.image.matrix import ARCH_LABEL, pip_packages
from recipekit.memory.operations import Operations
from recipekit.plan.layout import Layout
from recipekit.plan.parallelism import STAGE3_PREFETCH_FACTOR
from recipekit.plan.plan import Plan, Precision
from recipekit.recipe import mindcluster
from recipekit.recipe.k8snames import host_volume_name
from recipekit.recipe.schema import to_data
from recipekit.recipe.sections import Recipe
from recipekit.runtime.boundary import exitcodes
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
NO_SIDECAR = {"sidecar.istio.io/inject": "false"}
#: The prefix of every metrics port's name (a Kubernetes port name: at most 15 characters).
METRICS_PORT_NAME = "metrics"


@dataclass(frozen=True)
class Documents:
    """What the bundle's files carry besides the plan's numbers, each built once (:func:`make_documents`)."""

    env: dict[str, str]  # launch.json's environment: the runtime's, then the operations layer's collective timeouts
    pip_packages: list[str]
    training_arguments: dict[str, Any]
    ds_config: dict[str, Any] | None  # None: the bundle does not run DeepSpeed (Plan.uses_deepspeed)
    launch: dict[str, Any]
    job: dict[str, Any]
    #: recipe.yaml's ``operations`` section, in the very type the runtime reads it as (runtime/boundary/recipeview.py)
    operations: OperationsView


def make_documents(recipe: Recipe, plan: Plan, ops: Operations) -> Documents:
    """The documents of ``recipe`` laid out as ``plan`` with the operations layer's numbers (``ops``): its collective
    timeouts join the environment (a key the runtime or ``hw.env`` sets keeps its value), its metrics ports the
    Job's container, and its thresholds recipe.yaml's ``operations`` section."""
    deepspeed = plan.uses_deepspeed
    env = dict(sorted({**ops.env, **runtime_env(recipe, deepspeed)}.items()))
    return Documents(
        env=env,
        pip_packages=pip_packages(recipe, plan.family, deepspeed),
        training_arguments=trainer_arguments(
            recipe, plan.output_dir, plan.layout, plan.precision, plan.total_steps, plan.warmup_steps, deepspeed
        ),
        ds_config=deepspeed_config(recipe, plan.layout, plan.precision) if deepspeed else None,
        launch=launch_spec(recipe, plan, env),
        job=volcano_job(recipe, plan, ops.metrics_ports),
        operations=operations_view(recipe, plan, ops),
    )


def operations_view(recipe: Recipe, plan: Plan, ops: Operations) -> OperationsView:
    """recipe.yaml's ``operations``: what the runtime's preflight, watchdog, alerts, exporter and fault injection
    read, built as the runtime's own view types so that the two sides cannot disagree on a key."""
    spec = recipe.ops
    return OperationsView(
        preflight=PreflightView(
            enabled=spec.preflight,
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


def deepspeed_config(recipe: Recipe, layout: Layout, precision: Precision) -> dict[str, Any]:
    """The ds_config: batch values equal to the Trainer's (DeepSpeed and the Trainer both check them).

    With tensor parallelism it carries DeepSpeed AutoTP (``tensor_parallel.autotp_size``) and no
    ``train_batch_size``: the Trainer's check and DeepSpeed's both count every rank of a TP group as if it saw its
    own batch (``world_size × micro × accumulation``), while the global batch is micro × accumulation × the
    data-parallel size; left out, DeepSpeed derives its figure and the Trainer has nothing to compare.
    ``stage3_gather_16bit_weights_on_model_save`` then asks Accelerate to gather the TP-sliced weights whole when
    the Trainer saves the model, so the output loads without DeepSpeed (despite its name it is read for TP too).
    """
    par, tr, hidden = recipe.parallel, recipe.train, recipe.model.hidden_size
    zero: dict[str, Any] = {
        "stage": par.zero_stage,
        "overlap_comm": par.overlap_comm,
        "contiguous_gradients": True,
        "reduce_bucket_size": par.reduce_bucket_size,
    }
    if par.zero_stage in (1, 2):
        zero.update(allgather_partitions=True, allgather_bucket_size=par.reduce_bucket_size, reduce_scatter=True)
    if par.zero_stage == 3:
        zero.update(
            stage3_prefetch_bucket_size=int(STAGE3_PREFETCH_FACTOR * hidden * hidden),
            stage3_param_persistence_threshold=10 * hidden,
            stage3_max_live_parameters=1_000_000_000,
            stage3_max_reuse_distance=1_000_000_000,
            sub_group_size=1_000_000_000,
            # Without this the saved model holds empty placeholders instead of weights.
            stage3_gather_16bit_weights_on_model_save=True,
        )
    for key, where in (("offload_optimizer", par.offload_optimizer), ("offload_param", par.offload_param)):
        if where == "cpu":
            zero[key] = {"device": "cpu", "pin_memory": True}
        elif where == "nvme":
            zero[key] = {"device": "nvme", "nvme_path": par.nvme_path, "pin_memory": True}

    tp = layout.tensor_parallel
    if tp > 1:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {} if tp > 1 else {"train_batch_size": layout.global_batch_size}
    config |= {
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.gradient_accumulation_steps,
        "gradient_clipping": tr.max_grad_norm,
        "zero_optimization": zero,
        "steps_per_print": 1_000_000,  # the Trainer logs; DeepSpeed's own step prints are noise
        "wall_clock_breakdown": False,
    }
    if tp > 1:
        config["tensor_parallel"] = {"autotp_size": tp}
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "loss_scale_window": 1000,
            "initial_scale_power": 16,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    if par.offload_optimizer != "none":
        # ZeRO-Offload runs DeepSpeed's CPU Adam; "auto" lets the Trainer fill the values from its arguments.
        config["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    return config


def trainer_arguments(
    recipe: Recipe,
    output_dir: str,
    layout: Layout,
    precision: Precision,
    total_steps: int | None,
    warmup: int | float,
    deepspeed: bool,
) -> dict[str, Any]:
    """``transformers.TrainingArguments`` keyword arguments, exactly as train.py passes them."""
    tr, par, hw, data = recipe.train, recipe.parallel, recipe.hw, recipe.data
    micro = layout.micro_batch_size
    args: dict[str, Any] = {
        "output_dir": output_dir,
        "run_name": recipe.name,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": layout.gradient_accumulation_steps,
        "learning_rate": tr.learning_rate,
        "lr_scheduler_type": tr.lr_scheduler,
        "warmup_steps": warmup,
        "weight_decay": tr.weight_decay,
        "max_grad_norm": tr.max_grad_norm,
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "optim": hw.optimizer,
        "logging_steps": tr.logging_steps,
        "logging_first_step": True,
        "save_strategy": "steps",
        "save_steps": tr.save_steps,
        "save_total_limit": tr.save_total_limit,
        "seed": tr.seed,
        "report_to": [r for r in tr.report_to if r != "none"] or "none",
        "dataloader_num_workers": tr.dataloader_workers,
        "activation_checkpointing": par.gradient_checkpointing,
        "ddp_backend": hw.comm_backend,
        "ddp_timeout": recipe.cluster.connect_timeout_s,
        "ddp_find_unused_parameters": False,
        "remove_unused_columns": False,
        "include_num_input_tokens_seen": True,
        # A NaN/inf loss is logged as it is; the runtime's loss guard stops the run on it (ops.nonfinite_loss).
        "logging_nan_inf_filter": False,
    }
    if tr.max_steps:
        args["max_steps"] = tr.max_steps
    elif data.streaming and total_steps:  # an iterable dataset has no length: the Trainer needs the step count
        args["max_steps"] = total_steps
    else:
        args["num_train_epochs"] = tr.epochs
    if data.streaming:
        # Every rank reads the stream and keeps its share (runtime/data/stream.py): no dispatch from rank 0, and no
        # DataLoader workers, which would each read the whole stream again (the reader keeps the chunk counts that
        # resumption needs in the training process).
        args["accelerator_config"] = {"dispatch_batches": False}
        args["dataloader_num_workers"] = 0
        args["ignore_data_skip"] = True  # the stream starts at the checkpoint's row itself
    if par.gradient_checkpointing:
        args["activation_checkpointing_kwargs"] = {"use_reentrant": False}
    if deepspeed:
        args["deepspeed"] = DS_CONFIG
    if data.eval_fraction > 0:
        args.update(eval_strategy="steps", eval_steps=tr.save_steps, per_device_eval_batch_size=micro)
    return args


def runtime_env(recipe: Recipe, deepspeed: bool) -> dict[str, str]:
    """Environment run.sh exports (each overridable from the pod spec): collective timeouts, NICs, tunings."""
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
    if deepspeed:
        env["DS_ACCELERATOR"] = hw.ds_accelerator
    if recipe.model.name_or_path.startswith("/"):
        env["HF_HUB_OFFLINE"] = "1"
    # After SIGTERM torchrun waits this long for train.py's last checkpoint before SIGKILL (default 30 s); it must
    # end before the kubelet's own grace period does.
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(TERMINATION_GRACE_S - SHUTDOWN_MARGIN_S)
    # The run key signs each checkpoint and the prepared data: only what this run wrote is resumed (docs/trust.md).
    env[trust.KEY_ENV] = f"{trust.KEY_MOUNT}/{trust.KEY_NAME}"
    env.update(hw.env)
    return dict(sorted(env.items()))


def launch_spec(recipe: Recipe, plan: Plan, env: dict[str, str]) -> dict[str, Any]:
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
        "module": TRAIN_MODULE,
        "args": ["--resume", "auto"],
        "cann_env": list(plan.family.cann_env),
    }


def job_labels(plan: Plan) -> dict[str, str]:
    """The labels of the Job and its pods that name the run (the PodMonitor selects by the name label)."""
    return {"app.kubernetes.io/name": plan.job_name, "app.kubernetes.io/managed-by": "recipekit"}


def volcano_job(recipe: Recipe, plan: Plan, metrics_ports: tuple[int, ...] = ()) -> dict[str, Any]:
    """The ``batch.volcano.sh/v1alpha1`` Job: gang-scheduled, env+svc plugins, restart on eviction or failure; the
    trainer container declares the rendezvous port and the metrics ports (``ops.metrics_port``)."""
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": _job_metadata(recipe, plan),
        "spec": _job_spec(recipe, plan, _pod_spec(recipe, plan, metrics_ports)),
    }


def _pod_storage(recipe: Recipe, plan: Plan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the trainer's mounts of them: /dev/shm, the shared volume, the run key, the host paths
    the hardware needs, the NVMe scratch directory of an NVMe offload, and the run files (the bundle's ConfigMap)."""
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
    if hw.device_env_from_annotation:
        container["env"] = [
            {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{annotation}']"}}}
            for name, annotation in sorted(hw.device_env_from_annotation.items())
        ]
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
    pod_spec.update(placement.pod_placement(recipe, job_labels(plan)))
    if cl.priority_class:
        pod_spec["priorityClassName"] = cl.priority_class
    return pod_spec


def _job_spec(recipe: Recipe, plan: Plan, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The Job's spec: Volcano's scheduler, the gang, the plugins the launcher reads, the lifecycle policies."""
    hw, cl = recipe.hw, recipe.cluster
    annotations = dict(NO_SIDECAR)
    if plan.superpod_block is not None:
        annotations["sp-block"] = str(plan.superpod_block)
    spec: dict[str, Any] = {
        "schedulerName": "volcano",
        "minAvailable": plan.layout.nodes,
        "queue": cl.queue,
        "maxRetry": cl.max_retry,
        # Ranks resolve each other before any pod is Ready (none is until training runs).
        "plugins": {"env": [], "svc": ["--publish-not-ready-addresses"]},
        # The first matching policy wins: the exitCode policies (the runtime contract's table) before PodFailed's.
        "policies": [
            *exitcodes.exit_code_policies(recipe.ops.nonfinite_loss),
            {"event": "PodEvicted", "action": "RestartJob"},
            {"event": "PodFailed", "action": "RestartJob"},
            {"event": "TaskCompleted", "action": "CompleteJob"},
        ],
        "tasks": [
            {
                "name": plan.task_name,
                "replicas": plan.layout.nodes,
                "template": {
                    "metadata": {"labels": {**job_labels(plan), **hw.pod_labels}, "annotations": annotations},
                    "spec": pod_spec,
                },
                **placement.task_partition_policy(cl.placement, plan.layout.nodes),
            }
        ],
        **placement.job_network_topology(cl.placement),
    }
    if cl.priority_class:
        spec["priorityClassName"] = cl.priority_class
    return spec


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
        annotations = {"sp-block": str(plan.superpod_block), **annotations}
    if annotations:
        metadata["annotations"] = annotations
    return metadata
