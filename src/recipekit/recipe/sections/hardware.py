"""The ``hw`` section: one accelerator type and the node it comes in; peak figures are data, overridable per recipe."""

from __future__ import annotations

from typing import Annotated, Literal

from recipekit.recipe.domains import (
    ENV_NAME,
    EXTENDED_RESOURCE,
    HOST_PATH,
    LABEL_KEY,
    LABEL_VALUE,
    SHORT_NAME,
)
from recipekit.recipe.schema import Allow, Section, spec
from recipekit.runtime.boundary.recipeview import DEVICE_TARGETS


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
    peak_tflops_fp8: float | None = spec(
        None,
        ge=0.001,
        le=1e6,
        description="Dense FP8 peak per device, TFLOP/s (Hopper: the datasheet's, without sparsity); None: no FP8 "
        "(train.precision=fp8 is refused).",
    )
    supports_bf16: bool = spec(description="bf16 arithmetic available (910B/A3/Ampere+: yes; 910A, V100: no).")
    supports_fp16: bool = spec(True, description="fp16 arithmetic available (accelerators: yes; CPU training: no).")
    torch_device: Literal[DEVICE_TARGETS] = spec(  # type: ignore[valid-type]  # the runtime's own list
        description="torch device type the training processes must find; train.py refuses to run on another."
    )
    fp32_matmul: Literal["hf32", "tf32"] | None = spec(
        None,
        omit_default=True,
        description="Reduced-precision fp32 matmuls the runtime enables at start: hf32 on Ascend "
        "(torch.npu.matmul.allow_hf32, torch.npu.conv.allow_hf32), tf32 on NVIDIA Ampere+ "
        "(torch.backends.cuda.matmul.allow_tf32, cudnn.allow_tf32); None: full fp32.",
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
    assumed_mfu: float = spec(
        0.4,
        gt=0,
        le=1,
        description="Model FLOPs utilisation of the whole step (bubbles and exposed communication included, "
        "recomputation not counted): model FLOPs per step / (step time × devices × peak). A published MFU gives the "
        "published step.",
    )
    assumed_mfu_attention: Literal["dense", "causal"] = spec(
        "dense",
        description="How assumed_mfu counts attention: dense (recipekit's FLOP counter, every S×S score) or causal "
        "(half of them, as NeMo and Megatron-Bridge report); a causal MFU is converted to recipekit's.",
    )
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
