"""The dry run: the bundle's own launcher and runtime, as N simulated Volcano pods on this machine.

The bundle is never written to: :mod:`recipekit.validate.dryrun.workdir.workcopy` re-plans its recipe for this machine
(tiny twin, generated data, a few steps, pods × --procs-per-pod processes, the CPU) into a work directory and records
every difference in ``substitutions.json``. Then :mod:`~recipekit.validate.dryrun.workdir.extensions` builds DeepSpeed's
C++ extensions once, :mod:`~recipekit.validate.dryrun.cluster.attempts` starts the pods and watches them, and
:mod:`~recipekit.validate.dryrun.judges.training` decides whether what they did is right. This module holds the options
and the sequence: prerequisites, work copy, ops, the first attempt, and — with ``--kill-pod I --at-step S`` — the kill
of pod I's whole process tree at step S, the deletion of the other pods as Volcano's RestartJob does (SIGTERM, grace
period, SIGKILL), and the restart, which must resume from the newest complete checkpoint by the runtime contract's rule
(the one train.py itself applies).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from recipekit.recipe.sections import TRACKERS
from recipekit.runtime.boundary import filenames, metricslog
from recipekit.runtime.boundary.recipeview import HotCheckpointsView
from recipekit.runtime.volume import hottier
from recipekit.validate.dryrun import elasticrun, policyrun, restartrun
from recipekit.validate.dryrun.cluster.attemptlog import Attempt, exits_in_words
from recipekit.validate.dryrun.cluster.attempts import DryRun, node_local_dir, pod_environment
from recipekit.validate.dryrun.judges import training
from recipekit.validate.dryrun.judges.evaluation import eval_result, judge_eval
from recipekit.validate.dryrun.judges.operations import (
    OpsExpectation,
    judge_fault,
    judge_metrics,
    judge_preflight,
    judge_profile,
)
from recipekit.validate.dryrun.judges.rows import judge_attempts_rows
from recipekit.validate.dryrun.judges.trackers import judge_trackers, logged_losses
from recipekit.validate.dryrun.options import DryRunOptions, DryRunUsageError
from recipekit.validate.dryrun.workdir.engines import dryrun_engine, engine_of_doc
from recipekit.validate.dryrun.workdir.extensions import build_extensions
from recipekit.validate.dryrun.workdir.locks import FileLock
from recipekit.validate.dryrun.workdir.workcopy import WorkCopy, prepare, rescale_work_copy, rescaled_or_refused
from recipekit.validate.shared.childpython import python_argv, safe_env
from recipekit.validate.shared.loader import Bundle, load_bundle
from recipekit.validate.shared.results import Result
from recipekit.validate.static.consistency import check_batch

METRICS_FILE = filenames.METRICS_FILE
Progress = Callable[[str], None]


# ---------------------------------------------------------------------------------------------- prerequisites
def _devices(kind: str) -> tuple[int, str]:
    """How many ``kind`` devices this machine has (asked in a child: importing torch_npu here is not wanted)."""
    probe = {
        "cuda": "import torch; print(torch.cuda.device_count())",
        "npu": "import torch, torch_npu; print(torch.npu.device_count())",
    }[kind]
    try:
        proc = subprocess.run(python_argv("-c", probe), capture_output=True, text=True, timeout=120, env=safe_env())
    except subprocess.TimeoutExpired:
        return 0, "probing the devices timed out"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return 0, f"no usable {kind} device here ({last[:160]})"
    try:
        return int(proc.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return 0, f"could not count {kind} devices"


# ------------------------------------------------------------------------------------------------ the dry run
@dataclass
class _Results:
    """The dry run's own results, in the order they are reported (the operations layer's are added after)."""

    prep: Result
    extensions: Result
    train: Result
    resume: Result | None
    restart: Result | None = None

    @classmethod
    def of(cls, options: DryRunOptions) -> _Results:
        train = Result(
            "dryrun.train",
            f"dry run: {options.pods} pod(s) × launcher → train.py ({options.procs_per_pod} process(es) each), "
            f"{options.steps} steps, checkpoint at {options.save_steps}",
        )
        resume = None
        if options.kill_pod is not None:
            where = (
                f"continue on {options.resume_pods} pod(s) at the same global batch (rescale)"
                if options.resume_pods is not None
                else "RestartJob"
            )
            resume = Result(
                "dryrun.resume",
                f"dry run: kill pod {options.kill_pod} at step {options.at_step}, {where}, "
                "resume from the last complete checkpoint",
            )
        if options.lose_pod is not None:
            back = f", capacity back at step {options.return_at_step}" if options.return_at_step else ""
            resume = Result(
                "dryrun.elastic",
                f"dry run: lose pod {options.lose_pod} for good at step {options.at_step}{back}; the pods that are "
                "left go on by themselves (torchrun's elastic agent) at the same global batch, resuming exactly",
            )
        restart = None
        if options.restart is not None:
            restart = Result(
                "dryrun.restart",
                f"dry run: once complete, restart as `recipekit restart` writes it: {options.restart}",
            )
        return cls(
            Result("dryrun.prepare", "dry run: work copy of the bundle with the laptop substitutions"),
            Result("dryrun.ops", "dry run: DeepSpeed C++ ops (built once, cached)"),
            train,
            resume,
            restart,
        )

    def all(self) -> list[Result]:
        later = [r for r in (self.resume, self.restart) if r is not None]
        return [self.prep, self.extensions, self.train, *later]


def _unrunnable(bundle: Bundle, options: DryRunOptions, progress: Progress) -> str | None:
    """Why this machine cannot dry-run ``bundle`` (every result is skipped with it), or None. The engine's own
    prerequisites are its room's (the Megatron engine builds its venv here, once per machine)."""
    engine = engine_of_doc(bundle.doc)
    if bundle.doc is None or bundle.recipe is None or bundle.run_sh is None or engine.entry_file not in bundle.raw:
        return f"needs a parseable recipe.yaml, run.sh and {engine.entry_file} (see files.parse)"
    if bundle.args.get("deepspeed") and bundle.ds_config is None:
        return "a DeepSpeed bundle without a parseable ds_config.json (see files.parse)"
    if shutil.which("bash") is None:
        return "bash not found"
    return device_problem(options) or engine.unrunnable(bundle, progress)


def device_problem(options: DryRunOptions) -> str | None:
    """Why this machine cannot give ``--device``'s dry run its pods × processes devices, or None (always None on the
    CPU). ``validate`` asks before any check runs and refuses the flag (exit 2): a dry run asked for on a device this
    machine lacks did not run, and must not read as passed."""
    if options.device == "cpu":
        return None
    count, why = _devices(options.device)
    wanted = options.pods * options.procs_per_pod
    if count == 0:
        why = why or f"no {options.device} device here"
        return f"--device {options.device}: {why}; drop --device to dry-run on the CPU"
    if count < wanted:
        return (
            f"--device {options.device}: {options.pods} pods × {options.procs_per_pod} process(es) need {wanted} "
            f"{options.device} devices, this machine has {count}; fewer --pods or --procs-per-pod, or the CPU"
        )
    return None


def run_dry_run(bundle: Bundle, options: DryRunOptions, progress: Progress = lambda message: None) -> list[Result]:
    """Prepare the work copy, build DeepSpeed's ops, run the pods (kill and restart them), and report.

    The work directory is held (a lock, workdir/locks.py) from its preparation to the end, by this process and by
    the pods, so a second dry run of it is refused at once; the extension cache likewise, shared."""
    options = options.resolved()  # resolved options come back unchanged (validate() resolves them first)
    refusal = elasticrun.not_elastic(bundle.launch, options)
    if refusal:
        raise DryRunUsageError(refusal)
    started = time.monotonic()
    results = _Results.of(options)
    unproven = _not_proven(bundle)
    why = _unrunnable(bundle, options, progress)
    if why is not None:
        return [r.skip(why) for r in results.all()] + unproven
    # the engine's own word on the layout as built, then what the run cannot prove (its venv: unrunnable() built it)
    engine_results = engine_of_doc(bundle.doc).own_checks(bundle) + unproven
    progress(f"preparing the work copy of {bundle.path}")
    preparing = time.monotonic()
    work = prepare(bundle, options)
    try:
        copy = _judge_work_copy(work, results.prep, options, time.monotonic() - preparing)
        cache = build_extensions(
            work, pod_environment(work, 0, options), results.extensions, progress, started + options.timeout
        )
        try:
            found = _run_pods(work, copy, options, results, progress, started, cache)
        finally:
            if cache is not None:
                cache.close()
    finally:
        work.release()
    found += engine_results
    (work.root / "report.json").write_text(
        json.dumps([r.to_json() for r in found], indent=2, default=str) + "\n", encoding="utf-8"
    )
    return found


def _not_proven(bundle: Bundle) -> list[Result]:
    """What a CPU dry run of the bundle's engine does not prove, as one result of validate's report (skipped: not
    a check that passed); none for an engine whose limits are the dry run's usual ones (docs/validate.md)."""
    items = engine_of_doc(bundle.doc).not_proven(bundle)
    if not items:
        return []
    result = Result("dryrun.unproven", "dry run: what a CPU dry run of this engine does not prove")
    result.details["not_proven"] = items
    return [result.skip("not proven here: " + "; ".join(items))]


def _judge_work_copy(work: WorkCopy, prep: Result, options: DryRunOptions, seconds: float) -> Bundle:
    """The work copy as a bundle, its substitutions recorded in ``prep`` and checked for consistency."""
    prep.seconds = seconds
    prep.details = {"workdir": str(work.root), "substitutions": [s.to_json() for s in work.substitutions]}
    derived = sum(1 for s in work.substitutions if s.derived)
    prep.reason = (
        f"{len(work.substitutions) - derived} substitutions in the recipe and {derived} values that follow from them, "
        f"in {work.root / 'substitutions.json'}"
    )
    copy = load_bundle(work.bundle)
    for finding in check_batch(copy).findings:  # the substitutions themselves must leave a consistent bundle
        prep.fail(finding.file, finding.field, "work copy: " + finding.message, finding.hint)
    if options.resume_pods is not None and copy.recipe is not None:  # refused before any pod starts
        rescaled_or_refused(copy.recipe, options.resume_pods)
    return copy


def _run_pods(
    work: WorkCopy,
    copy: Bundle,
    options: DryRunOptions,
    results: _Results,
    progress: Progress,
    started: float,
    cache: FileLock | None,
) -> list[Result]:
    """The attempts, once the ops are there: every result of the dry run, the operations layer's included."""
    train, resume = results.train, results.resume
    found = results.all()
    if results.extensions.failed:
        for result in (train, resume):
            if result is not None:
                result.skip("the DeepSpeed ops could not be built")
        return found
    engine = dryrun_engine(work.plan.engine)
    operations = _engine_operations(
        OpsExpectation.from_doc(copy.doc, options.device), engine.operations, options.restart
    )
    if operations.fault is not None and options.kill_pod is not None:
        raise DryRunUsageError(f"--kill-pod and an injected {operations.fault} (ops.testing): one fault per dry run")
    checks = _ops_results(operations, options, found)
    expect = training.Expectation(
        steps=options.steps,
        save_steps=options.save_steps,
        world_size=work.plan.layout.world_size,
        killed=options.kill_pod is not None,
        tensor_parallel=work.plan.layout.tensor_parallel,
        engine=engine,
        weights=engine.exports_weights(copy.doc),
    )
    tracked = _tracker_result(copy, found)
    evaluated = eval_result(copy, found)
    held = tuple(lock.fd for lock in (work.lock, cache) if lock is not None)
    run = DryRun(work, options, progress, started + options.timeout, held=held)
    with run.podset:
        try:
            _train(run, expect, train, resume, operations, checks)
            if results.restart is not None:
                _restart(run, expect, train, results.restart)
        finally:
            run.podset.kill_all()
            left = run.podset.leftovers()
            if left:
                train.fail("<dry run>", "processes", f"processes still alive after cleanup: {left}")
    if tracked is not None:
        if logged_losses(work.output_dir):
            judge_trackers(tracked, work.output_dir, tracked.details.pop("trackers"))
        else:
            tracked.skip("no training step was logged")
    if evaluated is not None:  # eval.enabled: rank 0 scored the twin after the final save
        if train.failed:
            evaluated.skip("training did not finish")
        else:
            judge_eval(evaluated, work.output_dir)
    train.details.update(wall_s=round(time.monotonic() - started, 1), workdir=str(work.root))
    return found


def _engine_operations(operations: OpsExpectation, runs: frozenset[str], restart: str | None) -> OpsExpectation:
    """``operations`` less what the engine's room does not run (its dry run then judges none of it: validate's
    report says so in dryrun.unproven); a fault the recipe injects into such a room is refused."""
    if restart is not None and "restart" not in runs:
        raise DryRunUsageError(f"--restart {restart}: this engine's room does not take `recipekit restart` requests")
    if operations.fault is not None and "fault" not in runs:
        raise DryRunUsageError(
            f"ops.testing injects a {operations.fault} fault, which this engine's room does not run: drop ops.testing"
        )
    return replace(
        operations,
        preflight=operations.preflight and "preflight" in runs,
        metrics=operations.metrics and "metrics" in runs,
        profile_steps=operations.profile_steps if "profile" in runs else None,
    )


def _restart(run: DryRun, expect: training.Expectation, train: Result, restart: Result) -> None:
    """``--restart``: once the run completed, each restart as `recipekit restart` writes it (restartrun.py)."""
    first = run.attempts[0] if run.attempts else None
    if first is None or first.outcome != "completed" or train.failed:
        restart.skip("the run did not complete")
        return
    work = run.work
    restartrun.run_restarts(
        lambda env: run.attempt(kill_at=None, env=env),
        work.bundle,
        work.root,
        work.output_dir,
        run.options.restarts(),
        run.attempts[-1],
        restart,
        expect,
        run.progress,
    )
    if restart.failed:
        restart.details["log_tails"] = run.tails()


def _tracker_result(copy: Bundle, results: list[Result]) -> Result | None:
    """The trackers' result when the work copy reports to one (each runs offline in a dry run), added to
    ``results``."""
    reported = copy.args.get("report_to")
    names = [name for name in (reported if isinstance(reported, list) else []) if name in TRACKERS]
    if not names:
        return None
    result = Result("dryrun.trackers", f"dry run: {', '.join(names)} offline; their files hold the run's losses")
    result.details["trackers"] = names
    results.append(result)
    return result


def _ops_results(operations: OpsExpectation, options: DryRunOptions, results: list[Result]) -> dict[str, Result]:
    """The operations layer's results this dry run reports, added to ``results`` (by the work copy's recipe)."""
    found: dict[str, Result] = {}
    if operations.preflight:
        found["preflight"] = Result("dryrun.preflight", f"dry run: preflight on {options.pods} pod(s), every check")
    if operations.metrics:
        found["metrics"] = Result("dryrun.metrics", "dry run: the pods serve every metric name for Prometheus")
    if operations.fault == "stall":
        found["fault"] = Result(
            "dryrun.stall",
            f"dry run: rank {operations.stall_rank} stalls at step {operations.stall_at} (ops.testing): detected, "
            "stacks dumped, RestartJob, resumed",
        )
    elif operations.fault == "nonfinite":
        then = (
            "RestartJob, resumed past the step's batch"
            if operations.nonfinite_loss == "skip"
            else "TerminateJob, no retry, the batch kept"
        )
        found["fault"] = Result(
            "dryrun.nonfinite",
            f"dry run: NaN loss at step {operations.nan_at} (ops.testing): stopped with the reason, {then}",
        )
    elif operations.fault in ("user_error", "preflight"):
        pod = operations.user_error_pod if operations.fault == "user_error" else operations.device_count_pod
        found["fault"] = Result(
            "dryrun.policy",
            f"dry run: pod {pod} fails with the {operations.fault} exit code (ops.testing); the Job's own policies "
            "decide",
        )
    if operations.profile_steps:
        found["profile"] = Result(
            "dryrun.profile", f"dry run: profiler trace of steps {list(operations.profile_steps)}"
        )
    results.extend(found.values())
    return found


def _train(
    run: DryRun,
    expect: training.Expectation,
    train: Result,
    resume: Result | None,
    operations: OpsExpectation,
    checks: dict[str, Result],
) -> None:
    """The attempts in order, each judged as it ends; a failed result gets the pods' log tails."""
    options, work = run.options, run.work
    lost = elasticrun.lost_node(options)
    last = run.attempt(kill_at=options.at_step if options.kill_pod is not None else None, lost=lost)
    first = run.attempts[0]
    train.seconds = last.ended - first.started
    train.details.update(training.first_attempt_details(first, options.pods), logs=str(work.logs))
    losses = [s.loss for s in first.steps if s.loss is not None]
    if operations.fault in ("user_error", "preflight"):  # the Job's exitCode policies answer it
        pod = operations.user_error_pod if operations.fault == "user_error" else operations.device_count_pod
        second = policyrun.run_policy_fault(
            lambda: run.attempt(kill_at=None),
            checks["fault"],
            train,
            operations.fault,
            pod,
            first,
            run.job,
            expect,
            work.output_dir,
            run.tails,
        )
        if "preflight" in checks:
            if second is None:
                checks["preflight"].skip("the Job ended after the first attempt")
            else:
                judge_preflight(checks["preflight"], second)
        for key in ("metrics", "profile"):
            if key in checks and second is None:
                checks[key].skip("the Job ended after the first attempt")
        if second is not None:
            if "metrics" in checks:
                judge_metrics(checks["metrics"], run.attempts)
            if "profile" in checks and operations.profile_steps:
                judge_profile(checks["profile"], work.output_dir, operations.profile_steps, run.attempts)
        return
    timed_out = first.outcome == "timeout" and first.last(metricslog.EVENT_PREFLIGHT) is None
    if "preflight" in checks and timed_out:
        checks["preflight"].skip("the first attempt timed out before preflight reported")
    elif "preflight" in checks and not judge_preflight(checks["preflight"], first):
        checks["preflight"].details["log_tails"] = run.tails()
        train.fail("<dry run>", "preflight", "no training: preflight did not pass (dryrun.preflight says why)")
        for key, result in checks.items():
            if key != "preflight":
                result.skip("preflight did not pass")
        if resume:
            resume.skip("preflight did not pass")
        return
    try:
        if lost is not None and resume is not None:
            elasticrun.judge_elastic(run, lost, train, resume, expect)
            if resume.failed or train.failed:
                train.details["log_tails"] = run.tails()
        elif "fault" in checks and operations.fault is not None:
            _recover(run, expect, train, checks["fault"], operations, first)
        else:
            _attempts(run, expect, train, resume, first, losses)
    finally:
        if "metrics" in checks:
            judge_metrics(checks["metrics"], run.attempts)
        if "profile" in checks and operations.profile_steps:
            judge_profile(checks["profile"], work.output_dir, operations.profile_steps, run.attempts)


def hot_tier_of_one_pod(run: DryRun) -> Path | None:
    """The hot tier a restart of a one-pod run may resume from (train.hot_checkpoints; runtime/volume/hottier.py
    says where it lies and why only one pod's counts), or None."""
    work = run.work
    if work.hot_tier == "none" or run.options.pods != 1:
        return None
    view = HotCheckpointsView(work.hot_tier, "/", 1)
    tier = hottier.hot_tier(view, work.plan.job_name, {hottier.HOT_DIR_ENV: str(node_local_dir(work, 0))})
    return tier.directory if tier is not None else None


def _recover(
    run: DryRun,
    expect: training.Expectation,
    train: Result,
    fault: Result,
    operations: OpsExpectation,
    first: Attempt,
) -> None:
    """A fault the recipe injects: the first attempt must fail because of it, then RestartJob and a resumed run."""
    expected = training.expected_resume_step(run.work.output_dir, engine=expect.engine)
    fault.details["complete_checkpoints_at_restart"] = training.complete_checkpoints(run.work.output_dir, expect.engine)
    judge_fault(fault, operations.fault or "", operations, first, None, expected)
    if fault.failed:
        fault.details["log_tails"] = run.tails()
        train.fail("<dry run>", "fault", "the injected fault was not handled (see " + fault.id + ")")
        return
    if operations.fault == "nonfinite":  # the Job's own policy answers exit nonfinite (ops.nonfinite_loss)
        if policyrun.nonfinite_policy(fault, train, first, run.job, operations.nonfinite_loss) is None:
            if fault.failed:
                fault.details["log_tails"] = run.tails()
                train.fail("<dry run>", "fault", "the NaN loss was not answered as the Job's policies say")
            return
    run.progress(f"{fault.id}: the fault stopped the job as it should; restarting every pod (RestartJob)")
    start = time.monotonic()
    second = run.attempt(kill_at=None)
    fault.seconds = time.monotonic() - start
    fault.details.pop("stalled_records", None)
    judge_fault(fault, operations.fault or "", operations, first, second, expected, run.work.output_dir)
    if operations.fault == "nonfinite" and not fault.failed:
        policyrun.judge_skipped(fault, run.work.output_dir, operations.nan_at)
    if fault.failed:
        fault.details["log_tails"] = run.tails()
        if second.outcome != "completed":
            return
    # The poisoned step's loss is NaN by design; every other loss must be finite.
    kept = [s.loss for s in first.steps if s.loss is not None and s.step != operations.nan_at]
    all_losses = kept + [s.loss for s in second.steps if s.loss is not None]
    training.judge_completion(train, second, all_losses, run.work.output_dir, replace(expect, killed=True), attempts=2)
    if train.failed:
        train.details["log_tails"] = run.tails()


def _judge_rows(run: DryRun, resume: Result, first: Attempt, second: Attempt, expected: int | None) -> None:
    """The row ledger: the resumed attempt trains exactly the rows the killed one had not (ops.testing.record_rows)."""
    judge_attempts_rows(resume, run.work.output_dir, [first, second], [expected or 0])


def _attempts(
    run: DryRun,
    expect: training.Expectation,
    train: Result,
    resume: Result | None,
    first: Attempt,
    losses: list[float],
) -> None:
    """Without an injected fault: the first attempt completes, or is killed (--kill-pod) and resumed."""
    options, work = run.options, run.work
    if first.outcome in ("timeout", "failed"):
        if first.outcome == "timeout":
            last = first.steps[-1].step if first.steps else "none"
            train.fail(
                "<dry run>", "timeout", f"no result within --timeout {options.timeout:.0f} s (last step seen: {last})"
            )
        else:
            bad = exits_in_words(first.exit_codes, failed_only=True)
            train.fail("<dry run>", "exit codes", f"{bad}; log tails below, full logs in {work.logs}")
        train.details["log_tails"] = run.tails()
        if resume:
            resume.skip(f"the first attempt {'timed out' if first.outcome == 'timeout' else 'failed'}")
        return
    training.judge_start(train, first, expect.world_size, expect.tensor_parallel)

    if first.outcome == "completed":
        training.judge_completion(train, first, losses, work.output_dir, expect)
        if train.failed:
            train.details["log_tails"] = run.tails()
        if resume is not None:
            resume.fail(
                "<dry run>",
                "--at-step",
                f"training finished before step {options.at_step} was seen in {METRICS_FILE}, so no pod was killed",
                hint="choose a smaller --at-step or more --steps",
            )
        return

    # killed: the pods are restarted, as Volcano's RestartJob policy does
    assert resume is not None
    train.details.update(killed_pod=options.kill_pod, killed_at_step=first.killed_step)
    train.reason = (
        f"{len(first.steps)} steps before the kill; {train.details['time_to_first_step_s']} s to the first step, "
        f"{train.details['steps_per_s']} steps/s"
    )
    checkpoints = training.complete_checkpoints(work.output_dir, expect.engine)
    hot = hot_tier_of_one_pod(run) if options.resume_pods is None else None
    expected = training.expected_resume_step(work.output_dir, hot, expect.engine)
    resume.details["kill_requested_at_step"] = options.at_step
    if hot is not None:
        resume.details["hot_checkpoints_at_restart"] = training.signed_hot_checkpoints(hot)
    start = time.monotonic()
    if options.resume_pods is not None:  # the node is gone for good: the Job is rebuilt for the pods (rescale)
        change = rescale_work_copy(work, options.resume_pods)
        run.resize(options.resume_pods)
        run.progress(f"continuing on {options.resume_pods} pod(s): {change}")
    second = run.attempt(kill_at=None)
    resume.seconds = time.monotonic() - start
    recorded = work.output_dir if "recovery" in expect.engine.operations else None  # the room's recovery.jsonl
    training.judge_resume(resume, first, second, checkpoints, expected, recorded)
    if second.outcome == "completed":
        if options.resume_pods is not None:
            world = options.resume_pods * options.procs_per_pod
            training.judge_rescale(resume, first, second, world)
        if work.records_rows:
            _judge_rows(run, resume, first, second, expected)
    if resume.failed:
        resume.details["log_tails"] = run.tails()
        if second.outcome != "completed":
            return
    all_losses = losses + [s.loss for s in second.steps if s.loss is not None]
    training.judge_completion(train, second, all_losses, work.output_dir, expect, attempts=2)
    if train.failed:
        train.details["log_tails"] = run.tails()
