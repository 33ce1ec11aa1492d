"""MTTR in production: the runtime's recovery records, their history, and `recipekit runs history`."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from recipekit.cli import main
from recipekit.runtime.volume import recovery


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _attempt(out: Path, clock: Clock, steps: range, resume: int | None, launched: float, done: bool = False):
    log = recovery.RecoveryLog(out, enabled=True, clock=clock, environ={recovery.LAUNCH_TIME_ENV: str(launched)})
    log.started(resume, f"{out}/checkpoint-{resume}" if resume else None)
    clock.now += 5
    log.loaded(resume or 0)
    for step in steps:
        clock.now += 1
        log.step(step)
    if done:
        log.done(steps[-1])


def _workers_started(
    out: Path, clock: Clock, launched: float, workers: float, resume: int, world: int
) -> recovery.RecoveryLog:
    """A start written by workers torchrun's agent started at ``workers`` under a launcher that began at
    ``launched`` (an elastic regroup: the launcher went on), resuming checkpoint ``resume`` on ``world`` ranks."""
    log = recovery.RecoveryLog(out, enabled=True, clock=clock, environ={recovery.LAUNCH_TIME_ENV: str(launched)})
    recovery.WORKER_STARTED, saved = workers, recovery.WORKER_STARTED
    try:
        log.started(resume, f"{out}/checkpoint-{resume}", world_size=world)
    finally:
        recovery.WORKER_STARTED = saved
    return log


def test_a_kill_and_a_restart_make_one_recovery_with_its_mttr_and_steps_lost(tmp_path: Path) -> None:
    clock = Clock()
    _attempt(tmp_path, clock, range(1, 7), None, launched=990.0)  # killed after step 6 at t=1011
    clock.now = 1040.0
    _attempt(tmp_path, clock, range(5, 9), 4, launched=1030.0, done=True)  # resumes at 4, first step 5 at t=1046
    found = recovery.history(recovery.read(tmp_path))
    assert len(found) == 1
    r = found[0]
    assert (r.interrupted_step, r.interrupted_time, r.restart_time) == (6, 1011.0, 1030.0)
    assert (r.resume_step, r.loaded_time, r.first_step, r.first_step_time) == (4, 1045.0, 5, 1046.0)
    assert r.mttr_s == 35.0 and r.steps_lost == 2
    assert recovery.summary(found) == {"restarts": 1, "steps_lost": 2, "mttr_s": 35.0, "last_mttr_s": 35.0}
    # a start after a finished run is no interruption
    clock.now = 2000.0
    _attempt(tmp_path, clock, range(9, 9), 8, launched=1999.0)
    assert len(recovery.history(recovery.read(tmp_path))) == 1


def test_a_restart_without_a_step_yet_has_no_mttr(tmp_path: Path) -> None:
    clock = Clock()
    _attempt(tmp_path, clock, range(1, 3), None, launched=999.0)
    log = recovery.RecoveryLog(tmp_path, enabled=True, clock=clock, environ={})
    log.started(None, None)
    (r,) = recovery.history(recovery.read(tmp_path))
    assert r.mttr_s is None and r.first_step is None and r.restart_time == clock.now  # no launcher: its own start


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    log = recovery.RecoveryLog(tmp_path, enabled=False)
    log.started(None, None)
    log.step(1)
    assert not list(tmp_path.iterdir())


def test_runs_history_prints_the_same_mttr(tmp_path: Path) -> None:
    clock = Clock()
    _attempt(tmp_path, clock, range(1, 7), None, launched=990.0)
    clock.now = 1040.0
    _attempt(tmp_path, clock, range(5, 9), 4, launched=1030.0, done=True)
    result = CliRunner().invoke(main, ["runs", "history", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["mttr_s"] == 35.0 and data["recoveries"][0]["steps_lost"] == 2
    text = CliRunner().invoke(main, ["runs", "history", str(tmp_path)])
    assert "interrupted after step 6" in text.output and "MTTR 35.00 s" in text.output
    missing = CliRunner().invoke(main, ["runs", "history", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "not found" in missing.output


def test_the_mttr_is_recorded_in_its_parts_that_add_up(tmp_path: Path) -> None:
    clock = Clock()
    _attempt(tmp_path, clock, range(1, 7), None, launched=990.0)  # last step 6 at t=1011
    clock.now = 1040.0
    _attempt(tmp_path, clock, range(5, 9), 4, launched=1030.0, done=True)  # start 1040, loaded 1045, step 1046
    (bare,) = recovery.history(recovery.read(tmp_path))
    # no end record: detection is not told apart, its time joins rescheduling
    assert bare.parts == {"detect": None, "reschedule": 19.0, "restart": 10.0, "load": 5.0, "first_step": 1.0}
    ends = [[{"time": 1005.0}, {"time": 1013.5}, {"time": 1012.0}]]  # one before the last step: not this step's end
    (r,) = recovery.detected([bare], ends)
    assert r.parts == {"detect": 1.0, "reschedule": 18.0, "restart": 10.0, "load": 5.0, "first_step": 1.0}
    assert sum(v for v in r.parts.values() if v is not None) == r.mttr_s == 35.0
    result = CliRunner().invoke(main, ["runs", "history", str(tmp_path), "--json"])
    assert json.loads(result.output)["recoveries"][0]["parts_s"]["load"] == 5.0
    text = " ".join(CliRunner().invoke(main, ["runs", "history", str(tmp_path)]).output.split())  # 80 columns
    assert "parts: detect -, reschedule 19.00 s, restart 10.00 s, load 5.00 s, first step 1.00 s" in text


def test_an_elastic_restart_is_timed_from_its_new_workers_and_said_to_be_torchruns(tmp_path: Path) -> None:
    """The pods went on (cluster.min_nodes): the next start carries the same launcher's time, older than the
    interruption, so the restart is when torchrun's agent started the new workers (``worker_time``), and the
    attempt's end says no pod was restarted."""
    clock = Clock()
    _attempt(tmp_path, clock, range(1, 7), None, launched=990.0)  # last step 6 at t=1011
    clock.now = 1040.0
    log = _workers_started(tmp_path, clock, launched=990.0, workers=1032.0, resume=4, world=1)
    clock.now = 1045.0
    log.loaded(4)
    clock.now = 1046.0
    log.step(5)
    (r,) = recovery.history(recovery.read(tmp_path))
    assert r.restart_time == 1032.0 and r.parts["reschedule"] == 21.0
    ends = [{"rank": 0, "pod": 0, "host": "h", "code": 1, "name": "failed", "signal": None, "step": 6, "time": 1012.0}]
    found, attempts, ended = recovery.recoveries_seen(recovery.read(tmp_path), ends, 2)
    assert found[0].parts["detect"] == 1.0
    assert "torchrun's agents restarted the workers (elastic), no pod restarted" in ended[0]["why"]


def test_an_elastic_restart_whose_rank_0_moved_to_another_pod_is_still_timed_from_its_new_workers(
    tmp_path: Path,
) -> None:
    """torchrun's rendezvous gives rank 0 to the pod that sorts first: when the pod of the old rank 0 is lost, the
    next start is written by another pod whose launcher never stopped (older than the previous start, though not
    the previous launcher). Its restart is the new workers' start, not that launcher's (which would put the restart
    before the interruption and leave detection and rescheduling unmeasured): seen in CI when the dry run's
    agents sorted by process id."""
    clock = Clock()
    _attempt(tmp_path, clock, range(1, 7), None, launched=991.0)  # rank 0 on pod 1; last step 6 at t=1011
    clock.now = 1040.0
    log = _workers_started(
        tmp_path, clock, launched=990.0, workers=1032.0, resume=4, world=1
    )  # rank 0 now on pod 0, launched at 990
    clock.now = 1046.0
    log.step(5)
    ends = [{"rank": 0, "pod": 1, "host": "h", "code": 1, "name": "failed", "signal": None, "step": 6, "time": 1012.0}]
    found, _, ended = recovery.recoveries_seen(recovery.read(tmp_path), ends, 2)
    assert found[0].restart_time == 1032.0
    assert found[0].parts["detect"] == 1.0 and found[0].parts["reschedule"] == 20.0
    assert "torchrun's agents restarted the workers (elastic), no pod restarted" in ended[0]["why"]


def test_a_job_restart_launches_anew_and_is_timed_from_its_launcher(tmp_path: Path) -> None:
    """A launcher started after the previous attempt's start is a pod Volcano started again: no regroup."""
    clock = Clock()
    _attempt(tmp_path, clock, range(1, 7), None, launched=991.0)
    clock.now = 1040.0
    log = recovery.RecoveryLog(tmp_path, enabled=True, clock=clock, environ={recovery.LAUNCH_TIME_ENV: "1030.0"})
    log.started(4, f"{tmp_path}/checkpoint-4", world_size=2)
    (r,) = recovery.history(recovery.read(tmp_path))
    assert r.restart_time == 1030.0


def test_an_elastic_growth_is_timed_from_its_new_workers_though_the_returning_pods_launcher_writes_it(
    tmp_path: Path,
) -> None:
    """Capacity returns: the replacement pod's launcher starts, its agent joins, and the agents stop the shrunk
    workers to grow. The returning pod sorts first, so its rank 0 writes the next start, with a launcher that began
    before the interruption it follows (the shrunk group's last step): the restart is the new workers' start."""
    clock = Clock()
    _attempt(tmp_path, clock, range(1, 7), None, launched=991.0)  # the shrunk group; its last step 6 at t=1011
    clock.now = 1030.0
    log = _workers_started(tmp_path, clock, launched=1008.0, workers=1020.0, resume=6, world=2)
    clock.now = 1033.0
    log.step(7)
    ends = [{"rank": 0, "pod": 1, "host": "h", "code": 143, "name": "preempted", "signal": 15, "step": 6,
             "time": 1012.0}]  # fmt: skip
    found, _, ended = recovery.recoveries_seen(recovery.read(tmp_path), ends, 2)
    assert found[0].restart_time == 1020.0
    assert found[0].parts["detect"] == 1.0 and found[0].parts["reschedule"] == 8.0
    assert "torchrun's agents restarted the workers (elastic), no pod restarted" in ended[0]["why"]
