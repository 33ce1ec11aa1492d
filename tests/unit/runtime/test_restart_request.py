"""Restarts a user asks for (runtime/boundary/restart.py, runtime/volume/restart.py): the request is typed and
applied once; newer checkpoints are set aside, never deleted; the rollback mark follows; a later ``--resume auto``
continues the new history; the run's recovery log records the restart and counts it as no recovery.

The whole path on real pods, from the overlay ``recipekit restart`` writes: tests/integration/test_dryrun_restart.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipekit.runtime.volume import recovery, restart, resume
from tests.unit.runtime.test_resume_proof import KEY, RUN, checkpoint, choose


def _env(request: restart.RestartRequest) -> dict[str, str]:
    return {restart.RESTART_ENV: request.to_env()}


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("{", "not JSON"),
        ('{"id": "abcdef12"}', 'not {"id"'),
        ('{"id": "ABCDEF12", "from": null}', "hex digits"),
        ('{"id": "abcdef12", "from": "../checkpoint-4"}', "from is not null or checkpoint-N"),
        ('{"id": "abcdef12", "from": "checkpoint-04"}', "from is not null or checkpoint-N"),
        ("x" * 2000, "longer than 1024 bytes"),
    ],
)
def test_a_malformed_request_is_refused_in_one_line(tmp_path: Path, value: str, why: str) -> None:
    with pytest.raises(restart.RestartRefused, match="RECIPEKIT_RESTART is not a restart request") as info:
        restart.pending(tmp_path, RUN, KEY, {restart.RESTART_ENV: value})
    assert why in str(info.value) and "\n" not in str(info.value)


def test_the_choice_takes_a_checkpoint_name_or_fresh_and_nothing_else() -> None:
    assert restart.choice("checkpoint-40") == "checkpoint-40"
    assert restart.choice("fresh") is None
    for bad in ("checkpoint-0", "/out/checkpoint-4", "4", "checkpoint-٤"):
        with pytest.raises(ValueError, match="directory name"):
            restart.choice(bad)


def test_a_restart_from_a_checkpoint_sets_the_newer_aside_once_and_auto_continues_the_new_history(
    tmp_path: Path,
) -> None:
    for step in (2, 4, 6):
        checkpoint(tmp_path, step)
    resume.mark_resumed(tmp_path, RUN, 6, KEY)  # the run already resumed from step 6
    request = restart.new_request("checkpoint-2")
    assert restart.pending(tmp_path, RUN, KEY, _env(request)) == request
    assert restart.resume_argument(tmp_path, request) == str(tmp_path / "checkpoint-2")
    assert choose(tmp_path, str(tmp_path / "checkpoint-2")).step == 2  # by its path: proven as any checkpoint
    moved = restart.apply(tmp_path, RUN, KEY, request)
    assert moved == ["checkpoint-4", "checkpoint-6"]
    aside = tmp_path / restart.SUPERSEDED_DIR / request.id
    assert sorted(p.name for p in aside.iterdir()) == moved and not (tmp_path / "checkpoint-6").exists()
    assert restart.pending(tmp_path, RUN, KEY, _env(request)) is None  # applied: a pod restart resumes as always
    checkpoint(tmp_path, 4)  # the new history's next checkpoint
    assert choose(tmp_path).step == 4  # no rollback refusal: the mark went back to step 2 with the restart


def test_a_fresh_restart_sets_every_checkpoint_aside_and_clears_the_mark(tmp_path: Path) -> None:
    for step in (2, 4):
        checkpoint(tmp_path, step)
    resume.mark_resumed(tmp_path, RUN, 4, KEY)
    request = restart.new_request(None)
    assert restart.resume_argument(tmp_path, request) == "none"
    assert restart.apply(tmp_path, RUN, KEY, request) == ["checkpoint-2", "checkpoint-4"]
    assert not (tmp_path / resume.MARK_FILE).exists() and choose(tmp_path).path is None


def test_a_checkpoint_that_is_not_there_is_refused_naming_those_that_are(tmp_path: Path) -> None:
    checkpoint(tmp_path, 2)
    with pytest.raises(restart.RestartRefused, match=r"checkpoint-8, which is not in .*there: checkpoint-2"):
        restart.resume_argument(tmp_path, restart.new_request("checkpoint-8"))


def test_an_applied_record_that_does_not_verify_applies_nothing_twice_it_did_not_prove(tmp_path: Path) -> None:
    request = restart.new_request(None)
    restart.apply(tmp_path, RUN, KEY, request)
    forged = json.loads((tmp_path / restart.APPLIED_FILE).read_text())
    forged["applied"].append("0123456789ab")
    (tmp_path / restart.APPLIED_FILE).write_text(json.dumps(forged))
    other = restart.RestartRequest("0123456789ab", None)
    assert restart.pending(tmp_path, RUN, KEY, _env(other)) == other  # a planted id does not pass as applied
    with pytest.raises(restart.RestartRefused, match="needs the run key"):
        restart.pending(tmp_path, RUN, None, _env(other))


def test_the_recovery_log_records_the_restart_and_counts_it_as_no_recovery(tmp_path: Path) -> None:
    log = recovery.RecoveryLog(tmp_path, enabled=True, clock=lambda: 1000.0, environ={})
    log.step(5)  # a run that was at step 5 when the user deleted its Job
    log.restarted("abcdef123456", "checkpoint-2", ["checkpoint-4"])
    log.started(2, str(tmp_path / "checkpoint-2"), 2, restart="abcdef123456")
    records = recovery.read(tmp_path)
    assert recovery.history(records) == []
    assert recovery.restarts(records) == [
        {"id": "abcdef123456", "from": "checkpoint-2", "superseded": ["checkpoint-4"], "time": 1000.0}
    ]


def test_the_dry_runs_restart_flag_names_checkpoints_it_saves_or_fresh() -> None:
    from recipekit.validate.dryrun.options import DryRunOptions, DryRunUsageError

    assert DryRunOptions(restart="checkpoint-4,fresh").restarts() == ["checkpoint-4", None]
    for flag, says in (
        ("checkpoint-3", "the dry run saves checkpoint-4, checkpoint-8"),
        ("checkpoint-4,/x", "a checkpoint's directory name"),
    ):
        with pytest.raises(DryRunUsageError, match=says):
            DryRunOptions(restart=flag).check()
    with pytest.raises(DryRunUsageError, match="--restart and --kill-pod"):
        DryRunOptions(restart="fresh", kill_pod=1).check()
