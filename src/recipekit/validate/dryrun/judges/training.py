"""Judging a dry run's attempts: did training start as planned, finish, checkpoint, and resume where it had to?

Everything here is a pure function of what was observed (:mod:`recipekit.validate.dryrun.cluster.attemptlog`: the steps
and the runtime's structured records in metrics.jsonl) and of the output directory on the simulated shared volume;
nothing starts a process, and no log text is read. So each rule is unit-tested with synthetic metrics files and
checkpoint directories.

Where training must resume is decided by the runtime contract's own rule —
:func:`~recipekit.runtime.boundary.resume.checkpointdirs.latest_complete_checkpoint`, which train.py's ``--resume auto``
calls — so the expectation and the runtime cannot disagree about what "complete" means (a truncated safetensors file, a
sharded index whose shard is missing, an interrupted save). Where it did resume is what train.py says in its ``start``
record (``resume_step``, ``resume_from``), not a line of its log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipekit.runtime.boundary import filenames, metricslog
from recipekit.runtime.boundary.resume import checkpointdirs
from recipekit.runtime.volume import recovery
from recipekit.validate.dryrun.cluster.attemptlog import Attempt, Step, exits_in_words
from recipekit.validate.dryrun.workdir.engines import DryRunEngine, dryrun_engine
from recipekit.validate.shared.results import Result

WHERE = "<dry run>"
TRAINER = dryrun_engine("trainer")


@dataclass(frozen=True)
class Expectation:
    """What this dry run asked of training."""

    steps: int
    save_steps: int
    world_size: int | None  # the work copy's planned world size (pods × processes per pod); None: not checked
    killed: bool = False  # a pod is killed, so the midway checkpoint may be replaced by a later one
    tensor_parallel: int | None = None  # the work copy's TP degree; None: not checked
    #: the engine whose room ran: where its checkpoints and final weights are (workdir/engines)
    engine: DryRunEngine = TRAINER
    weights: bool = True  # the bundle writes final weights (a Megatron bundle without its HF export does not)


# ----------------------------------------------------------------------------------------------- the output dir
def complete_checkpoints(output_dir: Path, engine: DryRunEngine = TRAINER) -> list[int]:
    """Steps of the checkpoints a restart can resume from, oldest first (the engine's room's rule; the Trainer's is
    the runtime contract's)."""
    return engine.checkpoints(output_dir)


def expected_resume_step(output_dir: Path, hot_dir: Path | None = None, engine: DryRunEngine = TRAINER) -> int | None:
    """The step a restarted run (``--resume auto``) must continue from: its newest complete checkpoint, chosen by the
    rule the room itself applies (for the Trainer, the contract function train.py calls); None when it must start
    from scratch. ``hot_dir``: the pod's hot tier (one pod, train.hot_checkpoints), whose newest complete checkpoint
    its drain signed counts too."""
    shared = engine.resume_step(output_dir)
    hot = max(signed_hot_checkpoints(hot_dir), default=None) if hot_dir is not None else None
    return max((s for s in (shared, hot) if s is not None), default=None)


def signed_hot_checkpoints(hot_dir: Path) -> list[int]:
    """Steps of the complete checkpoints of a hot tier that its drain signed (the record is there), oldest first."""
    return sorted(
        step
        for step, path, problem in checkpointdirs.checkpoints(hot_dir)
        if problem is None and (path / filenames.RUN_FILE).is_file()
    )


def final_global_step(output_dir: Path, engine: DryRunEngine = TRAINER) -> int | None:
    """The final step the room's own state says (the Trainer's trainer_state.json, Bridge's tracker file)."""
    return engine.final_step(output_dir)


def rate(steps: list[Step]) -> float | None:
    """Steps per second between the first and the last step seen."""
    if len(steps) < 2 or steps[-1].at <= steps[0].at:
        return None
    return (steps[-1].step - steps[0].step) / (steps[-1].at - steps[0].at)


def fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else str(value)


# -------------------------------------------------------------------------------------------------- the records
def resumed_step(start: dict[str, Any]) -> int | None:
    """The checkpoint step a start record says training continues from (None: from scratch)."""
    step = start.get("resume_step")
    if isinstance(step, int) and not isinstance(step, bool):
        return step
    where = start.get("resume_from")
    return checkpointdirs.checkpoint_step(Path(str(where))) if where else None


def judge_start(
    result: Result, attempt: Attempt, world_size: int | None, tensor_parallel: int | None = None
) -> dict[str, Any] | None:
    """train.py's start record of ``attempt``: present, at the planned world size (torchrun formed the world the
    work copy plans: every pod joined) and the planned TP degree."""
    start = attempt.last(metricslog.EVENT_START)
    if start is None:
        result.fail(
            WHERE,
            filenames.METRICS_FILE,
            f"attempt {attempt.number}: train.py wrote no {metricslog.EVENT_START!r} record, so where it started "
            "(world size, resume point) is unknown",
            hint="train.py must append metricslog.event('start', ...) before training",
        )
        return None
    if world_size is not None and start.get("world_size") != world_size:
        result.fail(
            WHERE,
            f"{filenames.METRICS_FILE} start.world_size",
            f"attempt {attempt.number}: train.py started at world size {start.get('world_size')}, but the work "
            f"copy plans {world_size} (pods × processes per pod)",
        )
    # the Trainer's record says tensor_parallel; the Megatron room's gives every size under parallel
    started_tp = start.get("tensor_parallel", (start.get("parallel") or {}).get("tensor", 1))
    if tensor_parallel is not None and started_tp != tensor_parallel:
        result.fail(
            WHERE,
            f"{filenames.METRICS_FILE} start.tensor_parallel",
            f"attempt {attempt.number}: train.py started with TP {started_tp}, but the work "
            f"copy plans TP {tensor_parallel}",
        )
    return start


def first_attempt_details(attempt: Attempt, pods: int) -> dict[str, Any]:
    """The figures of the first attempt: time to the first step, steps/s, first loss, and train.py's own account."""
    losses = [s.loss for s in attempt.steps if s.loss is not None]
    start = attempt.last(metricslog.EVENT_START)
    return {
        "pods": pods,
        "exit_codes": attempt.exit_codes,
        "time_to_first_step_s": round(attempt.steps[0].at - attempt.started, 2) if attempt.steps else None,
        "steps_per_s": round(r, 2) if (r := rate(attempt.steps)) else None,
        "first_loss": losses[0] if losses else None,
        "started": {k: v for k, v in start.items() if k != "event"} if start else None,
        "data": data_details(attempt),
        "adapted_by_train_py": [str(r.get("note")) for r in attempt.events(metricslog.EVENT_ADAPTED)],
    }


def data_details(attempt: Attempt) -> dict[str, Any] | None:
    """train.py's account of the training data in ``attempt``: prepared by the pods (how many workers, chunks, rows)
    or reused from an earlier attempt."""
    record = attempt.last(metricslog.EVENT_DATA)
    return {k: v for k, v in record.items() if k != "event"} if record else None


# ------------------------------------------------------------------------------------------------- completion
def judge_completion(
    train: Result, last: Attempt, losses: list[float], output_dir: Path, expect: Expectation, attempts: int = 1
) -> None:
    """The run finished: final step reached, the checkpoints complete, final weights written, every loss finite,
    and train.py's done record agrees."""
    final_step = final_global_step(output_dir, expect.engine)
    checkpoints = complete_checkpoints(output_dir, expect.engine)
    weights = expect.engine.final_weights(output_dir)
    finite = [loss for loss in losses if isinstance(loss, (int, float)) and math.isfinite(loss)]
    done = last.last(metricslog.EVENT_DONE)
    train.details.update(
        final_step=final_step,
        checkpoints=checkpoints,
        final_weights=weights,
        final_loss=finite[-1] if finite else None,
        exit_codes=last.exit_codes,
        done={k: v for k, v in done.items() if k != "event"} if done else None,
    )
    if final_step != expect.steps:
        train.fail(WHERE, filenames.TRAINER_STATE_FILE, f"final global_step {final_step}, expected {expect.steps}")
    if done is None:
        train.fail(WHERE, filenames.METRICS_FILE, f"train.py exited 0 but wrote no {metricslog.EVENT_DONE!r} record")
    elif done.get("step") != expect.steps:
        train.fail(WHERE, f"{filenames.METRICS_FILE} done.step", f"{done.get('step')}, expected {expect.steps} steps")
    if expect.save_steps not in checkpoints and not expect.killed:
        train.fail(
            WHERE, "checkpoints", f"no complete checkpoint-{expect.save_steps} (complete: {checkpoints or 'none'})"
        )
    if expect.steps not in checkpoints:
        train.fail(WHERE, "checkpoints", f"no complete checkpoint-{expect.steps} (complete: {checkpoints or 'none'})")
    if expect.weights and not weights:
        train.fail(WHERE, "final model", f"no model weights in {output_dir} after training")
    if len(finite) != len(losses) or not losses:
        train.fail(WHERE, "loss", f"losses not all finite: {losses}")
    if train.failed:
        return
    d = train.details
    over = f" over {attempts} attempts" if attempts > 1 else ""
    train.reason = (
        f"{expect.steps} steps{over}; {d.get('time_to_first_step_s')} s to the first step, {d.get('steps_per_s')} "
        f"steps/s; loss {fmt(d.get('first_loss'))} → {fmt(d['final_loss'])}; checkpoints {checkpoints}"
    )


# ----------------------------------------------------------------------------------------------------- resume
def replayed_losses(first: Attempt, second: Attempt) -> list[tuple[int, float, float]]:
    """(step, loss the first time, loss the second time) of each step both attempts trained: those after the
    checkpoint the second resumed from and before the first stopped. Same data, same state: the same loss."""
    before = {s.step: s.loss for s in first.steps if isinstance(s.loss, (int, float))}
    return [
        (s.step, before[s.step], s.loss) for s in second.steps if s.step in before and isinstance(s.loss, (int, float))
    ]


def recorded_recovery(output_dir: Path | None) -> dict[str, Any] | None:
    """The last recovery the run directory records (runtime/volume/recovery.py, the code ``recipekit runs history``
    runs: one MTTR definition for the dry run and production)."""
    if output_dir is None:
        return None
    found = recovery.history(recovery.read(output_dir))
    return found[-1].to_json() if found else None


def judge_recorded_recovery(result: Result, output_dir: Path | None, expected: int | None) -> float | None:
    """The run directory recorded the recovery, resuming at ``expected``; its MTTR (None without a record)."""
    recorded = recorded_recovery(output_dir)
    result.details["recovery"] = recorded
    if output_dir is None:
        return None
    if recorded is None:
        result.fail(WHERE, recovery.RECOVERY_FILE, "the restarted run recorded no recovery in its output directory")
        return None
    if recorded["resume_step"] != (expected or 0):
        result.fail(
            WHERE,
            recovery.RECOVERY_FILE,
            f"records a resume at step {recorded['resume_step']}, the newest complete checkpoint was {expected}",
        )
    return recorded["mttr_s"]


def judge_resume(
    resume: Result,
    first: Attempt,
    second: Attempt,
    checkpoints_at_restart: list[int],
    expected: int | None,
    output_dir: Path | None = None,
) -> None:
    """After the kill and RestartJob: train.py resumed from ``expected`` (the newest complete checkpoint when the
    pods restarted), its first step is the next one, and steps trained twice repeat their loss. The MTTR is the one
    the run directory records (:func:`recorded_recovery`); the dry run's own observation is kept beside it."""
    assert first.killed_at is not None
    resume.details.update(
        killed_pod=first.killed_pod,
        killed_at_step=first.killed_step,
        killed_processes=first.killed_processes,
        complete_checkpoints_at_restart=checkpoints_at_restart,
        expected_resume_step=expected,
        preempted=[{k: v for k, v in r.items() if k != "event"} for r in first.events(metricslog.EVENT_PREEMPTED)],
        teardown_s=round(second.started - first.killed_at, 2),
        survivor_exit_codes={i: c for i, c in first.exit_codes.items() if i != first.killed_pod},
    )
    start = second.last(metricslog.EVENT_START)
    step = resumed_step(start) if start else None
    first_new = second.steps[0] if second.steps else None
    observed = round(first_new.at - first.killed_at, 2) if first_new else None
    recorded = judge_recorded_recovery(resume, output_dir, expected) if second.outcome == "completed" else None
    mttr = recorded if recorded is not None else observed
    resume.details["mttr_observed_s"] = observed
    resume.details.update(
        resumed_from=start.get("resume_from") if start else None,
        resumed_step=step,
        first_step_after_restart=first_new.step if first_new else None,
        mttr_s=mttr,
        restart_to_first_step_s=round(first_new.at - second.started, 2) if first_new else None,
        exit_codes=second.exit_codes,
        data=data_details(second),
    )
    if second.outcome != "completed":
        what = "timed out" if second.outcome == "timeout" else f"failed ({exits_in_words(second.exit_codes)})"
        resume.fail(WHERE, "restart", f"the restarted job {what}")
        return
    if start is None:
        resume.fail(
            WHERE,
            filenames.METRICS_FILE,
            f"the restarted train.py wrote no {metricslog.EVENT_START!r} record: where it resumed is unknown",
        )
    elif step != expected:
        resume.fail(
            WHERE,
            "resume",
            f"resumed from {start.get('resume_from') or 'scratch'}, but the newest complete checkpoint at the restart "
            f"was {f'checkpoint-{expected}' if expected is not None else 'none'}",
        )
    want_first = (expected or 0) + 1
    if first_new is not None and first_new.step != want_first:
        resume.fail(
            WHERE,
            "resume",
            f"the first step after the restart is {first_new.step}, expected {want_first}"
            + (f" (resuming at checkpoint-{expected})" if expected is not None else " (starting over)"),
        )
    replayed = replayed_losses(first, second)
    if replayed:
        # Steps trained twice (after the checkpoint, before the kill): same data, same state, so the same loss.
        resume.details["replayed_steps"] = [s for s, _, _ in replayed]
        resume.details["replayed_loss_max_abs_diff"] = max(abs(a - b) for _, a, b in replayed)
    if resume.failed:
        return
    replay = resume.details.get("replayed_loss_max_abs_diff")
    resume.reason = (
        f"killed pod {first.killed_pod} at step {first.killed_step}; resumed from "
        f"{f'checkpoint-{step}' if step is not None else 'scratch'} (newest complete: {expected}); MTTR {mttr} s"
        + (f"; replayed steps' loss differs by {replay:.2g}" if replay is not None else "")
    )


#: How far a step trained again after a rescale may move its loss, relative: the same weights and rows, summed in
#: another order over another number of ranks (measured: well under 1e-3 on CPU; the compare gate's default is 2%).
RESCALE_LOSS_TOLERANCE = 0.02


def judge_rescale(resume: Result, first: Attempt, second: Attempt, world_size: int) -> None:
    """After continuing on fewer (or more) pods: train.py ran at the new world size and the old global batch, said
    which world the checkpoint was saved at, and the steps it trained again kept their losses within tolerance."""
    before, after = first.last(metricslog.EVENT_START) or {}, second.last(metricslog.EVENT_START) or {}
    resume.details.update(
        world_size_before=before.get("world_size"),
        world_size_after=after.get("world_size"),
        global_batch_before=before.get("global_batch_size"),
        global_batch_after=after.get("global_batch_size"),
        accumulation_before=before.get("gradient_accumulation_steps"),
        accumulation_after=after.get("gradient_accumulation_steps"),
    )
    if after.get("world_size") != world_size:
        resume.fail(WHERE, "rescale", f"the continued run has world size {after.get('world_size')}, not {world_size}")
    if after.get("global_batch_size") != before.get("global_batch_size"):
        resume.fail(
            WHERE,
            "rescale",
            f"global batch {before.get('global_batch_size')} before, {after.get('global_batch_size')} after",
        )
    if after.get("saved_world_size") != before.get("world_size"):
        resume.fail(
            WHERE,
            "rescale",
            f"the checkpoint resumed was saved at world size {after.get('saved_world_size')}, the first attempt ran "
            f"at {before.get('world_size')}",
        )
    drift = [abs(again - once) / max(abs(once), 1e-12) for _, once, again in replayed_losses(first, second)]
    resume.details["replayed_loss_max_rel_diff"] = max(drift) if drift else None
    if drift and max(drift) > RESCALE_LOSS_TOLERANCE:
        resume.fail(
            WHERE,
            "loss",
            f"a step trained again at world size {world_size} moved its loss by {max(drift):.2%} "
            f"(tolerance {RESCALE_LOSS_TOLERANCE:.0%})",
        )
    if not resume.failed:
        resume.reason += (
            f"; continued at world size {world_size} (was {before.get('world_size')}), global batch "
            f"{after.get('global_batch_size')} kept, accumulation {before.get('gradient_accumulation_steps')} → "
            f"{after.get('gradient_accumulation_steps')}"
        )
