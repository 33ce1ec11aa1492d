"""recipe.yaml's ``recipe``, ``plan`` and ``operations`` sections, as the runtime reads them: frozen dataclasses
holding exactly the keys some runtime module reads, nothing more, and the recipe values both sides act on.

recipekit writes recipe.yaml from its typed Recipe in the same build that copies this module into the bundle, so the
two always ship together: every key named here is present, and a recipe.yaml that lacks one was not written by this
bundle's recipekit. :func:`read_section` says which key, in one line, before any training starts. Keys recipe.yaml
carries for people (descriptions, sizes) and keys only recipekit reads are left out on purpose.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, fields
from typing import Any, TypeVar, Union

# ---------------------------------------------------------------------------------------------- recipe values
#: The modes that train a LoRA adapter on a frozen base (QLoRA: a 4-bit base). recipekit plans, sizes and pins them
#: by this; the runtime wraps the model in peft by it.
ADAPTER_MODES = ("lora", "qlora")


def trains_adapter(mode_kind: str) -> bool:
    """Whether a recipe's ``mode.kind`` trains a LoRA adapter (and not every parameter)."""
    return mode_kind in ADAPTER_MODES


#: The devices a bundle can target (``recipe.hw.torch_device``), which train.py finds or refuses before training.
DEVICE_TARGETS = ("npu", "cuda", "cpu")


class MissingKey(ValueError):
    """A key the runtime reads is absent from recipe.yaml, or holds a value of another shape."""


# -------------------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True, slots=True)
class PlanFlops:
    """recipe.yaml ``plan.flops``: the FLOPs per token the run's MFU is measured against."""

    model_per_token: float
    hardware_per_token: float
    peak_tflops: float


@dataclass(frozen=True, slots=True)
class RunPlan:
    """recipe.yaml's ``plan``, as the runtime reads it: the plan's numbers a run needs. recipekit writes these keys
    (``Plan.summary()``, which also carries numbers for people; a test holds the two together)."""

    job_name: str
    run_id: str
    prepared_dir: str
    world_size: int
    global_batch_size: int
    tensor_parallel: int
    zero_stage: int
    comm_backend: str
    flops: PlanFlops
    #: cluster.min_nodes: plan/rescale.py ``Elastic.summary()``; absent from the plan of a run that is not elastic
    elastic: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, plan: dict[str, Any]) -> RunPlan:
        """The typed plan; a missing key is a KeyError naming it (:func:`plan_keys` lists them all up front), a key
        with a default may be absent."""
        values = {
            f.name: plan[f.name]
            for f in fields(cls)
            if f.name != "flops" and (f.name in plan or f.default is dataclasses.MISSING)
        }
        flops = plan["flops"]
        return cls(**values, flops=PlanFlops(**{f.name: float(flops[f.name]) for f in fields(PlanFlops)}))


def elastic_accumulation(plan: RunPlan, world_size: int) -> int | None:
    """The gradient accumulation that keeps the plan's global batch at ``world_size``, when the plan is elastic and
    lists that size (plan/rescale.py decided it at build); None otherwise. A malformed table lists no size."""
    table = (plan.elastic or {}).get("accumulation") if isinstance(plan.elastic, dict) else None
    for row in table if isinstance(table, list) else []:
        if isinstance(row, dict) and row.get("world_size") == world_size:
            steps = row.get("gradient_accumulation_steps")
            if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
                return steps
    return None


def data_parallel_size(world_size: int, model_parallel: int = 1) -> int:
    """How many ranks see different data: the world over the ranks of one model replica (TP × PP). The one
    definition: the plan's layout, the runtime's global batch, the dry run's sample count and the Trainer's check."""
    return max(1, world_size // max(1, model_parallel))


def plan_keys() -> tuple[str, ...]:
    """The dotted keys of recipe.yaml's ``plan`` the runtime needs (``plan.flops.model_per_token``, ...)."""
    flat = [f"plan.{f.name}" for f in fields(RunPlan) if f.name != "flops" and f.default is dataclasses.MISSING]
    return (*flat, *(f"plan.flops.{f.name}" for f in fields(PlanFlops)))


# ------------------------------------------------------------------------------------------------------ recipe
@dataclass(frozen=True, slots=True)
class ModelView:
    """``recipe.model``: where the weights come from, and the architecture the random twin is built with."""

    name: str
    name_or_path: str
    init: str
    trust_remote_code: bool
    family: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim_override: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_theta: float
    rms_norm_eps: float
    attention_bias: bool
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    router_aux_loss_coef: float
    router_aux_loss: bool
    config: dict[str, Any] | None = None  # the architecture's transformers config; None: built from the numbers above


@dataclass(frozen=True, slots=True)
class LoraView:
    """``recipe.mode.lora``: the adapter's shape, and whether rank 0 also saves a merged model."""

    r: int
    alpha: int
    dropout: float
    target_modules: str | list[str]
    merge_on_save: bool


@dataclass(frozen=True, slots=True)
class QuantView:
    """``recipe.mode.quant``: QLoRA's 4-bit base."""

    quant_type: str
    double_quant: bool


@dataclass(frozen=True, slots=True)
class ModeView:
    """``recipe.mode``: the kind, and the LoRA and quantisation settings of the modes that have them."""

    kind: str
    lora: LoraView | None = None
    quant: QuantView | None = None

    def __post_init__(self) -> None:
        if trains_adapter(self.kind) and self.lora is None:
            raise MissingKey(f"recipe.mode.lora is missing (mode {self.kind} trains an adapter)")
        if self.kind == "qlora" and self.quant is None:
            raise MissingKey("recipe.mode.quant is missing (mode qlora loads a 4-bit base)")


@dataclass(frozen=True, slots=True)
class HardwareView:
    """``recipe.hw``: the target device and what a pod must mount and request to see it."""

    name: str
    torch_device: str
    ds_accelerator: str
    visible_devices_env: str | None
    device_resource: str | None
    host_mounts: dict[str, str]
    runtime_context_gib: float
    fp32_matmul: str | None = None  # hf32 / tf32: runtime/matmulmode.py enables it at start


@dataclass(frozen=True, slots=True)
class ParallelView:
    """``recipe.parallel``: the ZeRO stage (MoE blocks become ZeRO-3 leaves by it) and where states are offloaded
    (whether a checkpoint can be re-sharded for another world size, reshard.py)."""

    zero_stage: int
    offload_optimizer: str
    offload_param: str


@dataclass(frozen=True, slots=True)
class DataView:
    """``recipe.data``: the dataset and how it is cut, checked and tokenised."""

    format: str
    path: str
    max_len: int
    packing: bool
    eval_fraction: float
    max_bad_records: int
    shard_mib: float
    fingerprint: str
    streaming: bool


@dataclass(frozen=True, slots=True)
class ClusterView:
    """``recipe.cluster``: where the shared volume is mounted in the pods."""

    mount_path: str


@dataclass(frozen=True, slots=True)
class HotCheckpointsView:
    """``recipe.train.hot_checkpoints``: the node-local hot tier of the checkpoints (volume/hottier.py)."""

    medium: str
    mount_path: str
    keep: int


@dataclass(frozen=True, slots=True)
class ColdCheckpointsView:
    """``recipe.train.cold_checkpoints``: the command that copies checkpoints to a cold store (volume/coldtier.py)."""

    command: list[str]
    every: int
    timeout_s: int


@dataclass(frozen=True, slots=True)
class TrainView:
    """``recipe.train``: the profiler window and the checkpoints' hot and cold tiers (absent: none; the Trainer's
    own arguments are recipe.yaml's training_arguments)."""

    profile_steps: list[int] | None
    hot_checkpoints: HotCheckpointsView | None = None
    cold_checkpoints: ColdCheckpointsView | None = None


@dataclass(frozen=True, slots=True)
class EvalView:
    """``recipe.eval``: the benchmark after training (absent from recipe.yaml while off)."""

    enabled: bool
    tasks: list[str]
    task_dir: str | None
    limit: int | None
    num_fewshot: int | None
    batch_size: int


@dataclass(frozen=True, slots=True)
class RecipeView:
    """recipe.yaml's ``recipe``, as the runtime reads it."""

    name: str
    model: ModelView
    mode: ModeView
    hw: HardwareView
    parallel: ParallelView
    data: DataView
    cluster: ClusterView
    train: TrainView
    eval: EvalView | None = None  # recipe.yaml leaves the section out while it has its default (off)


# -------------------------------------------------------------------------------------------------- operations
@dataclass(frozen=True, slots=True)
class PreflightView:
    """``operations.preflight``: whether preflight runs and gates (``mode``: strict, warn, off), and every threshold
    of its checks."""

    enabled: bool
    mode: str
    timeout_s: float
    allreduce_sizes_mb: list[float]
    allreduce_iterations: int
    link: str
    link_gbps: float
    bandwidth_warn_gbps: float
    devices_per_pod: int
    expected_versions: dict[str, str]
    checkpoint_bytes: int
    storage_needed_bytes: int
    collective_hint: str
    p2p_size_mb: float
    p2p_iterations: int
    p2p_max_rounds: int
    p2p_slow_fraction: float
    storage_probe_mb: int
    checkpoint_save_limit_s: float
    burn_in_s: int
    burn_in_slow_fraction: float
    burn_in_tflops: float


@dataclass(frozen=True, slots=True)
class WatchdogView:
    """``operations.watchdog``: the hang watchdog's timeouts per phase, and the step time the plan expects."""

    planned_step_time_s: float
    startup_timeout_s: float
    stall_timeout_s: float
    steady_timeout_s: float


@dataclass(frozen=True, slots=True)
class MetricsView:
    """``operations.metrics``: the Prometheus ports (one per local rank), which ranks serve, and the address."""

    ports: list[int]
    ranks: str
    bind: str


@dataclass(frozen=True, slots=True)
class AlertsView:
    """``operations.alerts``: the in-process alert thresholds and what a non-finite loss does."""

    loss_spike_ratio: float
    grad_norm_jump_ratio: float
    mfu_target: float
    mfu_low_steps: int
    checkpoint_save_limit_s: float
    device_utilisation_min: float
    nonfinite_loss: str


@dataclass(frozen=True, slots=True)
class FaultsView:
    """``operations.testing``: faults injected on purpose (all None in a real run's bundle)."""

    stall_rank: int
    stall_at_step: int | None
    nan_at_step: int | None
    spike_rank: int
    spike_at_step: int | None
    device_count: int | None
    device_count_pod: int | None
    user_error_pod: int | None
    record_rows: bool


@dataclass(frozen=True, slots=True)
class OperationsView:
    """recipe.yaml's ``operations``, as the runtime reads it."""

    preflight: PreflightView
    watchdog: WatchdogView
    metrics: MetricsView
    alerts: AlertsView
    testing: FaultsView


# ----------------------------------------------------------------------------------------------------- reading
T = TypeVar("T")
_SCALARS: dict[type, tuple[type, ...]] = {
    bool: (bool,),
    int: (int,),
    float: (int, float),
    str: (str,),
}


def _convert(hint: object, value: object, where: str) -> object:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        members = typing.get_args(hint)
        if value is None and type(None) in members:
            return None
        for member in members:
            if member is type(None):
                continue
            try:
                return _convert(member, value, where)
            except MissingKey:
                continue
        raise MissingKey(f"{where} is {value!r}: expected {hint}")
    if origin is list:
        if not isinstance(value, list):
            raise MissingKey(f"{where} is {value!r}: expected a list")
        (item,) = typing.get_args(hint)
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise MissingKey(f"{where} is {value!r}: expected a mapping")
        if typing.get_args(hint)[1] is Any:  # JSON data (recipekit checked it: ModelSpec.config)
            return {str(k): v for k, v in value.items()}
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise MissingKey(f"{where} is {value!r}: expected a mapping")
        return read_section(hint, value, where)
    if isinstance(hint, type) and hint in _SCALARS:
        if isinstance(value, bool) and hint is not bool:
            raise MissingKey(f"{where} is {value!r}: expected {hint.__name__}")
        if not isinstance(value, _SCALARS[hint]):
            raise MissingKey(f"{where} is {value!r}: expected {hint.__name__}")
        return hint(value)
    raise TypeError(f"{where}: recipeview cannot read a {hint!r}")  # a field type this module does not support


def read_section(view: type[T], raw: dict[str, object], where: str) -> T:
    """``raw`` (one section of recipe.yaml) as ``view``; a missing or misshapen key is a MissingKey naming it."""
    hints = typing.get_type_hints(view)
    values: dict[str, object] = {}
    for field in dataclasses.fields(view):  # type: ignore[arg-type]  # view is a dataclass type
        key = f"{where}.{field.name}"
        if field.name in raw:
            values[field.name] = _convert(hints[field.name], raw[field.name], key)
        elif field.default is dataclasses.MISSING:
            raise MissingKey(f"{key} is missing")
    return view(**values)
