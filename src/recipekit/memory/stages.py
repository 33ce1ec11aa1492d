"""A training run of several stages (8K pretraining, then a long-context stage with context parallelism, ...):
each stage its own recipe and estimate, the run's time, device-hours and cost their sums.

``recipekit plan BASE --stage "OVERRIDES" ...`` makes them: the first stage is the base recipe, each ``--stage``
another with its overrides added to the base's. Pure: the estimates are made by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recipekit.memory.estimate import Estimate


@dataclass(frozen=True)
class Stage:
    """One stage of a run: the overrides that make it from the base recipe, and its estimate."""

    overrides: tuple[str, ...]
    estimate: Estimate


@dataclass(frozen=True)
class Stages:
    """The stages of a run and their sums (None where a stage has no step count or no price)."""

    stages: tuple[Stage, ...]
    total_time_s: float | None
    device_hours: float | None
    cost: float | None

    @property
    def fits(self) -> bool:
        return all(stage.estimate.fits for stage in self.stages)


def _sum(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def summed(stages: Sequence[Stage]) -> Stages:
    """The run's time, device-hours and cost over ``stages``: each stage's own, added."""
    ests = [s.estimate for s in stages]
    return Stages(
        tuple(stages),
        _sum([e.total_time_s for e in ests]),
        _sum([e.device_hours for e in ests]),
        _sum([e.cost for e in ests]),
    )
