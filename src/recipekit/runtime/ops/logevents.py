"""Log keywords that name a fault, counted per rank for Prometheus: the runtime's own counter, no log shipper.

What feeds it: a ``logging.Handler`` on the root logger (every WARNING and above this process logs — transformers',
DeepSpeed's, torch's Python-side messages and train.py's own ``training failed`` record, which carries the fatal
exception and so its text: an HCCL execution timeout, a CUDA/NPU out-of-memory error, an ECC error surface there as
Python exceptions). What it cannot see: lines the collective libraries' C++ threads write straight to stderr (NCCL's
watchdog, which with ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` ends the process itself) and the kernel's Xid lines (the
node's log; DCGM's exporter counts those, bundle/devicetelemetry.py).

The kinds (:data:`KINDS`) and their keywords:

* ``collective_timeout``: HCCL or NCCL with a timeout in the same line, torch's "Watchdog caught collective
  operation timeout", HCCL's timeout error codes EI0002 / EI0006;
* ``device_ecc``: an ECC error or an NVIDIA Xid;
* ``device_oom``: "out of memory" (CUDA, NPU, torch's ``OutOfMemoryError``).

Each kind counted goes to the exporter (``recipekit_log_events_total{kind}`` and the time in
``recipekit_log_event_timestamp_seconds{kind}``) and to ``log-events/rank-R.json`` in the run directory: a fatal
error ends the process before Prometheus scrapes it again, so the restarted process reads the file and serves the
counts and times again under the same rank (and, on Volcano, the same pod name). The alert fires on the time, for
``ops.log_event_window_s`` after the event (bundle/monitoring.py). Standard library only.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

from ..boundary import jsonfile
from ..boundary import metricnames as names

#: Each kind of fault (``metricnames.LOG_EVENT_KINDS``) and what a log line or error says when it happens.
KINDS: dict[str, re.Pattern[str]] = {
    "collective_timeout": re.compile(
        r"\b[HN]CCL\b[^\n]*\btim(?:e ?out|ed out)|watchdog caught collective operation timeout|\bEI000[26]\b",
        re.IGNORECASE,
    ),
    "device_ecc": re.compile(r"\bECC\b|\bXid\b", re.IGNORECASE),
    "device_oom": re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE),
}
#: Characters of one record scanned at most.
SCAN_MAX = 16 * 1024
#: Bytes of a rank's counts file read at most.
FILE_MAX = 64 * 1024
DIR = "log-events"


def classify(text: str) -> list[str]:
    """The kinds of fault ``text`` names, in :data:`KINDS` order."""
    head = text[:SCAN_MAX]
    return [kind for kind, pattern in KINDS.items() if pattern.search(head)]


assert tuple(KINDS) == names.LOG_EVENT_KINDS, "metricnames.LOG_EVENT_KINDS lists the kinds the alerts name"


class LogEvents:
    """This rank's counts and times per kind, mirrored to the exporter and the run directory."""

    def __init__(self, output_dir: Path, rank: int, exporter: Any = None):
        self.path = output_dir / DIR / f"rank-{rank}.json"
        self.exporter: Any = None
        self.counts: dict[str, int] = {}
        self.times: dict[str, float] = {}
        self._load()
        if exporter is not None:
            self.attach(exporter)

    def attach(self, exporter: Any) -> None:
        """Serve through ``exporter`` from now on, starting with what this rank counted so far (in this process
        and, from the run directory, in the processes before it)."""
        self.exporter = exporter
        for kind in self.counts:
            exporter.inc(names.LOG_EVENTS, kind, self.counts[kind])
            exporter.set(names.LOG_EVENT_TIME, self.times[kind], kind)

    def _load(self) -> None:
        """What an earlier process of this rank counted (typed; anything malformed counts as nothing)."""
        try:
            data = jsonfile.read(self.path, max_bytes=FILE_MAX)
        except (OSError, ValueError):
            return
        for kind, entry in (data if isinstance(data, dict) else {}).items():
            if kind in KINDS and isinstance(entry, dict):
                count, at = entry.get("count"), entry.get("time")
                if isinstance(count, int) and count > 0 and isinstance(at, (int, float)):
                    self.counts[kind], self.times[kind] = count, float(at)

    def note(self, text: str) -> list[str]:
        """Count the kinds ``text`` names; the kinds."""
        kinds = classify(text)
        if not kinds:
            return kinds
        now = time.time()
        for kind in kinds:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.times[kind] = now
            if self.exporter is not None:
                self.exporter.inc(names.LOG_EVENTS, kind)
                self.exporter.set(names.LOG_EVENT_TIME, now, kind)
        document = {kind: {"count": self.counts[kind], "time": self.times[kind]} for kind in self.counts}
        try:
            jsonfile.replace_text(self.path, json.dumps(document, sort_keys=True) + "\n")
        except OSError:
            pass  # the counter is served; the file only carries it over a restart
        return kinds


class KeywordHandler(logging.Handler):
    """Feeds every WARNING-or-worse record (its message and its exception's text) to :class:`LogEvents`."""

    def __init__(self, events: LogEvents):
        super().__init__(logging.WARNING)
        self.events = events
        self._inside = False

    def emit(self, record: logging.LogRecord) -> None:
        if self._inside:  # a record logged while counting one: never recurse
            return
        self._inside = True
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                error = record.exc_info[1]
                text += f"\n{type(error).__name__}: {error}"
            self.events.note(text)
        except Exception:  # noqa: BLE001 - counting never breaks logging, nor training
            pass
        finally:
            self._inside = False


def install(output_dir: Path, rank: int) -> KeywordHandler:
    """Count this process's log keywords from now on, to the end of the process (the handler is on the root logger,
    where every logger's records arrive; train.py's record of a fatal error comes after training has closed the
    exporter, and still reaches the run directory). The exporter joins with ``handler.events.attach``."""
    handler = KeywordHandler(LogEvents(output_dir, rank))
    logging.getLogger().addHandler(handler)
    return handler
