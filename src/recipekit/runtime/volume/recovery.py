"""Interruptions and recoveries of a run, recorded in its output directory, and the MTTR computed from them.

Standard library only: train.py writes the records (rank 0), ``recipekit runs history`` reads them, and the dry
run's judge computes its MTTR with :func:`history` over the same file, so the figure a cluster shows and the one a
dry run reports are one definition.

Two files in the output directory:

* ``recipekit-progress.json`` — the last completed optimizer step and its wall time, replaced atomically after
  every step (one small write; a crash leaves the previous one whole). It is what survives a kill.
* ``recovery.jsonl`` — one record per event: ``start`` (this process began: the launcher's start time, the
  checkpoint it resumes from, and — read from the progress file — the step and time where the previous attempt
  stopped), ``loaded`` (the checkpoint is loaded: the Trainer's ``on_train_begin``), ``first_step`` (the first
  step completed after the start), ``done``, ``skip`` (``ops.nonfinite_loss: skip``: the step whose loss was
  not finite and the positions of its batch in its epoch's order, which every later attempt's sampler leaves out)
  and ``restart`` (a restart the user asked for, applied: ``recipekit restart``; its start is no recovery).

MTTR of one recovery = time of the first step after the restart − time of the last step completed before the
interruption: detection, teardown, rescheduling, start-up, loading and the first step all count, as they do for
the people waiting. :attr:`Recovery.parts` splits it at the times the run recorded: **detect** (last step → the
first rank's end record, attempt-ends/: the watchdog, a collective's timeout or the kill noticed), **reschedule**
(→ the launcher started again: teardown, Volcano's restart, scheduling, the container's start; in an elastic run,
whose pods go on, → torchrun's agents started new workers: their rendezvous on the pods that are left),
**restart** (→ the ``start`` record: torchrun, the process group, preflight), **load** (→ ``loaded``: model and
checkpoint) and **first step** (→ ``first_step``). A part whose end time is not recorded is None and its time
joins the next part's (no end record: detection counts as rescheduling). Steps lost = that last step − the
checkpoint step resumed from (work done twice).
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..boundary import jsonfile, metricslog
from . import attemptends

RECOVERY_FILE = "recovery.jsonl"
PROGRESS_FILE = "recipekit-progress.json"
#: The launcher's wall time at start (set for torchrun's workers): when this attempt of the pod began.
LAUNCH_TIME_ENV = "RECIPEKIT_LAUNCH_TIME"
#: When this worker process began (train.py imports this module first): after an elastic restart, torchrun's agent
#: started new workers in a pod whose launcher kept running, so the launcher's time predates the interruption.
WORKER_STARTED = time.time()


@dataclass(frozen=True)
class Recovery:
    """One interruption and what followed it."""

    interrupted_step: int
    interrupted_time: float
    restart_time: float  # the launcher started again
    resume_step: int  # 0: from scratch
    loaded_time: float | None  # checkpoint loaded, training loop begins
    first_step: int | None
    first_step_time: float | None
    started_time: float | None = None  # the ``start`` record: the process group exists, preflight passed
    detected_time: float | None = None  # the interrupted attempt's first end record (attempt-ends/), where known

    @property
    def parts(self) -> dict[str, float | None]:
        """The MTTR in its parts, seconds (see the module's docstring); they add up to :attr:`mttr_s`."""
        marks = [
            ("detect", self.detected_time),
            ("reschedule", self.restart_time),
            ("restart", self.started_time),
            ("load", self.loaded_time),
            ("first_step", self.first_step_time),
        ]
        found: dict[str, float | None] = {}
        since = self.interrupted_time
        for name, at in marks:
            if at is None or at < since:  # not recorded, or a clock of another pod behind this one
                found[name] = None
                continue
            found[name], since = round(at - since, 2), at
        return found

    @property
    def mttr_s(self) -> float | None:
        """Last step before the interruption → first step after the restart, seconds."""
        return None if self.first_step_time is None else round(self.first_step_time - self.interrupted_time, 2)

    @property
    def steps_lost(self) -> int:
        return max(0, self.interrupted_step - self.resume_step)

    def to_json(self) -> dict[str, Any]:
        return {
            "interrupted_step": self.interrupted_step,
            "interrupted_time": self.interrupted_time,
            "restart_time": self.restart_time,
            "resume_step": self.resume_step,
            "loaded_time": self.loaded_time,
            "first_step": self.first_step,
            "first_step_time": self.first_step_time,
            "mttr_s": self.mttr_s,
            "parts_s": self.parts,
            "steps_lost": self.steps_lost,
        }


#: The bounds of recovery.jsonl as it is read back (a record per start, load, first step and end: a few per restart).
MAX_RECOVERY_BYTES = 64 << 20
MAX_RECOVERY_LINE = 64 << 10
MAX_RECOVERY_LINES = 1_000_000
#: The largest time (Unix seconds) or step taken from a record: a larger one is no time this run logged.
MAX_TIME_S = attemptends.MAX_TIME_S
MAX_STEP = attemptends.MAX_STEP
#: The most attempts ``runs history`` keeps: the last ones (a Job restarts at most ``maxRetry`` times; thousands of
#: starts in one directory are no run's).
MAX_ATTEMPTS = 10_000
#: The fields of the records :func:`history` and ``runs history`` use; the rest of a record is not kept.
_USED = ("event", "time", "launch_time", "worker_time", "world_size", "ranks_per_pod", "resume_step", "step",
         "epoch", "start", "stop", "restart", "id", "from")  # fmt: skip
#: The most checkpoints a restart record's ``superseded`` list keeps as it is read back.
MAX_SUPERSEDED = 1000

_time = attemptends.finite_time


def _step(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP
    return value if ok else None


def history(records: list[dict[str, Any]]) -> list[Recovery]:
    """Every recovery in ``recovery.jsonl``'s records, in order: each ``start`` that found an interrupted attempt.
    Fields are typed as they are taken: a start whose interruption has no valid step and time (or no valid restart
    time) opens no recovery, and a later time or step that is not one is left unknown."""
    found: list[Recovery] = []
    current: dict[str, Any] | None = None

    def close() -> None:
        if current is not None:
            found.append(
                Recovery(
                    interrupted_step=current["interrupted_step"],
                    interrupted_time=current["interrupted_time"],
                    restart_time=current["restart_time"],
                    resume_step=current["resume_step"],
                    loaded_time=current.get("loaded_time"),
                    first_step=current.get("first_step"),
                    first_step_time=current.get("first_step_time"),
                    started_time=current.get("started_time"),
                )
            )

    previous: dict[str, Any] | None = None  # the start before (an elastic regroup's launchers went on)
    for record in records:
        kind = record.get("event") if isinstance(record, dict) else None
        if kind == "start":
            close()
            current = None
            restart = attemptends.attempt_began(record, previous)
            previous = record
            interrupted = record.get("interrupted")
            if isinstance(interrupted, dict) and not record.get("restart"):  # a restart asked for is no recovery
                step, at = _step(interrupted.get("step")), _time(interrupted.get("time"))
                if step is not None and at is not None and restart is not None:
                    current = {
                        "interrupted_step": step,
                        "interrupted_time": at,
                        "restart_time": restart,
                        "resume_step": _step(record.get("resume_step")) or 0,
                        "started_time": _time(record.get("time")),
                    }
        elif current is not None and kind == "loaded" and "loaded_time" not in current:
            current["loaded_time"] = _time(record.get("time"))
        elif current is not None and kind == "first_step" and "first_step" not in current:
            current["first_step"], current["first_step_time"] = _step(record.get("step")), _time(record.get("time"))
    close()
    return found


def detected(recoveries: list[Recovery], ends: list[list[dict[str, Any]]]) -> list[Recovery]:
    """Each recovery with the time its interruption was detected: the first end record (attempt-ends/) of the attempt
    it followed (``ends[i]``, the ends of recovery ``i``'s interrupted attempt; typed by attemptends.read_ends), at
    or after the last step (an earlier one is no end of that step's attempt)."""
    found = []
    for i, r in enumerate(recoveries):
        times = [e["time"] for e in (ends[i] if i < len(ends) else []) if e.get("time") is not None]
        first = min((t for t in times if t >= r.interrupted_time), default=None)
        found.append(replace(r, detected_time=first))
    return found


def recoveries_seen(
    records: list[dict[str, Any]], ends: list[dict[str, Any]], job_world: int | None
) -> tuple[list[Recovery], list[dict[str, Any]], list[dict[str, Any]]]:
    """What ``recipekit runs history`` shows, from recovery.jsonl's records and the typed end records
    (attemptends.read_ends): every recovery with the time its interruption was detected, every attempt, and the
    attempt each recovery followed (the one before each start that found an interruption)."""
    attempts = attemptends.by_attempt(records, ends, job_world)
    ended = [a for i, a in enumerate(attempts[:-1]) if attempts[i + 1]["resumed_after_interruption"]]
    return detected(history(records), [a["ends"] for a in ended]), attempts, ended


def read(output_dir: Path) -> list[dict[str, Any]]:
    """The records of a run's ``recovery.jsonl`` (empty when it has none or it cannot be read)."""
    try:
        return [record for _, record in read_lines(output_dir).values]
    except OSError:
        return []


def read_lines(output_dir: Path) -> jsonfile.Lines:
    """``recovery.jsonl`` read line by line within its bounds (its JSON objects, the lines refused and why);
    ``OSError`` when it is not a regular file inside ``output_dir``."""
    return jsonfile.read_lines(
        Path(output_dir) / RECOVERY_FILE,
        max_bytes=MAX_RECOVERY_BYTES,
        max_line_bytes=MAX_RECOVERY_LINE,
        max_lines=MAX_RECOVERY_LINES,
        within=Path(output_dir),
        keep=lambda value: value if isinstance(value, dict) else None,
    )


def compact(value: Any) -> dict[str, Any] | None:
    """A record with only the fields history uses, each a scalar (``interrupted``: its step and time), or None when
    it is no object: what a reader of thousands of records keeps of each."""
    if not isinstance(value, dict):
        return None
    kept = {k: value[k] for k in _USED if k in value and isinstance(value[k], (int, float, str, type(None)))}
    aside = value.get("superseded")
    if isinstance(aside, list):  # a restart's checkpoints set aside (restarts() reads them)
        kept["superseded"] = [name[:64] for name in aside[:MAX_SUPERSEDED] if isinstance(name, str)]
    interrupted = value.get("interrupted")
    if isinstance(interrupted, dict):
        kept["interrupted"] = {
            k: interrupted.get(k) for k in ("step", "time") if isinstance(interrupted.get(k), (int, float, str))
        }
    return kept


@dataclass
class Tail:
    """The records of the last :data:`MAX_ATTEMPTS` attempts of ``recovery.jsonl`` (each start with the records
    after it), gathered while the file is read so that no more is ever held; ``starts`` counts them all."""

    most: int = MAX_ATTEMPTS
    starts: int = 0
    groups: deque[list[dict[str, Any]]] = field(default_factory=deque)

    def keep(self, value: Any) -> None:
        record = compact(value)
        if record is None:
            return
        if record.get("event") == "start" or not self.groups:
            if record.get("event") == "start":
                self.starts += 1
            self.groups.append([])
            if len(self.groups) > self.most:
                self.groups.popleft()
        self.groups[-1].append(record)

    @property
    def records(self) -> list[dict[str, Any]]:
        return [record for group in self.groups for record in group]

    @property
    def cut(self) -> str | None:
        shown = sum(1 for group in self.groups if group and group[0].get("event") == "start")
        return f"only the last {shown:,} of {self.starts:,} starts are shown" if shown < self.starts else None


def read_tail(output_dir: Path, most: int = MAX_ATTEMPTS) -> tuple[Tail, jsonfile.Lines]:
    """``recovery.jsonl`` read within its bounds, keeping the records of its last ``most`` attempts only (compact:
    the fields history uses); ``OSError`` as :func:`read_lines`."""
    tail = Tail(most)

    def keep(value: Any) -> None:
        tail.keep(value)

    return tail, jsonfile.read_lines(
        Path(output_dir) / RECOVERY_FILE,
        max_bytes=MAX_RECOVERY_BYTES,
        max_line_bytes=MAX_RECOVERY_LINE,
        max_lines=MAX_RECOVERY_LINES,
        within=Path(output_dir),
        keep=keep,
    )


#: The record of a skipped batch (``ops.nonfinite_loss: skip``).
SKIP_EVENT = "skip"
#: The record of a restart the user asked for and the run applied (``recipekit restart``; volume/restart.py).
RESTART_EVENT = "restart"


def restarts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The well-formed ``restart`` records, in order: ``id``, ``from`` (a checkpoint name, or None: fresh), the
    checkpoints ``superseded`` (set aside) and the ``time`` it was applied."""
    found = []
    for record in records:
        if record.get("event") != RESTART_EVENT or not isinstance(record.get("id"), str):
            continue
        start_from = record.get("from")
        aside = record.get("superseded")
        superseded = [s[:64] for s in aside if isinstance(s, str)][:MAX_SUPERSEDED] if isinstance(aside, list) else []
        found.append(
            {
                "id": record["id"][:32],
                "from": start_from[:64] if isinstance(start_from, str) else None,
                "superseded": [s[:64] for s in superseded if isinstance(s, str)]
                if isinstance(superseded, list)
                else [],
                "time": _time(record.get("time")),
            }
        )
    return found


def skips(records: list[dict[str, Any]]) -> list[dict[str, int]]:
    """The well-formed ``skip`` records, in order: ``step``, ``epoch`` and the positions ``[start, stop)`` of that
    step's batch in the epoch's order (sampler.py leaves them out of every later attempt)."""
    found = []
    for record in records:
        if record.get("event") != SKIP_EVENT:
            continue
        fields = {k: _step(record.get(k)) for k in ("step", "epoch", "start", "stop")}
        typed = {k: v for k, v in fields.items() if v is not None}
        if len(typed) == len(fields) and typed["start"] < typed["stop"]:
            found.append(typed)
    return found


def skipped_batches(output_dir: Path) -> tuple[tuple[int, int, int], ...]:
    """The batches this run's resumes leave out: ``(epoch, start, stop)`` of each ``skip`` record, oldest first."""
    return tuple((s["epoch"], s["start"], s["stop"]) for s in skips(read(output_dir)))


def summary(recoveries: list[Recovery]) -> dict[str, Any]:
    """Restarts, steps lost, and the mean / last MTTR over the recoveries that reached a first step."""
    times = [r.mttr_s for r in recoveries if r.mttr_s is not None]
    return {
        "restarts": len(recoveries),
        "steps_lost": sum(r.steps_lost for r in recoveries),
        "mttr_s": round(sum(times) / len(times), 2) if times else None,
        "last_mttr_s": times[-1] if times else None,
    }


class RecoveryLog:
    """Rank 0's writer of the two files (every other rank gets one whose calls do nothing)."""

    def __init__(
        self,
        output_dir: Path,
        enabled: bool,
        clock: Callable[[], float] = time.time,
        environ: Mapping[str, str] | None = None,
    ):
        self.dir, self.enabled, self.clock = Path(output_dir), enabled, clock
        self.environ = os.environ if environ is None else environ
        self.first_step_seen = False
        self.records: list[dict[str, Any]] = []
        attemptends.watch(self.dir)  # every rank: a non-zero exit of this process is recorded there

    def _append(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            metricslog.append_record(self.dir / RECOVERY_FILE, record)
        except OSError:
            pass  # never stop training for a record

    def started(
        self,
        resume_step: int | None,
        resume_from: str | None,
        world_size: int | None = None,
        restart: str | None = None,
    ) -> None:
        """This attempt began (resuming ``resume_from`` at ``resume_step``, or from scratch) on ``world_size`` ranks
        (``runs history`` names the ranks that left no end record); ``restart``: the id of the restart request it
        applied (a restart the user asked for, never counted as a recovery)."""
        if not self.enabled:
            return
        launch = self.environ.get(LAUNCH_TIME_ENV, "")
        try:
            launched = float(launch) if launch else None
        except ValueError:
            launched = None
        progress = self._progress()
        interrupted = None
        if progress is not None and not progress.get("done"):
            interrupted = {"step": progress.get("step"), "time": progress.get("time")}
        skipped = [s["step"] for s in skips(read(self.dir))]  # the batches this attempt's order leaves out
        self._append(
            metricslog.event(
                "start",
                time=self.clock(),
                launch_time=launched,
                worker_time=WORKER_STARTED,
                resume_from=resume_from,
                resume_step=resume_step or 0,
                interrupted=interrupted,
                world_size=world_size,
                ranks_per_pod=_int_or_none(self.environ.get("LOCAL_WORLD_SIZE")),  # torchrun's processes per pod
                **({"skipped_steps": skipped} if skipped else {}),
                **({"restart": restart} if restart else {}),
            )
        )

    def restarted(self, request_id: str, start_from: str | None, superseded: list[str]) -> None:
        """A restart the user asked for was applied (volume/restart.py): from ``start_from`` (None: fresh), with the
        newer checkpoints ``superseded`` set aside."""
        if self.enabled:
            record = {"id": request_id, "from": start_from, "superseded": superseded, "time": self.clock()}
            self._append(metricslog.event(RESTART_EVENT, **record))

    def skipped(self, step: int, epoch: int, start: int, stop: int) -> None:
        """Step ``step``'s loss was not finite and ``ops.nonfinite_loss`` is ``skip``: the resume leaves out the
        positions ``[start, stop)`` of epoch ``epoch``'s order (that step's batch on every rank)."""
        if self.enabled:
            self._append(
                metricslog.event(SKIP_EVENT, step=step, epoch=epoch, start=start, stop=stop, time=self.clock())
            )

    def loaded(self, step: int) -> None:
        if self.enabled:
            self._append(metricslog.event("loaded", step=step, time=self.clock()))

    def step(self, step: int) -> None:
        """An optimizer step completed: the progress file moves on; the first one after the start is recorded."""
        attemptends.stepped(step)
        if not self.enabled:
            return
        now = self.clock()
        if not self.first_step_seen:
            self.first_step_seen = True
            self._append(metricslog.event("first_step", step=step, time=now))
        self._write_progress({"step": step, "time": now})

    def done(self, step: int) -> None:
        if self.enabled:
            self._append(metricslog.event("done", step=step, time=self.clock()))
            self._write_progress({"step": step, "time": self.clock(), "done": True})

    def _progress(self) -> dict[str, Any] | None:
        try:
            data = jsonfile.read(self.dir / PROGRESS_FILE, 64 << 10, within=self.dir)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write_progress(self, data: dict[str, Any]) -> None:
        try:
            jsonfile.replace_text(self.dir / PROGRESS_FILE, json.dumps(data))
        except OSError:
            pass


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None
