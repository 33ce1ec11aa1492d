"""A dry run's restarts asked for (``--restart checkpoint-N,fresh``): `recipekit restart` as a user runs it.

Once the run has completed, each restart is made as on a cluster: ``recipekit restart``'s own code writes the
kustomize overlay of the work copy's bundle (handover/restart.py), the request is read back out of the overlay's
patch — the value the Job's trainer container would get — and every pod starts again with it, as the new Job's
pods would. Each restart must then do what the request says, judged from the run's own records:

* the start record resumes from the named checkpoint (or from scratch), and the first step is the one after it;
* the checkpoints newer than it (all of them, fresh) were set aside under ``recipekit-superseded/<id>/``, and
  recovery.jsonl records the restart with that id (what ``recipekit runs history`` shows), and no recovery;
* the run completes: the final step, its checkpoint and weights, every loss finite; a restart from a checkpoint
  retrains its steps to the same losses as the first time (same weights, same rows).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from recipekit.handover.restart import KUSTOMIZATION, write_restart
from recipekit.runtime.boundary import metricslog
from recipekit.runtime.volume import recovery
from recipekit.runtime.volume.restart import FRESH, RESTART_ENV, SUPERSEDED_DIR
from recipekit.validate.dryrun.cluster.attemptlog import Attempt
from recipekit.validate.dryrun.judges import training
from recipekit.validate.shared.results import Result

WHERE = "<dry run>"
#: How far a retrained step's loss may move, relative (the kill-and-resume check asks the same of a replayed step).
REPLAY_RTOL = 1e-4


def overlay_env(overlay: Path) -> dict[str, str]:
    """The variable the overlay's patch adds to the Job's trainer container, as the pods of the new Job get it."""
    document = yaml.safe_load((overlay / KUSTOMIZATION).read_text(encoding="utf-8"))
    patch = yaml.safe_load(document["patches"][0]["patch"])
    value = patch[0]["value"]
    return {value["name"]: value["value"]}


def run_restarts(
    attempt: Callable[[dict[str, str]], Attempt],
    bundle: Path,
    root: Path,
    output_dir: Path,
    wanted: list[str | None],
    first: Attempt,
    result: Result,
    expect: training.Expectation,
    progress: Callable[[str], None],
) -> None:
    """Each restart of ``wanted`` in turn (the run has completed once: ``first``), judged into ``result``."""
    before = first
    for number, start_from in enumerate(wanted, 1):
        label = start_from or FRESH
        written = write_restart(bundle, label, root / f"restart-{number}")
        env = overlay_env(written.overlay)
        if env.get(RESTART_ENV) != written.request.to_env():
            result.fail(WHERE, "overlay", f"restart {number}: the overlay does not carry the request")
            return
        checkpoints = training.complete_checkpoints(output_dir)
        progress(f"restart {number} ({written.request.id}): {label}, as `recipekit restart` writes it")
        started = time.monotonic()
        after = attempt(env)
        result.seconds += time.monotonic() - started
        judged = _judge(result, number, written.request.id, start_from, checkpoints, before, after, output_dir, expect)
        result.details.setdefault("restarts", []).append(judged)
        if result.failed:
            return
        before = after
    steps = ", ".join(f"{r['from'] or 'fresh'} → step {r['final_step']}" for r in result.details["restarts"])
    result.reason = f"{len(wanted)} restart(s) as `recipekit restart` writes them: {steps}; each in runs history"


def _judge(
    result: Result,
    number: int,
    request_id: str,
    start_from: str | None,
    checkpoints: list[int],
    before: Attempt,
    after: Attempt,
    output_dir: Path,
    expect: training.Expectation,
) -> dict[str, Any]:
    step = int(start_from.split("-")[1]) if start_from else 0
    what = f"restart {number} ({start_from or 'fresh'})"
    start = after.last(metricslog.EVENT_START) or {}
    judged: dict[str, Any] = {"id": request_id, "from": start_from}
    if after.outcome != "completed":
        result.fail(WHERE, "restart", f"{what}: the pods did not complete ({after.outcome}, exit {after.exit_codes})")
        return judged
    if training.resumed_step(start) != (step or None):
        result.fail(WHERE, "resume", f"{what}: the run resumed from {start.get('resume_from') or 'scratch'}")
    if after.steps and after.steps[0].step != step + 1:
        result.fail(WHERE, "resume", f"{what}: its first step is {after.steps[0].step}, expected {step + 1}")
    newer = sorted(f"checkpoint-{s}" for s in checkpoints if s > step)
    recorded = [r for r in recovery.restarts(recovery.read(output_dir)) if r["id"] == request_id]
    if len(recorded) != 1:
        result.fail(WHERE, "recovery.jsonl", f"{what}: {len(recorded)} restart records with its id, expected 1")
    elif sorted(recorded[0]["superseded"]) != newer:
        result.fail(WHERE, "recovery.jsonl", f"{what}: set aside {recorded[0]['superseded']}, expected {newer}")
    aside = output_dir / SUPERSEDED_DIR / request_id
    missing = [name for name in newer if not (aside / name).is_dir()]
    if missing:
        result.fail(WHERE, SUPERSEDED_DIR, f"{what}: {missing} not set aside in {aside}")
    starts = [r for r in recovery.read(output_dir) if r.get("event") == "start"]
    if not starts or starts[-1].get("restart") != request_id:
        result.fail(WHERE, "recovery.jsonl", f"{what}: the last start record does not name the restart it applied")
    losses = [s.loss for s in after.steps if s.loss is not None]
    training.judge_completion(result, after, losses, output_dir, expect, attempts=1)
    judged["final_step"] = training.final_global_step(output_dir)
    replayed = training.replayed_losses(before, after)
    drift = [abs(b - a) / max(abs(a), 1e-12) for _, a, b in replayed if math.isfinite(a) and math.isfinite(b)]
    judged.update(retrained_steps=[s for s, _, _ in replayed], retrained_loss_max_rel_diff=max(drift, default=None))
    if start_from and drift and max(drift) > REPLAY_RTOL:
        result.fail(WHERE, "loss", f"{what}: retrained steps' loss moved by up to {max(drift):.2g} (relative)")
    return judged
