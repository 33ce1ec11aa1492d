"""A dry run whose first attempt fails on one pod on purpose (``ops.testing.user_error_pod`` or
``device_count`` + ``device_count_pod``), answered as Volcano would answer it: by the Job's own policies.

The first pod that exits non-zero is the failure Volcano's controller sees (event PodFailed with that pod's exit
code); :func:`recipekit.validate.shared.controller.pod_failed_action` picks the action from the bundle's Job. RestartJob
starts every pod again; TerminateJob and AbortJob end the Job there, without a retry. The result says which code the
pod exited with, which action the Job took, and whether that is what the runtime contract's table says.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recipekit.runtime.boundary import exitcodes
from recipekit.runtime.volume import recovery
from recipekit.validate.dryrun.cluster.attemptlog import Attempt, exits_in_words
from recipekit.validate.dryrun.judges import training
from recipekit.validate.shared import controller
from recipekit.validate.shared.results import Result

WHERE = "<dry run>"
RESTARTS = ("RestartJob", "RestartTask", "RestartPod")


def expected_code(fault: str) -> int:
    """The exit code the injected one-pod fault must produce."""
    return exitcodes.EXIT_USER_ERROR if fault == "user_error" else exitcodes.EXIT_PREFLIGHT


def judge_first_failure(result: Result, fault: str, pod: int | None, first: Attempt, job: dict[str, Any]) -> str:
    """The failed pod and its code are the injected ones; returns the action the Job's policies take."""
    failure = first.first_failure
    task = controller.first_task(job.get("spec") or {})
    want = expected_code(fault)
    result.details.update(
        injected=fault,
        injected_pod=pod,
        first_failure=list(failure) if failure else None,
        exit_codes=first.exit_codes,
    )
    if first.outcome != "failed" or failure is None:
        result.fail(WHERE, "exit codes", f"the first attempt {first.outcome} ({exits_in_words(first.exit_codes)})")
        return controller.NO_POLICY
    failed_pod, code = failure
    action = controller.pod_failed_action(job, code, task)
    table = next((c.action for c in exitcodes.EXIT_CODES if c.code == code), None) or "RestartJob"
    result.details.update(exit_name=exitcodes.exit_code_name(code), action=action, contract_action=table)
    if code != want:
        result.fail(
            WHERE,
            "exit code",
            f"pod {failed_pod} exited {code} ({exitcodes.exit_code_name(code)}), expected {want} "
            f"({exitcodes.exit_code_name(want)}): the pod's exit status is not the run's own code",
        )
    # preflight's verdict is agreed by every pod, so any of them may fail first; a configuration error is the pod's own
    if fault == "user_error" and pod is not None and failed_pod != pod:
        result.fail(WHERE, "exit code", f"pod {failed_pod} failed first, the fault was injected into pod {pod}")
    if action != table:
        result.fail(WHERE, "policies", f"the Job answers exit {code} with {action}, the runtime contract with {table}")
    return action


def run_policy_fault(
    attempt: Callable[[], Attempt],
    result: Result,
    train: Result,
    fault: str,
    pod: int | None,
    first: Attempt,
    job: dict[str, Any],
    expect: training.Expectation,
    output_dir: Any,
    tails: Callable[[], dict[str, str]],
) -> Attempt | None:
    """Apply the Job's action to the first attempt's failure; the second attempt when the action restarts."""
    action = judge_first_failure(result, fault, pod, first, job)
    if result.failed:
        result.details["log_tails"] = tails()
        train.skip("the injected failure was not answered as the Job's policies say (see " + result.id + ")")
        return None
    code = result.details["first_failure"][1]
    if action not in RESTARTS:
        steps = [s.step for s in first.steps]
        result.details.update(attempts=1, steps_trained=steps)
        if steps:
            result.fail(WHERE, "steps", f"training ran steps {steps} although pod {pod} failed before training")
        result.reason = (
            f"pod {pod} exited {code} ({exitcodes.exit_code_name(code)}); the Job's policy: {action}, the Job ends "
            "without a retry"
        )
        train.skip(f"the Job ended by its own policy ({action} on exit {code}), as the test intends")
        return None
    start = time.monotonic()
    second = attempt()
    result.seconds = time.monotonic() - start
    result.details.update(attempts=2, second_exit_codes=second.exit_codes)
    if second.outcome != "completed":
        result.fail(WHERE, "restart", f"the restarted Job {second.outcome} ({exits_in_words(second.exit_codes)})")
        result.details["log_tails"] = tails()
        return second
    losses = [s.loss for s in second.steps if s.loss is not None]
    training.judge_completion(train, second, losses, output_dir, expect, attempts=2)
    result.reason = (
        f"pod {pod} exited {code} ({exitcodes.exit_code_name(code)}); the Job's policy: {action}; the restarted Job "
        f"trained {expect.steps} steps"
    )
    return second


def nonfinite_policy(result: Result, train: Result, first: Attempt, job: dict[str, Any], mode: str) -> str | None:
    """The Job's answer to the NaN loss the recipe injected: the action its policies take for the first failed pod
    (exit ``nonfinite``), held to ``ops.nonfinite_loss`` (TerminateJob under stop, RestartJob under skip). A Job that
    ends is judged here (the batch and the report kept, no second attempt) and None returned; else the action."""
    failure = first.first_failure
    code = failure[1] if failure else None
    action = controller.pod_failed_action(job, code, controller.first_task(job.get("spec") or {})) if code else None
    want = exitcodes.nonfinite_action(mode)
    result.details.update(exit_code=code, action=action, contract_action=want, nonfinite_loss=mode)
    if code != exitcodes.EXIT_NONFINITE:
        result.fail(WHERE, "exit code", f"the first failed pod exited {code}, not {exitcodes.EXIT_NONFINITE}")
        return None
    if action != want:
        result.fail(
            WHERE, "policies", f"the Job answers exit {code} with {action}; ops.nonfinite_loss: {mode} says {want}"
        )
        return None
    if action in RESTARTS:
        return action
    record = result.details.get("nonfinite") or {}
    report = Path(str(record.get("report") or ""))
    kept = sorted(p.name for p in report.glob("batch-rank-*.json")) if record.get("report") else []
    result.details.update(attempts=1, report_kept=(report / "report.json").is_file(), batches_kept=kept)
    if not (report / "report.json").is_file() or not kept:
        result.fail(WHERE, "nonfinite report", f"the report and the offending batches are not both in {report}")
    if record.get("action") != action:
        result.fail(WHERE, "nonfinite record", f"the run's record says {record.get('action')}, the Job did {action}")
    if not result.failed:
        result.reason = (
            f"loss NaN at step {record.get('step')}: every rank stopped; exit {code} (nonfinite); the Job's policy: "
            f"{action}, the Job ends without a retry; the report and {len(kept)} batch file(s) kept in {report}"
        )
        train.skip(f"the Job ended by its own policy ({action} on exit {code}), as ops.nonfinite_loss: {mode} asks")
    return None


def judge_skipped(result: Result, output_dir: Path, step: int | None) -> None:
    """``ops.nonfinite_loss: skip``: recovery.jsonl records that step ``step``'s batch is skipped, and the restarted
    attempt's start says its order leaves it out (the record ``recipekit runs history`` reads)."""
    records = recovery.read(output_dir)
    skips = recovery.skips(records)
    starts = [r for r in records if r.get("event") == "start"]
    result.details.update(skips=skips, skipped_steps=starts[-1].get("skipped_steps") if starts else None)
    if not any(s["step"] == step for s in skips):
        result.fail(WHERE, recovery.RECOVERY_FILE, f"no skip record of step {step}'s batch: {skips}")
    elif len(starts) < 2 or step not in (starts[-1].get("skipped_steps") or []):
        result.fail(WHERE, recovery.RECOVERY_FILE, f"the restarted attempt's start does not skip step {step}")
    elif result.reason:
        s = next(s for s in skips if s["step"] == step)
        result.reason += (
            f"; the resume skipped step {step}'s batch (positions {s['start']}-{s['stop'] - 1} of epoch "
            f"{s['epoch']}'s order, ops.nonfinite_loss: skip)"
        )
