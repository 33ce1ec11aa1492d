"""What MFU and HFU mean: the plan's FLOPs per token over the peak (for the planner, a run's metrics and the report).

The FLOPs per token themselves are torch's FLOP counter over the model, measured once by ``recipekit model import``
and stored in the model option (``recipe.model.flops``); the plan reads them at the recipe's sequence length.

Standard library only: the plan (recipekit) and the throughput callback (train.py) compute with the same code.
"""

from __future__ import annotations

#: Tensor cores run fp32 (as TF32) at about half their 16-bit rate; the planner and the metrics share the figure.
FP32_PEAK_FRACTION = 0.5


def peak_tflops(precision: str, *, bf16: float, fp16: float, fp8: float | None = None) -> float:
    """The utilisation denominator per device: the hardware's peak for its precision (FP8 training: the FP8 peak its
    matrix multiplies run at); fp32 at a fraction of the 16-bit peak."""
    if precision == "fp8":
        return fp8 or bf16
    if precision == "fp16":
        return fp16
    if precision == "bf16":
        return bf16
    return bf16 * FP32_PEAK_FRACTION


def causal_share(attention: float, total: float) -> float:
    """The share of ``total`` FLOPs per token that a count taking causal attention as half the dense S×S (NeMo's,
    Megatron-Bridge's) counts, where ``attention`` is the dense attention term of ``total``. At the same tokens per
    second an MFU in that count, divided by the share, is the MFU in this one."""
    return (total - attention / 2) / total if total > 0 else 1.0


def utilisation(tokens_per_s_per_device: float, flops_per_token: float, peak: float) -> float:
    """Achieved FLOP/s over the peak: MFU with model FLOPs, HFU with hardware FLOPs."""
    return tokens_per_s_per_device * flops_per_token / (peak * 1e12) if peak > 0 else 0.0


#: Significant digits of the utilisation figures a run logs: enough to compare with :func:`utilisation` to 1e-5.
DIGITS = 6


def step_figures(
    tokens_per_s_per_device: float, model_per_token: float, hardware_per_token: float, peak: float
) -> dict[str, float]:
    """What a run logs of its throughput, per device: tokens/s, the model TFLOP/s achieved, MFU and HFU. One
    definition for every engine's metrics (the Trainer's throughput callback, the Megatron room's callback)."""
    return {
        "tokens_per_second_per_device": round(tokens_per_s_per_device, 1),
        "tflops_per_device": round(tokens_per_s_per_device * model_per_token / 1e12, 4),
        "mfu": significant(utilisation(tokens_per_s_per_device, model_per_token, peak)),
        "hfu": significant(utilisation(tokens_per_s_per_device, hardware_per_token, peak)),
    }


def significant(value: float, digits: int = DIGITS) -> float:
    return float(f"{value:.{digits}g}")
