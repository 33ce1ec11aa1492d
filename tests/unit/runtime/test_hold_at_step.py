"""The dry run's kill lands at its step: with the testing-only variable set, every rank waits before the next step
until it is killed (or SIGTERM, as the other pods of a RestartJob get, ends the wait)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from recipekit.runtime.boundary import exitcodes  # noqa: E402
from recipekit.runtime.session.callbacks import HoldAtStepCallback, PreemptionCallback  # noqa: E402


def test_it_is_armed_only_by_the_variable() -> None:
    preemption = PreemptionCallback()
    assert HoldAtStepCallback.from_env(preemption, 2, {}) == []
    assert HoldAtStepCallback.from_env(preemption, 2, {exitcodes.HOLD_AT_STEP_ENV: "x6"}) == []
    (hold,) = HoldAtStepCallback.from_env(preemption, 2, {exitcodes.HOLD_AT_STEP_ENV: "6"})
    assert hold.step == 6 and hold.release is None and hold.below_world is None
    both = {exitcodes.HOLD_AT_STEP_ENV: "6", exitcodes.HOLD_SHRUNK_AT_STEP_ENV: "7"}
    lost, shrunk = HoldAtStepCallback.from_env(preemption, 2, both)
    assert (lost.step, shrunk.step, shrunk.below_world) == (6, 7, 2)


def test_the_lost_nodes_peers_go_on_once_the_release_file_exists(tmp_path: Path) -> None:
    """--lose-pod: the pods that are left are not deleted, so nothing signals them; the dry run's file ends the
    wait, and a new worker group resuming at that step does not hold again."""
    release = tmp_path / "released"
    environ = {exitcodes.HOLD_AT_STEP_ENV: "3", exitcodes.HOLD_RELEASE_ENV: str(release)}
    (hold,) = HoldAtStepCallback.from_env(PreemptionCallback(), 2, environ)
    threading.Timer(0.5, release.touch).start()
    hold.on_step_begin(None, SimpleNamespace(global_step=3), None)
    assert hold.held and release.exists()
    (again,) = HoldAtStepCallback.from_env(PreemptionCallback(), 2, environ)
    again.on_step_begin(None, SimpleNamespace(global_step=3), None)
    assert not again.held


def test_the_return_hold_holds_only_in_a_shrunk_world() -> None:
    preemption = PreemptionCallback()
    hold = HoldAtStepCallback(5, preemption, limit_s=60, below_world=2)
    hold.on_step_begin(SimpleNamespace(world_size=2), SimpleNamespace(global_step=5), None)  # full size: no wait
    assert not hold.held
    threading.Timer(0.5, lambda: setattr(preemption, "requested", True)).start()  # the agent's SIGTERM
    hold.on_step_begin(SimpleNamespace(world_size=1), SimpleNamespace(global_step=5), None)
    assert hold.held and preemption.requested


def test_it_holds_after_its_step_until_sigterm_and_only_once() -> None:
    preemption = PreemptionCallback()
    hold = HoldAtStepCallback(3, preemption, limit_s=60)
    hold.on_step_begin(None, SimpleNamespace(global_step=2), None)  # not its step: no wait
    assert not hold.held
    threading.Timer(0.5, lambda: setattr(preemption, "requested", True)).start()
    hold.on_step_begin(None, SimpleNamespace(global_step=3), None)  # step 3 done, step 4 about to begin
    assert hold.held and preemption.requested, "it returned only once SIGTERM was asked for"
    hold.on_step_begin(None, SimpleNamespace(global_step=3), None)  # the next micro-step of step 4: no second wait


def test_a_hold_nobody_ends_gives_up_after_its_limit() -> None:
    hold = HoldAtStepCallback(1, PreemptionCallback(), limit_s=0.2)
    hold.on_step_begin(None, SimpleNamespace(global_step=1), None)
    assert hold.held
