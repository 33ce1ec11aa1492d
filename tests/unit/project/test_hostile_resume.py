"""train.py's resume, as an attacker who can write to the shared volume but not read the run key would try it.

Each case plants something in a real bundle's output directory and runs the bundle's own ``python -m runtime.train``
(as torchrun starts it in a pod) under the measuring wrapper: exit 2 and one ``train.py:`` line naming the
checkpoint and why (not a traceback and exit 1: the Job would restart into the same crash until ``maxRetry``),
nothing written in the case directory, nothing unpickled, wall time and peak RSS under the bounds of the other
hostile-input tables. The finer cases are unit tests of ``runtime/volume/resume.py`` (tests/unit/runtime).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from recipekit.runtime.boundary import filenames
from recipekit.runtime.boundary.resume import resumechoice
from recipekit.runtime.volume import resume, trust
from tests.measure import measure
from tests.unit.project.test_hostile_input import MAX_RSS_MIB, MAX_WALL_S, Probe, snapshot, surface

if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")):
    pytest.skip("the training stack is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow  # each case starts train.py, which imports torch and transformers

KEY = b"hostile-resume-key-" + b"7" * 32


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from recipekit.bundle.build import build

    path = build(["recipe=tiny_sft"], tmp_path_factory.mktemp("bundle") / "b", force=True).path
    run_id = yaml.safe_load((path / "recipe.yaml").read_text())["plan"]["run_id"]
    return path, run_id


def genuine(run: Path, step: int, run_id: str) -> Path:
    """checkpoint-<step> as this run writes it: the Trainer's state, a weights file, the signed record."""
    path = run / f"{filenames.CHECKPOINT_PREFIX}{step}"
    path.mkdir(parents=True)
    (path / filenames.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step}))
    (path / "pytorch_model.bin").write_bytes(b"\x80\x04weights")
    record = resumechoice.run_record(run_id, world_size=1, zero_stage=2, step=step)
    resumechoice.write_run_record(path, trust.sign(record, KEY, trust.digests(path, frozenset({filenames.RUN_FILE}))))
    return path


def unsigned(run: Path, step: int, name: str, content: bytes) -> None:
    path = run / f"{filenames.CHECKPOINT_PREFIX}{step}"
    path.mkdir(parents=True)
    (path / filenames.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step}))
    (path / name).write_bytes(content)


def _self_index(run: Path, run_id: str) -> None:
    unsigned(run, 9, "model.safetensors.index.json", b'{"weight_map": {"w": "model.safetensors.index.json"}}')


def _deep_header(run: Path, run_id: str) -> None:
    header = b"[" * 300_000 + b"]" * 300_000
    unsigned(run, 9, "model.safetensors", len(header).to_bytes(8, "little") + header)


def _non_ascii_hmac(run: Path, run_id: str) -> None:
    path = genuine(run, 9, run_id)
    record = json.loads((path / filenames.RUN_FILE).read_text())
    (path / filenames.RUN_FILE).write_text(json.dumps({**record, "hmac": "\u00e9" * 64}))


def _copied(run: Path, run_id: str) -> None:
    shutil.copytree(genuine(run, 4, run_id), run / "checkpoint-999")


def _linked(run: Path, run_id: str) -> None:
    (run / "checkpoint-999").symlink_to(genuine(run, 4, run_id))


def _rolled_back(run: Path, run_id: str) -> None:
    genuine(run, 4, run_id)
    resume.mark_resumed(run, run_id, 8, KEY)  # this run resumed from checkpoint-8 before; it was removed since


def _fifo_record(run: Path, run_id: str) -> None:
    path = run / "checkpoint-9"
    path.mkdir(parents=True)
    os.mkfifo(path / filenames.RUN_FILE)


def _huge_record(run: Path, run_id: str) -> None:
    path = genuine(run, 9, run_id)
    with (path / filenames.RUN_FILE).open("ab") as handle:
        handle.write(b" " * (resume.RECORD_MAX_BYTES + 1))


RESUME_SURFACE = [
    Probe("unsigned: weights index naming itself", _self_index, "checkpoint-9 has no readable recipekit-run.json"),
    Probe("unsigned: safetensors header 300,000 deep", _deep_header, "checkpoint-9 has no readable recipekit-run.json"),
    Probe("signature of non-ASCII characters", _non_ascii_hmac, "signature is not a sha256 hex digest"),
    Probe("genuine checkpoint-4 copied to checkpoint-999", _copied, "its signed record says step 4, its name says"),
    Probe("checkpoint-999 a symlink to checkpoint-4", _linked, "checkpoint-999 is a symlink"),
    Probe("rollback below the step resumed before", _rolled_back, "rollback refused"),
    Probe("a FIFO as the run record", _fifo_record, "recipekit-run.json in checkpoint-9 is not a regular file"),
    Probe("a run record over 16 MiB", _huge_record, "larger than 16777216 bytes"),
]


@surface(RESUME_SURFACE)
def test_resume_surface(probe: Probe, bundle: tuple[Path, str], tmp_path: Path) -> None:
    source, run_id = bundle
    case = tmp_path / "case"
    run = case / "run"
    run.mkdir(parents=True)
    probe.setup(run, run_id)
    copy = shutil.copytree(source, tmp_path / "bundle")
    doc = yaml.safe_load((copy / "recipe.yaml").read_text())
    doc["plan"]["output_dir"] = doc["training_arguments"]["output_dir"] = str(run)
    (copy / "recipe.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "key").write_bytes(KEY)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PYTHONPATH")}
    env.update({"PYTHONPATH": str(copy), trust.KEY_ENV: str(tmp_path / "key"), "HOME": str(tmp_path / "home")})
    before = snapshot(case)
    command = [sys.executable, "-P", "-m", "runtime.train", "--recipe", str(copy / "recipe.yaml")]
    result = measure(command, copy, env, 240)
    said = [line for line in result.stderr.splitlines() if line.startswith("train.py:")]
    where = f"{probe.id}: exit {result.code}, {result.wall_s:.1f} s, {result.rss_mib:.0f} MiB\n{result.stderr[-3000:]}"
    assert result.code == probe.code, where
    assert "Traceback" not in result.stderr + result.stdout, where
    assert len(said) == 1 and probe.expect in said[0], where
    assert snapshot(case) == before, f"{probe.id}: something was written in the case directory"
    assert result.wall_s < MAX_WALL_S and result.rss_mib < MAX_RSS_MIB, where
