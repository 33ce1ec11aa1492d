"""The pipeline schedule's arithmetic: the bubble's share of a step, and how many micro-batches of activations a
stage holds at once (1F1B, interleaved 1F1B, DualPipe).

Its own module because both follow from the schedule alone (stages, micro-batches, virtual stages), not from a
model or a precision: the memory breakdown and the estimate's time both read it.
"""

from __future__ import annotations


def bubble_fraction(
    pipeline_parallel: int, micro_batches: int, virtual_stages: int = 1, *, schedule: str = "1f1b"
) -> float:
    """Idle share of a pipeline step: (p − 1)/(v·m + p − 1) for p stages, m micro-batches and v virtual stages per
    rank (1F1B and GPipe: v = 1; interleaved 1F1B divides the bubble's time by v, Narayanan et al. 2021, §2.2.2).

    DualPipe (DeepSeek-V3 report, Table 2): a bubble of (p/2 − 1)(F&B + B − 3W) against 1F1B's (p − 1)(F + B); with
    backward twice the forward and the weight gradient half the backward (B = 2F, W = F, F&B = F + B) that is
    (p/2 − 1)·2F against m micro-batches of 3F."""
    p, m, v = pipeline_parallel, micro_batches, virtual_stages
    if schedule == "dualpipe":
        idle = max(0.0, p / 2 - 1) * 2
        return idle / (3 * m + idle)
    return (p - 1) / (v * m + p - 1)


def layers_in_flight(
    stage: int, layers: int, *, stages: int, micro_batches: int, virtual_stages: int = 1, schedule: str = "1f1b"
) -> float:
    """Layer-micro-batches whose activations stage ``stage`` (0 first) of ``stages`` holds at once.

    Non-interleaved 1F1B: the stage runs p − stage forwards before its first backward, so that many micro-batches
    (at most m) of its layers are alive. Interleaved: Megatron-core's warm-up on rank r is 2(p − r − 1) + (v − 1)·p
    chunk forwards (``get_pp_rank_microbatches``, micro-batches in groups of p), one more before the first backward,
    each a chunk of layers / v: on the first stage L·(1 + (p − 1)/(p·v)) of an L-layer model, Korthikanti et al.'s
    figure. DualPipe: p + 1 micro-batches on every rank (DeepSeek-V3 report, Table 2). No pipeline: one micro-batch.
    """
    p, m, v = stages, micro_batches, virtual_stages
    if p == 1:
        return float(layers)
    if schedule == "dualpipe":
        return float(min(p + 1, m) * layers)
    if v == 1:
        return float(min(p - stage, m) * layers)
    chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    return chunks * layers / v
