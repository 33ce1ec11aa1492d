"""The random twin (``model.init: random``): a tokenizer trained on the run's data and seeded random weights.

It stands in for a pretrained model in tests and dry runs: the same family and architecture numbers as the recipe's
model, so the Trainer, DeepSpeed and PEFT run the same code paths, without a download.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import datasets
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from .chat import CHAT_TEMPLATE, ROLES, SPECIAL_TOKENS, conversations
from .common import log0
from .samples import MAP_BATCH

TOKENIZER_SAMPLE_LIMIT = 50_000  # records the twin's tokenizer is trained on: plenty for a dry-run vocabulary


def corpus_texts(raw: datasets.Dataset, fmt: str, limit: int = TOKENIZER_SAMPLE_LIMIT) -> Iterator[str]:
    """The text of up to ``limit`` records, for training the random twin's tokenizer on the run's own data."""
    sample = raw.select(range(min(limit, len(raw))))
    for batch in sample.iter(batch_size=MAP_BATCH):
        if fmt == "text":
            yield from batch["text"]
        else:
            for messages in conversations(batch, fmt):
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


def architecture_config(spec: Any, tokenizer: Any) -> LlamaConfig | Qwen2Config:
    """A transformers config from the recipe's architecture numbers (the random twin has no config.json)."""
    common = {
        "vocab_size": max(spec.vocab_size, len(tokenizer)),
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "use_cache": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if spec.family == "llama":
        return LlamaConfig(**common, attention_bias=spec.attention_bias)
    return Qwen2Config(**common)  # Qwen2 always has q/k/v biases


def random_model(spec: Any, tokenizer: Any) -> Any:
    """The twin's model class with fresh weights (seed torch first for reproducible ones).

    The class itself, not AutoModelForCausalLM.from_config: under ZeRO-3 from_config partitions the new model with
    deepspeed.zero.Init, a collective this one process would run alone. The weights are written whole by
    :func:`create_random_init` and partitioned when every rank loads them.
    """
    config = architecture_config(spec, tokenizer)
    return (LlamaForCausalLM if spec.family == "llama" else Qwen2ForCausalLM)(config)


def create_random_init(spec: Any, raw: datasets.Dataset, fmt: str, seed: int, destination: Path) -> None:
    """Write the random twin (seeded weights and a tokenizer trained on the data) to ``destination``, atomically.

    Written once, then loaded like any pretrained checkpoint, so a resumed run, a LoRA adapter and a merge all use
    the very same base weights and tokenizer.
    """
    if (destination / "config.json").exists():
        return
    tokenizer = train_tokenizer(corpus_texts(raw, fmt), spec.vocab_size, spec.max_position_embeddings)
    torch.manual_seed(seed)
    model = random_model(spec, tokenizer)
    staging = destination.with_name(f"{destination.name}.tmp-{os.getpid()}")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    os.replace(staging, destination)
    log0("random twin: %d-token tokenizer and seeded weights written to %s", len(tokenizer), destination)
