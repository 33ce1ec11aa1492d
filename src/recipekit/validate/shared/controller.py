"""What Volcano's job controller does when a pod of the Job fails: the Job's own lifecycle policies, applied.

The dry run restarts or ends its simulated Job by these rules, so the policies the bundle ships are the ones tested.
The rules, as ``applyPolicies`` in Volcano's ``pkg/controllers/job/job_controller_util.go`` (v1.x) reads them:

* a failed pod is a request with event ``PodFailed`` and the exit code of its first container
  (``job_controller_handler.go`` ``updatePod``); a deleted pod is ``PodEvicted`` with no code;
* the policies of the pod's task are tried first, then the Job's, each list in order; the first policy whose event
  (or ``*``) matches the request's event, or whose ``exitCode`` equals the request's code, gives the action;
* no match: the Job is only synced (a failed pod then counts towards the Job's failure).

So an exitCode policy listed after an event policy that matches ``PodFailed`` can never fire:
:func:`unreachable_policy_findings` reports that, and :func:`contract_policy_findings` that the Job's exitCode
policies are the runtime contract's table.
"""

from __future__ import annotations

from typing import Any

from recipekit.bundle.files import JOB
from recipekit.runtime.boundary import exitcodes
from recipekit.validate.shared.results import Finding

POD_FAILED = "PodFailed"
POD_EVICTED = "PodEvicted"
#: What the controller does when no policy matches.
NO_POLICY = "SyncJob"


def _events(policy: dict[str, Any]) -> list[str]:
    return ([policy["event"]] if policy.get("event") else []) + [str(e) for e in policy.get("events") or []]


def _policies(job: dict[str, Any], task: str | None) -> list[dict[str, Any]]:
    spec = job.get("spec") or {}
    found: list[dict[str, Any]] = []
    for t in spec.get("tasks") or []:
        if isinstance(t, dict) and t.get("name") == task:
            found.extend(p for p in t.get("policies") or [] if isinstance(p, dict))
            break
    found.extend(p for p in spec.get("policies") or [] if isinstance(p, dict))
    return found


def action_for(job: dict[str, Any], *, event: str, exit_code: int | None = None, task: str | None = None) -> str:
    """The action Volcano takes for a pod of ``task`` that raised ``event`` (with ``exit_code`` for PodFailed)."""
    for policy in _policies(job, task):
        listed = _events(policy)
        if listed and (event in listed or "*" in listed):
            return str(policy.get("action") or NO_POLICY)
        code = policy.get("exitCode")
        if code is not None and exit_code is not None and code == exit_code:
            return str(policy.get("action") or NO_POLICY)
    return NO_POLICY


def pod_failed_action(job: dict[str, Any], exit_code: int, task: str | None = None) -> str:
    """The action for a pod that exited with ``exit_code`` (non-zero: a zero exit is a success, not a failure)."""
    return action_for(job, event=POD_FAILED, exit_code=exit_code, task=task)


def unreachable_policy_findings(job: Any) -> list[Finding]:
    """exitCode policies that a ``PodFailed`` (or ``*``) event policy before them shadows: they never fire."""
    out: list[Finding] = []
    if not isinstance(job, dict):
        return out
    spec = job.get("spec") or {}
    lists = [("spec.policies", spec.get("policies"))] + [
        (f"spec.tasks[{i}].policies", t.get("policies"))
        for i, t in enumerate(spec.get("tasks") or [])
        if isinstance(t, dict)
    ]
    for where, policies in lists:
        shadow: str | None = None
        for i, policy in enumerate(policies or []):
            if not isinstance(policy, dict):
                continue
            listed = _events(policy)
            if shadow is None and (POD_FAILED in listed or "*" in listed):
                shadow = f"{where}[{i}]"
            elif shadow is not None and policy.get("exitCode") is not None:
                out.append(
                    Finding(
                        JOB,
                        f"{where}[{i}]",
                        f"exitCode {policy['exitCode']} policy never fires: {shadow} matches every failed pod first",
                        hint="Volcano takes the first matching policy: list exitCode policies before PodFailed",
                    )
                )
    return out


def contract_policy_findings(job: Any, nonfinite_loss: str = "stop") -> list[Finding]:
    """The Job's exitCode policies must be the runtime contract's table (the codes train.py and the launcher use),
    ``nonfinite``'s action as the recipe's ``ops.nonfinite_loss`` asks."""
    if not isinstance(job, dict):
        return []
    spec = job.get("spec") or {}
    have = {
        p.get("exitCode"): p.get("action")
        for p in spec.get("policies") or []
        if isinstance(p, dict) and p.get("exitCode") is not None
    }
    out = []
    for entry in exitcodes.exit_code_policies(nonfinite_loss):
        code, action = entry["exitCode"], entry["action"]
        got = pod_failed_action(job, code, first_task(spec))
        if got != action:
            name = exitcodes.exit_code_name(code)
            out.append(
                Finding(
                    JOB,
                    "spec.policies",
                    f"a pod exiting {code} ({name}) gets {got}, the runtime contract says {action}"
                    + ("" if code in have else f": no exitCode {code} policy"),
                    hint="rebuild the bundle: the policies come from runtime/boundary/exitcodes.py's EXIT_CODES",
                )
            )
    return out


def first_task(spec: dict[str, Any]) -> str | None:
    tasks = [t for t in spec.get("tasks") or [] if isinstance(t, dict)]
    return str(tasks[0].get("name")) if tasks else None


def nonfinite_mode(doc: dict[str, Any] | None) -> str:
    """recipe.yaml's ``ops.nonfinite_loss`` (``operations.alerts.nonfinite_loss``); ``stop`` when it is not there."""
    alerts = ((doc or {}).get("operations") or {}).get("alerts") or {}
    mode = alerts.get("nonfinite_loss") if isinstance(alerts, dict) else None
    return mode if isinstance(mode, str) else "stop"
