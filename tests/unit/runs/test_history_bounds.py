"""Issue 38: `recipekit runs history` of a volume holding the hostile records a volume writer can plant.

A start record claiming 10**12 ranks (a MemoryError before), one claiming 10**7 (2.4 GB, every missing rank
printed), 150,000 starts with 200 rank files of 1 MiB of ends each (ends were matched to attempts pairwise: past a
minute; the files' sum was unbounded: 640 MB), host, name and signal fields holding terminal sequences, and NaN
times (``--json`` printed ``NaN``). The command must stay within 200 MB and 5 s of CPU, print no raw escape, name
the cuts it made in warnings, and, with ``--json``, print strict JSON.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.unit.project.test_hostile_input import run_measured

MAX_RSS_MIB = 200
MAX_CPU_S = 5.0
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"


def hostile_volume(run: Path) -> None:
    """The records of issue 38, written fast (each file from one repeated line)."""
    run.mkdir(parents=True)
    lines = []
    for i in range(150_000):
        at = 1_000.0 + 10 * i
        lines.append(
            f'{{"event": "start", "time": {at}, "launch_time": {at}, "world_size": 8, "ranks_per_pod": 8, '
            f'"interrupted": {{"step": {i}, "time": {at - 0.5}}}}}\n'
        )
    at = 1_000.0 + 10 * 150_000
    lines += [
        f'{{"event": "start", "time": {at}, "launch_time": {at}, "world_size": {10**12}}}\n',
        f'{{"event": "start", "time": {at + 10}, "launch_time": {at + 10}, "world_size": {10**7}, '
        f'"interrupted": {{"step": 1, "time": {at + 5}}}}}\n',
        '{"event": "first_step", "step": 3, "time": NaN}\n',
        '{"event": "start", "time": NaN, "launch_time": NaN, "world_size": 2, "interrupted": {"step": 2, "time": 1}}\n',
    ]
    (run / "recovery.jsonl").write_text("".join(lines))
    ends = run / "attempt-ends"
    ends.mkdir()
    for rank in range(200):
        end = {"rank": rank, "pod": rank // 8, "host": "h" + ESCAPES, "code": 1, "name": "failed" + ESCAPES,
               "signal": ESCAPES, "step": 1, "time": at + 11}  # fmt: skip
        line = json.dumps(end) + "\n"
        (ends / f"rank-{rank}.jsonl").write_text(line * ((1 << 20) // len(line)))
    (ends / "rank-200.jsonl").write_text('{"rank": 3, "pod": 0, "host": "h", "code": 1, "name": "failed", '
                                         '"signal": null, "step": 1, "time": NaN}\n')  # fmt: skip


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("hostile") / "run"
    hostile_volume(run)
    return run


def _bounded(result, what: str) -> str:
    output = result.stdout + result.stderr
    where = (
        f"{what}: exit {result.code}, {result.wall_s:.1f} s wall, {result.cpu_s:.1f} s CPU, {result.rss_mib:.0f} MiB"
    )
    assert result.code == 0, f"{where}\n{output[-3000:]}"
    assert result.rss_mib < MAX_RSS_MIB and result.cpu_s < MAX_CPU_S, where
    assert "Traceback" not in output, where
    assert not any(c in output for c in "\x1b\x07\x9b\u202e"), f"{where}: a raw escape reached the terminal"
    return output


def test_history_of_hostile_records_is_bounded_escaped_and_one_line_per_attempt(volume: Path, tmp_path: Path) -> None:
    result = run_measured(["runs", "history", str(volume)], tmp_path, env={"COLUMNS": "80"})
    _bounded(result, "runs history")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert any("only the last 10,000 of 150,003 starts are shown" in w for w in warnings), result.stderr
    assert any("rank files left unread (past 16 MiB in all)" in w for w in warnings), result.stderr
    text = " ".join(result.stdout.split())
    assert "earlier recoveries (--json lists them all)" in text
    # the 10**7-rank attempt is none of this run's sizes (above the largest world): its missing ranks are not counted;
    # no reason lists more than eight ranks one by one
    assert "10,000,000" not in text and "9,999,99" not in text
    assert not re.search(r"rank\(s\) (\d+, ){8,}", text)
    # one entry per attempt shown (a recovery and why its attempt ended, each broken at 80 columns into a few lines),
    # the last 1,000 of them; nothing per missing rank
    lines = result.stdout.splitlines()
    assert len([line for line in lines if re.match(r"  \d+\. interrupted", line)]) == 1000
    assert len([line for line in lines if line.startswith("     ended: ")]) <= 1000
    assert len(lines) < 8 * 1000
    assert max(len(line) for line in result.stdout.splitlines()[1:]) <= 80


def test_history_json_of_hostile_records_is_strict_json(volume: Path, tmp_path: Path) -> None:
    result = run_measured(["runs", "history", str(volume), "--json"], tmp_path)
    _bounded(result, "runs history --json")

    def refuse(constant: str) -> None:
        raise AssertionError(f"not strict JSON: {constant}")

    data = json.loads(result.stdout, parse_constant=refuse)
    attempts = data["attempts"]
    assert len(attempts) == 10_000 and attempts[-1]["launched"] is None  # a NaN launch: unknown, not NaN
    assert attempts[-3]["world_size"] is None and attempts[-2]["world_size"] is None  # 10**12 and 10**7 ranks
    listed = [end for attempt in attempts for end in attempt["ends"]]
    assert listed and all(end["host"].startswith("h\\x1b]0;owned\\x07") for end in listed if end["host"] != "h")
    assert all(len(attempt["ends"]) <= 100 for attempt in attempts)
    assert sum(a["ends_recorded"] for a in attempts) > len(listed)


def test_a_world_size_is_bounded_by_the_jobs_and_missing_ranks_are_counted_not_listed() -> None:
    from recipekit.runtime.volume import attemptends

    ends = [{"rank": 3, "pod": 0, "host": "h", "code": 9, "name": "x", "signal": None, "step": 1, "time": 5.0}]
    records = [{"event": "start", "time": 1.0, "world_size": 10**7, "ranks_per_pod": 8}]
    (attempt,) = attemptends.by_attempt(records, ends, job_world=16)
    assert attempt["world_size"] is None  # above the Job's 16 ranks: not this Job's
    why = attemptends.explain(ends, 60_000, 8)
    assert "59,999 ranks (the first: 0, 1, 2, 4, 5, 6, 7, 8; pod(s) 0, 1) left no record" in why
