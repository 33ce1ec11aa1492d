"""Why each attempt of a run ended: every training process that exits non-zero leaves one line in the run's output
directory, and ``recipekit runs history`` reads them beside the recoveries.

The launcher's own record of its workers' codes lives in a temporary directory that goes with the pod; this one
stays on the shared volume. Each rank appends to its own file, ``attempt-ends/rank-<R>.jsonl`` (no two writers share
a file), one line per exit: the global rank, the pod (torchrun's ``GROUP_RANK``, Volcano's task index), the host
(the pod's name), the exit code and its name in ``exitcodes.EXIT_CODES``, the signal of a 128 + N code, the last
step this attempt completed and the time. A process killed outright (SIGKILL, the kernel's OOM killer, a lost node)
writes nothing: its rank is then named as missing, which is itself the cause more often than not.

Standard library only (it ships in the bundle); the reader bounds what it reads, refuses links and anything but
regular files, and keeps only typed fields.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..boundary import exitcodes

ENDS_DIR = "attempt-ends"
#: The most a rank's file is read (one line is about 200 bytes: thousands of attempts).
MAX_FILE_BYTES = 1 << 20
#: The most rank files read (the largest world recipekit plans is far below).
MAX_RANKS = 65_536

#: Where this process's end goes, and the last step it completed (set by the run's RecoveryLog).
_state: dict[str, Any] = {"dir": None, "step": None}


def watch(output_dir: Path) -> None:
    """From now on this process's non-zero exit is recorded under ``output_dir``."""
    _state["dir"] = Path(output_dir)


def stepped(step: int) -> None:
    _state["step"] = step


def signal_name(code: int) -> str | None:
    """``SIGTERM`` for 143 (128 + N), else None."""
    if code <= 128:
        return None
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return f"signal {code - 128}"


def record_end(code: int, environ: Mapping[str, str] | None = None) -> None:
    """Append this process's exit (``code`` non-zero) to its rank's file; never raises, never blocks training."""
    directory = _state["dir"]
    if code == exitcodes.EXIT_OK or directory is None:
        return
    env = os.environ if environ is None else environ
    line = {
        "rank": _int(env.get("RANK")),
        "pod": _int(env.get("GROUP_RANK")),
        "host": socket.gethostname()[:253],
        "code": int(code),
        "name": exitcodes.exit_code_name(code),
        "signal": signal_name(code),
        "step": _state["step"],
        "time": time.time(),
    }
    try:
        (directory / ENDS_DIR).mkdir(parents=True, exist_ok=True)
        rank = line["rank"] if line["rank"] is not None else os.getpid()
        with open(directory / ENDS_DIR / f"rank-{rank}.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
    except OSError:
        pass


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------------------------------ reading
_FIELDS: dict[str, tuple[type, ...]] = {
    "rank": (int,),
    "pod": (int, type(None)),
    "host": (str,),
    "code": (int,),
    "name": (str,),
    "signal": (str, type(None)),
    "step": (int, type(None)),
    "time": (int, float),
}


def read_ends(output_dir: Path) -> list[dict[str, Any]]:
    """Every well-formed end under ``output_dir``, oldest first; malformed lines and unreadable files are skipped."""
    directory = Path(output_dir) / ENDS_DIR
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return []
        files = sorted(p for p in directory.iterdir() if p.name.startswith("rank-") and p.suffix == ".jsonl")
    except OSError:
        return []
    ends = [end for path in files[:MAX_RANKS] for end in _lines(path)]
    return sorted(ends, key=lambda end: end["time"])


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return []
            data = handle.read(MAX_FILE_BYTES)
    except OSError:
        return []
    found = []
    for raw in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict) and all(
            isinstance(record.get(k), kinds) and not isinstance(record.get(k), bool) for k, kinds in _FIELDS.items()
        ):
            found.append({k: record[k] for k in _FIELDS})
    return found


# ---------------------------------------------------------------------------------------------------- explaining
def cause(ends: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The end that caused an attempt's end: the first failure other than SIGTERM (torchrun and Volcano stop the
    others with SIGTERM once one fails), else the first end."""
    failures = [e for e in ends if e["code"] != exitcodes.EXIT_PREEMPTED]
    found = failures or ends
    return found[0] if found else None


def job_action(code: int) -> str:
    """What the Job does on a pod exiting ``code``: the exitCode policy of its entry in ``exitcodes.EXIT_CODES``, else
    the Job's PodFailed policy (RestartJob)."""
    for entry in exitcodes.EXIT_CODES:
        if entry.code == code and entry.action:
            return entry.action
    return "RestartJob"


def describe(end: dict[str, Any]) -> str:
    """``rank 1 (pod 1, host tiny-sft-worker-1): exit 5 nonfinite after step 6``."""
    how = f"exit {end['code']} {end['name']}" + (f" ({end['signal']})" if end["signal"] else "")
    after = f" after step {end['step']}" if end["step"] is not None else ""
    return f"rank {end['rank']} (pod {end['pod']}, host {end['host']}): {how}{after}"


def explain(ends: list[dict[str, Any]], world_size: int | None, per_pod: int | None = None) -> str:
    """Why an attempt ended, in one line, and what the Job did. A recorded failure with a meaning of its own (a code
    other than ``failed`` and ``preempted``) is the cause; otherwise ranks that left no record come first: killed
    outright, they are the likely cause, and the others' failures are lost peers and the teardown's SIGTERMs."""
    missing = sorted(set(range(world_size)) - {e["rank"] for e in ends}) if world_size else []
    first = cause(ends)
    telling = first is not None and first["code"] not in (exitcodes.EXIT_FAILED, exitcodes.EXIT_PREEMPTED)
    lost = ""
    if missing:
        pods = sorted({rank // per_pod for rank in missing}) if per_pod else []
        ranks = ", ".join(map(str, missing))
        named = f"pod(s) {', '.join(map(str, pods))} (rank(s) {ranks})" if pods else f"rank(s) {ranks}"
        lost = f"{named} left no record: killed outright (SIGKILL, the OOM killer or a lost node)"
    if first is None:
        return f"{lost}; the Job: RestartJob (PodFailed)" if lost else "no end recorded"
    if telling or not lost:
        parts = [describe(first), *([lost] if lost else [])]
        action = job_action(first["code"]) if first["code"] != exitcodes.EXIT_PREEMPTED else "RestartJob (PodEvicted)"
    else:
        parts, action = [lost, "then " + describe(first)], "RestartJob (PodFailed)"
    return "; ".join([*parts, f"the Job: {action}"])


def by_attempt(records: list[dict[str, Any]], ends: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each attempt of ``recovery.jsonl``'s ``start`` records, in order, with its world size, whether it was resumed
    after an interruption, and the ends recorded between its launch and the next attempt's (an attempt that failed
    before training began writes no start: its ends join the attempt before it)."""
    starts = [r for r in records if r.get("event") == "start"]
    found: list[dict[str, Any]] = []
    for record in starts:
        launched = record.get("launch_time") or record.get("time")
        found.append(
            {
                "launched": launched if isinstance(launched, (int, float)) else None,
                "world_size": _count(record.get("world_size")),
                "ranks_per_pod": _count(record.get("ranks_per_pod")),
                "resumed_after_interruption": isinstance(record.get("interrupted"), dict),
                "ends": [],
            }
        )
    for end in ends:
        later = [a for a in found if a["launched"] is not None and a["launched"] <= end["time"]]
        target = later[-1] if later else (found[0] if found else None)
        if target is not None:
            target["ends"].append(end)
    skipped = [r["step"] for r in records if r.get("event") == "skip" and all(_whole(r.get(k)) for k in SKIP_FIELDS)]
    for i, attempt in enumerate(found):
        interrupted = i + 1 < len(found) and found[i + 1]["resumed_after_interruption"]
        ended = attempt["ends"] or interrupted
        why = explain(attempt["ends"], attempt["world_size"], attempt["ranks_per_pod"])
        first = cause(attempt["ends"])
        if first is not None and first["code"] == exitcodes.EXIT_NONFINITE:
            why = nonfinite_next(why, i + 1 < len(found), skipped)
        attempt["why"] = why if ended else None
    return found


#: The fields of recovery.jsonl's ``skip`` record (recovery.py writes it), each a whole number.
SKIP_FIELDS = ("step", "epoch", "start", "stop")


def nonfinite_next(why: str, restarted: bool, skipped: list[Any]) -> str:
    """What followed a non-finite loss: the Job restarted and the resume skipped the batch (``ops.nonfinite_loss:
    skip``, a ``skip`` record in recovery.jsonl), or it ended with the batch and the report kept."""
    head = why.rsplit("; the Job: ", 1)[0]
    steps = ", ".join(str(s) for s in skipped if isinstance(s, int) and not isinstance(s, bool))
    if restarted:
        batch = f"step {steps}'s batch" if steps else "no batch (none recorded)"
        return f"{head}; the Job: RestartJob (ops.nonfinite_loss: skip), the resume skips {batch}"
    return (
        f"{head}; the Job: TerminateJob (ops.nonfinite_loss: stop), no retry: the offending batch and a report "
        "are kept in nonfinite-step-N/"
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
