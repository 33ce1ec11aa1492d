"""The dry run's tracker check (validate/dryrun/judges/trackers.py) fails when a tracker's files lack a logged loss,
refuses a link where a file should be, and reads a W&B log whose tail was torn off as far as it is whole.

The check passing on what the real trackers write is tests/integration/test_dryrun_trackers.py."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import zlib
from pathlib import Path

import pytest

from recipekit.runtime.boundary import filenames
from recipekit.validate.dryrun.judges.trackers import judge_trackers, tracker_losses
from recipekit.validate.shared.results import Result, Status

LOSSES = [(1, 2.5), (2, 2.25), (3, 2.0)]


def _run(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    lines = [{"event": "start"}] + [{"step": s, "loss": v, "learning_rate": 1e-3} for s, v in LOSSES]
    (out / filenames.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in lines))
    return out


def _mlflow(out: Path, pairs: list[tuple[int, float]]) -> Path:
    metric = out / "mlruns" / "1" / "abc" / "metrics" / "loss"
    metric.parent.mkdir(parents=True)
    metric.write_text("".join(f"17000000{i} {v} {s}\n" for i, (s, v) in enumerate(pairs)))
    return metric


def test_every_logged_loss_in_the_file_store_passes(tmp_path: Path) -> None:
    out = _run(tmp_path)
    _mlflow(out, list(reversed(LOSSES)))  # MLflow's async writer appends out of order
    result = Result("dryrun.trackers", "")
    judge_trackers(result, out, ["mlflow"])
    assert result.status is Status.PASS and "3 logged losses" in result.reason


def test_a_missing_or_different_loss_fails_naming_its_step(tmp_path: Path) -> None:
    out = _run(tmp_path)
    _mlflow(out, [(1, 2.5), (2, 2.2501)])
    result = Result("dryrun.trackers", "")
    judge_trackers(result, out, ["mlflow"])
    assert result.failed
    assert "2 of 3 logged losses missing" in result.findings[0].message
    assert "first at step 2" in result.findings[0].message


def test_no_files_and_a_link_are_failures(tmp_path: Path) -> None:
    out = _run(tmp_path)
    result = Result("dryrun.trackers", "")
    judge_trackers(result, out, ["swanlab"])
    assert result.failed and "no swanlog/run-*/backup.swanlab" in result.findings[0].message
    metric = _mlflow(out, LOSSES)
    target = tmp_path / "elsewhere"
    os.replace(metric, target)
    os.symlink(target, metric)
    with pytest.raises(ValueError, match="not a regular file"):
        tracker_losses(out, "mlflow")


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed (recipekit[train])")
def test_a_torn_wandb_log_is_read_as_far_as_it_is_whole(tmp_path: Path) -> None:
    from wandb.proto import wandb_internal_pb2 as pb

    def frame(data: bytes) -> bytes:  # leveldb's log_format.md: one FULL chunk
        return struct.pack("<IHB", zlib.crc32(data, zlib.crc32(b"\x01")) & 0xFFFFFFFF, len(data), 1) + data

    records = b""
    for step, loss in LOSSES:
        record = pb.Record()
        item = record.history.item.add()
        item.key, item.value_json = "train/loss", json.dumps(loss)
        item = record.history.item.add()
        item.key, item.value_json = "train/global_step", str(step)
        records += frame(record.SerializeToString())
    path = tmp_path / "out" / "wandb" / "offline-run-1" / "run-1.wandb"
    path.parent.mkdir(parents=True)
    path.write_bytes(b":W&B\xe1\xbe\x00" + records[:-3])  # the last record's tail never written
    assert tracker_losses(tmp_path / "out", "wandb") == LOSSES[:2]
