"""metrics.jsonl: the structured records train.py appends to it and every reader parses, so nothing scrapes log text.

Standard library only: the run writes with it, recipekit's report, dry run and tests read with it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import jsonfile

#: ``metrics.jsonl`` holds one JSON object per line. Training logs carry ``step`` and the Trainer's figures (loss,
#: learning_rate, ...); the records below carry ``event`` instead, so readers never parse log text.
#: run_id, world size, device, precision, parameters, resume_from (None: scratch), resume_step, global batch and
#: accumulation, saved_world_size (the world the resumed checkpoint was saved at)
EVENT_START = "start"
EVENT_ADAPTED = "adapted"  # one change to the plan for how train.py was launched (no torchrun): ``note``
EVENT_PREEMPTED = "preempted"  # SIGTERM: checkpoint saved at ``step``
EVENT_DONE = "done"  # final ``step``, where the model went
#: The training data, prepared or reused before the process group formed: fingerprint, directory, reused, workers,
#: chunks, train/eval rows and tokens, records read/bad/dropped, seconds (see runtime/dataprep.py).
EVENT_DATA = "data"
#: What ``rank`` begins now (``phase``: a short name such as "load data", "build model", "train"; extra fields are
#: shown beside it). Optional: the dry run prints each as it arrives, so minutes before step 1 are not silent.
EVENT_PHASE = "phase"
#: The operations layer's records. ``preflight``: rank 0's verdict and every check (also cluster-check.json);
#: ``stalled``: the hang watchdog fired (written by *each* rank that detects it: rank 0 may be the one that hangs);
#: ``nonfinite``: a NaN/inf loss stopped or warned; ``alert``: an in-process warning (``alert``, ``step``,
#: ``message``); ``checkpoint``: a save's ``seconds`` (training waited) and ``bytes``; ``profile``: where a trace went.
EVENT_PREFLIGHT = "preflight"
EVENT_STALLED = "stalled"
EVENT_NONFINITE = "nonfinite"
EVENT_LOSS_SPIKE = "loss_spike"  # the loss-spike alert's step, each rank's loss there, the report (lossguard.py)
EVENT_ALERT = "alert"
EVENT_CHECKPOINT = "checkpoint"
#: A hot tier's checkpoint reached the shared volume: ``step``, the drain's ``seconds``, the ``total`` from the save's
#: start, ``bytes`` copied (runtime/volume/hottier.py).
EVENT_CHECKPOINT_DRAINED = "checkpoint_drained"
EVENT_CHECKPOINT_COLD = "checkpoint_cold"  # a checkpoint's copy to the cold store: ``step``, ``seconds``, ``code``
EVENT_PROFILE = "profile"

#: metrics.jsonl's measured memory of each logged step, GiB, the largest over ranks: the device's peak allocated
#: tensors since the last log (torch's own counter, what the plan's memory per device estimates; absent on a CPU) and
#: the process's peak resident memory (the high-water mark of the whole run so far: what a CPU dry run measures).
PEAK_DEVICE_MEMORY_KEY = "peak_device_memory_gib"
PEAK_HOST_MEMORY_KEY = "peak_rss_gib"


def event(kind: str, **fields: Any) -> dict[str, Any]:
    """One structured record for metrics.jsonl."""
    return {"event": kind, **fields}


def stamped(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with ``time`` (Unix seconds) added: a run report places attempts and restarts on the clock."""
    return {**record, "time": round(time.time(), 3)}


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one record as a JSON line (rank 0 only writes; a reader may see a partial last line).

    The line goes out in one ``write`` on an append-mode descriptor, so the one record other ranks may write (the
    watchdog's ``stalled``, when rank 0 may be the rank that hangs) does not interleave with rank 0's lines. The file
    lies on the shared volume: it is opened without following a link, and a FIFO, device or someone else's file
    there is refused (``OSError``, :func:`.jsonfile.append`).
    """
    jsonfile.append(Path(path), (json.dumps(record, sort_keys=False) + "\n").encode())


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON object line of a metrics file; unreadable lines (a write in progress) are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return parse_records(text.splitlines())


def parse_records(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The JSON objects among ``lines`` (a reader following the file as it grows passes the new lines)."""
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def events(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The records of one event kind, in file order."""
    return [r for r in records if r.get("event") == kind]
