"""A resumed checkpoint is proven before it is parsed, and is the step its signed record says (volume/resume.py).

Someone who can write to the shared volume but not read the run key could copy or link a genuine older checkpoint
under a newer name (every restart would then resume the old state), or plant a directory that crashes the reader
before it verifies (a non-ASCII digit in its name, a weights index naming itself as a shard, a deeply nested
safetensors header, a non-ASCII signature: the Job restarts into the same crash). Each is refused in one line here.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from recipekit.runtime.boundary import filenames
from recipekit.runtime.boundary.resume import checkpointdirs, resumechoice
from recipekit.runtime.volume import resume, trust

KEY = b"resume-proof-key-" + b"0" * 32
RUN = "run-a"
EXCLUDED = frozenset({filenames.RUN_FILE})


def sign(path: Path, step: int, run_id: str = RUN) -> None:
    record = resumechoice.run_record(run_id, world_size=1, zero_stage=0, step=step)
    resumechoice.write_run_record(path, trust.sign(record, KEY, trust.digests(path, EXCLUDED)))


def checkpoint(root: Path, step: int, *, signed: bool = True, state_step: int | None = None) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    state = {"global_step": step if state_step is None else state_step}
    (path / filenames.TRAINER_STATE_FILE).write_text(json.dumps(state))
    (path / "pytorch_model.bin").write_bytes(b"\x80\x04weights")
    if signed:
        sign(path, step)
    return path


def choose(root: Path, mode: str = "auto", key: bytes | None = KEY) -> resumechoice.ResumeChoice:
    return resume.choose(root, RUN, mode, resumechoice.WorldLayout(1, 0), key)


def test_the_newest_signed_checkpoint_wins_and_an_interrupted_save_is_passed_over(tmp_path: Path) -> None:
    checkpoint(tmp_path, 2)
    checkpoint(tmp_path, 4)
    interrupted = checkpoint(tmp_path, 6, signed=False)
    (interrupted / filenames.INCOMPLETE_MARKER).write_text("")
    choice = choose(tmp_path)
    assert choice.path == tmp_path / "checkpoint-4" and choice.step == 4
    assert choice.skipped == (("checkpoint-6", "marked incomplete (an interrupted save, never signed)"),)
    assert choose(tmp_path, str(tmp_path / "checkpoint-2")).step == 2
    assert choose(tmp_path, "none").path is None


def test_an_older_checkpoint_copied_to_a_newer_name_is_refused_naming_both_steps(tmp_path: Path) -> None:
    old = checkpoint(tmp_path, 4)
    shutil.copytree(old, tmp_path / "checkpoint-999")
    with pytest.raises(trust.Untrusted, match="checkpoint-999: its signed record says step 4, its name says step 999"):
        choose(tmp_path)
    with pytest.raises(trust.Untrusted, match="says step 4, its name says step 999"):
        choose(tmp_path, str(tmp_path / "checkpoint-999"))


def test_a_complete_looking_unsigned_checkpoint_is_refused_not_passed_over(tmp_path: Path) -> None:
    """Issue 31: the newest checkpoint the run signed wins, and a planted directory may not decide silently which one
    that is. Unlike an interrupted save, a complete-looking checkpoint without a record is refused with one line that
    names it and the remedy; exit 2 ends the Job (TerminateJob), so it is no restart loop."""
    checkpoint(tmp_path, 4)
    checkpoint(tmp_path, 9, signed=False)
    with pytest.raises(resumechoice.ResumeRefused) as refused:
        choose(tmp_path)
    message = str(refused.value)
    assert message.startswith("checkpoint-9 has no readable recipekit-run.json") and "\n" not in message
    assert "remove it to resume the newest checkpoint this run signed" in message
    shutil.rmtree(tmp_path / "checkpoint-9")
    assert choose(tmp_path).step == 4


def test_a_symlinked_checkpoint_directory_or_a_link_inside_one_is_refused(tmp_path: Path) -> None:
    old = checkpoint(tmp_path, 4)
    (tmp_path / "checkpoint-999").symlink_to(old)
    with pytest.raises(trust.Untrusted, match="checkpoint-999 is a symlink"):
        choose(tmp_path)
    (tmp_path / "checkpoint-999").unlink()
    inner = checkpoint(tmp_path, 8)
    (inner / "extra.bin").symlink_to("/proc/self/environ")
    with pytest.raises(trust.Untrusted, match="extra.bin in checkpoint-8 is a symlink"):
        choose(tmp_path)


def test_trainer_state_must_say_the_same_step(tmp_path: Path) -> None:
    checkpoint(tmp_path, 6, state_step=4)  # signed as it is: only the key holder could write this
    with pytest.raises(trust.Untrusted, match="trainer_state.json says global_step 4, its record step 6"):
        choose(tmp_path)


def _self_index(path: Path) -> None:
    (path / "model.safetensors.index.json").write_text('{"weight_map": {"w": "model.safetensors.index.json"}}')


def _deep_header(path: Path) -> None:
    header = b"[" * 200_000 + b"]" * 200_000
    (path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)


@pytest.mark.parametrize(
    ("plant", "message"),
    [
        (_self_index, "has no readable recipekit-run.json"),
        (_deep_header, "has no readable recipekit-run.json"),
    ],
    ids=["index-names-itself", "safetensors-header-nested-200000-deep"],
)
def test_nothing_of_a_checkpoint_is_parsed_before_it_proves_itself(tmp_path: Path, plant, message: str) -> None:
    planted = tmp_path / "checkpoint-9"
    planted.mkdir()
    (planted / filenames.TRAINER_STATE_FILE).write_text('{"global_step": 9}')
    plant(planted)
    with pytest.raises(resumechoice.ResumeRefused, match=message):
        choose(tmp_path)
    sign(planted, 9)  # even signed (by a key holder), the parse is bounded: passed over as incomplete, no crash
    assert checkpointdirs.checkpoint_problem(planted) is not None


def test_a_non_ascii_signature_is_refused_not_a_type_error(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, 4)
    record = json.loads((path / filenames.RUN_FILE).read_text())
    record["hmac"] = "é" * 64
    (path / filenames.RUN_FILE).write_text(json.dumps(record))
    with pytest.raises(trust.Untrusted, match="signature is not a sha256 hex digest"):
        choose(tmp_path)


@pytest.mark.parametrize("name", ["checkpoint-²", "checkpoint-٣", "checkpoint-" + "9" * 40])
def test_a_name_that_only_looks_like_a_step_is_passed_over_not_a_stop(tmp_path: Path, name: str) -> None:
    """Issue 38: a stray directory whose name only looks like a step (a superscript, another script's digits, more
    digits than a step has) is no checkpoint by any reading, so it cannot stand for a newer one: resume passes over
    it and continues from the genuine checkpoint beside it, instead of stopping the run (before: exit 2)."""
    checkpoint(tmp_path, 4)
    (tmp_path / name).mkdir()
    assert checkpointdirs.checkpoint_step(tmp_path / name) is None
    assert [step for step, _, _ in checkpointdirs.checkpoints(tmp_path)] == [4]  # the dry run's judge: no crash either
    assert choose(tmp_path).step == 4


def test_other_names_are_not_checkpoints(tmp_path: Path) -> None:
    checkpoint(tmp_path, 4)
    for name in ("checkpoint-", "checkpoint-best", "tmp-checkpoint-9"):
        (tmp_path / name).mkdir()
    assert choose(tmp_path).step == 4


def test_a_lower_step_after_a_higher_one_resumed_is_a_rollback(tmp_path: Path) -> None:
    checkpoint(tmp_path, 4)
    newest = checkpoint(tmp_path, 8)
    assert choose(tmp_path).step == 8
    resume.mark_resumed(tmp_path, RUN, 8, KEY)
    resume.mark_resumed(tmp_path, RUN, 4, KEY)  # never lowered
    assert resume.resumed_step(tmp_path, RUN, KEY) == 8
    shutil.rmtree(newest)
    with pytest.raises(resumechoice.ResumeRefused, match=r"rollback refused.*checkpoint-4 \(step 4\).*from step 8"):
        choose(tmp_path)
    assert choose(tmp_path, str(tmp_path / "checkpoint-4")).step == 4  # by its path: on purpose
    forged = json.loads((tmp_path / resume.MARK_FILE).read_text())
    (tmp_path / resume.MARK_FILE).write_text(json.dumps({**forged, "step": 99}))
    assert resume.resumed_step(tmp_path, RUN, KEY) is None  # an edited mark proves nothing


def test_without_the_key_nothing_is_resumed_and_a_fifo_record_does_not_hang(tmp_path: Path) -> None:
    checkpoint(tmp_path, 4)
    with pytest.raises(trust.Untrusted, match="no run key"):
        choose(tmp_path, key=None)
    fifo = tmp_path / "checkpoint-6"
    fifo.mkdir()
    os.mkfifo(fifo / filenames.RUN_FILE)
    with pytest.raises(trust.Untrusted, match="recipekit-run.json in checkpoint-6 is not a regular file"):
        choose(tmp_path)
