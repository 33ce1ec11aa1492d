"""What a FLOP count, MFU and HFU mean: one definition for the planner's time estimate and the metrics a run logs.

Standard library only: the plan (recipekit) and the throughput callback (train.py) compute with the same code.
"""

from __future__ import annotations

#: Tensor cores run fp32 (as TF32) at about half their 16-bit rate; the planner and the metrics share the figure.
FP32_PEAK_FRACTION = 0.5


def flops_per_token(
    *,
    matmul_params: int,
    trainable_params: int,
    full_training: bool,
    layers: int,
    hidden: int,
    seq_len: int,
    recompute: bool = False,
) -> float:
    """Training FLOPs per token of a decoder-only transformer.

    ``matmul_params`` are the parameters that cost FLOPs: all but the input embedding, which is a lookup (a tied head
    is a matmul and counts). Full training: forward 2·N, backward 4·N (gradients of activations and of weights).
    LoRA: the frozen base runs forward (2·N) and passes activation gradients back (2·N) but computes no weight
    gradient; the adapters train fully (6 × adapter parameters). Attention scores and their weighted sum add
    4·L·h·s forward and twice that backward: 12·L·h·s.

    ``recompute=False`` counts the model's FLOPs: the numerator of **MFU** (model FLOPs utilisation, PaLM appendix B),
    independent of how the run saves memory. ``recompute=True`` adds the forward pass that activation checkpointing
    runs again in backward: the FLOPs the hardware really executes, the numerator of **HFU**. The planner's
    ``hw.assumed_mfu`` is an HFU (it times the work actually done); metrics.jsonl logs both.
    """
    attention = 12 * layers * hidden * seq_len
    if full_training:
        per_token = 6 * matmul_params + attention
        forward = 2 * matmul_params + attention / 3
    else:
        per_token = 4 * matmul_params + 6 * trainable_params + attention
        forward = 2 * matmul_params + 2 * trainable_params + attention / 3
    return float(per_token + forward) if recompute else float(per_token)


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
