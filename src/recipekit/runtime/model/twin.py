"""The random twin (``model.init: random``): a tokenizer trained on the run's data and seeded random weights.

It stands in for a pretrained model in tests and dry runs: the same family (its own transformers class: a Qwen3 MoE
recipe dry-runs a tiny Qwen3 MoE) and architecture as the recipe's model (its ``config`` mapping, or its architecture
numbers), so the Trainer, DeepSpeed and PEFT run the same code paths, without a download.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ..boundary.common import log0
from ..boundary.configfloats import untag_floats
from ..boundary.recipeview import ModelView
from ..data.chat import CHAT_TEMPLATE, ROLES, SPECIAL_TOKENS, conversations
from ..data.samples import WINDOW
from ..data.sources import FIELDS

TOKENIZER_SAMPLE_LIMIT = 50_000  # records the twin's tokenizer is trained on: plenty for a dry-run vocabulary


def corpus_texts(records: Iterable[dict[str, Any]], fmt: str) -> Iterator[str]:
    """The text of ``records`` (for text data the documents, else every turn's content), for training the random
    twin's tokenizer on the run's own data."""
    records = iter(records)
    while batch := list(islice(records, WINDOW)):
        columns = {field: [record.get(field) for record in batch] for field in FIELDS[fmt]}
        if fmt == "text":
            yield from columns["text"]
        else:
            for messages in conversations(columns, fmt):
                yield from (m["content"] for m in messages)


def train_tokenizer(texts: Iterable[str], vocab_size: int, max_length: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of at most ``vocab_size`` tokens, with bos/eos/pad, role markers and a chat template.

    Byte-level means any text encodes (no unknown token); the BPE trainer is deterministic, so every process
    trained on the same data would build the same tokenizer (the main process trains it once anyway).
    """
    roles = [f"<|{role}|>" for role in ROLES]
    specials = [*SPECIAL_TOKENS.values(), *roles]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=max_length, extra_special_tokens=roles, **SPECIAL_TOKENS
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


#: transformers' key for the routed experts of each MoE family (Mixtral's experts use intermediate_size).
EXPERT_KEYS = {"qwen3_moe": "num_experts", "mixtral": "num_local_experts"}
#: Families whose config has an attention_bias switch (Qwen2 always has q/k/v biases).
ATTENTION_BIAS_FAMILIES = ("llama", "qwen3", "qwen3_moe", "glm4", "mixtral")


def head_dim(spec: ModelView) -> int:
    """One head's width: the option's override, else hidden_size / heads."""
    return int(spec.head_dim_override or spec.hidden_size // spec.num_attention_heads)


def moe_settings(spec: ModelView) -> dict[str, Any]:
    """The config keys of an MoE option: experts, top-k, expert width, the router's load-balancing loss.

    ``output_router_logits`` makes transformers add ``router_aux_loss_coef`` × the load-balancing loss to the
    training loss (and return the router logits it needs)."""
    experts = int(spec.num_experts)
    if not experts:
        return {}
    settings: dict[str, Any] = {
        EXPERT_KEYS.get(spec.family, "num_experts"): experts,
        "num_experts_per_tok": int(spec.experts_per_token),
        "router_aux_loss_coef": float(spec.router_aux_loss_coef),
        "output_router_logits": bool(spec.router_aux_loss),
    }
    if spec.family == "mixtral":
        settings["intermediate_size"] = int(spec.moe_intermediate_size)
    else:
        settings["moe_intermediate_size"] = int(spec.moe_intermediate_size)
    if spec.family == "qwen3_moe":
        settings.update(decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    return settings


def architecture_config(spec: ModelView, tokenizer: Any = None) -> Any:
    """A transformers config of the option's own architecture: its ``config`` mapping where the option carries one
    (any architecture transformers ships: the dry run's generic twin), else built from its architecture numbers (the
    random twin has no config.json; tests count a full-size option's parameters with it on the meta device)."""
    from transformers import AutoConfig

    if spec.config is not None:
        return config_from_mapping(spec, tokenizer)
    common: dict[str, Any] = {
        "vocab_size": max(spec.vocab_size, len(tokenizer)) if tokenizer is not None else spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": head_dim(spec),
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "use_cache": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
    }
    if tokenizer is None:
        common["pad_token_id"] = None  # some families default to a padding row beyond a tiny vocabulary
    else:
        common.update(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    if spec.family in ATTENTION_BIAS_FAMILIES:
        common["attention_bias"] = spec.attention_bias
    common.update(moe_settings(spec))
    return AutoConfig.for_model(spec.family, **common)


def config_from_mapping(spec: ModelView, tokenizer: Any = None) -> Any:
    """The option's ``config`` as its architecture's transformers config, the vocabulary fitted to ``tokenizer``
    (at least its tokens; its bos/eos/pad ids) and the router's loss as the recipe sets it."""
    from transformers import CONFIG_MAPPING

    values = {key: value for key, value in untag_floats(spec.config or {}).items() if key != "model_type"}
    values["use_cache"] = False
    if tokenizer is not None:
        values["vocab_size"] = max(spec.vocab_size, len(tokenizer))
        values.update(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    if spec.num_experts:
        values.update(
            router_aux_loss_coef=float(spec.router_aux_loss_coef), output_router_logits=bool(spec.router_aux_loss)
        )
    return CONFIG_MAPPING[spec.family].from_dict(values)


def causal_lm_class(family: str) -> Any:
    """The family's causal-LM model class, e.g. Qwen3MoeForCausalLM for qwen3_moe."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family])


def random_model(spec: ModelView, tokenizer: Any) -> Any:
    """The twin's model class with fresh weights (seed torch first for reproducible ones).

    The class itself, not AutoModelForCausalLM.from_config: under ZeRO-3 from_config partitions the new model with
    deepspeed.zero.Init, a collective this one process would run alone. The weights are written whole by
    :func:`create_random_init` and partitioned when every rank loads them.
    """
    config = architecture_config(spec, tokenizer)
    return causal_lm_class(spec.family)(config)


def create_random_init(spec: ModelView, texts: Iterable[str], seed: int, destination: Path) -> None:
    """Write the random twin (seeded weights and a tokenizer trained on ``texts``) to ``destination``, atomically:
    the directory appears whole or not at all, which is what the other ranks wait for.

    Written once, then loaded like any pretrained checkpoint, so a resumed run, a LoRA adapter and a merge all use
    the very same base weights and tokenizer.
    """
    if (destination / "config.json").exists():
        return
    tokenizer = train_tokenizer(texts, spec.vocab_size, spec.max_position_embeddings)
    torch.manual_seed(seed)
    model = random_model(spec, tokenizer)
    staging = destination.with_name(f"{destination.name}.tmp-{os.getpid()}")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    os.replace(staging, destination)
    log0("random twin: %d-token tokenizer and seeded weights written to %s", len(tokenizer), destination)
