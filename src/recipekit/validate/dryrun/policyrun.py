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
from typing import Any

from recipekit.runtime.boundary import exitcodes
from recipekit.validate.dryrun.cluster.attemptlog import Attempt
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
        result.fail(WHERE, "exit codes", f"the first attempt {first.outcome} (exit codes {first.exit_codes})")
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
        result.fail(WHERE, "restart", f"the restarted Job {second.outcome} (exit codes {second.exit_codes})")
        result.details["log_tails"] = tails()
        return second
    losses = [s.loss for s in second.steps if s.loss is not None]
    training.judge_completion(train, second, losses, output_dir, expect, attempts=2)
    result.reason = (
        f"pod {pod} exited {code} ({exitcodes.exit_code_name(code)}); the Job's policy: {action}; the restarted Job "
        f"trained {expect.steps} steps"
    )
    return second
