"""Resuming a ZeRO checkpoint at another world size: rank 0 builds a signed re-sharded copy, every rank verifies it.

DeepSpeed's conversion itself is exercised by tests/integration/test_reshard.py and the rescale dry runs; here it is
replaced by a stand-in that writes what it writes (a tag directory and ``latest_universal``), so the rules around
it can fail on their own: who converts, who waits, what is reused, what is refused, what is signed and removed.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipekit.runtime.boundary import filenames
from recipekit.runtime.boundary.common import RunError
from recipekit.runtime.boundary.resume import resumechoice
from recipekit.runtime.session import checkpoints
from recipekit.runtime.volume import reshard, trust

KEY = b"unit-test-run-key-" + b"1" * 32


@pytest.fixture
def keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path.parent / f"{tmp_path.name}.key"
    path.write_bytes(KEY)
    monkeypatch.setenv(trust.KEY_ENV, str(path))
    return tmp_path


def zero_checkpoint(root: Path, step: int = 4, world_size: int = 2) -> Path:
    path = root / f"checkpoint-{step}"
    (path / f"global_step{step}").mkdir(parents=True)
    for rank in range(world_size):
        (path / f"global_step{step}" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"x" * 8)
    (path / "latest").write_text(f"global_step{step}")
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    record = resumechoice.run_record("abc123", world_size=world_size, zero_stage=2, global_batch_size=4)
    resumechoice.write_run_record(path, trust.sign(record, KEY, trust.digests(path, checkpoints.RECORD_EXCLUDED)))
    return path


def fake_universal_copy(calls: list[Path]):
    def convert(checkpoint: Path, target: Path, *, world_size: int | None = None) -> Path:
        calls.append(checkpoint)
        (target / "global_step4_universal" / "zero").mkdir(parents=True)
        (target / "global_step4_universal" / "zero" / "w.pt").write_bytes(b"w")
        (target / "latest_universal").write_text("global_step4_universal")
        (target / "trainer_state.json").write_text((checkpoint / "trainer_state.json").read_text())
        return target

    return convert


def choice(path: Path) -> resumechoice.ResumeChoice:
    return resumechoice.ResumeChoice(path, reshard=True, saved_world_size=2)


def test_rank_0_converts_signs_and_every_rank_then_verifies_the_copy(keyed: Path, monkeypatch) -> None:
    source = zero_checkpoint(keyed)
    calls: list[Path] = []
    monkeypatch.setattr(reshard, "universal_copy", fake_universal_copy(calls))
    target = checkpoints.resharded(choice(source), keyed, 1, rank=0, refusal=None)
    assert target == keyed / checkpoints.RESHARD_DIR / "checkpoint-4-world1" and calls == [source]
    record = resumechoice.read_run_record(target)
    assert record["world_size"] == 1 and record["resharded_from"] == "checkpoint-4"
    trust.verify_directory(target, record, KEY, checkpoints.RECORD_EXCLUDED, "copy")  # signed with the run key
    assert checkpoints.resharded(choice(source), keyed, 1, rank=1, refusal=None) == target  # another rank reuses it
    assert checkpoints.resharded(choice(source), keyed, 1, rank=0, refusal=None) == target and calls == [source]
    assert sorted(p.name for p in source.iterdir()) == [
        "global_step4",
        "latest",
        filenames.RUN_FILE,
        "trainer_state.json",
    ]


def test_the_other_ranks_wait_for_rank_0(keyed: Path, monkeypatch) -> None:
    source = zero_checkpoint(keyed)
    monkeypatch.setattr(reshard, "universal_copy", fake_universal_copy([]))
    monkeypatch.setattr(checkpoints, "RESHARD_POLL_S", 0.01)
    got: list[Path] = []
    waiter = threading.Thread(target=lambda: got.append(checkpoints.resharded(choice(source), keyed, 1, 1, None)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got  # nothing to load yet
    checkpoints.resharded(choice(source), keyed, 1, rank=0, refusal=None)
    waiter.join(5)
    assert got == [keyed / checkpoints.RESHARD_DIR / "checkpoint-4-world1"]


def test_a_tampered_copy_is_refused_and_a_planted_one_is_rebuilt(keyed: Path, monkeypatch) -> None:
    source = zero_checkpoint(keyed)
    calls: list[Path] = []
    monkeypatch.setattr(reshard, "universal_copy", fake_universal_copy(calls))
    target = checkpoints.resharded(choice(source), keyed, 1, rank=0, refusal=None)
    (target / "global_step4_universal" / "zero" / "w.pt").write_bytes(b"pickle payload")
    with pytest.raises(RunError, match="refusing to resume.*w.pt was changed after this run signed it"):
        checkpoints.resharded(choice(source), keyed, 1, rank=1, refusal=None)
    record = resumechoice.read_run_record(target)
    resumechoice.write_run_record(target, {**record, "hmac": "0" * 64})  # a forged record is not reused: rebuilt
    checkpoints.resharded(choice(source), keyed, 1, rank=0, refusal=None)
    assert len(calls) == 2


def test_a_layout_that_cannot_be_resharded_is_refused_with_the_reason(keyed: Path) -> None:
    source = zero_checkpoint(keyed)
    refusal = reshard.reshard_refusal(2, offload_optimizer="nvme")
    assert refusal is not None
    with pytest.raises(RunError) as refused:
        checkpoints.resharded(choice(source), keyed, 1, rank=0, refusal=refusal)
    message = str(refused.value)
    assert "cannot resume checkpoint-4 (saved at world size 2) at world size 1" in message and "NVMe" in message
    assert "run it at world size 2" in message and not (keyed / checkpoints.RESHARD_DIR).exists()


def test_the_copy_is_removed_once_the_run_saves_its_own_checkpoint(keyed: Path, monkeypatch) -> None:
    source = zero_checkpoint(keyed)
    monkeypatch.setattr(reshard, "universal_copy", fake_universal_copy([]))
    checkpoints.resharded(choice(source), keyed, 1, rank=0, refusal=None)
    (keyed / "checkpoint-6").mkdir()
    (keyed / "checkpoint-6" / "trainer_state.json").write_text("{}")
    callback = checkpoints.RunRecordCallback(resumechoice.run_record("abc123", world_size=1, zero_stage=2), KEY)
    callback.on_save(
        SimpleNamespace(output_dir=str(keyed)), SimpleNamespace(global_step=6, is_world_process_zero=True), None
    )
    assert not (keyed / checkpoints.RESHARD_DIR).exists() and source.is_dir()
