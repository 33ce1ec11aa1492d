"""The runtime contract's resume rules: which checkpoint a restart continues from, and which it must refuse.

contract.resume_choice is the one answer train.py acts on and the dry run predicts with, so it is tested here on
checkpoint directories built by hand (no training stack needed).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from recipekit.runtime import contract

RUN_ID = "4b4d9e"


def _safetensors(path: Path, floats: int = 64) -> None:
    """A minimal, valid safetensors file: 8-byte header length, JSON header, then the tensor's bytes."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [floats], "data_offsets": [0, 4 * floats]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * (4 * floats))


def checkpoint(root: Path, step: int, *, run_id: str | None = RUN_ID, world_size: int = 2, zero_stage: int = 2) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / contract.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step}))
    _safetensors(path / "model.safetensors")
    if run_id is not None:
        record = contract.run_record(run_id, world_size=world_size, zero_stage=zero_stage, step=step)
        contract.write_run_record(path, record)
    return path


def test_auto_skips_a_truncated_and_a_shard_missing_checkpoint_and_says_why(tmp_path):
    checkpoint(tmp_path, 2)
    good = checkpoint(tmp_path, 4)
    truncated = checkpoint(tmp_path, 6)
    whole = (truncated / "model.safetensors").stat().st_size
    with (truncated / "model.safetensors").open("r+b") as handle:
        handle.truncate(100)
    sharded = checkpoint(tmp_path, 8)
    (sharded / "model.safetensors").unlink()
    (sharded / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": {"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}})
    )
    (sharded / "pytorch_model-00001-of-00002.bin").write_bytes(b"x" * 10)
    (tmp_path / "checkpoint-notanumber").mkdir()

    choice = contract.resume_choice(tmp_path, RUN_ID)
    assert choice.path == good and choice.step == 4 and choice.warnings == ()
    assert choice.skipped == (
        ("checkpoint-8", "shard pytorch_model-00002-of-00002.bin missing"),
        ("checkpoint-6", f"model.safetensors truncated (100 of {whole} bytes)"),
    )
    assert contract.latest_complete_checkpoint(tmp_path) == good  # the same completeness rule


def test_none_empty_and_explicit(tmp_path):
    assert contract.resume_choice(tmp_path, RUN_ID) == contract.ResumeChoice(None)
    good = checkpoint(tmp_path, 3)
    assert contract.resume_choice(tmp_path, RUN_ID, "none").path is None
    assert contract.resume_choice(tmp_path, RUN_ID, str(good)).path == good
    broken = checkpoint(tmp_path, 5)
    (broken / contract.TRAINER_STATE_FILE).write_text('{"global_step": ')
    with pytest.raises(contract.ResumeRefused, match="--resume .*checkpoint-5: trainer_state.json missing"):
        contract.resume_choice(tmp_path, RUN_ID, str(broken))
    with pytest.raises(contract.ResumeRefused, match="not a directory"):
        contract.resume_choice(tmp_path, RUN_ID, str(tmp_path / "absent"))


def test_a_checkpoint_of_another_run_is_refused_naming_both_runs(tmp_path):
    foreign = checkpoint(tmp_path, 6, run_id="0a0a0a", world_size=4, zero_stage=3)
    for resume in ("auto", str(foreign)):
        with pytest.raises(contract.ResumeRefused) as refused:
            contract.resume_choice(tmp_path, RUN_ID, resume, world_size=2, zero_stage=2)
        message = str(refused.value)
        assert "'0a0a0a' (world size 4, ZeRO 3)" in message and f"'{RUN_ID}' (world size 2, ZeRO 2)" in message
        assert "same recipe" in message and "universal checkpoints are not supported" in message
        assert "\n" not in message


def test_a_foreign_checkpoint_is_refused_not_skipped_for_an_older_own_one(tmp_path):
    checkpoint(tmp_path, 2)
    checkpoint(tmp_path, 4, run_id="0a0a0a")
    with pytest.raises(contract.ResumeRefused, match="0a0a0a"):
        contract.resume_choice(tmp_path, RUN_ID)


def test_a_zero_checkpoint_of_another_world_size_is_refused_a_plain_one_is_not(tmp_path):
    checkpoint(tmp_path, 2, world_size=2, zero_stage=2)
    with pytest.raises(contract.ResumeRefused, match="world size 2, ZeRO 2, this run has world size 1, ZeRO 2"):
        contract.resume_choice(tmp_path, RUN_ID, world_size=1, zero_stage=2)
    assert contract.resume_choice(tmp_path, RUN_ID, world_size=2, zero_stage=2).step == 2
    assert contract.resume_choice(tmp_path, RUN_ID).step == 2  # no layout given: the run id alone decides

    plain = tmp_path / "plain"
    checkpoint(plain, 2, world_size=2, zero_stage=0)
    assert contract.resume_choice(plain, RUN_ID, world_size=1, zero_stage=0).step == 2


def test_a_checkpoint_without_a_run_record_is_refused(tmp_path):
    old = checkpoint(tmp_path, 4, run_id=None)
    with pytest.raises(contract.ResumeRefused, match=f"checkpoint-4 has no readable {contract.RUN_FILE}"):
        contract.resume_choice(tmp_path, RUN_ID)
    (old / contract.RUN_FILE).write_text("{not json")  # unreadable counts as absent
    with pytest.raises(contract.ResumeRefused, match="nothing proves"):
        contract.resume_choice(tmp_path, RUN_ID)
    assert contract.resume_choice(tmp_path, RUN_ID, "none").path is None


def test_the_run_record_is_written_whole_and_read_back(tmp_path):
    record = contract.run_record(RUN_ID, world_size=2, zero_stage=2, step=7, recipe="tiny_sft")
    contract.write_run_record(tmp_path, record)
    assert contract.read_run_record(tmp_path) == record
    assert [p.name for p in tmp_path.iterdir()] == [contract.RUN_FILE]  # no staging file left behind
    assert contract.read_run_record(tmp_path / "absent") is None
