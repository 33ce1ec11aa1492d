"""Why each attempt ended: the end each failing process records in the run's directory, read back bounded and typed,
and `recipekit runs history` naming the cause, the ranks that left no record and what the Job did."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from recipekit.cli import main
from recipekit.runtime.boundary import exitcodes, metricslog
from recipekit.runtime.volume import attemptends, recovery


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    saved = dict(attemptends._state)
    yield
    attemptends._state.update(saved)


def end(out: Path, rank: int, code: int, at: float, step: int | None = 6) -> None:
    """Rank ``rank`` of pod ``rank`` exits ``code`` at ``at`` (the clock is patched through the record's time)."""
    attemptends.watch(out)
    attemptends._state["step"] = step
    attemptends.record_end(code, {"RANK": str(rank), "GROUP_RANK": str(rank)})
    path = out / attemptends.ENDS_DIR / f"rank-{rank}.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[-1]) | {"time": at}
    path.write_text("\n".join([*lines[:-1], json.dumps(record)]) + "\n")


def start(out: Path, at: float, interrupted: dict | None = None, world: int = 2, per_pod: int | None = None) -> None:
    record = {"event": "start", "time": at, "launch_time": at, "interrupted": interrupted, "world_size": world}
    record |= {"ranks_per_pod": per_pod} if per_pod else {}
    metricslog.append_record(out / recovery.RECOVERY_FILE, record)


def test_a_non_zero_exit_is_recorded_with_its_name_signal_and_step(tmp_path: Path) -> None:
    attemptends.watch(tmp_path)
    attemptends.stepped(7)
    attemptends.record_end(exitcodes.EXIT_OK, {"RANK": "0"})
    assert not (tmp_path / attemptends.ENDS_DIR).exists()  # a clean exit is no attempt's end
    attemptends.record_end(143, {"RANK": "1", "GROUP_RANK": "1"})
    attemptends.record_end(exitcodes.EXIT_NONFINITE, {"RANK": "1", "GROUP_RANK": "1"})
    first, second = attemptends.read_ends(tmp_path)
    assert [first[k] for k in ("rank", "pod", "code", "name", "signal")] == [1, 1, 143, "preempted", "SIGTERM"]
    assert (second["code"], second["name"], second["signal"], second["step"]) == (5, "nonfinite", None, 7)


def test_the_pod_of_an_end_is_volcanos_not_the_node_rank_an_elastic_regroup_gave(tmp_path: Path) -> None:
    """After pod 0 was lost, the agents that were left numbered their nodes anew: pod 1's is node rank 0. The end
    names pod 1, the pod a person finds with kubectl; a bundle started by hand (no Volcano) names the node rank."""
    attemptends.watch(tmp_path)
    attemptends.record_end(143, {"RANK": "0", "GROUP_RANK": "0", "VC_TASK_INDEX": "1"})
    attemptends.record_end(143, {"RANK": "1", "GROUP_RANK": "1"})
    by_rank = {e["rank"]: e["pod"] for e in attemptends.read_ends(tmp_path)}
    assert by_rank == {0: 1, 1: 1}


def test_the_reader_keeps_typed_lines_and_refuses_links_and_fifos(tmp_path: Path) -> None:
    ends = tmp_path / attemptends.ENDS_DIR
    ends.mkdir()
    good = {"rank": 0, "pod": 0, "host": "h", "code": 1, "name": "failed", "signal": None, "step": 2, "time": 5.0}
    (ends / "rank-0.jsonl").write_text(
        "\n".join(
            [json.dumps(good), "{not json", json.dumps(good | {"code": "1"}), json.dumps(good | {"rank": True}), "[1]"]
        )
    )
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(json.dumps(good | {"rank": 1}) + "\n")
    (ends / "rank-1.jsonl").symlink_to(elsewhere)
    os.mkfifo(ends / "rank-2.jsonl")
    assert attemptends.read_ends(tmp_path) == [good]  # and the FIFO did not block the reader


def test_the_cause_is_the_first_failure_not_the_sigterms_it_caused(tmp_path: Path) -> None:
    start(tmp_path, 100.0)
    end(tmp_path, 0, exitcodes.EXIT_PREEMPTED, 151.0)
    end(tmp_path, 1, exitcodes.EXIT_NONFINITE, 150.5)
    start(tmp_path, 200.0, interrupted={"step": 6, "time": 150.0})
    first, second = attemptends.by_attempt(recovery.read(tmp_path), attemptends.read_ends(tmp_path))
    assert first["why"].startswith("rank 1 (pod 1, host ") and "exit 5 nonfinite after step 6" in first["why"]
    assert "the Job: RestartJob" in first["why"] and "left no record" not in first["why"]
    assert second["why"] is None  # not ended (yet)


def test_a_user_error_ends_the_job_and_a_killed_pod_is_named_by_its_missing_record(tmp_path: Path) -> None:
    start(tmp_path, 100.0, per_pod=1)
    end(tmp_path, 0, exitcodes.EXIT_PREEMPTED, 150.0)  # pod 1 was SIGKILLed: no record of its own
    start(tmp_path, 200.0, interrupted={"step": 6, "time": 149.0})
    end(tmp_path, 1, exitcodes.EXIT_USER_ERROR, 210.0)
    first, second = attemptends.by_attempt(recovery.read(tmp_path), attemptends.read_ends(tmp_path))
    assert first["why"].startswith("pod(s) 1 (rank(s) 1) left no record: killed outright (SIGKILL")
    assert "; then rank 0 (pod 0, host " in first["why"] and "exit 143 preempted (SIGTERM)" in first["why"]
    assert first["why"].endswith("the Job: RestartJob (PodFailed)")
    assert second["why"].startswith("rank 1 (pod 1, host ") and "exit 2 user_error" in second["why"]
    assert "rank(s) 0 left no record" in second["why"] and second["why"].endswith("the Job: TerminateJob")


def test_runs_history_says_why_each_attempt_ended(tmp_path: Path) -> None:
    start(tmp_path, 100.0)
    end(tmp_path, 0, exitcodes.EXIT_PREEMPTED, 150.0)
    start(tmp_path, 200.0, interrupted={"step": 6, "time": 149.0})
    metricslog.append_record(tmp_path / recovery.RECOVERY_FILE, {"event": "first_step", "step": 5, "time": 230.0})
    end(tmp_path, 0, exitcodes.EXIT_STALLED, 300.0)
    text = CliRunner().invoke(main, ["runs", "history", str(tmp_path)], env={"COLUMNS": "80"}).output
    flat = " ".join(text.split())
    assert "interrupted after step 6" in flat and "\n     ended: rank(s) 1 left no record" in text
    assert "ended: rank(s) 1 left no record: killed outright" in flat and "; then rank 0 (pod 0, host " in flat
    assert "the last attempt ended: rank 0" in flat and "exit 4 stalled" in flat and "RestartJob" in flat
    # broken between words at 80 columns, continuation lines indented under the text
    assert max(len(line) for line in text.splitlines()[1:]) <= 80 and "\n        " in text  # 1st: the path
    data = json.loads(CliRunner().invoke(main, ["runs", "history", str(tmp_path), "--json"]).output)
    assert "rank(s) 1 left no record" in data["recoveries"][0]["ended"]
    assert [a["world_size"] for a in data["attempts"]] == [2, 2] and data["attempts"][1]["ends"][0]["code"] == 4
