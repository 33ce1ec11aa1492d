"""What MFU and HFU mean: the plan's FLOPs per token over the peak (for the planner, a run's metrics and the report).

The FLOPs per token themselves are torch's FLOP counter over the model, measured once by ``recipekit model import``
and stored in the model option (``recipe.model.flops``); the plan reads them at the recipe's sequence length.

Standard library only: the plan (recipekit) and the throughput callback (train.py) compute with the same code.
"""

from __future__ import annotations

#: Tensor cores run fp32 (as TF32) at about half their 16-bit rate; the planner and the metrics share the figure.
FP32_PEAK_FRACTION = 0.5


def peak_tflops(precision: str, *, bf16: float, fp16: float) -> float:
    """The utilisation denominator per device: the hardware's 16-bit peak for its precision; fp32 at a fraction."""
    if precision == "fp16":
        return fp16
    if precision == "bf16":
        return bf16
    return bf16 * FP32_PEAK_FRACTION


def utilisation(tokens_per_s_per_device: float, flops_per_token: float, peak: float) -> float:
    """Achieved FLOP/s over the peak: MFU with model FLOPs, HFU with hardware FLOPs."""
    return tokens_per_s_per_device * flops_per_token / (peak * 1e12) if peak > 0 else 0.0
