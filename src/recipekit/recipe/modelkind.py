"""Which kind of model a config.json describes, and whether `recipekit model import` can make a decoder-only option.

recipekit trains decoder-only causal language models. A config that is something else is refused in one line that
says what it is: an encoder-decoder model (T5, BART), an encoder-only one (BERT and its kin, whose causal-LM class
reuses the encoder as a decoder), a multimodal model whose text model transformers has no causal-LM class for, or an
architecture transformers does not ship whose code comes with the checkpoint (``auto_map``: recipekit runs no remote
code). A multimodal config whose text model is a causal LM transformers has (LLaVA's Llama, Gemma 3's text model)
gives that text model, and a config with ``auto_map`` for an architecture transformers has natively (DeepSeek-V3,
Phi-3.5-MoE publish one) is imported with the native class; both say so in a note.

transformers is imported inside the functions (the plan never needs this module).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


class KindProblem(Exception):
    """A config recipekit cannot make a decoder-only option from, with the reason (one line)."""


@dataclass(frozen=True)
class DecoderConfig:
    """The decoder-only text model of a config: its transformers config, its config.json fields and what was done."""

    config: Any
    raw: dict[str, Any]
    notes: tuple[str, ...]


def remote_code_note(path: Path, raw: dict[str, Any]) -> str | None:
    """None without ``auto_map`` (or with an empty one, which names no code: Phi-4's config.json has one); a note
    when transformers has the architecture natively; else refused."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    auto_map = raw.get("auto_map")
    if auto_map is None or auto_map == {}:
        return None
    names = ", ".join(sorted(auto_map)) if isinstance(auto_map, dict) else "auto_map"
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING_NAMES:
        return (
            f"the config's auto_map names model code shipped with the checkpoint ({names}), but transformers has "
            f"{model_type!r} natively: imported with transformers' own class, no remote code runs"
        )
    raise KindProblem(
        f"{path}: remote code: the config's auto_map names model code shipped with the checkpoint ({names}) for "
        f"model_type {model_type!r}, which transformers does not ship; recipekit runs no checkpoint code "
        "(no --trust-remote-code), so it imports only architectures transformers has"
    )


def decoder_text_model(path: Path, config: Any, raw: dict[str, Any]) -> DecoderConfig:
    """The decoder-only text model ``config`` describes (itself, or a multimodal model's text model), or refused."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL

    model_type = str(config.model_type)
    _refuse_encoders(path, config, model_type)
    text = getattr(config, "text_config", None)
    if text is None or text is config:
        if model_type not in CAUSAL:
            raise KindProblem(
                f"{path}: model_type {model_type!r} has no causal language model class in transformers; recipekit "
                "trains decoder-only causal language models"
            )
        return DecoderConfig(config=config, raw=raw, notes=())
    text_type = str(getattr(text, "model_type", ""))
    if text_type not in CAUSAL or getattr(text, "is_encoder_decoder", False):
        raise KindProblem(
            f"{path}: model_type {model_type!r} is a multimodal model and transformers has no causal language model "
            f"class for its text model ({text_type or 'unnamed'!r}); recipekit trains decoder-only text models"
        )
    text_raw = raw.get("text_config")
    note = (
        f"model_type {model_type!r} is a multimodal model: the option describes its text model ({text_type}, "
        f"{CAUSAL[text_type]}), the other towers left out; name_or_path must hold that text model's weights"
    )
    return DecoderConfig(
        config=text,
        raw={**(text_raw if isinstance(text_raw, dict) else {}), "model_type": text_type},
        notes=(note,),
    )


def _refuse_encoders(path: Path, config: Any, model_type: str) -> None:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    if getattr(config, "is_encoder_decoder", False) or model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        raise KindProblem(
            f"{path}: model_type {model_type!r} is an encoder-decoder model; recipekit trains decoder-only causal "
            "language models"
        )
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        raise KindProblem(
            f"{path}: model_type {model_type!r} is an encoder-only model (a masked language model; its causal-LM "
            "class reuses the encoder as a decoder); recipekit trains decoder-only causal language models"
        )
