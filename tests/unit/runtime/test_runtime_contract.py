"""The runtime contract's resume rules: which checkpoint a restart continues from, and which it must refuse.

resumechoice.resume_choice is the one answer train.py acts on and the dry run predicts with, so it is tested here on
checkpoint directories built by hand (no training stack needed).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from recipekit.runtime.boundary import filenames
from recipekit.runtime.boundary.resume import checkpointdirs, resumechoice

RUN_ID = "4b4d9e"


def _safetensors(path: Path, floats: int = 64) -> None:
    """A minimal, valid safetensors file: 8-byte header length, JSON header, then the tensor's bytes."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [floats], "data_offsets": [0, 4 * floats]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * (4 * floats))


def checkpoint(
    root: Path,
    step: int,
    *,
    run_id: str | None = RUN_ID,
    world_size: int = 2,
    zero_stage: int = 2,
    global_batch_size: int | None = 8,
) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / filenames.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step}))
    _safetensors(path / "model.safetensors")
    if run_id is not None:
        record = resumechoice.run_record(
            run_id, world_size=world_size, zero_stage=zero_stage, global_batch_size=global_batch_size, step=step
        )
        resumechoice.write_run_record(path, record)
    return path


def layout(world_size: int, zero_stage: int, global_batch_size: int | None = 8) -> resumechoice.WorldLayout:
    return resumechoice.WorldLayout(world_size, zero_stage, global_batch_size)


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

    choice = resumechoice.resume_choice(tmp_path, RUN_ID)
    assert choice.path == good and choice.step == 4 and choice.warnings == ()
    assert choice.skipped == (
        ("checkpoint-8", "shard pytorch_model-00002-of-00002.bin missing"),
        ("checkpoint-6", f"model.safetensors truncated (100 of {whole} bytes)"),
    )
    assert checkpointdirs.latest_complete_checkpoint(tmp_path) == good  # the same completeness rule


def test_none_empty_and_explicit(tmp_path):
    assert resumechoice.resume_choice(tmp_path, RUN_ID) == resumechoice.ResumeChoice(None)
    good = checkpoint(tmp_path, 3)
    assert resumechoice.resume_choice(tmp_path, RUN_ID, "none").path is None
    assert resumechoice.resume_choice(tmp_path, RUN_ID, str(good)).path == good
    broken = checkpoint(tmp_path, 5)
    (broken / filenames.TRAINER_STATE_FILE).write_text('{"global_step": ')
    with pytest.raises(resumechoice.ResumeRefused, match="--resume .*checkpoint-5: trainer_state.json missing"):
        resumechoice.resume_choice(tmp_path, RUN_ID, str(broken))
    with pytest.raises(resumechoice.ResumeRefused, match="not a directory"):
        resumechoice.resume_choice(tmp_path, RUN_ID, str(tmp_path / "absent"))


def test_a_checkpoint_of_another_run_is_refused_naming_both_runs(tmp_path):
    foreign = checkpoint(tmp_path, 6, run_id="0a0a0a", world_size=4, zero_stage=3)
    for resume in ("auto", str(foreign)):
        with pytest.raises(resumechoice.ResumeRefused) as refused:
            resumechoice.resume_choice(tmp_path, RUN_ID, resume, layout=layout(2, 2))
        message = str(refused.value)
        assert "run '0a0a0a', not to this bundle's run" in message and f"'{RUN_ID}'" in message
        assert "same recipe (at the same global batch)" in message and "recipekit rescale" in message
        assert "\n" not in message


def test_a_foreign_checkpoint_is_refused_not_skipped_for_an_older_own_one(tmp_path):
    checkpoint(tmp_path, 2)
    checkpoint(tmp_path, 4, run_id="0a0a0a")
    with pytest.raises(resumechoice.ResumeRefused, match="0a0a0a"):
        resumechoice.resume_choice(tmp_path, RUN_ID)


def test_another_world_size_at_the_same_global_batch_resumes_zero_partitions_are_resharded(tmp_path):
    checkpoint(tmp_path, 2, world_size=2, zero_stage=2)
    same = resumechoice.resume_choice(tmp_path, RUN_ID, layout=layout(2, 2))
    assert same.step == 2 and not same.reshard and same.warnings == () and same.saved_world_size == 2
    smaller = resumechoice.resume_choice(tmp_path, RUN_ID, layout=layout(1, 2))
    assert smaller.step == 2 and smaller.reshard and smaller.saved_world_size == 2
    assert smaller.warnings == (
        "checkpoint-2 was saved at world size 2, this run has 1 (global batch 8 kept): its ZeRO 2 partitions are "
        "re-sharded first",
    )
    assert resumechoice.resume_choice(tmp_path, RUN_ID).step == 2  # no layout given: the run id alone decides

    plain = tmp_path / "plain"
    checkpoint(plain, 2, world_size=2, zero_stage=0)
    larger = resumechoice.resume_choice(plain, RUN_ID, layout=layout(4, 0))
    assert larger.step == 2 and not larger.reshard
    assert larger.warnings[0].endswith("whole optimizer states load at any size")


def test_a_streamed_run_continues_only_at_its_own_world_size(tmp_path):
    checkpoint(tmp_path, 2, world_size=2, zero_stage=0)
    streamed = resumechoice.WorldLayout(1, 0, 8, streaming=True)
    with pytest.raises(resumechoice.ResumeRefused, match="position in the stream per rank, so only world size 2"):
        resumechoice.resume_choice(tmp_path, RUN_ID, layout=streamed)
    assert (
        resumechoice.resume_choice(tmp_path, RUN_ID, layout=resumechoice.WorldLayout(2, 0, 8, streaming=True)).step == 2
    )


def test_another_global_batch_or_zero_stage_is_refused_with_the_numbers(tmp_path):
    checkpoint(tmp_path, 2, world_size=2, zero_stage=2, global_batch_size=8)
    with pytest.raises(resumechoice.ResumeRefused) as refused:
        resumechoice.resume_choice(tmp_path, RUN_ID, layout=layout(1, 2, 4))
    message = str(refused.value)
    assert "trained at global batch 8, this run's is 4" in message and "at world size 1" in message
    assert "recipekit rescale" in message
    with pytest.raises(resumechoice.ResumeRefused, match="saved with ZeRO 2, this run has ZeRO 3"):
        resumechoice.resume_choice(tmp_path, RUN_ID, layout=layout(2, 3))
    unrecorded = tmp_path / "old"
    checkpoint(unrecorded, 2, world_size=2, zero_stage=0, global_batch_size=None)  # a record without the batch
    choice = resumechoice.resume_choice(unrecorded, RUN_ID, layout=layout(1, 0, 4))
    assert "global batch unrecorded" in choice.warnings[0]


def test_a_checkpoint_without_a_run_record_is_refused(tmp_path):
    old = checkpoint(tmp_path, 4, run_id=None)
    with pytest.raises(resumechoice.ResumeRefused, match=f"checkpoint-4 has no readable {filenames.RUN_FILE}"):
        resumechoice.resume_choice(tmp_path, RUN_ID)
    (old / filenames.RUN_FILE).write_text("{not json")  # unreadable counts as absent
    with pytest.raises(resumechoice.ResumeRefused, match="nothing proves"):
        resumechoice.resume_choice(tmp_path, RUN_ID)
    assert resumechoice.resume_choice(tmp_path, RUN_ID, "none").path is None


def test_the_run_record_is_written_whole_and_read_back(tmp_path):
    record = resumechoice.run_record(
        RUN_ID, world_size=2, zero_stage=2, global_batch_size=16, step=7, recipe="tiny_sft"
    )
    resumechoice.write_run_record(tmp_path, record)
    assert resumechoice.read_run_record(tmp_path) == record
    assert [p.name for p in tmp_path.iterdir()] == [filenames.RUN_FILE]  # no staging file left behind
    assert resumechoice.read_run_record(tmp_path / "absent") is None
