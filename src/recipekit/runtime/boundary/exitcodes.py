"""The exit codes of a pod and what Volcano's policies make of them: the contract between a run and the scheduler.

One table (:data:`EXIT_CODES`) that the launcher and train.py exit by, the Job's exitCode policies are rendered from,
validate and the dry run check a Job against, and the docs list. Standard library only: shipped in every bundle.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import jsonfile


@dataclass(frozen=True)
class ExitCode:
    """One exit code of a pod: the contract between the run and the scheduler.

    ``action`` is the Volcano action the Job's exitCode policy takes for it; None means no policy of its own, so the
    Job's ``PodFailed → RestartJob`` applies (or nothing, for 0). The launcher exits with the worker's code, the
    Job's policies are rendered from this table (:func:`exit_code_policies`), and the bundle README and the docs
    list it: nothing else spells a code.
    """

    name: str
    code: int
    meaning: str
    action: str | None = None


#: Every code a pod can exit with, in the order the docs list them.
EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode("ok", 0, "training finished and the model is saved"),
    ExitCode("failed", 1, "a bug or an environment failure (a traceback is in the log); restarting may heal it"),
    ExitCode(
        "user_error",
        2,
        "something the user must fix (recipe, data, checkpoint, missing device or driver, a Job edited by hand), "
        "said in one line: restarting cannot heal it, so the Job ends without a retry",
        "TerminateJob",
    ),
    ExitCode(
        "preflight",
        3,
        "preflight found this pod or the cluster unfit to train (one line in the log and in the report): restart "
        "on other devices (MindCluster isolates the faulty device or node first, where it runs)",
        "RestartJob",
    ),
    ExitCode(
        "stalled",
        4,
        "the hang watchdog saw no step complete within the stall timeout (every rank's stacks are in hang/): restart "
        "from the last checkpoint",
        "RestartJob",
    ),
    ExitCode(
        "nonfinite",
        5,
        "the loss became NaN or infinite; the last good checkpoint, the offending step's batches and a report are "
        "kept in nonfinite-step-N/. ops.nonfinite_loss: stop ends the Job (a data-caused NaN would only repeat); "
        "skip restarts it (RestartJob) and the resume skips that step's batch",
        "TerminateJob",
    ),
    ExitCode(
        "preflight_gate",
        6,
        "ops.preflight: strict and preflight found a part below its bar (a slow node or link, a shared volume too "
        "slow for the plan's checkpoint, a device error counter, a node failing burn-in), named in one line and in "
        "cluster-check.json: the Job ends without a retry, as a restart would land on the same part; replace or "
        "cordon it, then resubmit",
        "TerminateJob",
    ),
    ExitCode(
        "preempted",
        128 + 15,
        "stopped by SIGTERM after saving a checkpoint (the pod was deleted or evicted): non-zero, so the Job "
        "restarts instead of completing",
    ),
)
_BY_NAME = {c.name: c for c in EXIT_CODES}


def exit_code(name: str) -> int:
    """The code of ``name`` in :data:`EXIT_CODES` (a KeyError for a name it lacks: a typo must not pass)."""
    return _BY_NAME[name].code


def exit_code_name(code: int | None) -> str:
    """The table's name of ``code``; a signal death (128 + N) not in it reads ``signal N``."""
    for entry in EXIT_CODES:
        if entry.code == code:
            return entry.name
    if code is not None and code > 128:
        return f"signal {code - 128}"
    return f"exit {code}"


def nonfinite_action(mode: str) -> str:
    """The Job's action on exit ``nonfinite`` under ``ops.nonfinite_loss: <mode>``: RestartJob only for ``skip``
    (the resume moves past the batch); otherwise the table's TerminateJob, as a restart would replay the same keyed
    data order into the same NaN until ``maxRetry``."""
    return "RestartJob" if mode == "skip" else str(_BY_NAME["nonfinite"].action)


def exit_code_policies(nonfinite_loss: str = "stop") -> list[dict[str, Any]]:
    """The Job's exitCode policies, one per code with an action of its own (``nonfinite``'s by the recipe's
    ``ops.nonfinite_loss``, :func:`nonfinite_action`).

    Volcano's controller takes the first policy that matches a pod's failure, in list order (task policies before
    the Job's), and a PodFailed event matches ``event: PodFailed`` before any exitCode policy listed after it: so
    these must precede the Job's event policies.
    """
    return [
        {"exitCode": c.code, "action": nonfinite_action(nonfinite_loss) if c.name == "nonfinite" else c.action}
        for c in EXIT_CODES
        if c.action and c.code != 0
    ]


EXIT_OK = exit_code("ok")
#: A bug or an environment failure (a traceback is in the log).
EXIT_FAILED = exit_code("failed")
#: Something the user must fix (recipe, data, checkpoint, missing device or driver), said in one line.
EXIT_USER_ERROR = exit_code("user_error")
#: Stopped by SIGTERM after saving a checkpoint: non-zero, so Volcano restarts the job instead of completing it.
EXIT_PREEMPTED = exit_code("preempted")
#: Preflight found this pod or the cluster unfit to train (the reason is one line in the log and in the report).
EXIT_PREFLIGHT = exit_code("preflight")
#: ops.preflight: strict and a check found a part below its bar (a warning under ``warn``): the Job ends.
EXIT_PREFLIGHT_GATE = exit_code("preflight_gate")
#: The hang watchdog saw no step complete within the stall timeout; every rank's stacks are in HANG_DIR.
EXIT_STALLED = exit_code("stalled")
#: The loss became NaN or infinite (ops.nonfinite_loss: stop or skip); the last good checkpoint is kept.
EXIT_NONFINITE = exit_code("nonfinite")

#: Where each training process writes the code it exits with (set by the launcher for torchrun's workers):
#: torchrun itself exits 1 whatever its worker's code, so the launcher reads the workers' codes from here.
EXIT_DIR_ENV = "RECIPEKIT_EXIT_DIR"
#: TESTING ONLY (the dry run's --kill-pod): every rank holds before the step after this one until it is killed, so
#: the simulated node failure lands at exactly that step whatever the machine's load (session/callbacks.py).
HOLD_AT_STEP_ENV = "RECIPEKIT_TESTING_HOLD_AT_STEP"
#: TESTING ONLY (the dry run's --lose-pod): the hold ends once this file exists, so the pods that are left go on
#: after the lost one was killed (its peers are not deleted: the run is elastic).
HOLD_RELEASE_ENV = "RECIPEKIT_TESTING_HOLD_RELEASE"
#: TESTING ONLY (the dry run's --return-at-step): while the world is smaller than planned, every rank holds before
#: the step after this one until torchrun's agent stops it (SIGTERM: the lost pod's replacement joined), so the run
#: grows back at exactly that step.
HOLD_SHRUNK_AT_STEP_ENV = "RECIPEKIT_TESTING_HOLD_SHRUNK_AT_STEP"
#: TESTING ONLY (the dry run's slow node): this global rank waits this many seconds before each of preflight's
#: point-to-point transfers and burn-in steps (``<rank>:<seconds>``), so preflight must name its node.
SLOW_RANK_ENV = "RECIPEKIT_TESTING_SLOW_RANK"


def record_exit(code: int, environ: Any = None) -> None:
    """Write this process's exit code where the launcher reads it (nothing when not started by the launcher).

    One small file per global rank, written before the process exits: ``rank-<R>.json`` with the code and the wall
    time, so the launcher can tell the first failure (the cause) from the ones torchrun's teardown caused.
    """
    env = os.environ if environ is None else environ
    directory = env.get(EXIT_DIR_ENV)
    if not directory:
        return
    rank = env.get("RANK", str(os.getpid()))
    try:
        record = json.dumps({"code": int(code), "time": time.time(), "rank": rank})
        jsonfile.replace_text(Path(directory) / f"rank-{rank}.json", record)
    except (OSError, ValueError):
        pass


def worker_exit_code(directory: Path) -> int | None:
    """The code of the first worker that exited non-zero (the cause), from the files :func:`record_exit` wrote.

    A SIGTERM exit (:data:`EXIT_PREEMPTED`) counts only when no worker failed otherwise: torchrun sends SIGTERM to
    a failed worker's peers, and their exits are the consequence, not the cause. None when no worker failed.
    """
    found: list[tuple[float, int]] = []
    try:
        files = sorted(Path(directory).glob("rank-*.json"))
    except OSError:
        return None
    for file in files:
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
            code, at = int(data["code"]), float(data["time"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if code != EXIT_OK:
            found.append((at, code))
    causes = sorted(f for f in found if f[1] != EXIT_PREEMPTED) or sorted(found)
    return causes[0][1] if causes else None
