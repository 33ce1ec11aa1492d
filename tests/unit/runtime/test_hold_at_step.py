"""The dry run's kill lands at its step: with the testing-only variable set, every rank waits before the next step
until it is killed (or SIGTERM, as the other pods of a RestartJob get, ends the wait)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from recipekit.runtime.boundary import exitcodes  # noqa: E402
from recipekit.runtime.session.callbacks import HoldAtStepCallback, PreemptionCallback  # noqa: E402


def test_it_is_armed_only_by_the_variable() -> None:
    preemption = PreemptionCallback()
    assert HoldAtStepCallback.from_env(preemption, {}) is None
    assert HoldAtStepCallback.from_env(preemption, {exitcodes.HOLD_AT_STEP_ENV: "x6"}) is None
    hold = HoldAtStepCallback.from_env(preemption, {exitcodes.HOLD_AT_STEP_ENV: "6"})
    assert hold is not None and hold.step == 6


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
