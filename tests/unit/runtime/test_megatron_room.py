"""The Megatron room's parts that need no engine: rows as Megatron samples (rows.py) and the proof of the checkpoint a
run continues from (checkpoints.py). The room end to end, in the engine's venv, is tests/integration/
test_megatron_engine.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recipekit.runtime.boundary import filenames  # noqa: E402
from recipekit.runtime.boundary.common import RunError  # noqa: E402
from recipekit.runtime.boundary.order import Permutation  # noqa: E402
from recipekit.runtime.megatron import checkpoints  # noqa: E402
from recipekit.runtime.megatron.checkpoints import CHECKPOINTS_DIR, Layout  # noqa: E402
from recipekit.runtime.megatron.rows import OrderedRows, megatron_sample  # noqa: E402
from recipekit.runtime.volume import trust  # noqa: E402

KEY = b"k" * 32


# ------------------------------------------------------------------------------------------------------- rows
def test_a_row_becomes_next_token_labels_with_the_learned_mask() -> None:
    row = {"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}  # prompt 5 6, answer 7 8
    sample = megatron_sample(row, seq_length=6, pad_id=0)
    assert sample["tokens"].tolist() == [5, 6, 7, 8, 0, 0]
    assert sample["labels"].tolist()[:3] == [6, 7, 8]
    assert sample["loss_mask"].tolist() == [0, 1, 1, 0, 0, 0]  # predicting 7 and 8: the answer; nothing after
    assert sample["position_ids"].tolist() == list(range(6)) and "attention_mask" not in sample


def test_a_pretraining_block_learns_every_next_token_and_is_cut_to_the_length() -> None:
    sample = megatron_sample({"input_ids": list(range(10, 20))}, seq_length=8, pad_id=0)
    assert sample["tokens"].tolist() == list(range(10, 18))
    assert sample["loss_mask"].tolist() == [1] * 7 + [0]


def test_a_packed_row_restarts_positions_and_masks_across_samples() -> None:
    row = {"input_ids": [1, 2, 3, 4, 5], "labels": [-100, 2, -100, 4, 5], "position_ids": [0, 1, 0, 1, 2]}
    sample = megatron_sample(row, seq_length=7, pad_id=0)
    assert sample["position_ids"].tolist() == [0, 1, 0, 1, 2, 0, 1]  # padding: a pseudo-sample of its own
    assert sample["loss_mask"].tolist() == [1, 0, 1, 1, 0, 0, 0]  # a sample's first token is never a target
    masked = sample["attention_mask"][0]
    assert masked.shape == (7, 7)
    allowed = (~masked).int().tolist()
    assert allowed[1] == [1, 1, 0, 0, 0, 0, 0]  # sample 1 sees itself only
    assert allowed[4] == [0, 0, 1, 1, 1, 0, 0]  # sample 2, causal
    assert allowed[6] == [0, 0, 0, 0, 0, 1, 1]


def test_samples_follow_the_trainers_keyed_order_epoch_after_epoch() -> None:
    split = [{"input_ids": [i, i + 1]} for i in range(5)]
    rows = OrderedRows(split, samples=12, seed=42, seq_length=2, pad_id=0)
    expected = [int(Permutation(5, 42, e)(np.array([p], dtype=np.uint64))[0]) for e in (0, 1, 2) for p in range(5)]
    assert [rows.row_of(i) for i in range(12)] == expected[:12]
    assert sorted(expected[:5]) == list(range(5)) and expected[:5] != expected[5:10]
    assert rows[7]["tokens"].tolist() == [expected[7], expected[7] + 1]


# ------------------------------------------------------------------------------------------------ checkpoints
LAYOUT = Layout("run-1", 4, {"tensor": 2, "pipeline": 2}, 8)


def saved(output: Path, step: int, layout: Layout = LAYOUT, key: bytes | None = KEY) -> Path:
    directory = output / CHECKPOINTS_DIR / f"iter_{step:07d}"
    directory.mkdir(parents=True)
    (directory / "common.pt").write_bytes(b"pickled state")
    (directory / "__0_0.distcp").write_bytes(b"shard")
    checkpoints.sign(directory, layout.record(step), key)
    return directory


def test_the_newest_signed_checkpoint_is_chosen_and_an_unsigned_newer_one_passed_over(tmp_path: Path) -> None:
    saved(tmp_path, 3)
    newest = saved(tmp_path, 6)
    cut = tmp_path / CHECKPOINTS_DIR / "iter_0000009"
    cut.mkdir()
    (cut / "common.pt").write_bytes(b"half")
    choice = checkpoints.choose(tmp_path, "auto", LAYOUT, KEY)
    assert (choice.path, choice.step) == (newest, 6)
    assert choice.skipped == (("iter_0000009", "never signed (a save cut by the end of its attempt)"),)
    checkpoints.settle(tmp_path, choice, LAYOUT.run_id, KEY)
    assert not cut.exists() and newest.exists()


def test_sign_new_signs_only_saved_steps_without_a_record(tmp_path: Path) -> None:
    first = saved(tmp_path, 3)
    before = first.joinpath(filenames.RUN_FILE).read_bytes()
    for step in (6, 9):
        (tmp_path / CHECKPOINTS_DIR / f"iter_{step:07d}").mkdir()
    assert checkpoints.sign_new(tmp_path / CHECKPOINTS_DIR, LAYOUT, KEY, upto=6) == [6]
    assert first.joinpath(filenames.RUN_FILE).read_bytes() == before
    record = json.loads((tmp_path / CHECKPOINTS_DIR / "iter_0000006" / filenames.RUN_FILE).read_text())
    assert record["step"] == 6 and record["engine"] == "megatron" and len(record[trust.HMAC_FIELD]) == 64


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (lambda d: (d / "common.pt").write_bytes(b"planted"), "common.pt was changed after this run signed it"),
        (lambda d: (d / "extra.pt").write_bytes(b"x"), "extra.pt is not in its signed record"),
        (lambda d: (d / "__0_0.distcp").unlink(), "__0_0.distcp is missing"),
    ],
)
def test_a_changed_checkpoint_is_refused_not_passed_over(tmp_path: Path, spoil, reason: str) -> None:
    saved(tmp_path, 3)
    spoil(saved(tmp_path, 6))
    with pytest.raises(RunError, match=reason):
        checkpoints.choose(tmp_path, "auto", LAYOUT, KEY)


def test_another_run_layout_or_key_is_refused(tmp_path: Path) -> None:
    saved(tmp_path, 3, Layout("run-0", 4, LAYOUT.parallel, 8))
    with pytest.raises(RunError, match="belongs to run 'run-0'"):
        checkpoints.choose(tmp_path, "auto", LAYOUT, KEY)
    other = tmp_path / "b"
    saved(other, 3, Layout("run-1", 4, {"tensor": 1, "pipeline": 4}, 8))
    with pytest.raises(RunError, match="saved with parallel"):
        checkpoints.choose(other, "auto", LAYOUT, KEY)
    with pytest.raises(RunError, match="signature does not verify"):
        checkpoints.choose(other, "auto", LAYOUT, b"x" * 32)
    with pytest.raises(RunError, match="no run key"):
        checkpoints.choose(other, "auto", LAYOUT, None)


def test_a_replayed_copy_and_a_rollback_are_refused(tmp_path: Path) -> None:
    three = saved(tmp_path, 3)
    (tmp_path / CHECKPOINTS_DIR / "iter_0000006").mkdir()
    for item in three.iterdir():
        (tmp_path / CHECKPOINTS_DIR / "iter_0000006" / item.name).write_bytes(item.read_bytes())
    with pytest.raises(RunError, match="says step 3 \\(replayed\\)"):
        checkpoints.choose(tmp_path, "auto", LAYOUT, KEY)
    fresh = tmp_path / "fresh"
    saved(fresh, 3)
    six = saved(fresh, 6)
    checkpoints.settle(fresh, checkpoints.choose(fresh, "auto", LAYOUT, KEY), LAYOUT.run_id, KEY)
    for item in six.iterdir():
        item.unlink()
    six.rmdir()
    with pytest.raises(RunError, match="rollback refused"):
        checkpoints.choose(fresh, "auto", LAYOUT, KEY)
    assert checkpoints.choose(fresh, "none", LAYOUT, KEY).path is None
