"""The typed Recipe: what a user may say, and nothing else.

Every section is a closed record (:class:`~recipekit.recipe.schema.Section`) so a misspelled key is an error rather than
a silently ignored setting. Each field carries a description: it is the documentation ``recipekit show`` and the recipes
README point to. Sections only check what one section can know on its own (types, ranges, enums); rules that need two
sections (global batch divisibility, precision against hardware, devices per pod) live in :mod:`recipekit.plan.plan`,
where the arithmetic is, so the error can show it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from recipekit.base.errors import Problem
from recipekit.recipe.domains import (
    ABSOLUTE_PATH,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    ENV_NAME,
    EXTENDED_RESOURCE,
    HOST_PATH,
    IFNAMES,
    IMAGE_REGISTRY,
    INDEX_URL,
    IP_ADDRESS,
    LABEL_KEY,
    LABEL_VALUE,
    LOCATION,
    MODULE_NAME,
    MOUNT_PATH,
    SHORT_NAME,
)
from recipekit.recipe.schema import Allow, Section, Tagged, field_types, sections_in, spec, unknown_key_hint, validate
from recipekit.runtime.boundary.contract import DEVICE_TARGETS

#: Upper bounds that keep every derived number meaningful (and far above any real model, cluster or schedule).
_MAX_DIM = 2**24
_MAX_COUNT = 10**12


# --------------------------------------------------------------------------------------------------------- model
class ParamCountsSpec(Section):
    """Exact parameter counts of a model, per part, as transformers builds it (written by `recipekit model import`
    from the model instantiated on the meta device). Stored so the planner uses them without importing torch."""

    embedding: int = spec(ge=0, le=_MAX_COUNT, description="Input embedding (a tied head is counted here, once).")
    attention: int = spec(ge=0, le=_MAX_COUNT, description="q/k/v/o projections and their biases, all layers.")
    mlp: int = spec(ge=0, le=_MAX_COUNT, description="Dense MLPs and shared experts, all layers.")
    experts: int = spec(0, ge=0, le=_MAX_COUNT, description="Routed experts, all layers (MoE).")
    router: int = spec(0, ge=0, le=_MAX_COUNT, description="Router (gate) weights, all layers (MoE).")
    norms: int = spec(ge=0, le=_MAX_COUNT, description="Every norm weight, the final norm included.")
    head: int = spec(0, ge=0, le=_MAX_COUNT, description="Output head; 0 when tied to the embedding.")
    other: int = spec(0, ge=0, le=_MAX_COUNT, description="Parameters in none of the parts above.")
    total: int = spec(gt=0, le=_MAX_COUNT, description="All parameters: what memory is counted from.")
    active: int = spec(
        gt=0,
        le=_MAX_COUNT,
        description="Parameters one token uses (routed experts × top-k / "
        "experts): what FLOPs and MFU are counted from; equals total for a dense model.",
    )
    linear: int = spec(
        ge=0,
        le=_MAX_COUNT,
        description="Weights of the decoder layers' nn.Linear modules (what LoRA can adapt and QLoRA quantizes).",
    )
    largest_module: int = spec(
        gt=0,
        le=_MAX_COUNT,
        description="Parameters of the biggest single module (its own, not its children's): ZeRO-3 gathers it whole.",
    )

    def rules(self) -> list[str | tuple[str, str]]:
        parts = self.embedding + self.attention + self.mlp + self.experts + self.router + self.norms + self.head
        broken: list[str | tuple[str, str]] = []
        if parts + self.other != self.total:
            broken.append(("total", f"the parts add up to {parts + self.other}, not {self.total}"))
        if self.active > self.total:
            broken.append(("active", f"{self.active} active parameters exceed the {self.total} in total"))
        return broken


#: Architecture families (transformers' ``model_type``) recipekit can plan and dry-run: each has a tiny twin.
FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "glm4")


class ModelSpec(Section):
    """A decoder-only transformer, described by its architecture numbers so that no download is ever needed."""

    name: str = spec(domain=SHORT_NAME, description="Short name, used in bundle and job names.")
    description: str = spec("", description="One line shown by `recipekit list model`.")
    family: Literal["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "glm4"] = spec(
        description="Architecture family (transformers' model_type); the tiny twin shares it."
    )
    architecture: str = spec(
        "", domain=MODULE_NAME, description="transformers model class, e.g. Qwen3MoeForCausalLM ('' = the family's)."
    )
    name_or_path: str = spec(
        domain=LOCATION, description="Weights and tokenizer: a path on the shared volume (or a hub id); one line."
    )
    init: Literal["pretrained", "random"] = spec(
        "pretrained",
        description="random: build from these numbers with random weights and a locally trained tokenizer.",
    )
    num_layers: int = spec(gt=0, le=10_000, description="Decoder layers (num_hidden_layers).")
    hidden_size: int = spec(gt=0, le=_MAX_DIM, description="Model width.")
    num_attention_heads: int = spec(gt=0, le=65_536, description="Query heads.")
    num_kv_heads: int = spec(gt=0, le=65_536, description="Key/value heads (grouped-query attention).")
    head_dim_override: int = spec(
        0,
        ge=0,
        le=65_536,
        description="Width of one head where it is not hidden_size / heads (Qwen3: 128); 0 = derived.",
    )
    qk_norm: bool = spec(False, description="RMSNorm on each head's queries and keys (Qwen3).")
    intermediate_size: int = spec(gt=0, le=_MAX_DIM, description="SwiGLU MLP width (dense layers).")
    vocab_size: int = spec(gt=0, le=_MAX_DIM, description="Tokenizer vocabulary (embedding rows).")
    max_position_embeddings: int = spec(gt=0, le=_MAX_DIM, description="Longest sequence the model was trained for.")
    tie_word_embeddings: bool = spec(False, description="Output head shares the input embedding.")
    rope_theta: float = spec(500000.0, gt=0, le=1e12, description="RoPE base.")
    rms_norm_eps: float = spec(1e-5, ge=1e-12, le=1, description="RMSNorm epsilon.")
    attention_bias: bool = spec(False, description="q/k/v projections carry a bias (Qwen2 does).")
    num_experts: int = spec(0, ge=0, le=65_536, description="Routed experts per MoE layer; 0 = a dense model.")
    experts_per_token: int = spec(0, ge=0, le=65_536, description="Experts each token is routed to (top-k).")
    moe_intermediate_size: int = spec(0, ge=0, le=_MAX_DIM, description="One routed expert's SwiGLU width.")
    shared_expert_intermediate_size: int = spec(
        0, ge=0, le=_MAX_DIM, description="Width of the always-on shared expert (Qwen2-MoE style); 0 = none."
    )
    router_aux_loss_coef: float = spec(
        0.001, ge=0, le=100, description="Weight of the router's load-balancing loss, added to the loss in training."
    )
    router_aux_loss: bool = spec(
        True, description="Train with the load-balancing loss (transformers' output_router_logits) on MoE models."
    )
    min_transformers: str = spec(
        "", pattern=r"(\d+(\.\d+){0,2})?", description="Oldest transformers release with this architecture."
    )
    params: ParamCountsSpec | None = spec(
        None, description="Exact counts from `recipekit model import`; None: counted from the numbers above."
    )
    trust_remote_code: bool = spec(False, description="Allow model code from the checkpoint; off unless needed.")

    def rules(self) -> list[str | tuple[str, str]]:
        broken: list[str | tuple[str, str]] = []
        if not self.head_dim_override and self.hidden_size % self.num_attention_heads:
            broken.append(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_kv_heads:
            broken.append(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.num_experts:
            if not 0 < self.experts_per_token <= self.num_experts:
                broken.append(
                    (
                        "experts_per_token",
                        f"must be 1..num_experts ({self.num_experts}) for an MoE model (got {self.experts_per_token})",
                    )
                )
            if not self.moe_intermediate_size:
                broken.append(("moe_intermediate_size", "must be set for an MoE model (num_experts > 0)"))
        elif self.experts_per_token or self.moe_intermediate_size:
            broken.append(("num_experts", "is 0 (a dense model) but experts_per_token/moe_intermediate_size are set"))
        return broken

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_attention_heads

    @property
    def moe(self) -> bool:
        return self.num_experts > 0


# ---------------------------------------------------------------------------------------------------------- mode
class LoraSpec(Section):
    """PEFT LoRA adapter settings (``peft.LoraConfig``)."""

    r: int = spec(16, gt=0, le=1024, description="Adapter rank.")
    alpha: int = spec(32, gt=0, le=65_536, description="Scaling numerator (lora_alpha).")
    dropout: float = spec(0.05, ge=0, lt=1, description="Dropout on the adapter input.")
    target_modules: Literal["all-linear"] | list[Annotated[str, MODULE_NAME]] = spec(
        "all-linear", description="Module names to adapt, or 'all-linear'."
    )
    merge_on_save: bool = spec(False, description="Also write the base model with the adapter merged in.")


class QuantSpec(Section):
    """4-bit base-model loading for QLoRA (bitsandbytes ``BitsAndBytesConfig``)."""

    bits: Literal[4] = spec(4, description="Weight bits of the frozen base model.")
    quant_type: Literal["nf4", "fp4"] = spec("nf4", description="4-bit data type.")
    double_quant: bool = spec(True, description="Quantize the quantization constants too.")


class _ModeBase(Section):
    description: str = spec("", description="One line shown by `recipekit list mode`.")


class PretrainMode(_ModeBase):
    """Train every parameter on raw text packed into fixed-length blocks."""

    kind: Literal["pretrain"] = spec(description="Which mode this is (selects the section's keys).")


class SftMode(_ModeBase):
    """Full supervised fine-tuning: every parameter, prompt tokens masked from the loss."""

    kind: Literal["sft"] = spec(description="Which mode this is (selects the section's keys).")


class LoraMode(_ModeBase):
    """Supervised fine-tuning of a LoRA adapter on a frozen base model."""

    kind: Literal["lora"] = spec(description="Which mode this is (selects the section's keys).")
    lora: LoraSpec = spec(default_factory=LoraSpec, description="The adapter.")


class QloraMode(_ModeBase):
    """LoRA on a 4-bit base model (bitsandbytes, on the image families that have a build: `recipekit list mode`)."""

    kind: Literal["qlora"] = spec(description="Which mode this is (selects the section's keys).")
    lora: LoraSpec = spec(default_factory=LoraSpec, description="The adapter.")
    quant: QuantSpec = spec(default_factory=QuantSpec, description="How the frozen base model is quantized.")


ModeSpec = Annotated[PretrainMode | SftMode | LoraMode | QloraMode, Tagged("kind")]


def adapter_of(mode: PretrainMode | SftMode | LoraMode | QloraMode) -> LoraSpec | None:
    """The LoRA adapter a mode trains, or None when it trains every parameter (the modes of
    ``contract.ADAPTER_MODES``: a test holds the two together)."""
    return mode.lora if isinstance(mode, (LoraMode, QloraMode)) else None


# ------------------------------------------------------------------------------------------------------ hardware
class HardwareSpec(Section):
    """One accelerator type and the node it comes in. Peak figures are data, overridable per recipe."""

    name: str = spec(domain=SHORT_NAME, description="Short name (the option's file name).")
    description: str = spec("", description="One line shown by `recipekit list hw`.")
    vendor: str = spec(
        domain=SHORT_NAME,
        description="Chip maker (ascend, nvidia, cpu), named in reports; behaviour comes from the fields below.",
    )
    chip: str = spec(domain=SHORT_NAME, description="Chip id used in image tags and labels, e.g. 910b, a3, a100.")
    image_family: str = spec(domain=SHORT_NAME, description="Key into images/matrix.yaml.")
    device_resource: str | None = spec(
        domain=EXTENDED_RESOURCE,
        description="Extended resource the device plugin advertises, domain/name (None for CPU).",
    )
    devices_per_node: int = spec(gt=0, le=64, description="Accelerators in one server.")
    memory_gib: float = spec(ge=0.01, le=65_536, description="Memory per device, GiB.")
    peak_tflops_bf16: float = spec(
        ge=0.001, le=1e6, description="Dense bf16 peak per device, TFLOP/s (MFU denominator)."
    )
    peak_tflops_fp16: float = spec(ge=0.001, le=1e6, description="Dense fp16 peak per device, TFLOP/s.")
    supports_bf16: bool = spec(description="bf16 arithmetic available (910B/A3/Ampere+: yes; 910A, V100: no).")
    supports_fp16: bool = spec(True, description="fp16 arithmetic available (accelerators: yes; CPU training: no).")
    torch_device: Literal[DEVICE_TARGETS] = spec(  # type: ignore[valid-type]  # the runtime's own list
        description="torch device type the training processes must find; train.py refuses to run on another."
    )
    ds_accelerator: str = spec(
        pattern=r"^[a-z][a-z0-9_]*$", description="DeepSpeed's accelerator name (DS_ACCELERATOR): npu, cuda, cpu."
    )
    optimizer: str = spec(
        pattern=r"^[a-z][a-z0-9_]*$",
        description="Trainer `optim` on this device: its fused AdamW where it has one (adamw_torch_npu_fused, ...).",
    )
    visible_devices_env: str | None = spec(
        None,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="Variable that limits a process to some devices (ASCEND_RT_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES).",
    )
    runtime_context_gib: float = spec(
        0.0,
        ge=0,
        le=64,
        description="Device memory the runtime holds before PyTorch allocates (CUDA context; CANN, HCCL buffers).",
    )
    assumed_mfu: float = spec(0.4, gt=0, le=1, description="Model FLOPs utilisation assumed for time estimates.")
    comm_backend: Literal["hccl", "nccl", "gloo"] = spec(description="torch.distributed backend.")
    intra_node_link: str = spec(max_length=64, description="Device interconnect inside a node (HCCS, NVLink, ...).")
    intra_node_gbps: float = spec(
        ge=0.001, le=1e6, description="Per-device intra-node bandwidth, GB/s (one direction)."
    )
    inter_node_link: str = spec(max_length=64, description="Network between nodes (RoCE, InfiniBand, Ethernet).")
    inter_node_gbps: float = spec(ge=0.001, le=1e6, description="Per-node inter-node bandwidth, GB/s (one direction).")
    node_selector: dict[Annotated[str, LABEL_KEY], Annotated[str, LABEL_VALUE]] = spec(
        default_factory=dict, description="Kubernetes nodeSelector for the pods (label keys and values)."
    )
    pod_labels: dict[Annotated[str, LABEL_KEY], Annotated[str, LABEL_VALUE]] = spec(
        default_factory=dict,
        description="Labels the device scheduler needs (on the Job and its pod template; label keys and values).",
    )
    host_mounts: dict[Annotated[str, HOST_PATH], Literal["Directory", "File"]] = spec(
        default_factory=dict,
        description="Host paths mounted read-only at the same path (drivers) and what they must be: a pod on a node "
        "that lacks one fails to start with the path named, instead of getting an empty directory in its place.",
    )
    device_env_from_annotation: dict[Annotated[str, ENV_NAME], Annotated[str, LABEL_KEY]] = spec(
        default_factory=dict,
        description="Container env filled from a pod annotation by the downward API (the Ascend device plugin's "
        "Volcano mode writes the allocated NPUs into annotation huawei.com/Ascend910: ASCEND_VISIBLE_DEVICES).",
    )
    superpod_devices: int | None = spec(
        None,
        gt=0,
        le=1_000_000,
        description="Devices in one physical SuperPoD (Atlas 900 A3: 384); set, the Job asks MindCluster for "
        "SuperPoD affinity with an sp-block annotation.",
    )
    node_cpus: int = spec(32, gt=0, le=4096, description="CPU cores a node offers to pods (allocatable).")
    node_memory_gib: int = spec(256, gt=0, le=65536, description="Host memory a node offers to pods, GiB.")
    env: dict[Annotated[str, ENV_NAME], Annotated[str, Allow("\t")]] = spec(
        default_factory=dict,
        description="Collective-library env defaults the launcher exports (launch.json): names are C identifiers; a "
        "value is one line of text (tabs allowed), passed byte for byte to the process environment (never through a "
        "shell).",
    )
    price_per_device_hour: float | None = spec(None, ge=0, le=1e6, description="Cost of one device for one hour.")
    archs: list[Literal["amd64", "arm64"]] = spec(
        description="CPU architectures this hardware's servers come with (Kubernetes names: amd64, arm64)."
    )
    arch: Literal["amd64", "arm64"] = spec(
        description="The nodes' CPU architecture: the image is built for it and the Job selects nodes of it."
    )
    arch_node_selector: dict[
        Literal["amd64", "arm64"], dict[Annotated[str, LABEL_KEY], Annotated[str, LABEL_VALUE]]
    ] = spec(
        default_factory=dict,
        description="Extra node labels per architecture (MindCluster labels Ascend hosts host-arch: huawei-arm or "
        "huawei-x86), added to kubernetes.io/arch.",
    )

    def rules(self) -> list[str | tuple[str, str]]:
        if self.arch not in self.archs:
            return [f"arch {self.arch!r} is not one of {self.name}'s architectures (archs: {', '.join(self.archs)})"]
        return []


# ------------------------------------------------------------------------------------------------------ parallel
class ParallelSpec(Section):
    """Data parallelism (plain DDP or a DeepSpeed ZeRO stage, with optional offload) and tensor parallelism."""

    name: str = spec(domain=SHORT_NAME, description="Short name (the option's file name).")
    description: str = spec("", description="One line shown by `recipekit list parallel`.")
    zero_stage: Literal[0, 1, 2, 3] = spec(description="0 = DDP without DeepSpeed; 1-3 = ZeRO stage.")
    offload_optimizer: Literal["none", "cpu", "nvme"] = spec("none", description="Where optimizer states live.")
    offload_param: Literal["none", "cpu", "nvme"] = spec("none", description="Where parameters live (ZeRO-3 only).")
    nvme_path: str | None = spec(None, domain=HOST_PATH, description="Local NVMe directory for nvme offload.")
    gradient_checkpointing: bool = spec(False, description="Recompute activations in backward to save memory.")
    overlap_comm: bool = spec(True, description="Overlap gradient reduction with backward (ZeRO).")
    reduce_bucket_size: int = spec(
        500_000_000, gt=0, le=_MAX_COUNT, description="Elements per gradient reduction bucket."
    )
    tensor_parallel: int = spec(
        1,
        ge=1,
        le=4096,
        description="Tensor-parallel degree: DeepSpeed AutoTP inside a pod (full training, ZeRO 0-2); world size = "
        "TP × data-parallel size.",
    )
    pipeline_parallel: int = spec(
        1,
        ge=1,
        le=4096,
        description="Pipeline stages, at most the model's layers (analysed by plan only; build needs 1).",
    )
    expert_parallel: int = spec(
        1,
        ge=1,
        le=65_536,
        description="Expert-parallel degree of an MoE model: each rank holds experts / EP of every MoE layer "
        "(analysed by plan only; build needs 1).",
    )


# ---------------------------------------------------------------------------------------------------------- data
class DataSpec(Section):
    """Training data on the shared volume."""

    name: str = spec(domain=SHORT_NAME, description="Short name (the option's file name).")
    description: str = spec("", description="One line shown by `recipekit list data`.")
    format: Literal["alpaca", "messages", "text"] = spec(
        description="alpaca: instruction/input/output records; messages: chat records; text: raw text. Records "
        "come as JSON lines, JSON arrays, Parquet or Arrow files; text also as .txt files."
    )
    path: str = spec(
        domain=LOCATION,
        description="A file, a directory (its data files) or a glob (corpus/**/*.jsonl) on the shared volume.",
    )
    max_len: int = spec(2048, gt=0, le=_MAX_DIM, description="Sequence length (truncation; block size when packing).")
    packing: bool = spec(False, description="Pack several samples into one sequence.")
    num_samples: int | None = spec(
        None,
        gt=0,
        le=_MAX_COUNT,
        description="Records (pretraining: blocks) per epoch: the estimate until num_rows is set.",
    )
    num_rows: int | None = spec(
        None,
        gt=0,
        le=_MAX_COUNT,
        description="Training rows per epoch, exact once the data is prepared (recipekit plan --data).",
    )
    num_tokens: int | None = spec(
        None,
        gt=0,
        le=_MAX_COUNT * 2**20,
        description="Tokens of the training rows per epoch (padding excluded): time and cost figures.",
    )
    eval_fraction: float = spec(0.0, ge=0, lt=1, description="Held-out fraction for evaluation.")
    max_bad_records: int = spec(
        0,
        ge=0,
        le=_MAX_COUNT,
        description="Bad records skipped (and reported) before preparing fails; 0: the first is fatal.",
    )
    shard_mib: float = spec(
        64.0, gt=0, le=65536, description="Input MiB per prepare work unit and output shard (split at record edges)."
    )
    prepared_dir: str | None = spec(
        None,
        domain=ABSOLUTE_PATH,
        description="Where prepared shards live on the shared volume, one directory per fingerprint, reused by "
        "every run with equal data, tokenizer and row settings (default: <cluster.output_dir>/prepared).",
    )
    fingerprint: Literal["stat", "content"] = spec(
        "stat",
        description="How data files are recognised for reuse: size and mtime (stat), or a sha256 of their content.",
    )
    streaming: bool = spec(
        False,
        description="Tokenise the input while training instead of preparing shards first, for a corpus the shared "
        "volume has no room for (object storage behind a FUSE mount): every rank reads the whole input and keeps its "
        "share; needs a step count (train.max_steps, or data.num_samples/num_rows) and no eval split.",
    )


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
    task_name: str = spec(
        "worker", domain=DNS_LABEL, description="Volcano task name (DNS-1123 label); pods read VC_<TASK>_HOSTS."
    )
    master_port: int = spec(29500, ge=1024, le=65535, description="Fixed rendezvous port on the first pod.")
    max_retry: int = spec(3, ge=1, le=1000, description="Job restarts Volcano allows before failing the Job.")
    mindcluster: MindClusterSpec = spec(
        default_factory=MindClusterSpec, description="MindCluster fault rescheduling on Ascend (off by default)."
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


# --------------------------------------------------------------------------------------------------------- train
class TrainSpec(Section):
    """Optimisation and bookkeeping; the Trainer arguments are derived from these by the plan."""

    micro_batch_size: int = spec(1, gt=0, le=65_536, description="Sequences per device per step.")
    gradient_accumulation_steps: int | None = spec(
        None,
        gt=0,
        le=1_048_576,
        description="Micro-steps per optimizer step; derived from global_batch_size when unset.",
    )
    global_batch_size: int | None = spec(
        None, gt=0, le=2**30, description="Sequences per optimizer step across all devices."
    )
    epochs: float = spec(1.0, gt=0, le=1e6, description="Passes over the data (ignored when max_steps is set).")
    max_steps: int | None = spec(None, gt=0, le=_MAX_COUNT, description="Optimizer steps; overrides epochs.")
    learning_rate: float = spec(2e-5, gt=0, lt=1, description="Peak learning rate.")
    lr_scheduler: Literal["cosine", "linear", "constant_with_warmup"] = spec("cosine", description="LR schedule.")
    warmup_ratio: float = spec(0.03, ge=0, lt=1, description="Fraction of steps spent warming up.")
    weight_decay: float = spec(0.0, ge=0, le=100, description="AdamW weight decay.")
    max_grad_norm: float = spec(1.0, gt=0, le=1e6, description="Gradient clipping norm.")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = spec("auto", description="auto: bf16 where supported.")
    save_steps: int = spec(500, gt=0, le=_MAX_COUNT, description="Checkpoint every N optimizer steps.")
    save_total_limit: int = spec(3, gt=0, le=100_000, description="Checkpoints kept (oldest deleted first).")
    logging_steps: int = spec(10, gt=0, le=_MAX_COUNT, description="Log every N optimizer steps.")
    seed: int = spec(42, ge=0, le=2**32 - 1, description="Random seed (NumPy's seeds are 32-bit).")
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "none"]] = spec(
        default_factory=lambda: ["tensorboard"], description="Trackers the Trainer reports to."
    )
    dataloader_workers: int = spec(4, ge=0, le=1024, description="DataLoader worker processes per device.")
    profile_steps: tuple[int, int] | None = spec(
        None,
        description="[first, last]: record a torch profiler trace (torch_npu's on Ascend) of these optimizer steps "
        "into output_dir/profile/ (keep the window short: a trace grows by megabytes per step).",
    )

    def rules(self) -> list[str]:
        if self.profile_steps is not None:
            first, last = self.profile_steps
            if not 1 <= first <= last:
                return [f"profile_steps {list(self.profile_steps)}: need 1 <= first <= last (steps count from 1)"]
        return []


# ----------------------------------------------------------------------------------------------------------- ops
class OpsTestingSpec(Section):
    """Fault injection — TESTING ONLY. Each switch breaks the run on purpose, once per output directory (a marker
    file there keeps the restarted job from breaking again), so that a drill or the dry run can prove that the
    operations layer notices and recovers. Never set these in a production recipe: ``build`` warns when any is set.
    """

    stall_rank: int = spec(0, ge=0, description="TESTING ONLY: the global rank that stalls (with stall_at_step).")
    stall_at_step: int | None = spec(
        None,
        ge=2,
        description="TESTING ONLY: stall_rank blocks forever when it begins this optimizer step (from 2: step 1 "
        "is covered by the startup timeouts), so the hang watchdog must detect it and the job restart.",
    )
    nan_at_step: int | None = spec(
        None, ge=1, description="TESTING ONLY: the loss of this optimizer step becomes NaN on every rank."
    )
    device_count: int | None = spec(
        None,
        ge=0,
        description="TESTING ONLY: preflight's device check sees this many devices instead of asking the driver "
        "(simulates a pod given the wrong number of devices; also on CPU).",
    )
    device_count_pod: int | None = spec(
        None,
        ge=0,
        description="TESTING ONLY: with device_count, only this pod (its Volcano task index) sees the wrong count, "
        "and only once per output directory: one faulty node, healed by a restart elsewhere (exit code preflight).",
    )
    user_error_pod: int | None = spec(
        None,
        ge=0,
        description="TESTING ONLY: this pod's processes stop before training with the configuration-error exit code "
        "(user_error), as a pod given a broken configuration would; never healed, so the Job must end unretried.",
    )
    record_rows: bool = spec(
        False,
        description="TESTING ONLY: every rank writes the row indices of each micro-batch it trains on to "
        "<output_dir>/rows/rank-R.jsonl, so a resume (also at another world size) can be checked sample by sample. "
        "Prepared data only (not data.streaming).",
    )


class OpsSpec(Section):
    """The operations layer every bundle carries: preflight checks, the hang watchdog and collective timeouts,
    metrics for Prometheus, and alert thresholds. Defaults are the operators' own; derived numbers (stall and
    collective timeouts, checkpoint sizes, bandwidth floors) are computed by recipekit.memory.operations from these."""

    preflight: bool = spec(
        True, description="Check devices, versions, shared storage and the collective on every pod before training."
    )
    preflight_timeout_s: int = spec(
        120, ge=10, le=3600, description="Preflight's collectives must finish within this; past it the pod fails."
    )
    allreduce_sizes_mb: list[float] = spec(
        default_factory=lambda: [1.0, 16.0, 256.0],
        description="Message sizes (MB) of preflight's all-reduce bandwidth test; the largest is held to the floor.",
    )
    allreduce_iterations: int = spec(10, ge=1, le=1000, description="Timed all-reduces per size (after 2 warm-ups).")
    bandwidth_warn_fraction: float = spec(
        0.5,
        gt=0,
        le=1,
        description="Warn when the all-reduce bus bandwidth is below this fraction of the hardware's link bandwidth "
        "(hw.inter_node_gbps across nodes, hw.intra_node_gbps within one).",
    )
    stall_timeout_floor_s: int = spec(
        300, ge=10, description="The hang watchdog's timeout is never shorter than this, seconds."
    )
    stall_timeout_factor: float = spec(
        10.0,
        ge=1,
        description="The hang watchdog fires when no optimizer step completes within this many planned step times "
        "(the plan's estimate), or the floor, whichever is longer.",
    )
    metrics_port: int | None = spec(
        9400,
        ge=1024,
        le=65535,
        description="Serve Prometheus metrics on this port (a process with local rank i uses port + i); null: off.",
    )
    metrics_bind: str = spec(
        "0.0.0.0",
        domain=IP_ADDRESS,
        description="Address the metrics endpoint listens on. 0.0.0.0 (every interface of the pod's own network "
        "namespace) is what Prometheus needs: it scrapes the pod IP. Choose 127.0.0.1 where the host's network is "
        "shared (hostNetwork, a bare-metal run) and a local agent scrapes; :: for IPv6.",
    )
    metrics_ranks: Literal["rank0", "all"] = spec(
        "all", description="Which processes serve metrics: global rank 0 only, or every rank (per-device figures)."
    )
    monitor_labels: dict[str, str] = spec(
        default_factory=dict,
        description="Labels on the PodMonitor and PrometheusRule, for the Prometheus that selects them "
        "(kube-prometheus-stack: release: <its release name>).",
    )
    loss_spike_ratio: float = spec(
        0.3, gt=0, description="Warn when the loss rises by more than this fraction from one logged step to the next."
    )
    grad_norm_jump_ratio: float = spec(
        0.3,
        gt=0,
        description="Warn when the gradient norm changes by more than this fraction, either way, in one logged step.",
    )
    mfu_target: float | None = spec(
        None,
        gt=0,
        le=1,
        description="Warn when MFU stays below this for mfu_low_steps; null: the MFU the plan assumes "
        "(hw.assumed_mfu, counted without recomputation).",
    )
    mfu_low_steps: int = spec(20, ge=1, description="Logged steps in a row below mfu_target before the warning.")
    checkpoint_save_limit_s: int = spec(
        600, gt=0, description="Warn when saving a checkpoint takes longer, seconds (twice this is a hang)."
    )
    device_utilisation_min: float = spec(
        0.5, ge=0, le=1, description="Warn when the device's utilisation (driver's figure) stays below this."
    )
    nonfinite_loss: Literal["stop", "warn"] = spec(
        "stop",
        description="A NaN/inf loss: stop (no checkpoint of the broken weights; the offending batch and a report "
        "are saved; non-zero exit) or only warn.",
    )
    testing: OpsTestingSpec = spec(default_factory=OpsTestingSpec, description="Fault injection: TESTING ONLY.")

    def rules(self) -> list[str]:
        broken = []
        sizes = self.allreduce_sizes_mb
        if not sizes or any(size <= 0 or size > 16384 for size in sizes):
            broken.append(f"allreduce_sizes_mb {sizes}: one or more sizes, each above 0 and at most 16384 MB")
        return broken


# -------------------------------------------------------------------------------------------------------- recipe
class Recipe(Section):
    """A complete, resolved recipe: one option of each group plus the training settings."""

    name: str = spec(
        pattern=r"[a-z]([a-z0-9._-]*[a-z0-9])?",
        max_length=200,
        description="Bundle name: lower case, starting with a letter (the Job's Service name, made from it, must be "
        "a DNS-1035 label).",
    )
    description: str = spec("", description="One line about this recipe.")
    model: ModelSpec = spec(description="The network (group `model`).")
    mode: ModeSpec = spec(description="What is trained and how (group `mode`), chosen by its `kind`.")
    hw: HardwareSpec = spec(description="The accelerator and its node (group `hw`).")
    parallel: ParallelSpec = spec(description="Data-parallel layout (group `parallel`).")
    data: DataSpec = spec(description="Training data (group `data`).")
    cluster: ClusterSpec = spec(description="Where the Volcano Job runs (group `cluster`).")
    train: TrainSpec = spec(default_factory=TrainSpec, description="Optimisation and bookkeeping.")
    ops: OpsSpec = spec(
        default_factory=OpsSpec, description="Preflight, hang watchdog, metrics and alerts (the operations layer)."
    )


def parse_recipe(raw: dict[str, Any]) -> Recipe:
    """Validate a plain dict into a Recipe; :class:`RecipeError` lists *every* problem found."""
    return validate(Recipe, raw)


def _section_fields(path: list[str]) -> set[str] | None:
    """The keys the section at ``path`` accepts (for ``mode``, those of every kind); None past a leaf or a dict."""
    sections: list[Any] = [Recipe]
    for part in path:
        found = [field_types(section)[part] for section in sections if part in field_types(section)]
        sections = [inner for annotation in found for inner in sections_in(annotation)]
        if not sections:
            return None
    return {name for section in sections for name in field_types(section)}


def unknown_override_keys(overrides: Sequence[str], groups: Sequence[str]) -> list[tuple[str, Problem]]:
    """(override, problem) for each plain ``key=value`` override whose key no recipe section has.

    Checked against the schema before composing, so a typo is reported with the keys that section does accept, and
    all typos cost no extra composition. ``+key`` (add) and ``~key`` (delete) are left to Hydra and the model, as
    are group choices.
    """
    found = []
    for override in overrides:
        key, sep, _ = override.partition("=")
        if not sep or key[:1] in "+~" or key in groups or re.split(r"[./]", key)[0] == "hydra":
            continue
        path = key.split(".")
        fields = _section_fields(path[:-1])
        if fields is not None and path[-1] not in fields:
            found.append((override, Problem(key, "unknown key", hint=unknown_key_hint(path[-1], list(fields)))))
    return found
