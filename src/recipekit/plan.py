"""Recipe → Plan: every number the bundle uses, computed once. Pure: no I/O, no clock, no environment.

A value that appears in two bundle files (world size in the Job and in launch.json, batch sizes in ds_config.json and
in the Trainer arguments, the master port in launch.json and the Job's container port, the FLOPs per token in the
estimate and in the run's MFU) is computed here and rendered into both, so the files cannot drift apart. The
DeepSpeed config, the Volcano Job and the launch data are built here as plain dicts; the renderer only serialises
them.

Every rule that needs more than one section is checked here, all of them before giving up, and each error shows
its arithmetic:
``train.global_batch_size: 100 is not divisible by micro_batch_size (2) × data-parallel size (16) = 32``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from recipekit import __version__
from recipekit.bundlefiles import DS_CONFIG, RUN, TRAIN_MODULE, WORKDIR
from recipekit.errors import Collector, Problem
from recipekit.images import ARCH_LABEL, ImageFamily, ImageMatrix, compatibility_problems, recipe_problems
from recipekit.modelsize import count_params, lora_params
from recipekit.recipe import HardwareSpec, Recipe
from recipekit.runtime import contract
from recipekit.schema import to_data

Precision = Literal["bf16", "fp16", "fp32"]

#: Seconds Kubernetes waits after SIGTERM before SIGKILL: time for train.py to write its last checkpoint.
TERMINATION_GRACE_S = 600
#: Seconds between torchrun's SIGKILL of its workers and the kubelet's SIGKILL of the pod.
SHUTDOWN_MARGIN_S = 60
#: How long the launcher waits for the first pod's DNS name (the svc plugin's records lag the pods by seconds).
MASTER_DNS_WAIT_S = 120
#: ZeRO-3 prefetch bucket in elements per hidden² (Transformers' value for "auto"; memory's estimate uses it too).
STAGE3_PREFETCH_FACTOR = 0.9
#: A Kubernetes object name (RFC 1123 label) and its length limit.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_DNS_LABEL = 63
#: Share of a node's allocatable CPU and memory a pod asks for by default (its share of the node's devices): room
#: for the kubelet's reservations, DaemonSets and the page cache the dataloaders lean on.
POD_CPU_HEADROOM = 0.9
POD_MEMORY_HEADROOM = 0.85
#: Pod annotation that keeps service meshes out: a sidecar would hold the rendezvous port's traffic and keep pods
#: alive after training ends.
NO_SIDECAR = {"sidecar.istio.io/inject": "false"}
#: Hex digits of the run fingerprint in the Job name and output directory: enough to keep runs of one team apart.
RUN_ID_LENGTH = 6


# ------------------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    """How the devices are used and how big a step is: the numbers every bundle file and every estimate share.

    The derived numbers are properties, so world size, data-parallel size and global batch cannot disagree with the
    numbers they come from. Megatron's order: TP innermost, then DP, PP outermost.
    """

    nodes: int
    devices_per_pod: int
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_pod

    @property
    def model_parallel(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def dp_size(self) -> int:
        return max(1, self.world_size // self.model_parallel)

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps * self.dp_size

    def numbers(self) -> dict[str, int]:
        """Every number, given and derived, under the names the bundle files use."""
        return {
            "nodes": self.nodes,
            "devices_per_pod": self.devices_per_pod,
            "world_size": self.world_size,
            "dp_size": self.dp_size,
            "tensor_parallel": self.tensor_parallel,
            "pipeline_parallel": self.pipeline_parallel,
            "micro_batch_size": self.micro_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "global_batch_size": self.global_batch_size,
        }


#: The plan's numbers as recipe.yaml carries them, with their types (validate checks recipe.yaml against this).
LAYOUT_KEYS = tuple(Layout(1, 1).numbers())


def derive_layout(
    nodes: int,
    devices_per_pod: int,
    *,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    micro_batch_size: int = 1,
    gradient_accumulation_steps: int | None = None,
    global_batch_size: int | None = None,
) -> tuple[Layout, list[Problem]]:
    """The layout for these choices, with every problem of the arithmetic (each showing its numbers).

    Accumulation is given, or derived from the global batch (which must then divide evenly), or 1.
    """
    problems: list[Problem] = []
    base = Layout(nodes, devices_per_pod, tensor_parallel, pipeline_parallel, micro_batch_size)
    world, model_parallel = base.world_size, base.model_parallel
    if world % model_parallel:
        problems.append(
            Problem(
                "parallel.tensor_parallel",
                f"world size {world} (nodes {nodes} × devices per pod {devices_per_pod}) is not divisible "
                f"by TP {tensor_parallel} × PP {pipeline_parallel} = {model_parallel}",
            )
        )
    dp, micro = base.dp_size, micro_batch_size
    per_step = micro * dp
    if global_batch_size is not None and gradient_accumulation_steps is not None:
        accum = gradient_accumulation_steps
        if micro * accum * dp != global_batch_size:
            problems.append(
                Problem(
                    "train.global_batch_size",
                    f"{global_batch_size} != micro_batch_size ({micro}) × gradient_accumulation_steps ({accum}) "
                    f"× data-parallel size ({dp}) = {micro * accum * dp}",
                    hint="set only one of global_batch_size and gradient_accumulation_steps",
                )
            )
    elif global_batch_size is not None:
        accum = max(1, global_batch_size // per_step)
        if global_batch_size % per_step:
            lower, upper = (global_batch_size // per_step) * per_step, (global_batch_size // per_step + 1) * per_step
            problems.append(
                Problem(
                    "train.global_batch_size",
                    f"{global_batch_size} is not divisible by micro_batch_size ({micro}) × data-parallel size "
                    f"({dp}) = {per_step}",
                    hint="nearest that divide: " + " or ".join(str(v) for v in (lower, upper) if v > 0),
                )
            )
    else:
        accum = gradient_accumulation_steps or 1
    return replace(base, gradient_accumulation_steps=accum), problems


def recipe_layout(recipe: Recipe) -> tuple[Layout, list[Problem]]:
    """The layout a recipe asks for (devices per pod default to a whole node)."""
    cl, par, tr = recipe.cluster, recipe.parallel, recipe.train
    return derive_layout(
        cl.nodes,
        cl.devices_per_pod or recipe.hw.devices_per_node,
        tensor_parallel=par.tensor_parallel,
        pipeline_parallel=par.pipeline_parallel,
        micro_batch_size=tr.micro_batch_size,
        gradient_accumulation_steps=tr.gradient_accumulation_steps,
        global_batch_size=tr.global_batch_size,
    )


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

    params_total: int
    params_trainable: int
    model_per_token: float  # MFU's numerator
    hardware_per_token: float  # HFU's: with the recomputation activation checkpointing adds
    peak_tflops: float  # per device, at the plan's precision


def recipe_flops(recipe: Recipe, precision: Precision) -> Flops:
    """FLOPs per token at ``data.max_len`` tokens, counted from the architecture numbers."""
    model, mode, hw = recipe.model, recipe.mode, recipe.hw
    counts = count_params(model)
    full = mode.kind not in ("lora", "qlora")
    trainable = counts.total if full else lora_params(model, mode.lora)  # type: ignore[union-attr]
    shape = dict(
        matmul_params=counts.matmul,
        trainable_params=trainable,
        full_training=full,
        layers=model.num_layers,
        hidden=model.hidden_size,
        seq_len=recipe.data.max_len,
    )
    return Flops(
        params_total=counts.total,
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
    pod_cpus: int
    pod_memory_gib: int
    superpod_block: int | None  # MindCluster's sp-block: devices of one logical SuperPoD
    flops: Flops
    image: str
    image_family: str
    family: ImageFamily
    env: dict[str, str]
    pip_packages: list[str]
    training_arguments: dict[str, Any]
    ds_config: dict[str, Any] | None
    launch: dict[str, Any]
    job: dict[str, Any]
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
            "flops": asdict(self.flops),
            "image": self.image,
        }


# ------------------------------------------------------------------------------------------------------- helpers
def k8s_name(text: str, limit: int = MAX_DNS_LABEL) -> str:
    """Make ``text`` a DNS label: lower case, ``[a-z0-9-]``, at most ``limit`` characters, no dash at either end."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[:limit].strip("-")
    return name or "recipe"


def task_env_name(task: str) -> str:
    """Volcano's svc plugin names env vars after the task: upper case, ``-`` → ``_``."""
    return task.replace("-", "_").upper()


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


def run_identity(recipe: Recipe, layout: Layout, precision: str) -> dict[str, Any]:
    """What defines a run: the model, what is trained, on which data, in which world layout, with which optimisation.

    Two builds with equal identities are the same run (a re-submission resumes its checkpoints); any difference gives
    a new Job name and output directory. Descriptions, cluster placement (namespace, queue, registry), hardware names
    and bookkeeping are left out: moving a run to another queue keeps its checkpoints.
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
        },
        "layout": {k: v for k, v in layout.numbers().items() if k not in ("nodes", "devices_per_pod")},
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


def host_volume_name(path: str) -> str:
    """The Job's volume name for a host path (a DNS label derived from the path)."""
    return k8s_name("host-" + path.strip("/").replace("/", "-").replace("_", "-").replace(".", "-"))


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


# -------------------------------------------------------------------------------------------------------- plan
def make_plan(recipe: Recipe, images: ImageMatrix, *, analysis_only: bool = False, documents: bool = True) -> Plan:
    """Derive every number and document of the bundle from ``recipe``; raise one RecipeError with all problems.

    ``analysis_only`` accepts tensor/pipeline parallel degrees the bundle's backend cannot run, for ``recipekit plan``.
    ``documents=False`` leaves out what only the bundle's files need (:func:`with_documents`: the image tag, a digest
    of the whole recipe, and the ds_config, Trainer arguments, launch data and Job dicts), for plans that are only
    estimated, such as each candidate ``plan --advise`` tries; every check still runs and every number is the same.
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
    if layout.model_parallel > 1 and not analysis_only and not problems:
        errors.add(
            "parallel.tensor_parallel",
            f"TP {par.tensor_parallel} × PP {par.pipeline_parallel} = {layout.model_parallel}: the bundle's "
            "Trainer/DeepSpeed backend runs data parallelism only",
            hint="set both to 1 to build; `recipekit plan` still analyses 3D layouts",
        )

    errors.extend(pipeline_problems(recipe))
    errors.extend(mount_problems(recipe))

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
    steps_per_epoch = total_steps = None
    if data.num_samples:
        train_samples = max(1, math.floor(data.num_samples * (1 - data.eval_fraction)))
        steps_per_epoch = math.ceil(train_samples / layout.global_batch_size)
    if tr.max_steps:
        total_steps = tr.max_steps
    elif steps_per_epoch:
        total_steps = math.ceil(steps_per_epoch * tr.epochs)
    warmup: int | float = math.ceil(tr.warmup_ratio * total_steps) if total_steps else tr.warmup_ratio
    if total_steps and tr.save_steps > total_steps:
        warnings.append(
            f"train.save_steps ({tr.save_steps}) > total steps ({total_steps}): no checkpoint before the end"
        )

    # --- run identity and cluster names
    identity = run_id(run_identity(recipe, layout, precision))
    if not DNS_LABEL.match(cl.task_name):
        errors.add("cluster.task_name", f"{cl.task_name!r} is not a DNS label", hint="lower case letters, digits, '-'")
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

    plan = Plan(
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
        pod_cpus=pod_cpus,
        pod_memory_gib=pod_memory_gib,
        superpod_block=superpod_block,
        flops=recipe_flops(recipe, precision),
        image="",
        image_family=hw.image_family,
        family=family,
        env={},
        pip_packages=[],
        training_arguments={},
        ds_config=None,
        launch={},
        job={},
        warnings=warnings,
    )
    return with_documents(recipe, plan) if documents else plan


def with_documents(recipe: Recipe, plan: Plan) -> Plan:
    """``plan`` with what the bundle's files carry: the image tag (a digest of the recipe, its pins and recipekit's
    version), the pins, the runtime environment, ds_config, the Trainer arguments, launch data and the Job."""
    deepspeed = bool(plan.zero_stage)
    image = f"{recipe.cluster.image_registry.rstrip('/')}/{k8s_name(recipe.name)}:{recipe_digest(recipe, plan.family)}"
    plan = replace(
        plan,
        image=image,
        env=runtime_env(recipe, deepspeed),
        pip_packages=pip_packages(recipe, plan.family, deepspeed),
        training_arguments=trainer_arguments(
            recipe, plan.output_dir, plan.layout, plan.precision, plan.total_steps, plan.warmup_steps, deepspeed
        ),
        ds_config=deepspeed_config(recipe, plan.layout, plan.precision) if deepspeed else None,
    )
    # The launch data and the Job are built from the finished plan (names, image, devices), then added to it.
    return replace(plan, launch=launch_spec(recipe, plan), job=volcano_job(recipe, plan))


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


# ---------------------------------------------------------------------------------------------------- documents
def deepspeed_config(recipe: Recipe, layout: Layout, precision: Precision) -> dict[str, Any]:
    """The ds_config: batch values equal to the Trainer's (DeepSpeed and the Trainer both check them)."""
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

    config: dict[str, Any] = {
        "train_batch_size": layout.global_batch_size,
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.gradient_accumulation_steps,
        "gradient_clipping": tr.max_grad_norm,
        "zero_optimization": zero,
        "steps_per_print": 1_000_000,  # the Trainer logs; DeepSpeed's own step prints are noise
        "wall_clock_breakdown": False,
    }
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
    }
    if tr.max_steps:
        args["max_steps"] = tr.max_steps
    else:
        args["num_train_epochs"] = tr.epochs
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
    env.update(hw.env)
    return dict(sorted(env.items()))


def pip_packages(recipe: Recipe, family: ImageFamily, deepspeed: bool) -> list[str]:
    """Pinned requirements the Dockerfile installs on top of torch (and torch_npu).

    The packages the base image pins for its own tools (CANN's protobuf) are pinned again, so that pip refuses a
    stack that would replace them instead of silently upgrading them.
    """
    wanted = dict(family.packages)
    if not deepspeed:
        wanted.pop("deepspeed", None)
    if recipe.mode.kind not in ("lora", "qlora"):
        wanted.pop("peft", None)
    if "tensorboard" not in recipe.train.report_to:
        wanted.pop("tensorboard", None)
    wanted.update(family.base_packages)
    pins = [f"{name}=={version}" for name, version in sorted(wanted.items())]
    if recipe.mode.kind == "qlora" and family.bitsandbytes:
        pins.append(family.bitsandbytes)
    return pins


def launch_spec(recipe: Recipe, plan: Plan) -> dict[str, Any]:
    """launch.json: everything the pod's launcher needs, as data (run.sh itself holds no recipe value).

    The launcher (runtime/launch.py) checks Volcano's variables against these numbers, waits for the master's DNS
    name, exports ``env`` (each key overridable from the pod spec) and execs torchrun. Keeping this data out of shell
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
        "env": plan.env,
        "module": TRAIN_MODULE,
        "args": ["--resume", "auto"],
    }


def volcano_job(recipe: Recipe, plan: Plan) -> dict[str, Any]:
    """The ``batch.volcano.sh/v1alpha1`` Job: gang-scheduled, env+svc plugins, restart on eviction or failure."""
    hw, cl = recipe.hw, recipe.cluster
    labels = {"app.kubernetes.io/name": plan.job_name, "app.kubernetes.io/managed-by": "recipekit"}
    resources: dict[str, Any] = {"cpu": str(plan.pod_cpus), "memory": f"{plan.pod_memory_gib}Gi"}
    if hw.device_resource:
        resources[hw.device_resource] = str(plan.layout.devices_per_pod)

    annotations = dict(NO_SIDECAR)
    if plan.superpod_block is not None:
        annotations["sp-block"] = str(plan.superpod_block)
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{cl.shm_gib}Gi"}},
        {"name": "shared", "persistentVolumeClaim": {"claimName": cl.pvc_claim}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "shared", "mountPath": cl.mount_path},
    ]
    for path, kind in hw.host_mounts.items():
        name = host_volume_name(path)
        volumes.append({"name": name, "hostPath": {"path": path, "type": kind}})
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
    par = recipe.parallel
    if par.nvme_path and "nvme" in (par.offload_optimizer, par.offload_param):
        volumes.append({"name": "nvme", "hostPath": {"path": par.nvme_path, "type": "DirectoryOrCreate"}})
        mounts.append({"name": "nvme", "mountPath": par.nvme_path})

    container = {
        "name": "trainer",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["bash", f"{WORKDIR}/{RUN}"],
        "workingDir": WORKDIR,
        "ports": [{"name": "rendezvous", "containerPort": plan.master_port, "protocol": "TCP"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": mounts,
    }
    if hw.device_env_from_annotation:
        container["env"] = [
            {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{annotation}']"}}}
            for name, annotation in sorted(hw.device_env_from_annotation.items())
        ]
    pod_spec: dict[str, Any] = {
        # Volcano, not the kubelet, restarts: a lone restarted rank could never rejoin a static rendezvous.
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "containers": [container],
        "volumes": volumes,
    }
    # The image is built for one CPU architecture: a pod on a node of another fails with "exec format error".
    pod_spec["nodeSelector"] = {**hw.node_selector, ARCH_LABEL: hw.arch, **hw.arch_node_selector.get(hw.arch, {})}
    if cl.priority_class:
        pod_spec["priorityClassName"] = cl.priority_class

    spec: dict[str, Any] = {
        "schedulerName": "volcano",
        "minAvailable": plan.layout.nodes,
        "queue": cl.queue,
        "maxRetry": cl.max_retry,
        # Ranks resolve each other before any pod is Ready (none is until training runs).
        "plugins": {"env": [], "svc": ["--publish-not-ready-addresses"]},
        "policies": [
            {"event": "PodEvicted", "action": "RestartJob"},
            {"event": "PodFailed", "action": "RestartJob"},
            {"event": "TaskCompleted", "action": "CompleteJob"},
        ],
        "tasks": [
            {
                "name": plan.task_name,
                "replicas": plan.layout.nodes,
                "template": {
                    "metadata": {"labels": {**labels, **hw.pod_labels}, "annotations": annotations},
                    "spec": pod_spec,
                },
            }
        ],
    }
    if cl.priority_class:
        spec["priorityClassName"] = cl.priority_class
    metadata: dict[str, Any] = {
        "name": plan.job_name,
        "namespace": cl.namespace,
        # MindCluster reads the device labels on the Job as well as on its pods
        "labels": {**labels, **hw.pod_labels, "recipekit.io/version": __version__, "recipekit.io/run": plan.run_id},
    }
    if plan.superpod_block is not None:
        metadata["annotations"] = {"sp-block": str(plan.superpod_block)}
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": metadata, "spec": spec}
