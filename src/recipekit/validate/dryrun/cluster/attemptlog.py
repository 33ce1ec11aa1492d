"""What the dry run saw of one attempt: training steps, the runtime's structured records, exit codes, the kill.

train.py appends to ``metrics.jsonl`` (the runtime contract's
:data:`~recipekit.runtime.boundary.filenames.METRICS_FILE`): training logs carry ``step`` and ``loss``; structured
records carry ``event`` (start, adapted, preempted, done, phase) and are never steps. :class:`MetricsTail` follows the
file while the pods run, and the attempt keeps both kinds apart, so judging
(:mod:`recipekit.validate.dryrun.judges.training`) reads records, never log text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipekit.runtime.boundary import metricslog
from recipekit.runtime.boundary.exitcodes import EXIT_CODES


def exits_in_words(codes: dict[int, int | None], *, failed_only: bool = False) -> str:
    """Each pod's end in words, from the exit-code table the Job's policies are made of: ``pod 0 exited 2
    (user_error), pod 1 was stopped by signal 15 (SIGTERM)``, never the dict ``{0: 2, 1: -15}``."""
    import signal

    meanings = {c.code: c.name for c in EXIT_CODES}
    words = []
    for pod, code in sorted(codes.items()):
        if failed_only and code in (0, None):
            continue
        if code is None:
            words.append(f"pod {pod} did not exit")
        elif code < 0 or (code > 128 and code not in meanings):
            number = -code if code < 0 else code - 128
            try:
                name = f" ({signal.Signals(number).name})"
            except ValueError:
                name = ""
            words.append(f"pod {pod} was stopped by signal {number}{name}")
        else:
            words.append(f"pod {pod} exited {code} ({meanings.get(code, 'not a code recipekit exits with')})")
    return ", ".join(words) or "no pod exited"


@dataclass
class Step:
    step: int
    loss: float | None
    at: float  # monotonic time this process saw the record


@dataclass
class Attempt:
    """One start of every pod, until all exited, one was killed, or the dry run's deadline passed."""

    number: int
    port: int
    started: float
    steps: list[Step] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)  # records with "event", in file order
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    outcome: str = ""  # completed | failed | killed | timeout
    killed_pod: int | None = None
    killed_at: float | None = None
    killed_step: int | None = None
    killed_processes: int = 0
    ended: float = 0.0
    log_offsets: dict[int, int] = field(default_factory=dict)
    scraped: dict[str, Any] | None = None  # rank 0's metrics endpoint, read once training checkpointed
    #: (pod, exit code) of the first pod seen exiting non-zero: the failure Volcano's controller acts on
    first_failure: tuple[int, int] | None = None
    #: the row ledger's file sizes when the attempt started and ended (runtime/volume/rowledger.py): its lines between
    ledger_from: dict[str, int] = field(default_factory=dict)
    ledger_to: dict[str, int] = field(default_factory=dict)

    def events(self, kind: str) -> list[dict[str, Any]]:
        """This attempt's records of one kind, in file order."""
        return metricslog.events(self.records, kind)

    def last(self, kind: str) -> dict[str, Any] | None:
        """The newest record of ``kind`` (train.py writes start and done once per run; a restart writes again)."""
        found = self.events(kind)
        return found[-1] if found else None

    def observe(self, record: dict[str, Any], at: float) -> Step | None:
        """File one metrics record under this attempt; the Step when it is a training log with a loss."""
        if "event" in record:
            self.records.append(record)
            return None
        if isinstance(record.get("step"), int) and "loss" in record:
            loss = record.get("loss")
            step = Step(record["step"], float(loss) if isinstance(loss, (int, float)) else None, at)
            self.steps.append(step)
            return step
        return None  # other Trainer logs (evaluation, the final summary)


class MetricsTail:
    """Follows metrics.jsonl as rank 0 appends to it: each call returns the complete lines written since the last.

    A line being written is kept until its newline arrives; a file that shrank (recreated) is read from the start.
    """

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:  # recreated
            self.offset, self.partial = 0, b""
        if size == self.offset:
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read(size - self.offset)
        self.offset = size
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        return metricslog.parse_records(lines)
