"""How much of a step's traffic its compute hides: each collective's waiting time, given the compute time.

A step waits for traffic that sits between two computations (TP's all-reduces, an all-to-all without overlap,
offload) and for what overlapped traffic (data-parallel buckets behind backward, ZeRO-3's prefetch, CP's ring
behind attention, an overlapped all-to-all) does not fit behind the compute it overlaps: each can hide behind its
share of the compute time, and all of it together behind no more than the whole compute time. Given the step's time
(the assumed MFU's) the compute time is what the bubble and the waiting leave: :func:`solve_compute` finds it.
Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Overlap:
    """One kind of traffic a step may wait for."""

    name: str  # the time item it belongs to: "TP traffic", "DP traffic", ...
    fixed_s: float  # always waited for: nothing overlaps it
    hideable_s: float  # can run behind compute
    share: float  # of the compute time it can hide behind

    @property
    def seconds(self) -> float:
        return self.fixed_s + self.hideable_s


def exposed(overlaps: tuple[Overlap, ...], compute_s: float) -> dict[str, float]:
    """Seconds the step waits for each kind of traffic when its compute takes ``compute_s``: each hides up to its
    share of the compute, all together at most the whole compute (they share the links and the copy engines)."""
    hidden = [min(o.hideable_s, max(0.0, compute_s) * o.share) for o in overlaps]
    total = sum(hidden)
    scale = min(1.0, max(0.0, compute_s) / total) if total > 0 else 1.0
    waits: dict[str, float] = {}
    for o, h in zip(overlaps, hidden):
        waits[o.name] = waits.get(o.name, 0.0) + o.fixed_s + o.hideable_s - h * scale
    return waits


def solve_compute(step_s: float, bubble: float, overlaps: tuple[Overlap, ...]) -> float:
    """The compute time a step of ``step_s`` leaves: the longest C with C / (1 − bubble) + waiting(C) = step; 0
    where the waiting alone overfills the step. The waiting falls by at most the compute it gains, so the left side
    never falls as C grows; where traffic bounds the step (everything else hidden behind it) a range of C gives the
    same step, and the longest is the kernels' slowest that keeps it."""

    def rest(compute_s: float) -> float:
        return compute_s / (1 - bubble) + sum(exposed(overlaps, compute_s).values()) - step_s

    low, high = 0.0, max(0.0, step_s) * (1 - bubble)
    if rest(low) > 1e-12 * max(1.0, step_s):
        return 0.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if rest(mid) <= 0 else (low, mid)
    return low
