"""Why each attempt of a run ended: every training process that exits non-zero leaves one line in the run's output
directory, and ``recipekit runs history`` reads them beside the recoveries.

The launcher's own record of its workers' codes lives in a temporary directory that goes with the pod; this one
stays on the shared volume. Each rank appends to its own file, ``attempt-ends/rank-<R>.jsonl`` (no two writers share
a file), one line per exit: the global rank, the pod (Volcano's task index, else torchrun's ``GROUP_RANK``), the host
(the pod's name), the exit code and its name in ``exitcodes.EXIT_CODES``, the signal of a 128 + N code, the last
step this attempt completed and the time. A process killed outright (SIGKILL, the kernel's OOM killer, a lost node)
writes nothing: its rank is then named as missing, which is itself the cause more often than not.

Standard library only (it ships in the bundle). The writer never follows a link or writes to a FIFO, a device or a
file it does not own (:mod:`..boundary.jsonfile`: anyone who can write to the volume could plant one); the reader
bounds what it reads, refuses links and anything but regular files, and keeps only typed fields.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..boundary import common, exitcodes, filenames, jsonfile

ENDS_DIR = "attempt-ends"
#: The most a rank's file is read (one line is about 200 bytes: thousands of attempts).
MAX_FILE_BYTES = 1 << 20
#: The most read from every rank file together: about 80,000 ends (a thousand ranks failing eighty times).
MAX_TOTAL_BYTES = 16 << 20
#: The most rank files read, and the largest world size taken from a record (the largest world recipekit plans is
#: far below; a larger one is no world this run had).
MAX_RANKS = 65_536
#: The ranks a reason names when some left no record; the others are counted.
NAMED_RANKS = 8
#: The longest text kept from an end (a host name is at most 253 characters).
MAX_TEXT = 253
#: The largest time (Unix seconds) or step taken from a record: a larger one is no time or step this run logged.
MAX_TIME_S = 1e11
MAX_STEP = 10**12

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
        "pod": common.volcano_pod_index(env),  # Volcano's index: an elastic regroup numbers torchrun's nodes anew
        "host": socket.gethostname()[:253],
        "code": int(code),
        "name": exitcodes.exit_code_name(code),
        "signal": signal_name(code),
        "step": _state["step"],
        "time": time.time(),
    }
    rank = line["rank"] if line["rank"] is not None else os.getpid()
    try:
        jsonfile.append(directory / ENDS_DIR / f"rank-{rank}.jsonl", (json.dumps(line) + "\n").encode())
    except OSError:
        pass  # a full disk or a planted name: the end goes unrecorded, the exit is unchanged


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


def read_ends(output_dir: Path, cut: list[str] | None = None) -> list[dict[str, Any]]:
    """Every well-formed end under ``output_dir``, oldest first; malformed lines and unreadable files are skipped.
    At most :data:`MAX_FILE_BYTES` of a file and :data:`MAX_TOTAL_BYTES` of them all are read: what was left
    unread is said in ``cut`` (when given). Text fields come back printable (a control character as its escape)."""
    directory = Path(output_dir) / ENDS_DIR
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return []
        files = sorted(p for p in directory.iterdir() if p.name.startswith("rank-") and p.suffix == ".jsonl")
    except OSError:
        return []
    ends: list[dict[str, Any]] = []
    budget = MAX_TOTAL_BYTES
    for number, path in enumerate(files[:MAX_RANKS]):
        if budget <= 0:
            if cut is not None:
                cut.append(f"{ENDS_DIR}: {len(files) - number:,} of {len(files):,} rank files left unread (past "
                           f"{MAX_TOTAL_BYTES >> 20} MiB in all)")  # fmt: skip
            break
        found, used = _lines(path, min(MAX_FILE_BYTES, budget))
        ends.extend(found)
        budget -= used
    return sorted(ends, key=lambda end: end["time"])


def _lines(path: Path, most: int) -> tuple[list[dict[str, Any]], int]:
    """The typed ends among the first ``most`` bytes of ``path`` (a regular file, not a link), and the bytes read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return [], 0
            data = handle.read(most)
    except OSError:
        return [], 0
    found = []
    for raw in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        end = typed_end(record)
        if end is not None:
            found.append(end)
    return found, len(data)


def typed_end(record: Any) -> dict[str, Any] | None:
    """An end as the reader keeps it: every field of its type and within its bounds (a rank below
    :data:`MAX_RANKS`, a finite time, an exit code of a process), text printable and short; None otherwise."""
    if not isinstance(record, dict) or not all(
        isinstance(record.get(k), kinds) and not isinstance(record.get(k), bool) for k, kinds in _FIELDS.items()
    ):
        return None
    end = {k: record[k] for k in _FIELDS}
    if not (0 <= end["rank"] < MAX_RANKS and 0 <= end["code"] <= 255) or finite_time(end["time"]) is None:
        return None
    if end["pod"] is not None and not 0 <= end["pod"] < MAX_RANKS:
        end["pod"] = None
    if end["step"] is not None and not 0 <= end["step"] <= MAX_STEP:
        end["step"] = None
    for key in ("host", "name", "signal"):
        if end[key] is not None:
            end[key] = sys.intern(printable(end[key]))  # the same host and name on thousands of lines
    return end


def printable(text: str, most: int = MAX_TEXT) -> str:
    """At most ``most`` characters of ``text`` with every control or invisible formatting character written as its
    escape: a field read from the volume never reaches a terminal as a sequence."""
    text = text[:most]
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def attempt_began(record: dict[str, Any], previous: dict[str, Any] | None) -> float | None:
    """When the attempt of ``start`` record ``record`` began: its pod's launcher's start, or, when that launcher kept
    running through the attempt before (:func:`regrouped`: an elastic run's new worker group, torchrun's agents
    restarted the workers), its workers' start; the record's own time when neither is known. The one rule the
    MTTR's parts (recovery.history) and the attempts' ends (:func:`by_attempt`) share."""
    launcher = finite_time(record.get("launch_time"))
    if launcher is not None and regrouped(record, previous):
        return finite_time(record.get("worker_time")) or launcher
    return launcher or finite_time(record.get("time"))


def regrouped(record: dict[str, Any], previous: dict[str, Any] | None) -> bool:
    """Whether start record ``record``'s launcher was already running before its attempt was called for: the pods
    went on and torchrun's agents formed a new worker group. A launcher started at or before the interruption it
    follows (the previous attempt's last step) or the previous start was not started by them. Which launcher writes
    the record turns on where rank 0 lands: the rendezvous gives it to the pod whose name sorts first, so it moves
    when that pod is lost (to another pod, whose launcher never stopped) and when it comes back (to the returning
    pod, whose launcher started as its capacity returned, before the workers were stopped to grow)."""
    launcher = finite_time(record.get("launch_time"))
    if launcher is None:
        return False
    interrupted = record.get("interrupted")
    stopped = finite_time(interrupted.get("time")) if isinstance(interrupted, dict) else None
    if stopped is not None and launcher <= stopped:
        return True
    if previous is None:
        return False
    before, began = finite_time(previous.get("launch_time")), finite_time(previous.get("time"))
    return launcher == before or (began is not None and launcher <= began)


def finite_time(value: Any) -> float | None:
    """A finite time within :data:`MAX_TIME_S` (a bool, a string, NaN or 1e20 is none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > MAX_TIME_S:
        return None
    number = float(value)
    return number if math.isfinite(number) and 0 <= number <= MAX_TIME_S else None


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


def missing_ranks(ends: list[dict[str, Any]], world_size: int) -> tuple[list[int], int]:
    """The first :data:`NAMED_RANKS` ranks below ``world_size`` that left no end among ``ends``, and how many did:
    linear in ``ends``, whatever the world size."""
    seen = {end["rank"] for end in ends if end["rank"] < world_size}
    named: list[int] = []
    rank = 0
    while len(named) < NAMED_RANKS and rank < world_size:
        if rank not in seen:
            named.append(rank)
        rank += 1
    return named, world_size - len(seen)


def _lost(ends: list[dict[str, Any]], world_size: int | None, per_pod: int | None) -> str:
    """The ranks that left no record, in words (empty when none did or the world size is unknown)."""
    named, count = missing_ranks(ends, world_size) if world_size else ([], 0)
    if not count:
        return ""
    ranks = ", ".join(map(str, named))
    pods = ", ".join(map(str, sorted({rank // per_pod for rank in named}))) if per_pod else ""
    if count > len(named):
        who = f"{count:,} ranks (the first: {ranks}" + (f"; pod(s) {pods}" if pods else "") + ")"
    else:
        who = f"pod(s) {pods} (rank(s) {ranks})" if pods else f"rank(s) {ranks}"
    return f"{who} left no record: killed outright (SIGKILL, the OOM killer or a lost node)"


#: What answered an attempt whose pods went on (an elastic run: the next start has the same launcher's time).
REGROUPED = "torchrun's agents restarted the workers (elastic), no pod restarted"


def explain(
    ends: list[dict[str, Any]], world_size: int | None, per_pod: int | None = None, went_on: bool = False
) -> str:
    """Why an attempt ended, in one line, and what the Job did (``went_on``: nothing, the pods went on and
    torchrun's agents formed the next worker group). A
    recorded failure with a meaning of its own (a code other than ``failed`` and ``preempted``) is the cause;
    otherwise ranks that left no record come first: killed outright, they are the likely cause, and the others'
    failures are lost peers and the teardown's SIGTERMs."""
    why = _explain(ends, world_size, per_pod)
    return why.rsplit("; the Job: ", 1)[0] + f"; {REGROUPED}" if went_on else why


def _explain(ends: list[dict[str, Any]], world_size: int | None, per_pod: int | None) -> str:
    lost = _lost(ends, world_size, per_pod)
    first = cause(ends)
    telling = first is not None and first["code"] not in (exitcodes.EXIT_FAILED, exitcodes.EXIT_PREEMPTED)
    if first is None:
        return f"{lost}; the Job: RestartJob (PodFailed)" if lost else "no end recorded"
    if telling or not lost:
        parts = [describe(first), *([lost] if lost else [])]
        action = job_action(first["code"]) if first["code"] != exitcodes.EXIT_PREEMPTED else "RestartJob (PodEvicted)"
    else:
        parts, action = [lost, "then " + describe(first)], "RestartJob (PodFailed)"
    return "; ".join([*parts, f"the Job: {action}"])


def by_attempt(
    records: list[dict[str, Any]], ends: list[dict[str, Any]], job_world: int | None = None
) -> list[dict[str, Any]]:
    """Each attempt of ``recovery.jsonl``'s ``start`` records, in order, with its world size, whether it was resumed
    after an interruption, and the ends recorded between its launch and the next attempt's (an attempt that failed
    before training began writes no start: its ends join the attempt before it). A world size above ``job_world``
    (the Job's, when known) or :data:`MAX_RANKS` is none this run had: unknown. Each end goes to the attempt with
    the latest launch at or before it, found by bisection over the launches sorted once: linear in what was read,
    up to a logarithm."""
    bound = min(job_world or MAX_RANKS, MAX_RANKS)
    found: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    for record in (r for r in records if r.get("event") == "start"):
        world = _count(record.get("world_size"))
        found.append(
            {
                "launched": attempt_began(record, previous),
                "regrouped": regrouped(record, previous),
                "world_size": world if world is not None and world <= bound else None,
                "ranks_per_pod": _count(record.get("ranks_per_pod")),
                "resumed_after_interruption": isinstance(record.get("interrupted"), dict),
                "ends": [],
            }
        )
        previous = record
    launches = sorted((a["launched"], i) for i, a in enumerate(found) if a["launched"] is not None)
    times = [launched for launched, _ in launches]
    for end in ends:
        at = bisect.bisect_right(times, end["time"]) - 1
        target = found[launches[at][1]] if at >= 0 else (found[0] if found else None)
        if target is not None:
            target["ends"].append(end)
    skipped = [r["step"] for r in records if r.get("event") == "skip" and all(_whole(r.get(k)) for k in SKIP_FIELDS)]
    for i, attempt in enumerate(found):
        interrupted = i + 1 < len(found) and found[i + 1]["resumed_after_interruption"]
        ended = attempt["ends"] or interrupted
        went_on = i + 1 < len(found) and found[i + 1]["regrouped"]  # the launchers went on
        why = explain(attempt["ends"], attempt["world_size"], attempt["ranks_per_pod"], went_on)
        first = cause(attempt["ends"])
        if first is not None and first["code"] == exitcodes.EXIT_NONFINITE:
            why = nonfinite_next(why, i + 1 < len(found), skipped, first["step"])
        attempt["why"] = why if ended else None
    return found


#: The fields of recovery.jsonl's ``skip`` record (recovery.py writes it), each a whole number.
SKIP_FIELDS = ("step", "epoch", "start", "stop")


def nonfinite_next(why: str, restarted: bool, skipped: list[Any], step: int | None = None) -> str:
    """What followed a non-finite loss: the Job restarted and the resume skipped the batch (``ops.nonfinite_loss:
    skip``, a ``skip`` record in recovery.jsonl), or it ended with the batch and the report kept in the directory of
    ``step`` (the step the end was recorded at: the guard stops at that step's end and names the directory by it)."""
    head = why.rsplit("; the Job: ", 1)[0]
    steps = ", ".join(str(s) for s in skipped if isinstance(s, int) and not isinstance(s, bool))
    if restarted:
        batch = f"step {steps}'s batch" if steps else "no batch (none recorded)"
        return f"{head}; the Job: RestartJob (ops.nonfinite_loss: skip), the resume skips {batch}"
    return (
        f"{head}; the Job: TerminateJob (ops.nonfinite_loss: stop), no retry: the offending batch and a report "
        f"are kept in {filenames.NONFINITE_PREFIX}{step if _whole(step) else 'N'}/"
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_RANKS else None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
