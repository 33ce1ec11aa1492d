"""A tiny twin of any architecture, shrunk from the architecture's own transformers config, and the module facts the
runtime reads off the model tree (LoRA targets, ZeRO-3 leaf modules).

Shrinking is generic, not per family: every width of the config comes down to a few dozen, every head count to a
few heads, every expert count to a few experts, the vocabulary to the locally trained tokenizer's. Depth keeps every
layer kind and the layer pattern: the twin keeps the shortest run of first layers that holds each kind of layer the
full depth has (a layer's kind is the classes of its modules and its attention's window: dense and MoE layers,
sliding and global attention, linear-attention or state-space layers), and every per-layer list of the config is cut
to that depth. The result is checked by building it; a config that cannot shrink says why in one line.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from ..boundary.configfloats import untag_floats
from ..boundary.layerkinds import cut_depth, depth_keeping_every_kind, layer_kinds

#: The twin's sizes: what every width, head count and expert count of the architecture's config comes down to.
WIDTH, HEADS, HEAD_DIM, FFN, EXPERT_FFN, EXPERTS, TOP_K, RANK = 64, 4, 16, 128, 32, 4, 2, 16
#: A sliding-window layer's window in the twin: shorter than a dry run's sequences (128 tokens), so the window masks.
WINDOW = 32
#: Config keys by what they count (transformers' names across architectures; a key an architecture lacks is skipped).
WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "embed_dim", "hidden_dim")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
HEAD_DIM_KEYS = (
    "head_dim",
    "v_head_dim",
    "attention_head_dim",
    "kv_channels",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "qk_head_dim",
)
ROPE_DIM_KEYS = ("qk_rope_head_dim", "qk_nope_head_dim", "rotary_dim", "partial_rotary_dim")
RANK_KEYS = (
    "q_lora_rank",
    "kv_lora_rank",
    "time_step_rank",
    "conv_L_cache",
    "state_size",
    "ssm_state_size",
    "mamba_d_state",
    "mamba_d_head",
    "d_state",
)
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k")
GROUP_KEYS = ("n_group", "topk_group", "n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
LINEAR_HEAD_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "mamba_n_heads", "ssm_num_heads")


class ShrinkProblem(Exception):
    """An architecture whose config cannot be shrunk to a twin that builds, with the reason (one line)."""


def _set(config: Any, keys: tuple[str, ...], value: Any) -> None:
    for key in keys:
        current = getattr(config, key, None)
        try:  # a derived key (a property without a setter) follows from the keys it is derived from
            if isinstance(current, int) and not isinstance(current, bool) and current > 0:
                setattr(config, key, min(current, value) if key in TOP_K_KEYS + GROUP_KEYS else value)
            elif isinstance(current, list) and current and all(isinstance(v, int) for v in current):
                setattr(config, key, [value] * len(current))
        except AttributeError:
            continue


def _shrink_head_dims(config: Any) -> None:
    """Every per-head width divided by one factor, so ``head_dim`` becomes :data:`HEAD_DIM` (heads × head_dim is
    the twin's width, as in most architectures): the widths that are equal or add up (MLA's query-key head is its
    no-rope part plus its rope part; a rotary width equal to the head's) stay so."""
    keys = [k for k in HEAD_DIM_KEYS + ROPE_DIM_KEYS if isinstance(getattr(config, k, None), int)]
    widths = [getattr(config, k) for k in keys if getattr(config, k) > 0]
    if not widths:
        return
    reference = getattr(config, "head_dim", None)
    reference = reference if isinstance(reference, int) and reference > 0 else min(widths)
    divisor = max(1, reference // HEAD_DIM)
    for key in keys:
        if getattr(config, key) > 0:
            _set(config, (key,), max(1, getattr(config, key) // divisor))


def _ffn_keys(config: Any) -> list[str]:
    """Every MLP width of the config: ``*intermediate_size``, ``*ffn_dim``, ``*ffn_hidden_size``, ``n_inner``."""
    return [
        key
        for key in config.to_dict()
        if key.endswith(("intermediate_size", "ffn_dim", "ffn_hidden_size", "n_inner", "mlp_dim"))
    ]


def shrink_widths(config: Any, vocab_size: int) -> Any:
    """A copy of ``config`` with every width, head and expert count made tiny, depth untouched."""
    small = copy.deepcopy(config)
    heads = next((getattr(small, k) for k in HEAD_KEYS if isinstance(getattr(small, k, None), int)), HEADS)
    kv = next((getattr(small, k) for k in KV_HEAD_KEYS if isinstance(getattr(small, k, None), int)), heads)
    _set(small, WIDTH_KEYS, WIDTH)
    _set(small, HEAD_KEYS, HEADS)
    _set(small, KV_HEAD_KEYS, HEADS if kv >= heads else 1 if kv == 1 else HEADS // 2)
    _shrink_head_dims(small)
    _set(small, RANK_KEYS, RANK)
    _set(small, LINEAR_HEAD_KEYS, HEADS)
    for key in _ffn_keys(small):
        _set(small, (key,), EXPERT_FFN if "moe" in key or "expert" in key else FFN)
    _set(small, EXPERT_KEYS, EXPERTS)
    _set(small, TOP_K_KEYS, TOP_K)
    _set(small, GROUP_KEYS, 1)
    _set(small, ("sliding_window",), WINDOW)
    small.vocab_size = vocab_size
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(small, key, None)
        if isinstance(value, int) and value >= vocab_size:
            setattr(small, key, vocab_size - 1)
    small.use_cache = False
    return small


def twin_config(config: Any, vocab_size: int) -> Any:
    """The tiny twin's config of ``config``: widths shrunk, depth cut to the shortest run keeping every layer kind."""
    import torch
    from transformers import AutoModelForCausalLM

    small = shrink_widths(config, vocab_size)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(small)
    except Exception as exc:  # transformers raises many kinds for a config it cannot build
        raise ShrinkProblem(f"the shrunk {config.model_type} config does not build ({_one_line(exc)})") from None
    kinds = layer_kinds(model)
    return cut_depth(small, depth_keeping_every_kind(kinds), modules=len(kinds))


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


# ----------------------------------------------------------------------------------------- facts of the module tree
#: Module names that route tokens to experts: LoRA leaves them alone (adapting a router changes the routing).
ROUTER_NAMES = ("gate", "router", "shared_expert_gate")


def lora_target_modules(model: Any) -> list[str]:
    """The names of every linear projection in the decoder layers (attention and MLP, shared experts too) that
    LoRA adapts: not the routers, not the output head, not a state-space layer's convolution."""
    import torch

    names = set()
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Linear) and leaf not in ROUTER_NAMES and ".layers." in f".{name}.":
            names.add(leaf)
    return sorted(names)


def lora_target_parameters(model: Any) -> list[str]:
    """The fused routed experts' 3-D weights (``experts.gate_up_proj``, ``experts.down_proj``: every expert's MLP
    projections in one tensor, not an nn.Linear), named as PEFT's ``target_parameters`` takes them; routers never."""
    names = set()
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] != "experts" or ".layers." not in f".{name}.":
            continue
        for parameter_name, parameter in module.named_parameters(recurse=False):
            if len(getattr(parameter, "ds_shape", None) or parameter.shape) == 3:
                names.add(f"experts.{parameter_name}")
    return sorted(names)


def moe_leaf_classes(model: Any) -> list[str]:
    """The classes of the modules that hold routed experts beside their router (an MoE block): ZeRO-3 gathers each
    whole, so a rank whose tokens skip an expert does not wait on a gather the others never run."""
    import torch

    classes = set()
    for _name, module in model.named_modules():
        children = dict(module.named_children())
        experts = children.get("experts")
        if experts is None:
            continue
        # under ZeRO-3's zero.Init a parameter is already a partition: its full shape is ds_shape
        fused = any(len(getattr(p, "ds_shape", None) or p.shape) == 3 for p in experts.parameters(recurse=False))
        if fused or isinstance(experts, torch.nn.ModuleList):
            classes.add(type(module).__name__)
    return sorted(classes)


# -------------------------------------------------------------------------------- the dry run's generic twin
#: Tokens of the CPU training step that proves a twin trains on this machine.
PROBE_TOKENS = 16


def whole_heads(config: Any, tp: int) -> Any:
    """``config`` with attention and key/value heads that TP ``tp`` divides (the fewest that do)."""
    import math

    heads = getattr(config, "num_attention_heads", None)
    if tp <= 1 or not isinstance(heads, int):
        return config
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads % tp == 0 and kv % tp == 0:
        return config
    kv = math.lcm(kv, tp)
    config.num_attention_heads = math.lcm(heads, kv)
    if hasattr(config, "num_key_value_heads"):
        config.num_key_value_heads = kv
    return config


def train_one_step(config: Any) -> None:
    """Build ``config``'s model on this CPU with random weights and train one step; ShrinkProblem with the reason
    where it cannot (a kernel with no CPU implementation, an op that needs an accelerator, a non-finite loss)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        model.train()
        ids = torch.randint(0, config.vocab_size, (1, PROBE_TOKENS))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    except Exception as exc:  # noqa: BLE001 - whatever the architecture's CPU path raises is the reason
        raise ShrinkProblem(f"its tiny twin does not train on a CPU ({_one_line(exc)})") from None
    if not torch.isfinite(loss):
        raise ShrinkProblem("its tiny twin's loss on a CPU is not finite")


def write_twin(config_path: Path, destination: Path, vocab_size: int, tp: int) -> Path:
    """Shrink the architecture config in ``config_path`` (a config.json: a model option's ``config`` mapping) to a
    twin with whole heads under TP ``tp``, train it a step on this CPU and write its config.json to
    ``destination``."""
    from transformers import CONFIG_MAPPING

    raw = json.loads(config_path.read_text(encoding="utf-8"))
    family = raw.get("model_type")
    if family not in CONFIG_MAPPING:
        raise ShrinkProblem(f"the transformers here does not know the architecture {family!r}")
    try:
        config = CONFIG_MAPPING[family].from_dict({k: v for k, v in untag_floats(raw).items() if k != "model_type"})
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a config it cannot read
        raise ShrinkProblem(f"transformers cannot read the architecture config ({_one_line(exc)})") from None
    small = whole_heads(twin_config(config, vocab_size), tp)
    train_one_step(small)
    destination.mkdir(parents=True, exist_ok=True)
    small.to_json_file(str(destination / "config.json"), use_diff=True)
    return destination / "config.json"


def main(argv: list[str] | None = None) -> int:
    """``python -m recipekit.runtime.model.shrink CONFIG DESTINATION VOCAB TP``: the twin's config.json written, or
    the reason there is none on stdout's last line (``no twin: ...``) and exit 2."""
    config, destination, vocab, tp = (argv if argv is not None else sys.argv[1:])[:4]
    try:
        written = write_twin(Path(config), Path(destination), int(vocab), int(tp))
    except ShrinkProblem as exc:
        print(f"no twin: {exc}")
        return 2
    print(f"twin: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
