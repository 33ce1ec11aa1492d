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
from ..boundary.layerkinds import layer_kinds, shortest_cut

#: The twin's sizes: what every width, head count and expert count of the architecture's config comes down to.
WIDTH, HEADS, HEAD_DIM, FFN, EXPERT_FFN, EXPERTS, TOP_K, RANK = 64, 4, 16, 128, 32, 4, 2, 16
#: A sliding-window layer's window in the twin: shorter than a dry run's sequences (128 tokens), so the window masks.
WINDOW = 32
#: Config keys by what they count (transformers' names across architectures; a key an architecture lacks is skipped).
WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "embed_dim", "hidden_dim", "embedding_dim")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
HEAD_DIM_KEYS = (
    "head_dim",
    "d_head",
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
    "mamba_headdim",
    "d_state",
    "hidden_size_per_layer_input",
)
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k")
GROUP_KEYS = (
    "n_group",
    "topk_group",
    "n_shared_experts",
    "num_shared_experts",
    "moe_num_shared_experts",
    "n_groups",
    "mamba_n_groups",
    "mamba_ngroups",
)
LINEAR_HEAD_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "mamba_n_heads", "ssm_num_heads", "n_mamba_heads")
#: A state-space layer's inner width, split into heads: (heads, head width, expansion of the model's width, the inner
#: width where the config names it). Heads × head width is the inner width; the twin keeps it so.
STATE_SPACE_KEYS = (
    ("num_heads", "head_dim", "expand", ""),
    ("mamba_n_heads", "mamba_d_head", "mamba_expand", "mamba_d_ssm"),
    ("n_mamba_heads", "mamba_headdim", "mamba_expand", ""),
)


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
    named = dict.fromkeys(_named(config, HEAD_DIM_KEYS) + ROPE_DIM_KEYS)
    keys = [k for k in named if isinstance(getattr(config, k, None), int)]
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
    """Every MLP width of the config: ``*intermediate_size``, ``*ffn_dim``, ``*ffn_hidden_size``, ``n_inner``,
    ``d_inner``, ``*mlp_dim``."""
    return [
        key
        for key in config.to_dict()
        if key.endswith(("intermediate_size", "ffn_dim", "ffn_hidden_size", "n_inner", "d_inner", "mlp_dim"))
    ]


def shrink_widths(config: Any, vocab_size: int) -> Any:
    """A copy of ``config`` with every width, head and expert count made tiny, depth untouched. Per-layer
    overrides (transformers' ``per_layer_config``: Gemma 4's wider global layers) are shrunk too
    (:func:`_shrink_override`)."""
    overrides = config.to_dict().get("per_layer_config") or {}
    flat = copy.deepcopy(config)
    if overrides:
        flat.per_layer_config = None  # the global values, readable again
    small = _shrink_flat(flat, vocab_size)
    shrunk = {index: _shrink_override(values, flat, small, vocab_size) for index, values in overrides.items()}
    if shrunk:  # kept even where equal to the global value: a config class may set its own overrides when none are
        small.per_layer_config = shrunk
    return small


def _shrink_override(values: dict[str, Any], flat: Any, small: Any, vocab_size: int) -> dict[str, Any]:
    """One layer's overrides shrunk: a whole number the global value holds keeps its ratio to it (a global layer's
    head twice as wide stays twice as wide); any other value as the layer's config whole shrinks."""
    layer = copy.deepcopy(flat)
    for key, value in values.items():
        setattr(layer, key, value)
    layer = _shrink_flat(layer, vocab_size)
    shrunk = {}
    for key, value in values.items():
        before, after = getattr(flat, key, None), getattr(small, key, None)
        numbers = (value, before, after)
        if all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in numbers):
            shrunk[key] = max(1, round(value * after / before))
        else:
            shrunk[key] = getattr(layer, key)
    return shrunk


def _shrink_flat(config: Any, vocab_size: int) -> Any:
    """:func:`shrink_widths` of a config with no per-layer overrides."""
    small = copy.deepcopy(config)
    heads = next((getattr(small, k) for k in HEAD_KEYS if isinstance(getattr(small, k, None), int)), HEADS)
    kv = next((getattr(small, k) for k in KV_HEAD_KEYS if isinstance(getattr(small, k, None), int)), heads)
    _set(small, WIDTH_KEYS, WIDTH)
    _scale_width_multiples(config, small)
    _set(small, _named(small, HEAD_KEYS), HEADS)
    _set(small, _named(small, KV_HEAD_KEYS), HEADS if kv >= heads else 1 if kv == 1 else HEADS // 2)
    _shrink_head_dims(small)
    _set(small, RANK_KEYS, RANK)
    _set(small, LINEAR_HEAD_KEYS, HEADS)
    for key in _ffn_keys(small):
        _set(small, (key,), EXPERT_FFN if "moe" in key or "expert" in key else FFN)
    _set(small, EXPERT_KEYS, EXPERTS)
    _set(small, TOP_K_KEYS, TOP_K)
    _set(small, GROUP_KEYS, 1)
    _set(small, ("sliding_window",), WINDOW)
    _keep_state_space_widths(config, small)
    _set(small, _named(small, ("vocab_size",)), vocab_size)  # an unpadded vocabulary too (Inkling's)
    small.vocab_size = vocab_size
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(small, key, None)
        if isinstance(value, int) and value >= vocab_size:
            setattr(small, key, vocab_size - 1)
    small.use_cache = False
    return small


def _named(config: Any, names: tuple[str, ...]) -> tuple[str, ...]:
    """The config's keys that are one of ``names`` or hold one as a word (a sliding-window layer's own
    ``swa_num_attention_heads``, an ``unpadded_vocab_size``, Gemma's ``vocab_size_per_layer_input``)."""
    ends, starts = tuple(f"_{n}" for n in names), tuple(f"{n}_" for n in names)
    return tuple(key for key in config.to_dict() if key in names or key.endswith(ends) or key.startswith(starts))


def _scale_width_multiples(config: Any, small: Any) -> None:
    """Another module's width named as a whole multiple of the model's (Zamba 2's attention over the hidden state
    and the embedding side by side: twice the width) stays that multiple of the twin's width."""
    width = _width(config)
    for key, value in config.to_dict().items():
        if key.endswith("hidden_size") and key not in WIDTH_KEYS and isinstance(value, int) and value > 0:
            if width and value % width == 0:
                setattr(small, key, value // width * WIDTH)


def _keep_state_space_widths(config: Any, small: Any) -> None:
    """A state-space layer splits its inner width (the config's, or the model's width times the expansion) into
    heads of a head width: where ``config``'s heads × head width was its inner width, ``small``'s are too (the
    shrunk inner width named, else as many heads as the shrunk width's expansion holds)."""
    for heads, head_width, expand, inner in STATE_SPACE_KEYS:
        numbers = [getattr(config, key, None) for key in (heads, head_width, expand)]
        if not all(isinstance(n, int | float) and not isinstance(n, bool) and n > 0 for n in numbers):
            continue
        count, width, factor = (float(n) for n in numbers)  # type: ignore[arg-type]  # checked just above
        named = getattr(config, inner, None) if inner else None
        if isinstance(named, int) and named == count * width:
            setattr(small, inner, getattr(small, heads) * getattr(small, head_width))
        elif count * width == factor * _width(config):
            setattr(small, heads, max(1, int(factor * _width(small)) // getattr(small, head_width)))


def _width(config: Any) -> int:
    """The model's width (0 where the config names none of :data:`WIDTH_KEYS`)."""
    return next((getattr(config, key) for key in WIDTH_KEYS if isinstance(getattr(config, key, None), int)), 0)


def twin_config(config: Any, vocab_size: int) -> Any:
    """The tiny twin's config of ``config``: widths shrunk, depth cut to the shortest run keeping every layer kind
    (:func:`~..boundary.layerkinds.shortest_cut`; two layers at least: a layer's input from another layer, schedules
    over the depth such as RWKV's defined)."""
    small = shrink_widths(config, vocab_size)
    kinds = layer_kinds(_meta_model(small, config.model_type))
    problems: list[str] = []

    def builds(cut: Any) -> bool:
        try:
            _meta_model(cut, config.model_type)
        except ShrinkProblem as exc:
            problems.append(str(exc))
            return False
        return True

    twin = shortest_cut(small, kinds, builds, least=2)
    if twin is None:
        raise ShrinkProblem(problems[-1])
    return twin


def _meta_model(config: Any, model_type: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # transformers raises many kinds for a config it cannot build
        raise ShrinkProblem(f"the shrunk {model_type} config does not build ({_one_line(exc)})") from None


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
