"""A dry run's lost node (``--lose-pod N --at-step S [--return-at-step T]``): an elastic bundle goes on without anyone.

The bundle must be elastic (``cluster.min_nodes``, plan/rescale.py): its launchers start torchrun's elastic agent,
and its Job leaves an evicted pod's replacement to Volcano. Pod N is killed at step S, whole tree, and stays away:
its node is gone and no capacity is left for the replacement. Nothing else is done to the pods: no RestartJob, no
rebuild, no command. The pods that are left must go on by themselves. Their workers fail in the next collective,
each agent restarts its workers on the pods that answer, and train.py resumes the newest checkpoint at the smaller
world, at the same global batch. With ``--return-at-step T``, capacity returns once the shrunk run reaches step T:
the replacement pod starts, its agent joins, and the agents stop their workers (SIGTERM: they finish step T + 1 and
save it) and grow the run back to every pod from that checkpoint.

Each worker group is an attempt of the dry run (cluster/attempts.py splits them at train.py's start records). The
judge asks of each new group what a restart is asked: it resumed the newest checkpoint, the next step first, the
steps it trained again kept their loss, every step drew its own rows once (the row ledger against the order
itself). It also asks that no pod was restarted (each launcher's process lived through the drill) and that the run
directory recorded each recovery with its MTTR in parts, as ``recipekit runs history`` shows them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipekit.runtime.boundary import metricslog
from recipekit.runtime.volume import attemptends, recovery
from recipekit.validate.dryrun.cluster.attemptlog import Attempt, exits_in_words
from recipekit.validate.dryrun.cluster.attempts import DryRun, LostNode
from recipekit.validate.dryrun.judges import training
from recipekit.validate.dryrun.judges.rows import judge_attempts_rows
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.shared.results import Result

WHERE = "<dry run>"
#: The seed's bar for a recovery without a person: the last step before the loss to the first step after it.
MTTR_LIMIT_S = 300.0


def lost_node(options: DryRunOptions) -> LostNode | None:
    """The drill ``options`` ask for (resolved options: ``at_step`` is set), or None."""
    if options.lose_pod is None or options.at_step is None:
        return None
    return LostNode(options.lose_pod, options.at_step, options.return_at_step)


def not_elastic(launch: dict[str, Any] | None, options: DryRunOptions) -> str | None:
    """Why the bundle cannot take ``--lose-pod`` (its launch.json starts no elastic agent), or None."""
    if options.lose_pod is None or isinstance((launch or {}).get("elastic"), dict):
        return None
    return (
        "--lose-pod needs an elastic bundle (cluster.min_nodes): this one restarts the whole Job when a pod is lost "
        "(use --kill-pod, and --resume-pods to rebuild it on fewer pods as `recipekit rescale` does)"
    )


def judge_elastic(run: DryRun, lost: LostNode, train: Result, result: Result, expect: training.Expectation) -> None:
    """Judge the drill from the attempts the dry run saw (see the module's docstring) into ``result``; the run's
    completion into ``train``."""
    attempts, options, output_dir = run.attempts, run.options, run.work.output_dir
    grows = lost.return_at is not None
    wanted = 3 if grows else 2
    result.details.update(lost_pod=lost.pod, lost_at_step=lost.at_step, return_at_step=lost.return_at)
    result.details["groups"] = [_group(a) for a in attempts]
    if len(attempts) != wanted:
        last = attempts[-1]
        why = "the pods that were left did not go on by themselves" if len(attempts) < wanted else "a restart more"
        result.fail(
            WHERE,
            "elastic",
            f"{len(attempts)} worker group(s), expected {wanted}: {why} "
            f"({last.outcome or 'running'}; {exits_in_words(last.exit_codes)})",
        )
        return
    full, shrunk = options.pods * options.procs_per_pod, (options.pods - 1) * options.procs_per_pod
    sizes = [full, shrunk, full] if grows else [full, shrunk]
    resumes: list[int] = []
    for before, after, world in zip(attempts[:-1], attempts[1:], sizes[1:], strict=True):
        resumes.append(_judge_group(result, before, after, world, options.save_steps))
    _judge_launchers(result, run, lost)
    _judge_rows(result, run, attempts, resumes)
    _judge_recoveries(result, output_dir, resumes)
    last = attempts[-1]
    losses = [s.loss for a in attempts for s in a.steps if s.loss is not None]
    training.judge_completion(train, last, losses, output_dir, expect, attempts=len(attempts))
    if not result.failed:
        steps = " → ".join(f"world {g['world_size']} from step {g['first_step']}" for g in result.details["groups"])
        result.reason = (
            f"pod {lost.pod} lost for good at step {lost.at_step}; nobody acted: {steps}; the global batch kept, "
            f"every step on its own rows; MTTR {', '.join(f'{m:.1f} s' for m in result.details['mttr_s'])}"
        )


def _group(attempt: Attempt) -> dict[str, Any]:
    start = attempt.last(metricslog.EVENT_START) or {}
    return {
        "world_size": start.get("world_size"),
        "global_batch_size": start.get("global_batch_size"),
        "gradient_accumulation_steps": start.get("gradient_accumulation_steps"),
        "resumed_step": training.resumed_step(start),
        "first_step": attempt.steps[0].step if attempt.steps else None,
        "last_step": attempt.steps[-1].step if attempt.steps else None,
        "outcome": attempt.outcome,
    }


def _judge_group(result: Result, before: Attempt, after: Attempt, world: int, save_steps: int) -> int:
    """``after`` is the worker group that followed ``before`` at ``world`` ranks: it resumed the newest checkpoint
    ``before`` saved, the next step first, and continued as a rescale must (world, global batch, the world the
    checkpoint was saved at, the steps trained again: :func:`~.judges.training.judge_rescale`); the step it resumed
    at."""
    last = before.steps[-1].step if before.steps else 0
    # the newest checkpoint is the last periodic one, or the one a SIGTERM saved as the agents grew the run
    saved = [int(r.get("step") or 0) for r in before.events(metricslog.EVENT_CHECKPOINT)]
    expected = max([s for s in saved if s <= last] + [last // save_steps * save_steps])
    step = training.resumed_step(after.last(metricslog.EVENT_START) or {}) or 0
    what = f"the world-{world} group"
    if step != expected:
        result.fail(WHERE, "resume", f"{what} resumed at step {step}, the newest checkpoint was {expected}")
    if after.steps and after.steps[0].step != step + 1:
        result.fail(WHERE, "resume", f"{what}'s first step is {after.steps[0].step}, expected {step + 1}")
    training.judge_rescale(result, before, after, world)
    return step


def _judge_launchers(result: Result, run: DryRun, lost: LostNode) -> None:
    """Nobody restarted a pod: each pod that was not lost ran one launcher process through the whole drill."""
    restarted = [pod.index for pod in run.pods if pod.index != lost.pod and pod.starts != 1]
    if restarted:
        result.fail(WHERE, "elastic", f"pod(s) {restarted} were started again: the drill allows no restart")


def _judge_rows(result: Result, run: DryRun, attempts: list[Attempt], resumes: list[int]) -> None:
    """Every step took its own rows of the order once, across the groups (each up to the step the next resumed)."""
    if run.work.records_rows:
        judge_attempts_rows(result, run.work.output_dir, attempts, resumes)


def _judge_recoveries(result: Result, output_dir: Path, resumes: list[int]) -> None:
    """The run directory recorded one recovery per new group, each resuming where it did, with its MTTR's parts
    (``recipekit runs history``'s own reading), within :data:`MTTR_LIMIT_S`."""
    ends = attemptends.read_ends(output_dir, [])
    found = recovery.recoveries_seen(recovery.read(output_dir), ends, None)[0][-len(resumes) :]
    result.details["recoveries"] = [r.to_json() for r in found]
    result.details["mttr_s"] = [r.mttr_s for r in found if r.mttr_s is not None]
    if [r.resume_step for r in found] != resumes:
        result.fail(
            WHERE,
            recovery.RECOVERY_FILE,
            f"records resumes at {[r.resume_step for r in found]}, the groups resumed at {resumes}",
        )
    for r in found:
        missing = [name for name, seconds in r.parts.items() if seconds is None]
        if missing:
            result.fail(WHERE, recovery.RECOVERY_FILE, f"the recovery to step {r.first_step} lacks {missing}")
        if r.mttr_s is None or r.mttr_s > MTTR_LIMIT_S:
            result.fail(WHERE, "mttr", f"a recovery took {r.mttr_s} s, the bar is {MTTR_LIMIT_S:.0f} s")
