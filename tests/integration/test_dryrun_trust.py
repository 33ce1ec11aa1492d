"""A checkpoint planted on the shared volume is refused before any byte of it is unpickled; the run's own resumes.

Two simulated pods of the tiny_sft bundle (DeepSpeed ZeRO-2, whose checkpoint engine loads partitions with
``torch.load(weights_only=False)``) train, checkpoint at step 4 and are killed at step 5. Then, as someone who can
write to the volume but not read the run key (the Secret, here a file of the work copy) would, a newer checkpoint is
planted: the run's own files with every partition replaced by a pickle that creates a marker file when unpickled, and
a record re-signed with a guessed key. The restart must refuse it (exit 2, one line) without creating the marker;
so must the next one after the record is removed, and the next after the run's own checkpoint-4 is copied whole to
checkpoint-9 (a replay: every byte signed, but the signed record says step 4). With the planted checkpoint gone,
the restart resumes from the run's own checkpoint-4 and finishes. Slow: three short attempts and three refused
pairs of pods.
"""

from __future__ import annotations

import importlib.util
import pickle
import shutil
import time
from pathlib import Path

import pytest

from recipekit.bundle.build import build
from recipekit.runtime.boundary import filenames, metricslog
from recipekit.runtime.boundary.resume import resumechoice
from recipekit.runtime.volume import trust
from recipekit.validate.dryrun.cluster.attempts import DryRun, pod_environment
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.workdir.extensions import build_extensions
from recipekit.validate.dryrun.workdir.workcopy import prepare
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Result

pytestmark = pytest.mark.slow

if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "deepspeed")):
    pytest.skip("the training stack is not installed", allow_module_level=True)

TIMEOUT_S = 1200  # five attempts (three refused) on a shared, busy machine


class Payload:
    """Unpickling this creates ``marker`` (by calling ``open(marker, "w")``): proof that a planted file was loaded."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant(output_dir: Path, own: Path, step: int, marker: Path) -> Path:
    """checkpoint-<step>: a copy of the run's own checkpoint whose .pt files are pickle payloads, re-signed with a
    key that is not the run's."""
    planted = output_dir / f"{filenames.CHECKPOINT_PREFIX}{step}"
    shutil.copytree(own, planted)
    payload = pickle.dumps(Payload(marker))
    for file in planted.rglob("*.pt"):
        file.write_bytes(payload)
    excluded = frozenset({filenames.RUN_FILE})
    record = dict(resumechoice.read_run_record(own) or {}, step=step)
    resumechoice.write_run_record(planted, trust.sign(record, b"guessed-" * 4, trust.digests(planted, excluded)))
    return planted


def pod_lines(run: DryRun, offset_attempt: int) -> str:
    attempt = run.attempts[offset_attempt]
    return "".join(
        pod.log_path.read_bytes()[attempt.log_offsets[pod.index] :].decode(errors="replace") for pod in run.pods
    )


def traceback_frames(logs: str) -> str:
    """The ``File ...`` lines of every traceback in ``logs`` (torchrun prints its own when a worker exits non-zero)."""
    return "\n".join(line for line in logs.splitlines() if line.lstrip().startswith('File "'))


def test_a_planted_checkpoint_is_refused_and_the_runs_own_resumes(tmp_path: Path) -> None:
    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle", force=True).path
    options = DryRunOptions(pods=2, workdir=tmp_path / "work", timeout=TIMEOUT_S, kill_pod=1, at_step=5)
    options.check()
    work = prepare(load_bundle(bundle), options)
    deadline = time.monotonic() + TIMEOUT_S
    ops = Result("dryrun.ops", "ops")
    build_extensions(work, pod_environment(work, 0, options), ops, lambda m: None, deadline)
    assert not ops.failed, ops.reason
    marker = tmp_path / "UNPICKLED"
    run = DryRun(work, options, lambda m: None, deadline)
    with run.podset:
        first = run.attempt(kill_at=5)
        assert first.outcome == "killed", pod_lines(run, 0)[-3000:]
        own = work.output_dir / "checkpoint-4"
        assert resumechoice.read_run_record(own)["hmac"], "the run's own checkpoint is signed"

        planted = plant(work.output_dir, own, 9, marker)
        forged = run.attempt(kill_at=None)
        logs = pod_lines(run, 1)
        assert forged.outcome == "failed", logs[-3000:]
        assert "train.py: refusing to resume: checkpoint-9: its record's signature does not verify" in logs
        assert "/runtime/" not in traceback_frames(logs) and not marker.exists()  # torchrun's own traceback only

        (planted / filenames.RUN_FILE).unlink()
        unsigned = run.attempt(kill_at=None)
        logs = pod_lines(run, 2)
        assert unsigned.outcome == "failed", logs[-3000:]
        assert f"train.py: checkpoint-9 has no readable {filenames.RUN_FILE}" in logs
        assert not marker.exists()

        shutil.rmtree(planted)
        shutil.copytree(own, planted)  # a genuine older checkpoint under a newer name: every byte still signed
        replayed = run.attempt(kill_at=None)
        logs = pod_lines(run, 3)
        assert replayed.outcome == "failed", logs[-3000:]
        assert "checkpoint-9: its signed record says step 4, its name says step 9" in logs
        assert "/runtime/" not in traceback_frames(logs) and not marker.exists()

        shutil.rmtree(planted)
        resumed = run.attempt(kill_at=None)
        logs = pod_lines(run, 4)
        assert resumed.outcome == "completed", logs[-3000:]
        assert "checkpoint-4: signed record and file digests verified" in logs
        start = resumed.last(metricslog.EVENT_START)
        assert start is not None and start["resume_step"] == 4
        assert not marker.exists()
    run.podset.kill_all()
