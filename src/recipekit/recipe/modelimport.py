"""A model option from a Hugging Face config.json: the architecture numbers the plan needs and exact parameter counts.

The counts come from transformers itself: the model is built from the config on the meta device (shapes, no
memory, no weights) and every parameter is put in one part by the module that holds it (embeddings, attention, MLP,
routed experts, router, norms, head). A tied head is the embedding's own tensor and is counted once. The option
stores them, so ``build`` plans from them without importing torch.

The training FLOPs per token are torch's FLOP counter's over one forward and backward pass of that same meta model
(:mod:`recipekit.recipe.measured.modelflops`), and the activation memory per token torch's memory tracker's over the
decoder under fake tensors, one layer of each kind (:mod:`recipekit.recipe.measured.modelmemory`), stored as numbers
too.

Only local files are read and no model code from the checkpoint runs: what is not a decoder-only text model, or is an
architecture transformers does not ship (``auto_map``), is refused with the reason
(:mod:`recipekit.recipe.modelkind`). There is no family switch: every number is measured from the module tree
(:mod:`recipekit.recipe.modelfacts`), so any decoder-only text architecture transformers builds imports. torch and
transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

import yaml

from recipekit.base.errors import RecipeError
from recipekit.recipe import modelfacts, modelkind
from recipekit.recipe.measured import modelflops, modelmemory, moduletree
from recipekit.recipe.schema import validate
from recipekit.recipe.sections import MAX_DIM, FlopsSpec, ModelSpec, ParamCountsSpec
from recipekit.runtime.boundary import jsonfile
from recipekit.runtime.boundary.configfloats import tag_floats
from recipekit.runtime.boundary.layerkinds import decoder_layers, layer_kinds

CONFIG_NAME = "config.json"

#: The transformers release that added an architecture, where recorded (others: the release that imports it), and
#: what raises it (Llama 3.1's rope scaling). A fact table, not a switch: an architecture missing here imports the same.
FIRST_RELEASE = {
    "llama": "4.28.0",
    "qwen2": "4.37.0",
    "mixtral": "4.36.0",
    "qwen3": "4.51.0",
    "qwen3_moe": "4.51.0",
    "glm4": "4.51.3",
    "gemma3": "4.50.0",
    "gemma3_text": "4.50.0",
    "deepseek_v3": "4.51.0",
    "glm4_moe": "4.54.0",
    "ernie4_5": "4.54.0",
    "ernie4_5_moe": "4.54.0",
    "gpt_oss": "4.55.0",
    "hunyuan_v1_dense": "4.56.0",
    "hunyuan_v1_moe": "4.56.0",
    "qwen3_next": "4.57.0",
    "qwen3_5": "5.2.0",
    "qwen3_5_moe": "5.2.0",
    "qwen3_5_text": "5.2.0",  # the text model of a multimodal Qwen3.5 checkpoint, what the option records
    "qwen3_5_moe_text": "5.2.0",
    "minicpm3": "5.8.0",
    "mistral": "4.34.0",
    "phi3": "4.40.0",
}
LLAMA3_ROPE_MIN_TRANSFORMERS = "4.43.0"
#: Architectures whose config's own head_dim (heads x head_dim other than hidden_size) a later release first read:
#: Mistral's came with Mistral-NeMo; an older release builds the attention at hidden_size / heads, a wrong shape.
HEAD_DIM_MIN_TRANSFORMERS = {"mistral": "4.43.0"}


class ImportProblem(Exception):
    """A config that cannot become a model option, with the reason (one line)."""


@dataclass(frozen=True)
class Imported:
    """What one config.json gave: the option's fields (ModelSpec's names) and the config's model class."""

    option: dict[str, Any]
    architecture: str
    notes: tuple[str, ...] = ()  # what the import decided on the way (a native class for auto_map, a text model)


def config_path(given: Path) -> Path:
    """The config.json itself, or the one inside a model directory."""
    path = given / CONFIG_NAME if given.is_dir() else given
    if not path.is_file():
        raise ImportProblem(f"{given}: no {CONFIG_NAME} there" if given.is_dir() else f"{given}: no such file")
    return path


#: The largest config.json read (a real one is a few KiB; one listing every label of a classifier, some hundred).
MAX_CONFIG_BYTES = 4 << 20
#: The config's counts the meta model is built from, and the ModelSpec field each becomes: each is checked against
#: that field's bounds before transformers builds anything (a 10⁹-layer config must not be built on the meta device).
COUNT_FIELDS = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_kv_heads",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings",
    "num_experts": "num_experts",
    "num_local_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "num_experts_per_tok": "experts_per_token",
    "moe_intermediate_size": "moe_intermediate_size",
    "shared_expert_intermediate_size": "shared_expert_intermediate_size",
    "head_dim": "num_attention_heads",  # at most as many as the heads' bound: a width per head
    # the low-rank and per-head widths of multi-head latent attention (DeepSeek-V3, MiniCPM3): widths, as hidden_size
    "kv_lora_rank": "hidden_size",
    "q_lora_rank": "hidden_size",
    "qk_rope_head_dim": "hidden_size",
    "qk_nope_head_dim": "hidden_size",
    "v_head_dim": "hidden_size",
    "n_shared_experts": "num_experts",
}
#: Counts a config sets to 0 (or leaves None) for "none": no low-rank query, a head width taken from the heads.
ZERO_MEANS_NONE = frozenset(
    {"head_dim", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"}
)
#: The most parameters a config may describe before anything is built from it (ParamCountsSpec's bound on a count).
MAX_PARAMS = 10**12


def read_raw(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (a regular file within :data:`MAX_CONFIG_BYTES`, nested at most 64 levels, every
    count a whole number within its ModelSpec field's bounds), refused before transformers sees it when it asks
    for remote code."""
    try:
        raw = jsonfile.read(path, MAX_CONFIG_BYTES)
    except OSError as exc:
        raise ImportProblem(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ImportProblem(f"{path}: not a readable JSON config ({getattr(exc, 'reason', exc)})") from None
    if not isinstance(raw, dict):
        raise ImportProblem(f"{path}: a config.json holds a JSON object")
    problems = _count_problems(raw)
    if problems:
        raise ImportProblem(f"{path}: {'; '.join(problems)}")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        raise ImportProblem(f"{path}: no model_type: transformers cannot tell which architecture this is")
    return raw


def _count_problems(raw: dict[str, Any]) -> list[str]:
    """Each count of ``raw`` that is not a whole number within its ModelSpec field's bounds (0 allowed where a
    config says "none": a q_lora_rank of 0 or None is no low-rank query)."""
    bounds = {f.name: f.metadata.get("bounds", {}) for f in fields(ModelSpec)}
    problems = []
    for key, field_name in COUNT_FIELDS.items():
        value = raw.get(key)
        if value is None:
            continue
        limit = bounds[field_name]
        least = 0 if "ge" in limit or key in ZERO_MEANS_NONE else 1
        most = int(limit.get("le", 1 << 31))
        values = value if isinstance(value, list) and value else [value]  # a list: one count per layer
        if any(type(v) is not int or not least <= v <= most for v in values):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            problems.append(f"{key} is {shown}: expected a whole number from {least} to {most:,}")
    return problems


def built_problems(config: Any, raw: dict[str, Any]) -> list[str]:
    """What is wrong with the (decoder) ``config`` transformers is about to build, before it builds anything: every
    count its config.json fields ``raw`` give (a multimodal model's text config) within its bounds, no count as
    transformers reads it (its defaults too) above them (a default below, such as XLNet's -1 for "no limit", builds
    nothing large), query heads a whole multiple of key-value heads, and at most :data:`MAX_PARAMS` parameters as the
    counts describe them (a config of 65,536 experts of width 2²⁴ is refused here, not built)."""
    varying = _per_layer_counts(config)
    if varying:
        return [
            f"sets {', '.join(varying)} per layer (transformers' heterogeneous config): recipekit plans one shape "
            "for every layer of a kind, so its FLOPs and memory would be another model's"
        ]
    values = {key: getattr(config, key, None) for key in COUNT_FIELDS}
    large = {key: value for key, value in values.items() if _above_bound(key, value)}
    problems = _count_problems(raw) + _count_problems(large)
    if problems:
        return problems
    heads, kv_heads = values["num_attention_heads"], values["num_key_value_heads"]
    if isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads and heads % kv_heads:
        problems.append(
            f"num_attention_heads ({heads}) is not a whole multiple of num_key_value_heads ({kv_heads}): grouped-"
            "query attention shares each key-value head among a whole number of query heads"
        )
    size = _described_params(values)
    if size > MAX_PARAMS:
        problems.append(f"describes about {size:.2e} parameters, over the {MAX_PARAMS:.0e} an option holds")
    return problems


def _per_layer_counts(config: Any) -> list[str]:
    """The fields ``config`` overrides layer by layer (transformers' heterogeneous configs keep them in
    ``_heterogeneity_spec`` and refuse a global read of them), sorted; empty for a config of one layer shape."""
    spec = vars(config).get("_heterogeneity_spec")
    overrides = getattr(spec, "per_layer_overrides", None) or {}
    return sorted({key for layer in overrides.values() if isinstance(layer, dict) for key in layer})


def _above_bound(key: str, value: Any) -> bool:
    """``value`` (one count, or a list of them per layer) holds a number above ``key``'s ModelSpec bound."""
    most = int(_BOUNDS[COUNT_FIELDS[key]].get("le", 1 << 31))
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) and v > most for v in values)


_BOUNDS = {f.name: f.metadata.get("bounds", {}) for f in fields(ModelSpec)}


def _described_params(values: dict[str, Any]) -> int:
    """The parameters the counts describe, roughly (attention, dense MLP, every routed expert and the embeddings
    with the head): enough to refuse a config far past any model before transformers builds it."""

    def count(*keys: str) -> int:
        found = [values.get(key) for key in keys]
        return next((v for v in found if isinstance(v, int) and not isinstance(v, bool) and v > 0), 0)

    hidden, layers = count("hidden_size"), count("num_hidden_layers") or 1
    heads, head_dim = (
        count("num_attention_heads"),
        count("head_dim", "v_head_dim") or hidden // max(1, count("num_attention_heads")),
    )
    attention = 4 * hidden * max(heads * head_dim, count("kv_lora_rank"), count("q_lora_rank"))
    experts = count("num_experts", "num_local_experts", "n_routed_experts")
    routed = experts * 3 * hidden * count("moe_intermediate_size", "intermediate_size")
    per_layer = attention + 3 * hidden * count("intermediate_size") + routed
    return layers * per_layer + 2 * count("vocab_size") * hidden


def load_config(path: Path) -> Any:
    """transformers' config for ``path`` (local only, no remote code)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    raw = read_raw(path)
    model_type = raw["model_type"]
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ImportProblem(f"{path}: transformers does not know model_type {model_type!r} (and remote code is off)")
    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds for a config it cannot read
        raise ImportProblem(f"{path}: transformers cannot read this config ({_one_line(exc)})") from None


def _one_line(exc: BaseException) -> str:
    return re.sub(r"\s+", " ", f"{type(exc).__name__}: {exc}").strip()[:400]


def meta_model(config: Any) -> Any:
    """The causal-LM model of ``config`` on the meta device: every parameter's shape, no memory."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            # batched_mm gathers each token's top-k experts: it runs on meta, and the FLOP counter sees what one uses
            return AutoModelForCausalLM.from_config(
                config, trust_remote_code=False, experts_implementation="batched_mm"
            )
    except Exception as exc:
        raise ImportProblem(f"transformers cannot build a model from this config ({_one_line(exc)})") from None


def count_parts(model: Any, config: Any) -> ParamCountsSpec:
    """Exact counts per part of a (meta) model, each parameter put in a part by the module that holds it
    (:mod:`recipekit.recipe.modelfacts`); shared tensors (a tied head) once; the active count leaves out the routed
    experts a token does not use (each experts module's parameters × (experts − top-k) / experts)."""
    import torch

    experts = modelfacts.experts_of(model, config)
    routers = modelfacts.routers_of(model, experts)
    names = {id(module): name for name, module in model.named_modules()}
    embeddings = {names[id(model.get_input_embeddings())]}
    head = model.get_output_embeddings()
    heads = {names[id(head)]} if head is not None else set()
    modules = dict(model.named_modules())
    parts = dict.fromkeys(modelfacts.PARTS, 0)
    for name, parameter in model.named_parameters():  # named_parameters yields a shared tensor once
        owner = modules[name.rpartition(".")[0]]
        part = modelfacts.part_of(name, owner, embeddings=embeddings, heads=heads, experts=experts, routers=routers)
        parts[part] += parameter.numel()
    linear = sum(
        module.weight.numel()
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name not in heads and modelfacts.in_layer(name.split("."))
    )
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    total = sum(parts.values())
    idle = sum(group.params * (group.count - group.top_k) // group.count for group in experts)
    counted = {"total": total, "active": total - idle, "linear": linear, "largest_module": largest, **parts}
    return validate(ParamCountsSpec, counted, root="model.params")


def _rope_theta(config: Any) -> float | None:
    parameters = getattr(config, "rope_parameters", None) or {}
    theta = parameters.get("rope_theta") if isinstance(parameters, dict) else None
    return float(theta if theta is not None else getattr(config, "rope_theta", None) or 10000.0)


def min_transformers(raw: dict[str, Any]) -> str:
    """The oldest transformers known to build this config: the release that added the architecture where recorded
    (:data:`FIRST_RELEASE`), else the release importing it now (the only one known to build it)."""
    from transformers import __version__ as running

    version = FIRST_RELEASE.get(raw["model_type"], running)
    rope = raw.get("rope_scaling") or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "llama3":
        version = max(version, LLAMA3_ROPE_MIN_TRANSFORMERS, key=_version_key)
    head_dim, heads, hidden = raw.get("head_dim"), raw.get("num_attention_heads"), raw.get("hidden_size")
    if raw["model_type"] in HEAD_DIM_MIN_TRANSFORMERS and head_dim and heads and head_dim * heads != hidden:
        version = max(version, HEAD_DIM_MIN_TRANSFORMERS[raw["model_type"]], key=_version_key)
    return ".".join(str(part) for part in _version_key(version))


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def option_fields(model: Any, config: Any, raw: dict[str, Any], counts: ParamCountsSpec) -> dict[str, Any]:
    """The ModelSpec fields of ``model`` (architecture numbers measured from its modules, the config's where a
    module does not hold them, and counts; name and paths are the caller's)."""
    embedding = model.get_input_embeddings()
    hidden = int(getattr(config, "hidden_size", 0) or embedding.embedding_dim)
    experts = modelfacts.experts_of(model, config)
    attention = modelfacts.attention_of(model, config) or modelfacts.Attention(1, 1, hidden, hidden, False, False)
    heads, head_dim = attention.heads, attention.head_dim
    first = experts[0] if experts else None
    dense = getattr(config, "intermediate_size", None)
    if not isinstance(dense, int) or dense <= 0:  # a list per layer, or none: the module's own width
        dense = modelfacts.mlp_width(model, hidden) or (first.width if first else 0) or 4 * hidden
    return {
        "family": raw["model_type"],
        "architecture": _architecture(config),
        "num_layers": int(getattr(config, "num_hidden_layers", 0) or len(decoder_layers(model))),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": attention.kv_heads,
        "head_dim_override": head_dim if head_dim * heads != hidden else 0,
        "qk_norm": attention.qk_norm,
        "intermediate_size": dense,
        "vocab_size": int(embedding.num_embeddings),
        "max_position_embeddings": _max_positions(config),
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "rope_theta": _rope_theta(config),
        "rms_norm_eps": _norm_eps(config),
        "attention_bias": attention.bias,
        "num_experts": first.count if first else 0,
        "experts_per_token": first.top_k if first else 0,
        "moe_intermediate_size": (first.width or int(getattr(config, "moe_intermediate_size", 0) or 0)) if first else 0,
        "shared_expert_intermediate_size": _whole(getattr(config, "shared_expert_intermediate_size", 0)),
        "router_aux_loss_coef": _aux_loss_coef(config) if first else 0.001,
        "min_transformers": min_transformers(raw),
        "params": counts,
        "config": architecture_config(raw),
    }


#: config.json keys that say nothing about the architecture (where it came from, its stored dtype and
#: quantization, remote code, the class: the option's ``architecture``; a classifier's labels), left out of the
#: option's ``config``.
NOT_ARCHITECTURE = (
    "_name_or_path",
    "architectures",
    "auto_map",
    "dtype",
    "id2label",  # a classification head's labels (keys "0", "1": no identifiers), not a causal LM's
    "label2id",
    "quantization_config",
    "torch_dtype",
    "transformers_version",
    "use_cache",
)


def architecture_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The config.json's keys that describe the architecture, in their order: what the runtime builds a random-weight
    model from (the dry run's generic twin is shrunk from it) without the checkpoint's own config.json. A bare
    ``Infinity`` (older transformers wrote them) is stored as transformers' tagged object, as JSON must be."""
    return {key: tag_floats(value) for key, value in raw.items() if key not in NOT_ARCHITECTURE}


def _whole(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


#: The longest sequence of a model whose config names none (no learned positions: a state-space model, ALiBi).
UNBOUNDED_POSITIONS = 1 << 20


def _max_positions(config: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = _whole(getattr(config, key, None))
        if value:
            return min(value, MAX_DIM)
    return UNBOUNDED_POSITIONS


def _norm_eps(config: Any) -> float:
    for key in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "layernorm_epsilon"):
        value = getattr(config, key, None)
        if isinstance(value, float) and 1e-12 <= value <= 1:
            return value
    return 1e-5


def _aux_loss_coef(config: Any) -> float:
    value = getattr(config, "router_aux_loss_coef", None)
    return float(value) if isinstance(value, (int, float)) and 0 <= value <= 100 else 0.001


#: A class name as config.json's ``architectures`` lists it.
_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def _architecture(config: Any) -> str:
    """The model class the config names first (``architectures``), or transformers' causal-LM class for it where the
    config names none that is a class name (``[null]``, a mapping, a number)."""
    named = getattr(config, "architectures", None)
    first = named[0] if isinstance(named, (list, tuple)) and named else None
    return first if isinstance(first, str) and _CLASS_NAME.fullmatch(first) else _causal_lm_class(config)


def _causal_lm_class(config: Any) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return str(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type])


def import_config(path: Path) -> Imported:
    """Read ``path`` (a config.json or a model directory), build its model on the meta device and count it. Every
    refusal is an :class:`ImportProblem` (one line), a schema bound the counts break included."""
    try:
        return _import_config(path)
    except RecipeError as err:
        raise ImportProblem(f"{path}: " + "; ".join(str(problem) for problem in err.problems)) from None


def _import_config(path: Path) -> Imported:
    path = config_path(path)
    raw = read_raw(path)
    try:
        native = modelkind.remote_code_note(path, raw)
        decoder = modelkind.decoder_text_model(path, load_config(path), raw)
    except modelkind.KindProblem as exc:
        raise ImportProblem(str(exc)) from None
    config, raw = decoder.config, decoder.raw
    problems = built_problems(config, raw)
    if problems:
        text = " (the text model's config)" if decoder.notes else ""
        raise ImportProblem(f"{path}{text}: {'; '.join(problems)}")
    model = meta_model(config)
    uneven = modelfacts.uneven_experts(model)
    if uneven:
        raise ImportProblem(
            f"{path}: the expert tensors of {uneven[0]} disagree on the expert count: some experts have no "
            "weights, so a token's active parameters depend on its routing and no fixed active count exists"
        )
    unrouted = [group.name for group in modelfacts.experts_of(model, config) if not group.top_k]
    if unrouted:
        raise ImportProblem(
            f"{path}: the routed experts of {unrouted[0]} have no top-k (the router's top_k and the config's "
            "num_experts_per_tok are unset): the active count cannot be known; set num_experts_per_tok"
        )
    counts = count_parts(model, config)
    option = option_fields(model, config, raw, counts)
    option["modules"] = moduletree.module_tree(model)
    option["flops"], flops_note = model_flops(model, option, counts)
    activations = modelmemory.measure_or_none(config, layer_kinds(model))
    if activations is not None:
        option["activations"] = activations
    notes = ((native,) if native else ()) + decoder.notes + ((flops_note,) if flops_note else ())
    return Imported(option=option, architecture=option["architecture"], notes=notes)


def model_flops(model: Any, option: dict[str, Any], counts: ParamCountsSpec) -> tuple[FlopsSpec, str | None]:
    """The counter's FLOPs per token of the meta ``model`` (on the CPU where a module cannot run on meta, within
    ``modelflops.CPU_BUDGET_BYTES``: :func:`~recipekit.recipe.measured.modelflops.measure`); where neither counts it,
    the same convention counted from ``counts`` and the measured attention (the option's ``flops.counted_by`` says
    which), with a note saying why."""
    try:
        return modelflops.measure(model), None
    except modelflops.TooLargeForCpu as exc:
        why = str(exc)
    except Exception as exc:  # a module that cannot run on meta, and fails on the CPU too
        why = f"the counter cannot run it on the meta device nor on the CPU ({_one_line(exc)[:200]})"
    head = model.get_output_embeddings()
    head_params = int(head.weight.numel()) if head is not None else 0
    attention = modelfacts.attention_of(model, model.config)
    flops = modelflops.analytic(
        matmul_params=counts.active - counts.embedding - counts.norms - counts.head + head_params,
        head_params=head_params,
        layers=option["num_layers"],
        attention_width=attention.heads * (attention.head_dim + attention.v_head_dim) if attention else 0,
    )
    return flops, f"FLOPs counted analytically, by the counter's convention: {why}"


def describe(option: dict[str, Any], title: str) -> str:
    """The one-line description `recipekit list model` shows: sizes and the attention/expert shape."""
    counts: ParamCountsSpec = option["params"]
    size = f"{_size(counts.total)} parameters"
    if option["num_experts"]:
        size += f", {_size(counts.active)} active; {option['num_experts']} experts, top-{option['experts_per_token']}"
    return f"{title} ({size}, GQA {option['num_attention_heads']}/{option['num_kv_heads']})"


def _size(count: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return str(count)


def option_yaml(option: dict[str, Any]) -> str:
    """The option as YAML, in ModelSpec's field order, leaving out every value equal to its default (so a default
    changes in one place). ``params`` is written in ParamCountsSpec's order."""
    from recipekit.recipe.schema import to_data

    lines: list[str] = []
    for f in fields(cast(Any, ModelSpec)):
        if f.name not in option:
            continue
        value = option[f.name]
        if f.name != "name" and value == f.default:
            continue
        if f.name in ("params", "flops", "activations"):
            lines.append(f"{f.name}:")
            lines += [f"  {key}: {_scalar(number)}" for key, number in _section_items(value, to_data(value))]
            continue
        if f.name == "modules":
            lines.append("modules:")
            lines += ["  " + line for line in _modules_yaml(value).splitlines()]
            continue
        if f.name == "config":
            lines.append("config:")
            lines += ["  " + line for line in _config_yaml(value).splitlines()]
            continue
        lines.append(f"{f.name}: {_scalar(value)}")
    return "\n".join(lines) + "\n"


def _config_yaml(config: dict[str, Any]) -> str:
    """``config`` as block YAML, one key a line; a list or mapping of plain values (a per-layer list, rope scaling)
    on one line in flow style."""
    return "".join(
        yaml.safe_dump(
            {key: value}, sort_keys=False, default_flow_style=isinstance(value, (list, dict)) and None, width=116
        )
        for key, value in config.items()
    )


def _modules_yaml(tree: Any) -> str:
    """``model.modules`` as block YAML, each name list on one line in flow style, empty lists left out."""
    from recipekit.recipe.schema import to_data

    def kept(data: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in data.items() if value not in ([], {})}

    data = kept(to_data(tree))
    data["layers"] = [kept(kind) for kind in data["layers"]]
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=116)


def _section_items(section: Any, data: dict[str, Any]) -> list[tuple[str, Any]]:
    """A nested section's keys in field order; FLOPs once a sequence left out at their default (0 for most models),
    as the option's own keys are."""
    defaults = {f.name: f.default for f in fields(cast(Any, type(section))) if f.name.endswith("_per_sequence")}
    return [(key, number) for key, number in data.items() if defaults.get(key, object()) != number]


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):  # YAML 1.1 (PyYAML) reads 1e-06 as text: the mantissa needs a point
        mantissa, _, exponent = repr(value).partition("e")
        mantissa += "" if "." in mantissa else ".0"
        return f"{mantissa}e{exponent}" if exponent else mantissa
    if isinstance(value, int):
        return str(value)
    if _PLAIN.fullmatch(value) and not _NUMBER.fullmatch(value):
        return value
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a YAML string


#: Text YAML reads back as the same text without quotes (names, paths, class names), and text that looks numeric.
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
_NUMBER = re.compile(r"[-+.0-9eE_]+|(?i:true|false|yes|no|on|off|null|y|n)")
