"""Judging the experiment trackers of a dry run: what each wrote offline holds the run's losses.

The dry run runs every tracker of ``train.report_to`` offline (workdir/substitutions.py), so each writes its own
files under the output directory: MLflow's file store (``mlruns/<experiment>/<run>/metrics/loss``, one
``timestamp value step`` line per logged step), W&B's transaction log (``wandb/offline-run-*/run-*.wandb``, protobuf
records) and SwanLab's backup (``swanlog/run-*/backup.swanlab``, JSON records), both LevelDB log files. The check
reads them back and wants, for every training step metrics.jsonl logged, the same loss at that step in the tracker's
records (any of its runs: a restarted attempt starts a new one).

MLflow's text and SwanLab's JSON records are read here; W&B's protobuf records are decoded in a child Python with
W&B's own generated classes, so the check reads them as W&B would, whatever this process imports. The log frames
are checked (each chunk's CRC-32 seeded by its type, as both writers make them) before any record is parsed, and
every file is size-bounded and must be a regular file inside the output directory.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import subprocess
import zlib
from pathlib import Path

from recipekit.runtime.boundary import filenames, metricslog
from recipekit.validate.shared.childpython import python_argv, safe_env
from recipekit.validate.shared.results import Result

WHERE = "<dry run>"
#: A tracker file larger than this is not read (a dry run's are kilobytes).
MAX_BYTES = 64 << 20
#: Seconds the child that reads a binary log may take (importing the tracker's client is most of it).
CHILD_TIMEOUT_S = 120
#: Relative difference within which a tracker's loss is the logged one (both are the same float, printed twice).
RTOL = 1e-6
#: Where each tracker's files are, as globs under the output directory.
GLOBS = {
    "mlflow": "mlruns/*/*/metrics/loss",
    "wandb": "wandb/offline-run-*/run-*.wandb",
    "swanlab": "swanlog/run-*/backup.swanlab",
}

#: LevelDB's log format (doc/log_format.md), which W&B's transaction log and SwanLab's backup both use: 32 KiB
#: blocks of chunks, each a 7-byte header (CRC-32 of the type byte and the data, length, type) and its data.
BLOCK, CHUNK_HEADER = 32768, 7
FULL, FIRST, LAST = 1, 2, 4
#: Each log's file header: its magic (the first 4 of its 7 bytes).
IDENTS = {"wandb": b":W&B", "swanlab": b":SWL"}


def frames(data: bytes, ident: bytes) -> list[bytes]:
    """The whole records of a LevelDB log (after its 7-byte file header); a torn or corrupt tail ends the list."""
    if data[:4] != ident:
        raise ValueError(f"not a log of this tracker (its first bytes are {data[:4]!r}, not {ident!r})")
    records, i, pending = [], CHUNK_HEADER, b""
    while i + CHUNK_HEADER <= len(data):
        if BLOCK - i % BLOCK < CHUNK_HEADER:  # a block's trailer, too short for a header: zeros
            i += BLOCK - i % BLOCK
            continue
        crc, length, kind = struct.unpack("<IHB", data[i : i + CHUNK_HEADER])
        chunk = data[i + CHUNK_HEADER : i + CHUNK_HEADER + length]
        i += CHUNK_HEADER + length
        if kind == 0 or len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            break  # preallocated zeros, or a write that never finished: what came before stands
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            records.append(pending)
    return records


#: The child that decodes W&B's records with W&B's own protobuf classes and prints [step, loss] pairs as JSON.
_WANDB = r"""
import json, sys
from pathlib import Path
from wandb.proto import wandb_internal_pb2 as pb
from recipekit.validate.dryrun.judges.trackers import IDENTS, frames
pairs = []
for path in sys.argv[1:]:
    for data in frames(Path(path).read_bytes(), IDENTS["wandb"]):
        record = pb.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") != "history":
            continue
        values = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
        if "train/loss" in values:
            step = values.get("train/global_step", str(record.history.step.num))
            pairs.append([int(float(json.loads(step))), float(json.loads(values["train/loss"]))])
print(json.dumps(pairs))
"""


def tracker_files(output_dir: Path, tracker: str) -> list[Path]:
    """The tracker's files under ``output_dir``, regular files only (a link or a FIFO there is refused unread)."""
    found = []
    for path in sorted(output_dir.glob(GLOBS[tracker])):
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path.relative_to(output_dir)} is not a regular file")
        if info.st_size > MAX_BYTES:
            raise ValueError(f"{path.relative_to(output_dir)} is {info.st_size} bytes (at most {MAX_BYTES})")
        found.append(path)
    return found


def _mlflow_pairs(files: list[Path]) -> list[tuple[int, float]]:
    pairs = []
    for path in files:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3:
                pairs.append((int(parts[2]), float(parts[1])))
    return pairs


def _swanlab_pairs(files: list[Path]) -> list[tuple[int, float]]:
    """SwanLab 0.7's backup: one JSON object a record; a scalar is ``{"model_type": "Scalar", "data": {"key",
    "step", "metric": {"data"}}}``."""
    pairs = []
    for path in files:
        for data in frames(path.read_bytes(), IDENTS["swanlab"]):
            try:
                record = json.loads(data)
            except ValueError:
                continue
            body = record.get("data") if isinstance(record, dict) and record.get("model_type") == "Scalar" else None
            if isinstance(body, dict) and body.get("key") == "train/loss":
                value = (body.get("metric") or {}).get("data")
                if isinstance(body.get("step"), int) and isinstance(value, (int, float)):
                    pairs.append((body["step"], float(value)))
    return pairs


def _wandb_pairs(files: list[Path]) -> list[tuple[int, float]]:
    proc = subprocess.run(
        python_argv("-c", _WANDB, *map(str, files)),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=safe_env(),
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise ValueError(f"its wandb/ files could not be read: {last[:200]}")
    return [(int(step), float(loss)) for step, loss in json.loads(proc.stdout.strip().splitlines()[-1])]


def tracker_losses(output_dir: Path, tracker: str) -> list[tuple[int, float]]:
    """(step, loss) of every training log the tracker wrote offline under ``output_dir``; ValueError saying why
    they cannot be read."""
    files = tracker_files(output_dir, tracker)
    if not files:
        raise ValueError(f"no {GLOBS[tracker]} under the output directory")
    return {"mlflow": _mlflow_pairs, "wandb": _wandb_pairs, "swanlab": _swanlab_pairs}[tracker](files)


def logged_losses(output_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) of every training log in metrics.jsonl, every attempt's."""
    records = metricslog.read_records(output_dir / filenames.METRICS_FILE)
    return [
        (r["step"], float(r["loss"]))
        for r in records
        if "event" not in r and isinstance(r.get("step"), int) and isinstance(r.get("loss"), (int, float))
    ]


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))


def judge_trackers(result: Result, output_dir: Path, trackers: list[str]) -> None:
    """Each tracker's offline files hold every logged step's loss (``result`` fails naming the first missing)."""
    logged = logged_losses(output_dir)
    if not logged:
        result.fail(WHERE, filenames.METRICS_FILE, "no training step logged: nothing to hold the trackers against")
        return
    held = {}
    for tracker in trackers:
        try:
            pairs = tracker_losses(output_dir, tracker)
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            result.fail(WHERE, tracker, f"{tracker}: {exc}")
            continue
        by_step: dict[int, list[float]] = {}
        for step, loss in pairs:
            by_step.setdefault(step, []).append(loss)
        missing = [(s, loss) for s, loss in logged if not any(_same(loss, v) for v in by_step.get(s, []))]
        if missing:
            step, loss = missing[0]
            result.fail(
                WHERE,
                tracker,
                f"{tracker}: {len(missing)} of {len(logged)} logged losses missing from its files, the first at step "
                f"{step} (loss {loss:.6g}; it has {by_step.get(step) or 'nothing'} there)",
            )
        held[tracker] = len(pairs)
    result.details.update(logged_steps=len(logged), tracker_records=held)
    if not result.failed:
        result.reason = (
            f"{', '.join(trackers)} offline: every one of the {len(logged)} logged losses is in the tracker's "
            "own files, at its step"
        )
