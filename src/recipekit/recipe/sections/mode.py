"""The ``mode`` section, one kind each: pretraining, full SFT, LoRA (PEFT) and QLoRA, with the adapter's shape."""

from __future__ import annotations

from typing import Annotated, Literal

from recipekit.recipe.domains import (
    MODULE_NAME,
)
from recipekit.recipe.schema import Section, Tagged, spec


# ---------------------------------------------------------------------------------------------------------- mode
class LoraSpec(Section):
    """PEFT LoRA adapter settings (``peft.LoraConfig``)."""

    r: int = spec(16, gt=0, le=1024, description="Adapter rank.")
    alpha: int = spec(32, gt=0, le=65_536, description="Scaling numerator (lora_alpha).")
    dropout: float = spec(0.05, ge=0, lt=1, description="Dropout on the adapter input.")
    target_modules: Literal["all-linear"] | list[Annotated[str, MODULE_NAME]] = spec(
        "all-linear", description="Module names to adapt, or 'all-linear'."
    )
    merge_on_save: bool = spec(False, description="Also write the base model with the adapter merged in.")


class QuantSpec(Section):
    """4-bit base-model loading for QLoRA (bitsandbytes ``BitsAndBytesConfig``)."""

    bits: Literal[4] = spec(4, description="Weight bits of the frozen base model.")
    quant_type: Literal["nf4", "fp4"] = spec("nf4", description="4-bit data type.")
    double_quant: bool = spec(True, description="Quantize the quantization constants too.")


class _ModeBase(Section):
    description: str = spec("", description="One line shown by `recipekit list mode`.")


class PretrainMode(_ModeBase):
    """Train every parameter on raw text packed into fixed-length blocks."""

    kind: Literal["pretrain"] = spec(description="Which mode this is (selects the section's keys).")


class SftMode(_ModeBase):
    """Full supervised fine-tuning: every parameter, prompt tokens masked from the loss."""

    kind: Literal["sft"] = spec(description="Which mode this is (selects the section's keys).")


class LoraMode(_ModeBase):
    """Supervised fine-tuning of a LoRA adapter on a frozen base model."""

    kind: Literal["lora"] = spec(description="Which mode this is (selects the section's keys).")
    lora: LoraSpec = spec(default_factory=LoraSpec, description="The adapter.")


class QloraMode(_ModeBase):
    """LoRA on a 4-bit base model (bitsandbytes, on the image families that have a build: `recipekit list mode`)."""

    kind: Literal["qlora"] = spec(description="Which mode this is (selects the section's keys).")
    lora: LoraSpec = spec(default_factory=LoraSpec, description="The adapter.")
    quant: QuantSpec = spec(default_factory=QuantSpec, description="How the frozen base model is quantized.")


ModeSpec = Annotated[PretrainMode | SftMode | LoraMode | QloraMode, Tagged("kind")]


def adapter_of(mode: PretrainMode | SftMode | LoraMode | QloraMode) -> LoraSpec | None:
    """The LoRA adapter a mode trains, or None when it trains every parameter (the modes of
    ``recipeview.ADAPTER_MODES``: a test holds the two together)."""
    return mode.lora if isinstance(mode, (LoraMode, QloraMode)) else None
