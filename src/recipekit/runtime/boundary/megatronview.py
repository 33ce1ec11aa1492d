"""recipe.yaml's ``megatron`` section: the configuration a bundle of the Megatron engine trains with, as plain data.

recipekit compiles it from the recipe (the build side); the engine's room (``runtime/megatron/``) reads it with
:func:`read_megatron` and applies it to Megatron-Bridge's own base recipe (``ConfigContainer``) before calling
Bridge's ``pretrain()`` or ``finetune()``. Both sides import this module, so the schema has one home. The reader
refuses what it does not know: an unknown section or field, a value of the wrong type, a choice outside its list,
a number below its floor; every problem of a document is collected and reported at once, each naming its key.

The document (the keys of a Bridge section are the same-named fields of that ``ConfigContainer`` section; a field
left out keeps the value of Bridge's base recipe: ``_pretrain_common()`` for ``pretrain``, ``_sft_common()`` or
``_peft_common()`` for ``finetune``)::

    megatron:
      recipekit:                       # the room's own settings (not Bridge's)
        entry: pretrain | finetune     # required; finetune for SFT and LoRA
        output_dir: /abs/path          # required; checkpoints/, hf/, metrics.jsonl go here
        export_hf: true                # HF weights into <output_dir>/hf at the end (merged, under LoRA)
      model:                           # the GPT provider AutoBridge makes from the HF config, then these
        tensor_model_parallel_size: 2          # required, >= 1 (each size below: >= 1)
        pipeline_model_parallel_size: 2        # required
        virtual_pipeline_model_parallel_size: null
        num_layers_in_first_pipeline_stage: null   # an edge stage of its own length (the rest split evenly)
        num_layers_in_last_pipeline_stage: null
        expert_model_parallel_size: 1          # required
        expert_tensor_parallel_size: null
        context_parallel_size: 1               # required
        sequence_parallel: false               # required
        seq_length: 128                        # required: rows are padded or cut to it
        transformer_impl: transformer_engine | local
        attention_backend: auto | local | flash | fused | unfused
        recompute_granularity: full | selective | null
        recompute_method: uniform | block | null
        recompute_num_layers: null
        recompute_modules: [core_attn]         # selective recompute's modules
        moe_token_dispatcher_type: alltoall | allgather | flex
        moe_grouped_gemm: false                # both need TE's kernels (a provider may default them on)
        moe_permute_fusion: false
        moe_aux_loss_coeff: 0.001
        moe_router_load_balancing_type: aux_loss | seq_aux_loss | sinkhorn | none
        calculate_per_token_loss: false
        bias_activation_fusion: false   # and masked_softmax_fusion, bias_dropout_fusion, apply_rope_fusion,
                                        # gradient_accumulation_fusion, persist_layer_norm, cross_entropy_loss_fusion
      train:
        micro_batch_size: 2                    # required
        global_batch_size: 8                   # required: micro × accumulation × data-parallel size
        train_iters: 8                         # required
        eval_iters: 0
        eval_interval: null
        manual_gc: false
        manual_gc_interval: 0
        exit_signal_handler: true              # SIGTERM → checkpoint → exit (the operations contract)
      optimizer:
        optimizer: adam | sgd
        lr: 1.0e-3                             # required
        min_lr: 0.0
        weight_decay: 0.01
        adam_beta1: 0.9
        adam_beta2: 0.95
        adam_eps: 1.0e-8
        clip_grad: 1.0
        use_distributed_optimizer: true        # must equal ddp.use_distributed_optimizer
      scheduler:
        lr_warmup_iters: 0
        lr_decay_iters: null
        lr_decay_style: constant | linear | cosine | inverse-square-root | WSD
      ddp:
        use_distributed_optimizer: true
        overlap_grad_reduce: false
        overlap_param_gather: false
        grad_reduce_in_fp32: true
        average_in_collective: true
        check_for_nan_in_grad: true
        bucket_size: null
      checkpoint:
        save_interval: 4                       # required
        most_recent_k: -1                      # checkpoints kept (-1: all)
        ckpt_format: torch_dist
        fully_parallel_save: true
        fully_parallel_load: false
      dist:
        distributed_backend: nccl | gloo       # required (gloo: the CPU dry run)
        distributed_timeout_minutes: 10
      rng:
        seed: 1234                             # required
      logger:
        log_interval: 1
      peft: null                               # or, for LoRA (entry finetune only):
        # scheme: lora
        # target_modules: [linear_qkv, linear_proj, linear_fc1, linear_fc2]
        # dim: 8
        # alpha: 16
        # dropout: 0.0
      mixed_precision: bf16_mixed | fp16_mixed | null   # required; null trains in fp32

Standard library only (shipped in every bundle of the engine).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The Bridge entries the room can start.
ENTRIES = ("pretrain", "finetune")


class MegatronDocError(ValueError):
    """A ``megatron`` document that the room must not start from: every problem, one per line."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Field:
    """One field's type: ``kind`` (bool, int, float, str, list), its choices or floor, whether null is allowed and
    whether the document must give it."""

    kind: type
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    nullable: bool = False
    required: bool = False

    def problem(self, value: Any) -> str | None:
        """Why ``value`` does not fit, or None."""
        if value is None:
            return None if self.nullable else "is null: expected a value"
        if self.kind is list:
            if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
                return f"is {value!r}: expected a list of names"
            return None
        fits = isinstance(value, bool) if self.kind is bool else not isinstance(value, bool)
        allowed: tuple[type, ...] = (int, float) if self.kind is float else (self.kind,)
        if not fits or not isinstance(value, allowed):
            return f"is {value!r}: expected {self.kind.__name__}"
        if self.choices and value not in self.choices:
            return f"is {value!r}: expected one of {', '.join(self.choices)}"
        if self.minimum is not None and isinstance(value, (int, float)) and value < self.minimum:
            return f"is {value!r}: expected at least {self.minimum:g}"
        return None


def _size(required: bool = False, nullable: bool = False) -> Field:
    return Field(int, minimum=1, required=required, nullable=nullable)


FLAG = Field(bool)
FUSIONS = (
    "bias_activation_fusion",
    "masked_softmax_fusion",
    "bias_dropout_fusion",
    "apply_rope_fusion",
    "gradient_accumulation_fusion",
    "persist_layer_norm",
    "cross_entropy_loss_fusion",
)

#: Bridge's ConfigContainer sections the document may set, and each field's type.
SECTIONS: dict[str, dict[str, Field]] = {
    "model": {
        "tensor_model_parallel_size": _size(required=True),
        "pipeline_model_parallel_size": _size(required=True),
        "virtual_pipeline_model_parallel_size": _size(nullable=True),
        "num_layers_in_first_pipeline_stage": _size(nullable=True),
        "num_layers_in_last_pipeline_stage": _size(nullable=True),
        "expert_model_parallel_size": _size(required=True),
        "expert_tensor_parallel_size": _size(nullable=True),
        "context_parallel_size": _size(required=True),
        "sequence_parallel": Field(bool, required=True),
        "seq_length": _size(required=True),
        "transformer_impl": Field(str, choices=("transformer_engine", "local")),
        "attention_backend": Field(str, choices=("auto", "local", "flash", "fused", "unfused")),
        "recompute_granularity": Field(str, choices=("full", "selective"), nullable=True),
        "recompute_method": Field(str, choices=("uniform", "block"), nullable=True),
        "recompute_num_layers": _size(nullable=True),
        "recompute_modules": Field(list, nullable=True),
        "moe_token_dispatcher_type": Field(str, choices=("alltoall", "allgather", "flex")),
        "moe_grouped_gemm": FLAG,
        "moe_permute_fusion": FLAG,
        "moe_aux_loss_coeff": Field(float, minimum=0),
        "moe_router_load_balancing_type": Field(str, choices=("aux_loss", "seq_aux_loss", "sinkhorn", "none")),
        "calculate_per_token_loss": FLAG,
        **{name: FLAG for name in FUSIONS},
    },
    "train": {
        "micro_batch_size": _size(required=True),
        "global_batch_size": _size(required=True),
        "train_iters": _size(required=True),
        "eval_iters": Field(int, minimum=0),
        "eval_interval": _size(nullable=True),
        "manual_gc": FLAG,
        "manual_gc_interval": Field(int, minimum=0),
        "exit_signal_handler": FLAG,
    },
    "optimizer": {
        "optimizer": Field(str, choices=("adam", "sgd")),
        "lr": Field(float, minimum=0, required=True),
        "min_lr": Field(float, minimum=0),
        "weight_decay": Field(float, minimum=0),
        "adam_beta1": Field(float, minimum=0),
        "adam_beta2": Field(float, minimum=0),
        "adam_eps": Field(float, minimum=0),
        "clip_grad": Field(float, minimum=0),
        "use_distributed_optimizer": FLAG,
    },
    "scheduler": {
        "lr_warmup_iters": Field(int, minimum=0),
        "lr_decay_iters": _size(nullable=True),
        "lr_decay_style": Field(str, choices=("constant", "linear", "cosine", "inverse-square-root", "WSD")),
    },
    "ddp": {
        "use_distributed_optimizer": FLAG,
        "overlap_grad_reduce": FLAG,
        "overlap_param_gather": FLAG,
        "grad_reduce_in_fp32": FLAG,
        "average_in_collective": FLAG,
        "check_for_nan_in_grad": FLAG,
        "bucket_size": _size(nullable=True),
    },
    "checkpoint": {
        "save_interval": _size(required=True),
        "most_recent_k": Field(int, minimum=-1),
        "ckpt_format": Field(str, choices=("torch_dist",)),
        "fully_parallel_save": FLAG,
        "fully_parallel_load": FLAG,
    },
    "dist": {
        "distributed_backend": Field(str, choices=("nccl", "gloo"), required=True),
        "distributed_timeout_minutes": _size(),
    },
    "rng": {"seed": _size(required=True)},
    "logger": {"log_interval": _size()},
}
ROOM: dict[str, Field] = {
    "entry": Field(str, choices=ENTRIES, required=True),
    "output_dir": Field(str, required=True),
    "export_hf": FLAG,
}
LORA: dict[str, Field] = {
    "scheme": Field(str, choices=("lora",), required=True),
    "target_modules": Field(list, required=True),
    "dim": _size(required=True),
    "alpha": _size(required=True),
    "dropout": Field(float, minimum=0),
}
PRECISIONS = ("bf16_mixed", "fp16_mixed")
#: The top-level keys: the room's, Bridge's sections, ``peft`` and ``mixed_precision``.
TOP_LEVEL = ("recipekit", *SECTIONS, "peft", "mixed_precision")


@dataclass(frozen=True)
class Lora:
    """``megatron.peft``: Bridge's LoRA (``megatron.bridge.peft.lora.LoRA``) on the named linear layers."""

    target_modules: tuple[str, ...]
    dim: int
    alpha: int
    dropout: float = 0.0


@dataclass(frozen=True)
class MegatronDoc:
    """A checked ``megatron`` document. ``sections``: Bridge section → field → value, only the fields it gives."""

    entry: str
    output_dir: str
    export_hf: bool
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    peft: Lora | None = None
    mixed_precision: str | None = None

    def get(self, section: str, name: str, default: Any = None) -> Any:
        return self.sections.get(section, {}).get(name, default)

    @property
    def model_parallel(self) -> int:
        """Ranks of one model replica: TP × PP × CP (expert parallelism splits the data-parallel ranks)."""
        model = self.sections["model"]
        sizes = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
        product = 1
        for size in sizes:
            product *= int(model[size])
        return product

    def data_parallel(self, world_size: int) -> int:
        return max(1, world_size // self.model_parallel)


def read_megatron(raw: Any, where: str = "megatron") -> MegatronDoc:
    """The document under ``where`` as a :class:`MegatronDoc`; a :class:`MegatronDocError` listing every problem."""
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise MegatronDocError([f"{where} is {type(raw).__name__}: expected a mapping"])
    for key in raw:
        if key not in TOP_LEVEL:
            problems.append(f"{where}.{key} is not a key of the document (allowed: {', '.join(TOP_LEVEL)})")
    room = _section(raw, "recipekit", ROOM, where, problems)
    sections = {name: _section(raw, name, fields, where, problems) for name, fields in SECTIONS.items()}
    peft = _lora(raw.get("peft"), f"{where}.peft", problems)
    if "mixed_precision" not in raw:
        problems.append(f"{where}.mixed_precision is missing (bf16_mixed, fp16_mixed, or null for fp32)")
    precision = raw.get("mixed_precision")
    reason = Field(str, choices=PRECISIONS, nullable=True).problem(precision)
    if reason:
        problems.append(f"{where}.mixed_precision {reason}")
    problems.extend(_rules(room, sections, peft, where))
    if problems:
        raise MegatronDocError(problems)
    return MegatronDoc(
        entry=room["entry"],
        output_dir=room["output_dir"],
        export_hf=bool(room.get("export_hf", True)),
        sections={name: dict(values) for name, values in sections.items() if values},
        peft=peft,
        mixed_precision=precision,
    )


def _section(raw: dict, name: str, fields: dict[str, Field], where: str, problems: list[str]) -> dict[str, Any]:
    value = raw.get(name, {})
    if not isinstance(value, dict):
        problems.append(f"{where}.{name} is {value!r}: expected a mapping")
        return {}
    checked: dict[str, Any] = {}
    for key, item in value.items():
        spec = fields.get(key)
        if spec is None:
            problems.append(f"{where}.{name}.{key} is not a field this room sets (allowed: {', '.join(fields)})")
            continue
        reason = spec.problem(item)
        if reason:
            problems.append(f"{where}.{name}.{key} {reason}")
            continue
        checked[key] = list(item) if isinstance(item, list) else item
    for key, spec in fields.items():
        if spec.required and key not in value:
            problems.append(f"{where}.{name}.{key} is missing")
    return checked


def _lora(raw: Any, where: str, problems: list[str]) -> Lora | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append(f"{where} is {raw!r}: expected a mapping or null")
        return None
    before = len(problems)
    values = _section({"peft": raw}, "peft", LORA, where.rsplit(".", 1)[0], problems)
    if len(problems) > before:
        return None
    return Lora(tuple(values["target_modules"]), values["dim"], values["alpha"], float(values.get("dropout", 0.0)))


def _rules(room: dict, sections: dict[str, dict], peft: Lora | None, where: str) -> list[str]:
    """What no single field says: the optimizer and DDP agree on the distributed optimizer, LoRA only finetunes,
    the global batch is whole micro-batches, an output directory is absolute, sequence parallelism needs TP."""
    problems = []
    optimizer, ddp = sections["optimizer"], sections["ddp"]
    key = "use_distributed_optimizer"
    if key in optimizer and key in ddp and optimizer[key] != ddp[key]:
        problems.append(f"{where}.optimizer.{key} and {where}.ddp.{key} differ: Bridge needs them equal")
    if peft is not None and room.get("entry") != "finetune":
        problems.append(f"{where}.peft is set but {where}.recipekit.entry is {room.get('entry')!r}: LoRA finetunes")
    train = sections["train"]
    micro, batch = train.get("micro_batch_size"), train.get("global_batch_size")
    if isinstance(micro, int) and isinstance(batch, int) and batch % micro:
        problems.append(f"{where}.train.global_batch_size {batch} is not a multiple of micro_batch_size {micro}")
    output = room.get("output_dir")
    if isinstance(output, str) and not output.startswith("/"):
        problems.append(f"{where}.recipekit.output_dir is {output!r}: expected an absolute path")
    model = sections["model"]
    if model.get("sequence_parallel") and model.get("tensor_model_parallel_size") == 1:
        problems.append(f"{where}.model.sequence_parallel needs tensor_model_parallel_size > 1")
    return problems


def check_world(doc: MegatronDoc, world_size: int) -> list[str]:
    """Why ``doc``'s layout cannot run on ``world_size`` ranks (the room checks it before the process group forms;
    Bridge repeats these checks, later and as tracebacks)."""
    problems = []
    if world_size % doc.model_parallel:
        problems.append(f"world size {world_size} is not a multiple of TP × PP × CP = {doc.model_parallel}")
        return problems
    dp = doc.data_parallel(world_size)
    micro, batch = int(doc.get("train", "micro_batch_size")), int(doc.get("train", "global_batch_size"))
    if batch % (micro * dp):
        problems.append(
            f"global_batch_size {batch} is not a multiple of micro_batch_size × data-parallel = {micro * dp}"
        )
    ep, pp = int(doc.get("model", "expert_model_parallel_size")), int(doc.get("model", "pipeline_model_parallel_size"))
    etp = int(doc.get("model", "expert_tensor_parallel_size") or doc.get("model", "tensor_model_parallel_size"))
    if world_size % (ep * etp * pp):
        problems.append(f"world size {world_size} is not a multiple of EP × ETP × PP = {ep * etp * pp}")
    return problems
