"""Recipe → Plan: every number the bundle uses, computed once. Pure: no I/O, no clock, no environment.

A value that appears in two bundle files (world size in the Job and in launch.json, batch sizes in ds_config.json and
in the Trainer arguments, the master port in launch.json and the Job's container port, the FLOPs per token in the
estimate and in the run's MFU) is computed here and rendered into both, so the files cannot drift apart. The layout
arithmetic is :mod:`recipekit.plan.layout`. The Plan holds numbers and names only: the documents built from them
(ds_config, Trainer arguments, launch data, the Volcano Job) are :mod:`recipekit.bundle.documents`, built once after
the estimate and the operations layer.

Every rule that needs more than one section is checked here, all of them before giving up, and each error shows
its arithmetic:
``train.global_batch_size: 100 is not divisible by micro_batch_size (2) × data-parallel size (16) = 32``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from recipekit import __version__
from recipekit.base.errors import Collector, Problem
from recipekit.image.matrix import ImageFamily, ImageMatrix, compatibility_problems, recipe_problems
from recipekit.plan.datasize import DataSize, data_size
from recipekit.plan.datasize import steps_per_epoch as steps_per_epoch_of
from recipekit.plan.layout import Layout, recipe_layout
from recipekit.plan.modelsize import count_params, lora_params
from recipekit.plan.parallelism import model_parallel_problems
from recipekit.recipe import mindcluster
from recipekit.recipe.k8snames import MAX_DNS_LABEL, host_volume_name, k8s_name, task_env_name
from recipekit.recipe.schema import to_data
from recipekit.recipe.sections import HardwareSpec, OpsSpec, Recipe
from recipekit.recipe.volumes import off_volumes
from recipekit.runtime.boundary import contract

Precision = Literal["bf16", "fp16", "fp32"]

#: Share of a node's allocatable CPU and memory a pod asks for by default (its share of the node's devices): room
#: for the kubelet's reservations, DaemonSets and the page cache the dataloaders lean on.
POD_CPU_HEADROOM = 0.9
POD_MEMORY_HEADROOM = 0.85
#: Hex digits of the run fingerprint in the Job name and output directory: enough to keep runs of one team apart.
RUN_ID_LENGTH = 6


# ------------------------------------------------------------------------------------------------------ precision
def resolve_precision(requested: str, hw: HardwareSpec) -> tuple[Precision, list[Problem]]:
    """``auto`` → bf16 where the hardware has it, else fp16 where it has that, else fp32; an explicit precision the
    hardware lacks is a problem. The one statement of these rules (validate applies it to a built bundle too)."""
    precision: Precision
    if requested == "auto":
        precision = "bf16" if hw.supports_bf16 else "fp16" if hw.supports_fp16 else "fp32"
    else:
        precision = requested  # type: ignore[assignment]
    problems = []
    if precision == "bf16" and not hw.supports_bf16:
        problems.append(
            Problem("train.precision", f"bf16 requested, but {hw.name} has no bf16", hint="use fp16 or auto")
        )
    if precision == "fp16" and not hw.supports_fp16:
        problems.append(
            Problem("train.precision", f"fp16 requested, but {hw.name} has no fp16", hint="use bf16, fp32 or auto")
        )
    return precision, problems


# ---------------------------------------------------------------------------------------------------------- FLOPs
@dataclass(frozen=True)
class Flops:
    """What one training token costs and the peak it is measured against (definitions: runtime contract)."""

    params_total: int  # what memory is counted from
    params_active: int  # what one token runs through (MoE: top-k experts): what the FLOPs are counted from
    params_trainable: int
    model_per_token: float  # MFU's numerator
    hardware_per_token: float  # HFU's: with the recomputation activation checkpointing adds
    peak_tflops: float  # per device, at the plan's precision


def recipe_flops(recipe: Recipe, precision: Precision) -> Flops:
    """FLOPs per token at ``data.max_len`` tokens, counted from the architecture numbers.

    An MoE model's FLOPs count its active parameters (the top-k experts a token is routed to), its memory all of
    them. The runtime's MFU divides by these very numbers (recipe.yaml ``plan.flops``): one definition for both."""
    model, mode, hw = recipe.model, recipe.mode, recipe.hw
    counts = count_params(model)
    full = not contract.trains_adapter(mode.kind)
    trainable = counts.total if full else lora_params(model, mode.lora)  # type: ignore[union-attr]
    shape: dict[str, Any] = dict(
        matmul_params=counts.matmul,
        trainable_params=trainable,
        full_training=full,
        layers=model.num_layers,
        hidden=model.hidden_size,
        seq_len=recipe.data.max_len,
    )
    return Flops(
        params_total=counts.total,
        params_active=counts.active,
        params_trainable=trainable,
        model_per_token=contract.flops_per_token(**shape),
        hardware_per_token=contract.flops_per_token(**shape, recompute=recipe.parallel.gradient_checkpointing),
        peak_tflops=contract.peak_tflops(precision, bf16=hw.peak_tflops_bf16, fp16=hw.peak_tflops_fp16),
    )


# ---------------------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Plan:
    """What the renderer needs, already decided. Field names are the words the bundle files use."""

    job_name: str
    run_id: str
    task_name: str
    task_env: str  # VC_<TASK_ENV>_HOSTS / VC_<TASK_ENV>_NUM
    layout: Layout
    precision: Precision
    comm_backend: str
    zero_stage: int
    steps_per_epoch: int | None
    total_steps: int | None
    warmup_steps: int | float
    master_port: int
    output_dir: str
    prepared_dir: str  # prepared data: <prepared_dir>/<fingerprint>, shared by runs with equal inputs
    data: DataSize
    pod_cpus: int
    pod_memory_gib: int
    superpod_block: int | None  # MindCluster's sp-block: devices of one logical SuperPoD
    flops: Flops
    image: str
    image_family: str
    family: ImageFamily
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The derived numbers, as written into recipe.yaml (train.py reads them) and shown by ``recipekit show``."""
        return {
            "job_name": self.job_name,
            "run_id": self.run_id,
            **self.layout.numbers(),
            "precision": self.precision,
            "comm_backend": self.comm_backend,
            "zero_stage": self.zero_stage,
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "master_port": self.master_port,
            "output_dir": self.output_dir,
            "prepared_dir": self.prepared_dir,
            "data": self.data.summary(),
            "flops": asdict(self.flops),
            "image": self.image,
        }

    @property
    def uses_deepspeed(self) -> bool:
        """Whether the bundle trains under DeepSpeed: for ZeRO, and for tensor parallelism (AutoTP) at any stage."""
        return bool(self.zero_stage) or self.layout.tensor_parallel > 1


# ------------------------------------------------------------------------------------------------------- helpers
def _digest(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def recipe_digest(recipe: Recipe, family: ImageFamily) -> str:
    """A short hash of what goes into the image (recipe, pins, recipekit version): the image tag, so a change forces
    a rebuild and two recipes never share a tag."""
    return _digest({"recipekit": __version__, "recipe": to_data(recipe), "image": to_data(family)})[:12]


#: The training settings that change a run's trajectory; bookkeeping (save/log cadence, trackers, workers) does not.
_TRAJECTORY_KEYS = (
    "epochs",
    "max_steps",
    "learning_rate",
    "lr_scheduler",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "seed",
)


#: The layout numbers that shape a run's trajectory. The global batch, not its factors: every step consumes the
#: same samples in the same order at any data-parallel size (runtime/data/sampler.py), so the same run may continue on
#: fewer or more nodes with accumulation raised or lowered (plan/rescale.py). TP, PP and the micro-batch stay: they
#: shape the checkpoint's files and the Trainer's own state.
TRAJECTORY_LAYOUT_KEYS = ("tensor_parallel", "pipeline_parallel", "micro_batch_size", "global_batch_size")


def run_identity(recipe: Recipe, layout: Layout, precision: str) -> dict[str, Any]:
    """What defines a run: the model, what is trained, on which data, at which global batch, with which optimisation.

    Two builds with equal identities are the same run (a re-submission resumes its checkpoints); any difference gives
    a new Job name and output directory. Descriptions, cluster placement (namespace, queue, registry), hardware names,
    the number of nodes and bookkeeping are left out: moving a run to another queue, or to fewer nodes at the same
    global batch, keeps its checkpoints.
    """
    data, train = recipe.data, to_data(recipe.train)
    return {
        "model": {k: v for k, v in to_data(recipe.model).items() if k != "description"},
        "mode": {k: v for k, v in to_data(recipe.mode).items() if k != "description"},
        "data": {
            "format": data.format,
            "path": data.path,
            "max_len": data.max_len,
            "packing": data.packing,
            "eval_fraction": data.eval_fraction,
            "shard_mib": data.shard_mib,  # chunks bound the packing windows, so they shape the rows
            # streaming draws rows in another order; absent when off, so existing runs keep their ids
            **({"streaming": True} if data.streaming else {}),
        },
        "layout": {k: layout.numbers()[k] for k in TRAJECTORY_LAYOUT_KEYS},
        "zero_stage": recipe.parallel.zero_stage,
        "precision": precision,
        "train": {k: train[k] for k in _TRAJECTORY_KEYS},
    }


def run_id(identity: dict[str, Any]) -> str:
    """The run fingerprint: a short hash of :func:`run_identity`, recorded in every checkpoint."""
    return _digest(identity)[:RUN_ID_LENGTH]


# -------------------------------------------------------------------------------------------- pod placement
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


# ------------------------------------------------------------------------------------------- operations, tracking
#: HCCL_EXEC_TIMEOUT's ceiling when HCCL expands collectives on the AI vector cores (HCCL_OP_EXPANSION_MODE=AIV).
HCCL_AIV_EXEC_TIMEOUT_MAX_S = 1091
#: Trackers the Trainer knows that a bundle does not wire, and why (see README "Experiment tracking").
UNWIRED_TRACKERS = {
    "wandb": "the image does not install wandb and the bundle wires no API key or server, so the Trainer would fail "
    "at start on the cluster",
    "mlflow": "the image does not install mlflow and the bundle wires no tracking URI or credentials, so the Trainer "
    "would fail at start on the cluster",
}


def steady_timeout_floor_s(ops: OpsSpec) -> int:
    """The least the steady timeout (a collective's wait once training runs) can be, whatever the step time: the
    stall floor, and room for a rank to wait out a peer's checkpoint save twice over."""
    return max(ops.stall_timeout_floor_s, 2 * ops.checkpoint_save_limit_s)


def metrics_ports(ops: OpsSpec, layout: Layout) -> tuple[int, ...]:
    """The ports a pod serves metrics on (``ops.metrics_port`` up): one per process with ``ops.metrics_ranks: all``,
    the first process's alone with ``rank0``; none without a metrics port."""
    if ops.metrics_port is None:
        return ()
    count = layout.devices_per_pod if ops.metrics_ranks == "all" else 1
    return tuple(ops.metrics_port + i for i in range(count))


def operations_problems(recipe: Recipe, layout: Layout, total_steps: int | None) -> tuple[list[Problem], list[str]]:
    """Rules of the operations layer that need more than the ``ops`` section: trackers, the metrics ports against
    the rendezvous port, the profiling window and the fault-injection switches against the schedule and the world."""
    ops, tr, problems, warnings = recipe.ops, recipe.train, [], []
    for tracker in tr.report_to:
        if tracker in UNWIRED_TRACKERS:
            problems.append(
                Problem(
                    "train.report_to",
                    f"{tracker}: {UNWIRED_TRACKERS[tracker]}",
                    hint="use tensorboard (in the image; logs in output_dir/runs) or none; the run's metrics are "
                    "served for Prometheus (ops.metrics_port)",
                )
            )
    ports = metrics_ports(ops, layout)
    if ports:
        last = ports[-1]
        if last > 65535:
            problems.append(Problem("ops.metrics_port", f"{ports[0]} + {len(ports)} processes passes 65535"))
        if ports[0] <= recipe.cluster.master_port <= last:
            problems.append(
                Problem(
                    "ops.metrics_port",
                    f"ports {ops.metrics_port}-{last} (one per process) include cluster.master_port "
                    f"{recipe.cluster.master_port}",
                    hint="choose another ops.metrics_port",
                )
            )
        if ops.metrics_bind.startswith("127.") or ops.metrics_bind == "::1":
            warnings.append(
                f"ops.metrics_bind is {ops.metrics_bind}: only a scraper on the pod's own host network reaches the "
                "metrics; the PodMonitor scrapes the pod IP and will find its targets down"
            )
    steady_floor = steady_timeout_floor_s(ops)
    if recipe.hw.env.get("HCCL_OP_EXPANSION_MODE") == "AIV" and steady_floor > HCCL_AIV_EXEC_TIMEOUT_MAX_S:
        warnings.append(
            f"HCCL_EXEC_TIMEOUT will be at least {steady_floor} s, but HCCL's AIV expansion mode caps it at "
            f"{HCCL_AIV_EXEC_TIMEOUT_MAX_S} s: a checkpoint save longer than that fails the waiting ranks' collective"
        )
    if tr.profile_steps is not None and total_steps and tr.profile_steps[1] > total_steps:
        warnings.append(f"train.profile_steps {list(tr.profile_steps)} ends after the last step ({total_steps})")
    testing = ops.testing
    if testing.stall_rank >= layout.world_size:
        problems.append(
            Problem("ops.testing.stall_rank", f"{testing.stall_rank}, but ranks are 0..{layout.world_size - 1}")
        )
    for name in ("device_count_pod", "user_error_pod"):
        pod = getattr(testing, name)
        if pod is not None and pod >= layout.nodes:
            problems.append(Problem(f"ops.testing.{name}", f"{pod}, but pods are 0..{layout.nodes - 1}"))
    injected = [
        f"{name}={value}"
        for name, value in (
            ("stall_at_step", testing.stall_at_step),
            ("nan_at_step", testing.nan_at_step),
            ("device_count", testing.device_count),
            ("user_error_pod", testing.user_error_pod),
            ("record_rows", testing.record_rows or None),
        )
        if value is not None
    ]
    if injected:
        warnings.append(f"ops.testing sets {', '.join(injected)}: this bundle injects faults (testing only)")
    return problems, warnings


# -------------------------------------------------------------------------------------------------------- plan
def make_plan(
    recipe: Recipe,
    images: ImageMatrix,
    *,
    analysis_only: bool = False,
    tp_across_pods: bool = False,
) -> Plan:
    """Derive every number and document of the bundle from ``recipe``; raise one RecipeError with all problems.

    ``analysis_only`` accepts tensor/pipeline parallel layouts the bundle's backend cannot run, for ``recipekit
    plan`` (:mod:`recipekit.plan.parallelism` says which it can). ``tp_across_pods`` lets a TP group span pods: only for
    the dry run, whose pods are processes of one machine. The bundle's documents are not built here
    (:func:`recipekit.bundle.documents.make_documents` builds them once, after the estimate and the operations
    layer), so each candidate ``plan --advise`` tries costs its checks and numbers only.
    """
    errors = Collector()
    warnings: list[str] = []
    hw, cl, tr, par, data, mode, model = (
        recipe.hw,
        recipe.cluster,
        recipe.train,
        recipe.parallel,
        recipe.data,
        recipe.mode,
        recipe.model,
    )

    # --- devices, world size and batch
    layout, problems = recipe_layout(recipe)
    errors.extend(problems)
    if layout.devices_per_pod > hw.devices_per_node:
        errors.add(
            "cluster.devices_per_pod",
            f"{layout.devices_per_pod} devices per pod, but a {hw.name} node has {hw.devices_per_node}",
            hint=f"at most {hw.devices_per_node}; add nodes instead",
        )
    if (layout.model_parallel > 1 or recipe.parallel.expert_parallel > 1) and not analysis_only and not problems:
        errors.extend(model_parallel_problems(recipe, layout, tp_across_pods=tp_across_pods))

    errors.extend(pipeline_problems(recipe))
    errors.extend(expert_problems(recipe, layout))
    errors.extend(moe_lora_problems(recipe))
    errors.extend(mount_problems(recipe))
    errors.extend(volume_problems(recipe))
    errors.extend(mindcluster.problems(recipe))

    # --- precision
    precision, problems = resolve_precision(tr.precision, hw)
    errors.extend(problems)

    # --- ZeRO and offload
    zero = par.zero_stage
    if zero == 0 and (par.offload_optimizer != "none" or par.offload_param != "none"):
        errors.add(
            "parallel.offload_optimizer", "offload needs DeepSpeed ZeRO (zero_stage ≥ 1)", hint="zero_stage: 2 or 3"
        )
    if par.offload_param != "none" and zero != 3:
        errors.add("parallel.offload_param", f"parameter offload needs zero_stage 3 (got {zero})")
    if "nvme" in (par.offload_optimizer, par.offload_param) and not par.nvme_path:
        errors.add("parallel.nvme_path", "nvme offload without a path", hint="a local NVMe directory, e.g. /local_nvme")
    if mode.kind == "qlora" and zero == 3:
        errors.add(
            "parallel.zero_stage",
            "qlora with ZeRO-3 is not supported by this backend",
            hint="use parallel=ddp, zero1 or zero2 (the 4-bit base is small)",
        )

    # --- data and model fit
    if mode.kind == "pretrain" and data.format != "text":
        errors.add("data.format", f"pretrain trains on raw text, got {data.format!r}", hint="data=text")
    if mode.kind != "pretrain" and data.format == "text":
        errors.add("data.format", f"{mode.kind} needs instruction data, got raw text", hint="data=alpaca or data=chat")
    if data.max_len > model.max_position_embeddings:
        errors.add(
            "data.max_len",
            f"{data.max_len} exceeds {model.name}'s max_position_embeddings ({model.max_position_embeddings})",
        )

    # --- schedule
    size = data_size(data)
    steps_per_epoch = total_steps = None
    if size.rows:
        steps_per_epoch = steps_per_epoch_of(size.rows, layout)
    if tr.max_steps:
        total_steps = tr.max_steps
    elif steps_per_epoch:
        total_steps = math.ceil(steps_per_epoch * tr.epochs)
    warmup: int | float = math.ceil(tr.warmup_ratio * total_steps) if total_steps else tr.warmup_ratio
    if total_steps and tr.save_steps > total_steps:
        warnings.append(
            f"train.save_steps ({tr.save_steps}) > total steps ({total_steps}): no checkpoint before the end"
        )

    errors.extend(streaming_problems(recipe, layout, total_steps))

    # --- operations layer and trackers
    problems, notes = operations_problems(recipe, layout, total_steps)
    errors.extend(problems)
    warnings.extend(notes)

    # --- run identity and cluster names
    identity = run_id(run_identity(recipe, layout, precision))
    suffix = f"-{identity}-{cl.task_name}-{cl.nodes - 1}"
    readable = k8s_name(recipe.name, limit=MAX_DNS_LABEL - len(suffix))
    if MAX_DNS_LABEL - len(suffix) < 1:
        errors.add("cluster.task_name", "task name too long to build <job>-<task>-<index> within 63 characters")
    job_name = f"{readable}-{identity}"
    output_dir = f"{cl.output_dir.rstrip('/')}/{job_name}"
    mount = cl.mount_path.rstrip("/") + "/"
    if not (output_dir + "/").startswith(mount):
        errors.add(
            "cluster.output_dir",
            f"{cl.output_dir} is not under the shared volume {cl.mount_path}",
            hint="checkpoints must survive a pod: put output_dir under mount_path",
        )
    prepared_dir = (data.prepared_dir or f"{cl.output_dir.rstrip('/')}/prepared").rstrip("/")
    if data.prepared_dir and not (prepared_dir + "/").startswith(mount):
        errors.add(
            "data.prepared_dir",
            f"{data.prepared_dir} is not under the shared volume {cl.mount_path}",
            hint="every pod prepares a share and reads every shard: put prepared_dir under mount_path",
        )

    # --- pod resources and placement
    pod_cpus, pod_memory_gib, problems = pod_resources(recipe, layout)
    errors.extend(problems)
    superpod_block, problems = superpod_block_size(hw, layout)
    errors.extend(problems)
    errors.extend(host_volume_problems(hw))

    # --- image
    family = images.families.get(hw.image_family)
    if family is None:
        errors.add(
            "hw.image_family",
            f"unknown image family {hw.image_family!r}",
            hint="families: " + ", ".join(images.families),
        )
    else:
        errors.extend(compatibility_problems(hw.image_family, family, images.torch_npu_table))
        errors.extend(recipe_problems(hw.image_family, family, recipe))

    errors.raise_if_any()
    assert family is not None

    return Plan(
        job_name=job_name,
        run_id=identity,
        task_name=cl.task_name,
        task_env=task_env_name(cl.task_name),
        layout=layout,
        precision=precision,
        comm_backend=hw.comm_backend,
        zero_stage=zero,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        warmup_steps=warmup,
        master_port=cl.master_port,
        output_dir=output_dir,
        prepared_dir=prepared_dir,
        data=size,
        pod_cpus=pod_cpus,
        pod_memory_gib=pod_memory_gib,
        superpod_block=superpod_block,
        flops=recipe_flops(recipe, precision),
        image=image_tag(recipe, family),
        image_family=hw.image_family,
        family=family,
        warnings=warnings,
    )


def image_tag(recipe: Recipe, family: ImageFamily) -> str:
    """The image the Job runs: named after the recipe, tagged with a digest of the recipe, its pins and recipekit's
    version (:func:`recipe_digest`)."""
    return f"{recipe.cluster.image_registry.rstrip('/')}/{k8s_name(recipe.name)}:{recipe_digest(recipe, family)}"


def pipeline_problems(recipe: Recipe) -> list[Problem]:
    """A pipeline stage holds at least one decoder layer: more stages than layers leave some with nothing to run."""
    stages, layers = recipe.parallel.pipeline_parallel, recipe.model.num_layers
    if stages <= layers:
        return []
    return [
        Problem(
            "parallel.pipeline_parallel",
            f"{stages} pipeline stages for {recipe.model.name}'s {layers} layers: a stage needs at least one layer",
            hint=f"at most {layers}",
        )
    ]


def moe_lora_problems(recipe: Recipe) -> list[Problem]:
    """PEFT adapts an MoE layer's fused 3-D experts with its ParamWrapper, which refuses LoRA dropout (PEFT 0.21:
    "lora.ParamWrapper does not work with lora_dropout != 0"); found by dry-running the Qwen3-MoE LoRA preset."""
    mode = recipe.mode
    if not contract.trains_adapter(mode.kind) or not recipe.model.moe:
        return []
    lora = mode.lora  # type: ignore[union-attr]
    if lora.target_modules != "all-linear" or lora.dropout == 0:
        return []
    return [
        Problem(
            "mode.lora.dropout",
            f"LoRA dropout {lora.dropout:g} on the MoE model {recipe.model.name} with all-linear targets: PEFT adapts "
            "the fused experts with its ParamWrapper, which works only without dropout",
            hint="mode.lora.dropout=0, or name the attention projections in mode.lora.target_modules",
        )
    ]


def expert_problems(recipe: Recipe, layout: Layout) -> list[Problem]:
    """Expert parallelism splits an MoE model's experts evenly over EP ranks drawn from the data-parallel ranks."""
    ep, model = recipe.parallel.expert_parallel, recipe.model
    if ep == 1:
        return []
    if not model.moe:
        return [Problem("parallel.expert_parallel", f"EP {ep} for {model.name}, a dense model: it has no experts")]
    problems = []
    if model.num_experts % ep:
        fits = [d for d in range(2, model.num_experts + 1) if model.num_experts % d == 0 and layout.dp_size % d == 0]
        problems.append(
            Problem(
                "parallel.expert_parallel",
                f"EP {ep} does not divide {model.name}'s {model.num_experts} experts "
                f"({model.num_experts} / {ep} = {model.num_experts / ep:g})",
                hint="EP " + ", ".join(map(str, fits[:6])) if fits else "EP 1",
            )
        )
    if layout.dp_size % ep:
        problems.append(
            Problem(
                "parallel.expert_parallel",
                f"EP {ep} does not divide the {layout.dp_size} data-parallel ranks: expert groups are made of them",
            )
        )
    return problems


def streaming_problems(recipe: Recipe, layout: Layout, total_steps: int | None) -> list[Problem]:
    """What ``data.streaming`` cannot do. An iterable dataset has no length, so the Trainer needs the step count up
    front; no split can be held out without preparing the rows first; and a tensor-parallel group must see one
    batch on all its ranks, which the stream's reading (every rank keeps its share of the rows) does not give."""
    data = recipe.data
    if not data.streaming:
        return []
    problems = []
    if total_steps is None:
        problems.append(
            Problem(
                "data.streaming",
                "a streamed dataset has no length, so the run needs its step count up front, and none is known",
                hint="set train.max_steps, or data.num_samples (estimate) or data.num_rows (exact)",
            )
        )
    if data.eval_fraction > 0:
        problems.append(
            Problem(
                "data.eval_fraction",
                f"{data.eval_fraction} with data.streaming: no split can be held out without preparing the data",
                hint="0 under streaming; or prepare the data (data.streaming=false) for an eval split",
            )
        )
    if layout.tensor_parallel > 1:
        problems.append(
            Problem(
                "data.streaming",
                f"streaming with parallel.tensor_parallel {layout.tensor_parallel}: the ranks of a TP group must "
                "train on the same rows, and the stream gives each rank its own share",
                hint="parallel.tensor_parallel=1 with streaming, or prepare the data (data.streaming=false)",
            )
        )
    return problems


def volume_problems(recipe: Recipe) -> list[Problem]:
    """The model and data must be on the pod's shared volume (or in the image): a path on no volume is a file the
    pods never see (:mod:`recipekit.recipe.volumes`, the rule validate applies to a built Job too)."""
    mount = recipe.cluster.mount_path
    paths = {"model.name_or_path": recipe.model.name_or_path, "data.path": recipe.data.path}
    return [
        Problem(
            key,
            f"{path} is on no volume of the pod: the shared volume is mounted at {mount} (cluster.mount_path)",
            hint=f"put it under {mount}",
        )
        for key, path in off_volumes(paths, [mount])
    ]


def mount_problems(recipe: Recipe) -> list[Problem]:
    """Every volume of the pod gets its own mount path: Kubernetes rejects a pod that mounts two volumes at one path
    (a host mount at the PVC's mount path, or at the NVMe scratch directory)."""
    par = recipe.parallel
    claimed = {recipe.cluster.mount_path.rstrip("/"): "cluster.mount_path"}
    if par.nvme_path and "nvme" in (par.offload_optimizer, par.offload_param):
        nvme = par.nvme_path.rstrip("/")
        if nvme in claimed:
            return [Problem("parallel.nvme_path", f"{par.nvme_path} is also {claimed[nvme]}", "a local NVMe directory")]
        claimed[nvme] = "parallel.nvme_path"
    return [
        Problem("hw.host_mounts", f"{path} is also {claimed[path.rstrip('/')]}", hint="mount paths must differ")
        for path in recipe.hw.host_mounts
        if path.rstrip("/") in claimed
    ]
