"""Accuracy alignment of two runs of one recipe (``recipekit compare``): do they follow the same loss curve?

The rule before anyone trusts a port's speed: the same recipe on the new hardware or versions must follow the
reference's loss within a tolerance. Both runs' per-step loss is compared on the steps both logged (after a restart,
a replayed step counts with its final value): per step, the absolute and relative difference; over a trailing window
of ``window`` steps, the relative difference of the two means (relative to the larger), which is what the verdict
tests once the window is full — a single noisy step does not fail a run, a drift does, and the first step whose
window is beyond ``loss_rtol`` is named. Gradient norms are held to their own, looser tolerance the same way; every
common evaluation to ``eval_rtol``. Throughput and MFU are shown side by side and never decide the verdict: speed is
a separate question from accuracy.

The recipe keys that differ are ``recipekit diff``'s cause list (:func:`recipekit.handover.diff.recipe_changes`), the
versions those pinned in the bundles and those preflight saw on the pods. The default tolerances and why they are
what they are: docs/reports.md.

Within the tolerances is not yet ALIGNED: two runs can only drift apart as far as their training has moved them, so
a comparison that could not have seen a different training is INCONCLUSIVE (:func:`cannot_tell`) — too few common
steps, a learning rate still warming up, a loss that moved less than the tolerance, or step-to-step noise larger
than it. Measured on the README's recipe, two 8-step dry runs at learning rates 1e-5 and 1e-4 differ by 1.4 % (within
2 %): a gate that passed them would pass a ×10 learning rate. Runs identical on every common step are ALIGNED
however short: there is no difference to judge.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from recipekit.handover.diff import recipe_changes
from recipekit.runs.evaluation import compare_scores
from recipekit.runs.runlog import RunLog, Series
from recipekit.runs.runplan import steady


@dataclass(frozen=True)
class Tolerances:
    """How far B may be from A and still be aligned (see docs/reports.md for the defaults' measurements)."""

    loss_rtol: float = 0.02
    window: int = 3
    grad_norm_rtol: float = 0.25
    eval_rtol: float = 0.02
    #: Fewer common steps than this cannot tell (two full windows of the default 3).
    min_steps: int = 6


class Verdict(Enum):
    """What ``compare`` concludes; the command exits with :attr:`exit_code` (the table: recipekit/cli/__init__)."""

    ALIGNED = "ALIGNED"
    NOT_ALIGNED = "NOT ALIGNED"
    INCONCLUSIVE = "INCONCLUSIVE"

    @property
    def exit_code(self) -> int:
        return {Verdict.ALIGNED: 0, Verdict.NOT_ALIGNED: 1, Verdict.INCONCLUSIVE: INCONCLUSIVE_EXIT}[self]


#: ``recipekit compare``'s exit code when the runs cannot tell (0 aligned, 1 not, 2 unusable input).
INCONCLUSIVE_EXIT = 3
#: Relative per-step difference below which two runs are the same numbers (bit-identical on one machine).
IDENTICAL_RTOL = 1e-6


@dataclass(frozen=True)
class StepDiff:
    step: int
    a: float
    b: float
    abs_diff: float
    rel_diff: float
    window_rel_diff: float  # relative difference of the trailing window means ending at this step
    judged: bool = True  # the window is full (or it is the last step of a short run): the verdict looks at it


@dataclass
class Alignment:
    """One series compared step by step."""

    key: str
    rtol: float
    steps: list[StepDiff] = field(default_factory=list)
    first_divergence: int | None = None  # first step whose window is beyond rtol

    @property
    def max_abs(self) -> float | None:
        return max((d.abs_diff for d in self.steps), default=None)

    @property
    def max_rel(self) -> float | None:
        return max((d.rel_diff for d in self.steps), default=None)

    @property
    def max_window_rel(self) -> float | None:
        return max((d.window_rel_diff for d in self.steps if d.judged), default=None)

    @property
    def aligned(self) -> bool:
        return bool(self.steps) and self.first_divergence is None


@dataclass
class Comparison:
    a: str
    b: str
    tolerances: Tolerances
    loss: Alignment
    grad_norm: Alignment
    eval_loss: Alignment
    recipe_changes: list[str]
    version_changes: list[str]
    throughput: list[dict[str, Any]]
    notes: list[str]
    #: Why the runs cannot tell, when they do not diverge (:func:`cannot_tell`); empty when they can.
    undecided: list[str] = field(default_factory=list)
    #: The benchmark scores after training of both runs (runs/evaluation.py): informative, not part of the verdict.
    benchmarks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        return any(a.first_divergence is not None for a in (self.loss, self.grad_norm, self.eval_loss))

    @property
    def verdict(self) -> Verdict:
        """NOT ALIGNED on any divergence; otherwise INCONCLUSIVE when the runs cannot tell; else ALIGNED."""
        if self.diverged:
            return Verdict.NOT_ALIGNED
        return Verdict.INCONCLUSIVE if self.undecided or not self.loss.steps else Verdict.ALIGNED

    @property
    def aligned(self) -> bool:
        return self.verdict is Verdict.ALIGNED

    @property
    def reasons(self) -> list[str]:
        """Why the runs are not aligned (empty when they are): each divergence, or why they cannot tell."""
        found = []
        if not self.loss.steps:
            found.append("no training step logged by both runs: nothing to compare")
        elif not self.diverged:
            found += self.undecided
        for alignment, what in ((self.loss, "loss"), (self.grad_norm, "grad norm"), (self.eval_loss, "eval loss")):
            if alignment.first_divergence is not None:
                at = next(d for d in alignment.steps if d.step == alignment.first_divergence)
                found.append(
                    f"{what} diverges at step {at.step}: windowed relative difference {at.window_rel_diff:.3g} > "
                    f"{alignment.rtol:g} (A {at.a:.5g}, B {at.b:.5g})"
                )
        return found

    def to_json(self) -> dict[str, Any]:
        def alignment(a: Alignment) -> dict[str, Any]:
            return {
                "rtol": a.rtol,
                "aligned": a.aligned,
                "first_divergence": a.first_divergence,
                "max_abs_diff": a.max_abs,
                "max_rel_diff": a.max_rel,
                "max_window_rel_diff": a.max_window_rel,
                "steps": [asdict(d) for d in a.steps],
            }

        return {
            "a": self.a,
            "b": self.b,
            "verdict": self.verdict.value,
            "aligned": self.aligned,
            "reasons": self.reasons,
            "tolerances": asdict(self.tolerances),
            "loss": alignment(self.loss),
            "grad_norm": alignment(self.grad_norm),
            "eval_loss": alignment(self.eval_loss),
            "recipe_changes": self.recipe_changes,
            "version_changes": self.version_changes,
            "throughput": self.throughput,
            "notes": self.notes,
            "benchmarks": self.benchmarks,
        }


def _relative(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return abs(b - a) / scale if scale > 0 else 0.0


def align(key: str, a: Series, b: Series, rtol: float, window: int) -> Alignment:
    """Per-step and trailing-window differences of two series on their common steps.

    A step is judged once its window is full (the first steps alone are one batch's noise), or at the last common
    step when the runs share fewer steps than the window.
    """
    result = Alignment(key, rtol)
    mine, theirs = dict(a), dict(b)
    common = sorted(set(mine) & set(theirs))
    window = max(1, window)
    for i, step in enumerate(common):
        recent = common[max(0, i - window + 1) : i + 1]
        mean_a = sum(mine[s] for s in recent) / len(recent)
        mean_b = sum(theirs[s] for s in recent) / len(recent)
        judged = i >= window - 1 or i == len(common) - 1  # a full window, or all there is of a short run
        diff = StepDiff(
            step,
            mine[step],
            theirs[step],
            abs(theirs[step] - mine[step]),
            _relative(mine[step], theirs[step]),
            _relative(mean_a, mean_b),
            judged,
        )
        result.steps.append(diff)
        if judged and result.first_divergence is None and diff.window_rel_diff > rtol:
            result.first_divergence = step
    return result


def cannot_tell(loss: Alignment, a_lr: Series, b_lr: Series, t: Tolerances) -> list[str]:
    """Why a loss comparison within its tolerance could not have seen a different training (empty: it could).

    * too few common steps (fewer than ``t.min_steps``, two windows of the default 3);
    * the learning rate still warming up at the last common step (either run's: rising, its highest yet): the
      updates so far are a fraction of the recipe's, and a ×10 learning rate has barely begun to differ;
    * the loss moved less than the tolerance between the first and the last window (either run): two runs from
      the same start cannot be further apart than their training has moved them;
    * the per-step noise of the difference, over a window, larger than the tolerance: a drift of that size would
      not stand out from it.

    Runs identical on every common step (within :data:`IDENTICAL_RTOL`) need none of this: nothing differs.
    """
    steps = loss.steps
    if not steps or all(d.rel_diff <= IDENTICAL_RTOL for d in steps):
        return []
    found = []
    window = max(1, t.window)
    if len(steps) < t.min_steps:
        found.append(f"only {len(steps)} common steps, fewer than {t.min_steps}: too few to tell (train longer)")
    last = steps[-1].step
    for name, lr in (("A", a_lr), ("B", b_lr)):
        rates = [value for step, value in lr if step <= last]
        if len(rates) >= 2 and rates[-1] > rates[0] and rates[-1] >= max(rates):
            found.append(
                f"{name}'s learning rate is still warming up at step {last} ({rates[0]:.3g} → {rates[-1]:.3g}): "
                "too early for a different training to show"
            )
            break
    moved = max(_relative(_mean([d.a for d in steps[:window]]), _mean([d.a for d in steps[-window:]])),
                _relative(_mean([d.b for d in steps[:window]]), _mean([d.b for d in steps[-window:]])))  # fmt: skip
    if moved < loss.rtol:
        found.append(
            f"the loss moved {moved:.2%} over the common steps, less than the tolerance {loss.rtol:.2%}: the runs "
            "cannot yet be that far apart whatever differs (train longer)"
        )
    noise = _window_noise([(d.b - d.a) / max(abs(d.a), abs(d.b), 1e-12) for d in steps], window)
    if noise is not None and noise > loss.rtol:
        found.append(
            f"the difference's step-to-step noise over a {window}-step window (±{noise:.2%}) is larger than the "
            f"tolerance {loss.rtol:.2%}: widen --window or train longer"
        )
    return found


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _window_noise(differences: list[float], window: int) -> float | None:
    """The noise of a window's mean difference: the per-step noise (from successive changes, which a steady drift
    does not inflate) over the square root of the window; None with fewer than 3 steps."""
    if len(differences) < 3:
        return None
    changes = [b - a for a, b in zip(differences, differences[1:])]
    per_step = math.sqrt(sum(c * c for c in changes) / len(changes) / 2)
    return per_step / math.sqrt(window)


def _versions(a: RunLog, b: RunLog) -> list[str]:
    mine, theirs = a.versions, b.versions
    return [
        f"{name}: {mine.get(name, '(absent)')} → {theirs.get(name, '(absent)')}"
        for name in sorted(set(mine) | set(theirs))
        if mine.get(name) != theirs.get(name)
    ]


def _throughput(a: RunLog, b: RunLog) -> list[dict[str, Any]]:
    rows = []
    for key, title in (
        ("step_time_s", "step time (s)"),
        ("tokens_per_second_per_device", "tokens/s per device"),
        ("mfu", "MFU (fraction of peak)"),
        ("hfu", "HFU (fraction of peak)"),
    ):
        va, vb = steady(a.values(key)), steady(b.values(key))
        rows.append({"key": key, "title": title, "a": va, "b": vb, "ratio": vb / va if va and vb is not None else None})
    return rows


def compare(a: RunLog, b: RunLog, tolerances: Tolerances = Tolerances()) -> Comparison:
    """A's and B's alignment, causes and speed: B is the candidate, A the reference."""
    t = tolerances
    notes = []
    last_a, last_b = a.final_step, b.final_step
    if last_a is not None and last_b is not None and last_a != last_b:
        notes.append(f"A logged up to step {last_a}, B up to step {last_b}: compared on the steps both logged")
    if not a.recipe or not b.recipe:
        notes.append("the recipe of a run is unknown (no bundle or baseline manifest): recipe keys not compared")
    elif a.recipe_digest and a.recipe_digest == b.recipe_digest:
        notes.append("both runs come from the same resolved recipe (recipe.yaml digests are equal)")
    loss = align("loss", a.series.get("loss", []), b.series.get("loss", []), t.loss_rtol, t.window)
    return Comparison(
        a.label,
        b.label,
        t,
        loss,
        align("grad_norm", a.series.get("grad_norm", []), b.series.get("grad_norm", []), t.grad_norm_rtol, t.window),
        align("eval_loss", a.series.get("eval_loss", []), b.series.get("eval_loss", []), t.eval_rtol, 1),
        recipe_changes(a.recipe, b.recipe) if a.recipe and b.recipe else [],
        _versions(a, b),
        _throughput(a, b),
        notes,
        cannot_tell(loss, a.series.get("learning_rate", []), b.series.get("learning_rate", []), t),
        compare_scores(a, b),
    )
