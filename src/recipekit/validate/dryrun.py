"""The dry run: the bundle's own run.sh and runtime, as N simulated Volcano pods on this machine.

The bundle is never written to: :mod:`recipekit.validate.workcopy` re-plans its recipe for this machine (tiny twin,
generated data, a few steps, pods × --procs-per-pod processes, the CPU) into a work directory and records every
difference in ``substitutions.json``. Then :mod:`~recipekit.validate.ops` builds DeepSpeed's C++ ops once,
:mod:`~recipekit.validate.attempts` starts the pods and watches them, and :mod:`~recipekit.validate.judge` decides
whether what they did is right. This module holds the options and the sequence: prerequisites, work copy, ops, the
first attempt, and — with ``--kill-pod I --at-step S`` — the kill of pod I's whole process tree at step S, the
deletion of the other pods as Volcano's RestartJob does (SIGTERM, grace period, SIGKILL), and the restart, which must
resume from the newest complete checkpoint by the runtime contract's rule (the one train.py itself applies).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from recipekit.childpython import python_argv, safe_env
from recipekit.runtime import contract
from recipekit.runtime.device import TARGETS
from recipekit.validate import judge
from recipekit.validate.attempts import DryRun, pod_environment
from recipekit.validate.checks import Result
from recipekit.validate.consistency import check_batch
from recipekit.validate.loader import Bundle, load_bundle
from recipekit.validate.observed import Attempt
from recipekit.validate.ops import build_ops, extensions_dir
from recipekit.validate.opsjudge import OpsExpectation, judge_fault, judge_metrics, judge_preflight, judge_profile
from recipekit.validate.workcopy import DryRunUsageError, prepare

__all__ = ["DryRunOptions", "DryRunUsageError", "extensions_dir", "pod_environment", "run_dry_run"]

METRICS_FILE = contract.METRICS_FILE
Progress = Callable[[str], None]


@dataclass
class DryRunOptions:
    pods: int = 2
    procs_per_pod: int = 1  # training processes (devices) per simulated pod
    steps: int = 8
    kill_pod: int | None = None
    at_step: int | None = None
    device: str = "cpu"  # cpu | npu | cuda
    workdir: Path | None = None
    timeout: float = 900.0  # the whole dry run, seconds
    grace: float = 20.0  # SIGTERM → SIGKILL when Volcano deletes the surviving pods

    @property
    def save_steps(self) -> int:
        return max(1, self.steps // 2)

    def check(self) -> None:
        """Raise DryRunUsageError for flags that contradict each other."""
        if self.pods < 1:
            raise DryRunUsageError(f"--pods must be at least 1 (got {self.pods})")
        if self.procs_per_pod < 1:
            raise DryRunUsageError(f"--procs-per-pod must be at least 1 (got {self.procs_per_pod})")
        if self.steps < 2:
            raise DryRunUsageError(f"--steps must be at least 2 (got {self.steps})")
        if self.at_step is not None and self.kill_pod is None:
            raise DryRunUsageError("--at-step needs --kill-pod")
        if self.kill_pod is not None:
            if not 0 <= self.kill_pod < self.pods:
                raise DryRunUsageError(f"--kill-pod {self.kill_pod}: pods are numbered 0..{self.pods - 1}")
            if self.at_step is None:
                self.at_step = min(self.steps - 1, self.save_steps + max(1, self.steps // 4))
            if not 1 <= self.at_step < self.steps:
                raise DryRunUsageError(
                    f"--at-step {self.at_step}: must be between 1 and --steps - 1 ({self.steps - 1})"
                )
        if self.device not in TARGETS:
            raise DryRunUsageError(f"--device {self.device}: one of {', '.join(TARGETS)}")


# ---------------------------------------------------------------------------------------------- prerequisites
def _missing_modules(bundle: Bundle) -> list[str]:
    needed = ["torch", "transformers", "datasets", "tokenizers", "psutil"]
    if bundle.plan.get("zero_stage") or (bundle.plan.get("tensor_parallel") or 1) > 1:
        needed.append("deepspeed")
    if bundle.recipe is not None and bundle.recipe.mode.kind in ("lora", "qlora"):
        needed.append("peft")
    return [name for name in needed if importlib.util.find_spec(name) is None]


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
        return 0, f"{kind} is not usable here ({last[:160]})"
    try:
        return int(proc.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return 0, f"could not count {kind} devices"


# ------------------------------------------------------------------------------------------------ the dry run
def run_dry_run(bundle: Bundle, options: DryRunOptions, progress: Progress = lambda message: None) -> list[Result]:
    """Prepare the work copy, build DeepSpeed's ops, run the pods (kill and restart them), and report."""
    options.check()
    started = time.monotonic()
    deadline = started + options.timeout
    prep = Result("dryrun.prepare", "dry run: work copy of the bundle with the laptop substitutions")
    ops = Result("dryrun.ops", "dry run: DeepSpeed C++ ops (built once, cached)")
    train = Result(
        "dryrun.train",
        f"dry run: {options.pods} pod(s) × run.sh → train.py ({options.procs_per_pod} process(es) each), "
        f"{options.steps} steps, "
        f"checkpoint at {options.save_steps}",
    )
    results = [prep, ops, train]
    resume = None
    if options.kill_pod is not None:
        resume = Result(
            "dryrun.resume",
            f"dry run: kill pod {options.kill_pod} at step {options.at_step}, RestartJob, "
            "resume from the last complete checkpoint",
        )
        results.append(resume)

    def skip_all(reason: str) -> list[Result]:
        return [r.skip(reason) for r in results]

    if bundle.doc is None or bundle.recipe is None or bundle.run_sh is None or "runtime/train.py" not in bundle.raw:
        return skip_all("needs a parseable recipe.yaml, run.sh and train.py (see files.parse)")
    if bundle.args.get("deepspeed") and bundle.ds_config is None:
        return skip_all("a DeepSpeed bundle without a parseable ds_config.json (see files.parse)")
    missing = _missing_modules(bundle)
    if missing:
        return skip_all(f"{', '.join(missing)} not installed here (pip install 'recipekit[train]')")
    if shutil.which("bash") is None:
        return skip_all("bash not found")
    if options.device != "cpu":
        count, why = _devices(options.device)
        if count == 0:
            return skip_all(why or f"no {options.device} device here")
        wanted = options.pods * options.procs_per_pod
        if count < wanted:
            return skip_all(
                f"{options.pods} pods × {options.procs_per_pod} process(es) need {wanted} {options.device} devices; "
                f"found {count}"
            )

    progress(f"preparing the work copy of {bundle.path}")
    start = time.monotonic()
    work = prepare(bundle, options)
    prep.seconds = time.monotonic() - start
    prep.details = {"workdir": str(work.root), "substitutions": [s.to_json() for s in work.substitutions]}
    prep.reason = f"{len(work.substitutions)} substitutions, listed in {work.root / 'substitutions.json'}"
    copy = load_bundle(work.bundle)
    for finding in check_batch(copy).findings:  # the substitutions themselves must leave a consistent bundle
        prep.fail(finding.file, finding.field, "work copy: " + finding.message, finding.hint)

    build_ops(work, pod_environment(work, 0, options), ops, progress, deadline)
    if ops.failed:
        train.skip("the DeepSpeed ops could not be built")
        if resume:
            resume.skip("the DeepSpeed ops could not be built")
        return results

    opsx = OpsExpectation.from_doc(copy.doc, options.device)
    if opsx.fault is not None and options.kill_pod is not None:
        raise DryRunUsageError(f"--kill-pod and an injected {opsx.fault} (ops.testing): one fault per dry run")
    checks = _ops_results(opsx, options, results)
    world, tp = copy.plan.get("world_size"), copy.plan.get("tensor_parallel")
    expect = judge.Expectation(
        steps=options.steps,
        save_steps=options.save_steps,
        world_size=world if isinstance(world, int) else None,
        killed=options.kill_pod is not None,
        tensor_parallel=tp if isinstance(tp, int) else None,
    )
    run = DryRun(work, options, progress, deadline)
    with run.podset:
        try:
            _train(run, expect, train, resume, opsx, checks)
        finally:
            run.podset.kill_all()
            left = run.podset.leftovers()
            if left:
                train.fail("<dry run>", "processes", f"processes still alive after cleanup: {left}")
    train.details.update(wall_s=round(time.monotonic() - started, 1), workdir=str(work.root))
    (work.root / "report.json").write_text(
        json.dumps([r.to_json() for r in results], indent=2, default=str) + "\n", encoding="utf-8"
    )
    return results


def _ops_results(opsx: OpsExpectation, options: DryRunOptions, results: list[Result]) -> dict[str, Result]:
    """The operations layer's results this dry run reports, added to ``results`` (by the work copy's recipe)."""
    found: dict[str, Result] = {}
    if opsx.preflight:
        found["preflight"] = Result("dryrun.preflight", f"dry run: preflight on {options.pods} pod(s), every check")
    if opsx.metrics:
        found["metrics"] = Result("dryrun.metrics", "dry run: the pods serve every metric name for Prometheus")
    if opsx.fault == "stall":
        found["fault"] = Result(
            "dryrun.stall",
            f"dry run: rank {opsx.stall_rank} stalls at step {opsx.stall_at} (ops.testing): detected, stacks "
            "dumped, RestartJob, resumed",
        )
    elif opsx.fault == "nonfinite":
        found["fault"] = Result(
            "dryrun.nonfinite",
            f"dry run: NaN loss at step {opsx.nan_at} (ops.testing): stopped with the reason, RestartJob, resumed",
        )
    if opsx.profile_steps:
        found["profile"] = Result("dryrun.profile", f"dry run: profiler trace of steps {list(opsx.profile_steps)}")
    results.extend(found.values())
    return found


def _train(
    run: DryRun,
    expect: judge.Expectation,
    train: Result,
    resume: Result | None,
    opsx: OpsExpectation,
    checks: dict[str, Result],
) -> None:
    """The attempts in order, each judged as it ends; a failed result gets the pods' log tails."""
    options, work = run.options, run.work
    first = run.attempt(kill_at=options.at_step if options.kill_pod is not None else None)
    train.seconds = first.ended - first.started
    train.details.update(judge.first_attempt_details(first, options.pods), logs=str(work.logs))
    losses = [s.loss for s in first.steps if s.loss is not None]
    timed_out = first.outcome == "timeout" and first.last(contract.EVENT_PREFLIGHT) is None
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
        if "fault" in checks and opsx.fault is not None:
            _recover(run, expect, train, checks["fault"], opsx, first)
        else:
            _attempts(run, expect, train, resume, first, losses)
    finally:
        if "metrics" in checks:
            judge_metrics(checks["metrics"], run.attempts)
        if "profile" in checks and opsx.profile_steps:
            judge_profile(checks["profile"], work.output_dir, opsx.profile_steps, run.attempts)


def _recover(
    run: DryRun,
    expect: judge.Expectation,
    train: Result,
    fault: Result,
    opsx: OpsExpectation,
    first: Attempt,
) -> None:
    """A fault the recipe injects: the first attempt must fail because of it, then RestartJob and a resumed run."""
    expected = judge.expected_resume_step(run.work.output_dir)
    fault.details["complete_checkpoints_at_restart"] = judge.complete_checkpoints(run.work.output_dir)
    judge_fault(fault, opsx.fault or "", opsx, first, None, expected)
    if fault.failed:
        fault.details["log_tails"] = run.tails()
        train.fail("<dry run>", "fault", "the injected fault was not handled (see " + fault.id + ")")
        return
    run.progress(f"{fault.id}: the fault stopped the job as it should; restarting every pod (RestartJob)")
    start = time.monotonic()
    second = run.attempt(kill_at=None)
    fault.seconds = time.monotonic() - start
    fault.details.pop("stalled_records", None)
    judge_fault(fault, opsx.fault or "", opsx, first, second, expected)
    if fault.failed:
        fault.details["log_tails"] = run.tails()
        if second.outcome != "completed":
            return
    # The poisoned step's loss is NaN by design; every other loss must be finite.
    kept = [s.loss for s in first.steps if s.loss is not None and s.step != opsx.nan_at]
    all_losses = kept + [s.loss for s in second.steps if s.loss is not None]
    judge.judge_completion(train, second, all_losses, run.work.output_dir, replace(expect, killed=True), attempts=2)
    if train.failed:
        train.details["log_tails"] = run.tails()


def _attempts(
    run: DryRun,
    expect: judge.Expectation,
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
            bad = {i: c for i, c in first.exit_codes.items() if c not in (0, None)}
            train.fail(
                "<dry run>", "exit codes", f"pod(s) exited non-zero: {bad}; log tails below, full logs in {work.logs}"
            )
        train.details["log_tails"] = run.tails()
        if resume:
            resume.skip(f"the first attempt {'timed out' if first.outcome == 'timeout' else 'failed'}")
        return
    judge.judge_start(train, first, expect.world_size, expect.tensor_parallel)

    if first.outcome == "completed":
        judge.judge_completion(train, first, losses, work.output_dir, expect)
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
    checkpoints = judge.complete_checkpoints(work.output_dir)
    expected = judge.expected_resume_step(work.output_dir)
    resume.details["kill_requested_at_step"] = options.at_step
    start = time.monotonic()
    second = run.attempt(kill_at=None)
    resume.seconds = time.monotonic() - start
    judge.judge_resume(resume, first, second, checkpoints, expected)
    if resume.failed:
        resume.details["log_tails"] = run.tails()
        if second.outcome != "completed":
            return
    all_losses = losses + [s.loss for s in second.steps if s.loss is not None]
    judge.judge_completion(train, second, all_losses, work.output_dir, expect, attempts=2)
    if train.failed:
        train.details["log_tails"] = run.tails()
