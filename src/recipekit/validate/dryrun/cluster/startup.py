"""What the pods are doing before (and around) the first step: one line per phase, as it happens.

Between "pods running run.sh" and step 1 a loaded machine can spend minutes (imports, the rendezvous, data,
the twin's weights, DeepSpeed's engine). Silence there looks like a hang, and printing every log line would bury the
steps; so the dry run reports *phases*, each once:

* the runtime's own announcements in each pod's log: lines that begin with the name of the bundle file that speaks
  (``launch: pod 1/2 of …; master …``, ``run.sh: …``, ``train.py: …``). They are shown, never judged;
* torchrun's start, seen in the pod's process tree (torchrun prints nothing when it starts its workers): a line
  when the workers running the launch module appear;
* train.py's structured records in metrics.jsonl: ``phase`` records (``{"event": "phase", "phase": …, "rank": …}``),
  and ``start``, ``adapted``, ``preempted`` and ``done``.

Judging never reads these lines; :mod:`recipekit.validate.dryrun.judges.training` reads the records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from recipekit.runtime.boundary import metricslog

#: Log lines the runtime prints in its own name (each file prefixes what it says with its name).
ANNOUNCERS = ("run.sh:", "launch:", "train.py:")
_TORCHRUN = ("torchrun", "torch.distributed.run")
_PLAIN_FIELDS = ("event", "phase", "rank", "time", "ts")
#: An announcement longer than this (a failure's whole message) is cut: the full text is in the pod's log.
MAX_CHARS = 200


class LogFollower:
    """The complete lines appended to one pod's log since ``offset`` (a line still being written waits)."""

    def __init__(self, path: Path, offset: int = 0):
        self.path, self.offset, self.partial = path, offset, b""

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return []
        self.offset += len(chunk)
        parts = (self.partial + chunk).split(b"\n")
        self.partial = parts.pop()
        return [part.decode("utf-8", errors="replace") for part in parts]


def announcement(line: str) -> str | None:
    """The runtime's announcement in a log line (cut to :data:`MAX_CHARS`), or None. Progress bars rewrite a line
    with carriage returns, so each rewritten segment is looked at."""
    for segment in reversed(line.split("\r")):
        text = segment.strip()
        if text.startswith(ANNOUNCERS):
            return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 2].rsplit(" ", 1)[0] + " …"
    return None


def workers(cmdlines: Iterable[list[str]], module: str) -> int:
    """How many of a pod's processes are torchrun workers running ``module`` (torchrun itself excluded)."""
    count = 0
    for cmdline in cmdlines:
        if any(part.endswith(_TORCHRUN) for part in cmdline):
            continue
        if any(a == "-m" and b == module for a, b in zip(cmdline, cmdline[1:], strict=False)):
            count += 1
    return count


def describe(record: dict[str, Any]) -> str | None:
    """One line for a structured record of train.py, or None for a kind not shown."""
    kind = record.get("event")
    if kind == metricslog.EVENT_PHASE:
        extra = ", ".join(f"{k} {v}" for k, v in record.items() if k not in _PLAIN_FIELDS)
        rank = f" rank {record['rank']}" if "rank" in record else ""
        return f"train.py{rank}: {record.get('phase')}" + (f" ({extra})" if extra else "")
    if kind == metricslog.EVENT_START:
        trainable, total = record.get("parameters_trainable"), record.get("parameters_total")
        params = (
            f"{trainable:,} of {total:,} parameters trainable"
            if isinstance(trainable, int) and isinstance(total, int)
            else "parameters unknown"
        )
        where = record.get("resume_from")
        parallel = record.get("parallel")  # the Megatron room's sizes; the Trainer's record has its ZeRO stage
        split = (
            " × ".join(f"{k} {v}" for k, v in parallel.items() if v != 1) or "no model parallelism"
            if isinstance(parallel, dict)
            else f"ZeRO {record.get('zero_stage')}"
        )
        return (
            f"train.py started: world size {record.get('world_size')}, {record.get('device')}, "
            f"{record.get('precision')}, {split}, {params}; " + (f"resuming from {where}" if where else "from scratch")
        )
    if kind == metricslog.EVENT_DATA and record.get("streaming"):
        return (
            f"train.py streams the data: {record.get('files')} file(s), {record.get('chunks')} chunks "
            f"({record.get('row_kind')}), from row {record.get('start_row')}"
        )
    if kind == metricslog.EVENT_DATA:
        how = (
            "reused prepared data"
            if record.get("reused")
            else f"prepared the data over {record.get('workers')} worker(s) in {record.get('seconds')} s"
        )
        return (
            f"train.py {how}: {record.get('chunks')} chunks, {record.get('train_rows')} train rows, "
            f"{record.get('train_tokens')} tokens ({record.get('row_kind')}) in {record.get('directory')}"
        )
    if kind == metricslog.EVENT_ADAPTED:
        return f"train.py adapted: {record.get('note')}"
    if kind == metricslog.EVENT_PREEMPTED:
        return f"train.py preempted: checkpoint saved at step {record.get('step')}"
    if kind == metricslog.EVENT_DONE:
        return f"train.py done at step {record.get('step')}; model in {record.get('output')}"
    return _describe_operations(kind, record)


def _describe_operations(kind: Any, record: dict[str, Any]) -> str | None:
    """The operations layer's records: preflight's verdict, a hang, a non-finite loss, an alert, a trace."""
    if kind == metricslog.EVENT_PREFLIGHT:
        checks = ", ".join(f"{c.get('check')} {c.get('status')}" for c in record.get("checks") or [])
        verdict = "passed" if record.get("ok") else f"FAILED: {record.get('reason')}"
        return f"train.py preflight {verdict} ({checks}; {record.get('seconds')} s)"
    if kind == metricslog.EVENT_STALLED:
        return (
            f"train.py rank {record.get('rank')}: watchdog fired after {record.get('waited_s')} s in "
            f"{record.get('phase')}; stacks in {record.get('stacks')}"
        )
    if kind == metricslog.EVENT_NONFINITE:
        return f"train.py: {record.get('message')}"
    if kind == metricslog.EVENT_ALERT:
        return f"train.py alert {record.get('alert')}: {record.get('message')}"
    if kind == metricslog.EVENT_PROFILE:
        return f"train.py profiled steps {record.get('steps')} into {record.get('path')}"
    return None


class PhaseReporter:
    """Reports one attempt's phases through ``progress``, each at most once per pod.

    ``cmdlines(index)`` returns the command lines of pod ``index``'s live process tree; ``logs`` maps each pod to
    its log file and the offset where this attempt's output begins.
    """

    def __init__(
        self,
        attempt: int,
        logs: dict[int, tuple[Path, int]],
        module: str,
        nproc: int,
        cmdlines: Callable[[int], list[list[str]]],
        progress: Callable[[str], None],
    ):
        self.prefix = f"attempt {attempt}: "
        self.followers = {index: LogFollower(path, offset) for index, (path, offset) in logs.items()}
        self.module, self.nproc, self.cmdlines, self.progress = module, max(1, nproc), cmdlines, progress
        self.torchrun_up: set[int] = set()
        self.said: set[tuple[int, str]] = set()
        #: set when the dry run killed a pod on purpose: (that pod, what happened); the others' failures follow
        self.expected: tuple[int, str] | None = None

    def poll(self) -> None:
        """Read the pods' new log lines and look at their process trees."""
        for index, follower in self.followers.items():
            for line in follower.lines():
                text = announcement(line)
                if text is not None and self.expected is not None:
                    text = self._as_expected(index, text)
                if text is not None and (index, text) not in self.said:
                    self.said.add((index, text))
                    self.progress(f"{self.prefix}pod {index}: {text}")
            if index not in self.torchrun_up:
                count = workers(self.cmdlines(index), self.module)
                if count >= self.nproc:
                    self.torchrun_up.add(index)
                    self.progress(f"{self.prefix}pod {index}: torchrun started {count} worker process(es)")

    def _as_expected(self, index: int, text: str) -> str | None:
        """After a kill on purpose, the other pods' errors (a peer's collective failing: gloo's "Connection closed by
        peer", torchrun's exit) are what a node failure does: said once per pod, plainly, the raw text left to the
        pod's log."""
        victim, what = self.expected or (-1, "")
        if index == victim or not text.startswith(("train.py:", "launch: torchrun exited")):
            return text
        log = self.followers[index].path.name
        return f"stopped, as expected once {what} (its peers' collectives fail); the error is in {log}"

    def record(self, record: dict[str, Any]) -> None:
        """Report one structured record of train.py."""
        text = describe(record)
        if text is not None:
            self.progress(self.prefix + text)
