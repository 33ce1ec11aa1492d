"""The random twin (``model.init: random``) for the engine's venv: the Trainer's twin (model/twin.py), with a tokenizer
made the way the installed transformers takes it.

Megatron-Bridge 0.3.1 needs transformers < 5, where the role markers are ``additional_special_tokens``; transformers
5 renamed them ``extra_special_tokens`` (what model/twin.py, written for the Trainer's image, passes). Everything else
is the Trainer's: the same BPE trained on the same first records, the same seeded weights of the option's own
architecture. So both engines start a dry run from the very same base model.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..boundary.common import log0
from ..boundary.recipeview import ModelView
from ..data.chat import CHAT_TEMPLATE, ROLES, SPECIAL_TOKENS


def train_tokenizer(texts: Iterable[str], vocab_size: int, max_length: int) -> Any:
    """model/twin.py's tokenizer under transformers 5; under 4.x the role markers go in additional_special_tokens."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from ..model import twin

    if int(transformers.__version__.split(".")[0]) >= 5:
        return twin.train_tokenizer(texts, vocab_size, max_length)
    roles = [f"<|{role}|>" for role in ROLES]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS.values(), *roles],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=max_length, additional_special_tokens=roles, **SPECIAL_TOKENS
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def create_random_init(spec: ModelView, texts: Iterable[str], seed: int, destination: Path) -> None:
    """Write the twin (seeded weights, a tokenizer trained on ``texts``) to ``destination`` atomically, as
    model/twin.py's create_random_init does."""
    import torch

    from ..model.twin import random_model

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
