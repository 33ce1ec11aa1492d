"""The experiment trackers (W&B, MLflow, SwanLab), guarded: a tracker that is down never stops training.

transformers' own integrations report (``WandbCallback``, ``MLflowCallback``, ``SwanLabCallback``: the Trainer adds
them for ``report_to``), configured by launch.json's environment (recipekit's bundle/trackers.py). Left alone, a
tracker can stop a run three ways: its client is missing or broken (the Trainer's constructor raises), a call raises
(a refused login, a server that answers 500), or a call blocks (``wandb.init`` waiting for a server, MLflow retrying
an unreachable one) while the other ranks wait in a collective until a timeout or the hang watchdog ends the run.

So each integration callback is replaced by a :class:`GuardedTracker` in the same place of the callback list (the
reporters run after the figures they report are added): every event runs on one thread of the tracker's own (its
thread-local state, such as MLflow's active run, stays where it was made) and is waited for at most
:func:`deadline_s`; an exception or a deadline passed turns that tracker off for the rest of the run, with one
warning line and an ``alert`` record (``tracker_off``). Training goes on, and metrics.jsonl, TensorBoard and the
metrics endpoint still have every figure. At the end each tracker's ``finish`` gets :data:`FINISH_WAIT_S` to send
what it holds (the process ends with ``os._exit``, so no exit hook of the tracker would run).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import queue
import threading
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from ...boundary.common import LOG
from .clients import MODULES

#: The integration callbacks guarded, by class name, with the tracker each reports to.
INTEGRATIONS = {"WandbCallback": "wandb", "MLflowCallback": "mlflow", "SwanLabCallback": "swanlab"}
#: Seconds the end of training waits for a tracker to send what it holds.
FINISH_WAIT_S = 60.0
#: Alert name of a tracker turned off (metrics.jsonl ``alert`` record, the alerts counter).
ALERT = "tracker_off"


def deadline_s(startup_timeout_s: float) -> float:
    """How long one tracker call may take: well inside the hang watchdog's start-up timeout (the other ranks wait for
    rank 0 meanwhile), at most a minute, at least 5 s."""
    return max(5.0, min(60.0, startup_timeout_s / 4))


def importable(report_to: Any) -> tuple[Any, list[str]]:
    """``report_to`` without the trackers whose client cannot be imported here, and a note for each one dropped: the
    Trainer's constructor would raise for it, before any guard could act."""
    if not isinstance(report_to, list):
        return report_to, []
    kept, notes = [], []
    for name in report_to:
        module = MODULES.get(name)
        if module is not None and importlib.util.find_spec(module) is None:
            notes.append(f"report_to {name}: its client ({module}) is not installed in this image; not reported to")
        else:
            kept.append(name)
    return (kept or "none"), notes


class _Thread:
    """One daemon thread that runs a tracker's calls in order; a call not done in time is left behind."""

    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=f"tracker-{name}", daemon=True).start()

    def _loop(self) -> None:
        while True:
            call, future = self.jobs.get()
            try:
                future.set_result(call())
            except BaseException as exc:  # the caller decides; this thread must keep serving
                future.set_exception(exc)

    def run(self, call: Callable[[], Any], timeout: float) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.jobs.put((call, future))
        return future.result(timeout)


class GuardedTracker(TrainerCallback):
    """One integration callback behind a guard: its events on its own thread, each within ``deadline``; the first
    failure turns it off (``alert(tracker, message)`` says so once)."""

    def __init__(self, inner: Any, tracker: str, deadline: float, alert: Callable[[str, str], None]):
        self.inner, self.tracker, self.deadline, self.alert = inner, tracker, deadline, alert
        self.off: str | None = None
        self._thread = _Thread(tracker)

    def _call(self, event: str, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.off is not None:
            return None
        method = getattr(self.inner, event)
        wait = FINISH_WAIT_S if event == "on_train_end" else self.deadline
        try:
            return self._thread.run(lambda: method(args, state, control, **kwargs), wait)
        except concurrent.futures.TimeoutError:
            self._turn_off(event, f"no answer within {wait:g} s")
        except Exception as exc:
            self._turn_off(event, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        return None

    def _turn_off(self, event: str, why: str) -> None:
        self.off = why
        self.alert(self.tracker, f"{self.tracker} failed in {event} ({why}): reporting to it is off for this run")

    def finish(self) -> None:
        """Let the tracker send what it holds (W&B and SwanLab end their run; MLflow ended it in on_train_end)."""
        if self.off is not None or self.tracker not in ("wandb", "swanlab"):
            return
        client = getattr(self.inner, "_" + self.tracker, None)  # the module the integration imported
        if client is None or (self.tracker == "wandb" and getattr(client, "run", None) is None):
            return
        try:
            self._thread.run(client.finish, FINISH_WAIT_S)
        except concurrent.futures.TimeoutError:
            LOG.warning("%s did not finish within %g s: its last records may be unsent", self.tracker, FINISH_WAIT_S)
        except Exception as exc:
            LOG.warning("%s could not finish: %s: %s", self.tracker, type(exc).__name__, exc)


def _guarded(event: str) -> Callable[..., Any]:
    def method(self: GuardedTracker, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self._call(event, args, state, control, **kwargs)

    method.__name__ = event
    return method


for _event in [name for name in vars(TrainerCallback) if name.startswith("on_")]:
    setattr(GuardedTracker, _event, _guarded(_event))


def guard_trackers(callbacks: list[Any], deadline: float, alert: Callable[[str, str], None]) -> list[GuardedTracker]:
    """Replace every integration callback in ``callbacks`` (the Trainer's handler list) by its guard, in place."""
    guards = []
    for index, callback in enumerate(callbacks):
        tracker = INTEGRATIONS.get(type(callback).__name__)
        if tracker is not None:
            guards.append(GuardedTracker(callback, tracker, deadline, alert))
            callbacks[index] = guards[-1]
    return guards


def finish(guards: list[GuardedTracker]) -> None:
    """Each guarded tracker's end of run, in turn (rank 0 holds the runs; elsewhere there is nothing to send)."""
    for guard in guards:
        guard.finish()
