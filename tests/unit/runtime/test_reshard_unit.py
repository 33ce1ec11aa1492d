"""runtime/volume/reshard.py without DeepSpeed: the refusal table, the resume config, the tag, the RNG renaming and the
directory protocol of ``universal_copy`` (the DeepSpeed conversion replaced by a stand-in)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipekit.runtime.volume import reshard


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_without_offload_reshard(stage: int) -> None:
    assert reshard.reshard_refusal(stage) is None


def test_cpu_offload_reshards_where_proven() -> None:
    assert reshard.reshard_refusal(2, offload_optimizer="cpu") is None
    assert reshard.reshard_refusal(3, offload_optimizer="cpu", offload_param="cpu") is None


@pytest.mark.parametrize(
    ("stage", "kwargs", "words"),
    [
        (0, {}, "whole optimizer states"),
        (4, {}, "does not exist"),
        (3, {"offload_optimizer": "nvme"}, "NVMe"),
        (3, {"offload_optimizer": "cpu", "offload_param": "nvme"}, "NVMe"),
        (1, {"offload_optimizer": "cpu"}, "CPU offload"),
        (3, {"offload_param": "cpu"}, "not the optimizer"),
        (1, {"tensor_parallel": 2}, "AutoTP"),
    ],
)
def test_refusals_say_why_in_one_sentence(stage: int, kwargs: dict, words: str) -> None:
    reason = reshard.reshard_refusal(stage, **kwargs)
    assert reason is not None and words in reason
    assert "\n" not in reason and reason.count(". ") == 0


def test_universal_config_turns_on_load_universal_and_leaves_the_input_alone() -> None:
    ds = {"zero_optimization": {"stage": 2}, "checkpoint": {"tag_validation": "Warn"}}
    out = reshard.ds_config_for_universal(ds)
    assert out["checkpoint"] == {"tag_validation": "Warn", "load_universal": True}
    assert out["zero_optimization"] == {"stage": 2}
    assert ds == {"zero_optimization": {"stage": 2}, "checkpoint": {"tag_validation": "Warn"}}
    out["zero_optimization"]["stage"] = 3
    assert ds["zero_optimization"]["stage"] == 2
    assert reshard.ds_config_for_universal({})["checkpoint"] == {"load_universal": True}


def fake_checkpoint(root: Path, world: int = 2, tag: str = "global_step4", latest: bool = True) -> Path:
    ckpt = root / "checkpoint-4"
    (ckpt / tag).mkdir(parents=True)
    (ckpt / tag / "mp_rank_00_model_states.pt").write_bytes(b"model")
    for name in reshard.TRAINER_FILES:
        (ckpt / name).write_text(name)
    for rank in range(world):
        (ckpt / f"rng_state_{rank}.pth").write_text(f"rng{rank}")
    if latest:
        (ckpt / "latest").write_text(tag + "\n")
    return ckpt


def test_tag_from_latest_or_the_only_global_step_dir(tmp_path: Path) -> None:
    assert reshard.checkpoint_tag(fake_checkpoint(tmp_path / "a")) == "global_step4"
    assert reshard.checkpoint_tag(fake_checkpoint(tmp_path / "b", latest=False)) == "global_step4"
    two = fake_checkpoint(tmp_path / "c", latest=False)
    (two / "global_step8").mkdir()
    with pytest.raises(reshard.ReshardError, match="2 global_step"):
        reshard.checkpoint_tag(two)
    bad = fake_checkpoint(tmp_path / "d")
    (bad / "latest").write_text("../elsewhere")
    with pytest.raises(reshard.ReshardError, match="not a directory"):
        reshard.checkpoint_tag(bad)


@pytest.mark.parametrize(
    ("old_world", "new_world", "expected"),
    [
        (2, 1, {"rng_state.pth": "rng0"}),
        (2, None, {"rng_state_0.pth": "rng0", "rng_state_1.pth": "rng1"}),
        (2, 4, {"rng_state_0.pth": "rng0", "rng_state_1.pth": "rng1"}),
        (2, 2, {"rng_state_0.pth": "rng0", "rng_state_1.pth": "rng1"}),
    ],
)
def test_rng_states_are_renamed_for_the_new_world(
    tmp_path: Path, old_world: int, new_world: int | None, expected: dict
) -> None:
    ckpt = fake_checkpoint(tmp_path, world=old_world)
    got = {name: p.read_text() for name, p in reshard._rng_files(ckpt, new_world).items()}
    assert got == expected


def test_one_rank_rng_state_goes_to_rank_0(tmp_path: Path) -> None:
    ckpt = fake_checkpoint(tmp_path, world=0)
    (ckpt / "rng_state.pth").write_text("single")
    got = {name: p.read_text() for name, p in reshard._rng_files(ckpt, 2).items()}
    assert got == {"rng_state_0.pth": "single"}


def stand_in_convert(calls: list[Path], fail: bool = False):  # noqa: ANN201
    def convert(tag_dir: Path, output_folder: Path, timeout_s: float = 0) -> None:
        calls.append(tag_dir)
        (output_folder / "zero").mkdir(parents=True)
        if fail:
            raise reshard.ReshardError("conversion died")
        (output_folder.parent / reshard.LATEST_UNIVERSAL).write_text(output_folder.name)

    return convert


def test_universal_copy_builds_the_sibling_once_and_never_writes_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = fake_checkpoint(tmp_path)
    before = sorted(p.relative_to(ckpt) for p in ckpt.rglob("*"))
    calls: list[Path] = []
    monkeypatch.setattr(reshard, "convert", stand_in_convert(calls))
    target = tmp_path / ".reshard" / "checkpoint-4"
    assert reshard.universal_copy(ckpt, target, world_size=1) == target
    assert calls == [ckpt / "global_step4"]
    assert sorted(p.name for p in target.iterdir()) == [
        "global_step4_universal",
        "latest_universal",
        "rng_state.pth",
        "scheduler.pt",
        "trainer_state.json",
    ]
    assert not any(p.is_symlink() for p in target.rglob("*"))
    assert sorted(p.relative_to(ckpt) for p in ckpt.rglob("*")) == before
    assert reshard.universal_copy(ckpt, target, world_size=1) == target
    assert len(calls) == 1
    assert reshard.extra_disk_bytes(target) == len("global_step4_universal")  # the rest is hardlinked


def test_an_unfinished_attempt_is_redone_and_never_looks_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = fake_checkpoint(tmp_path)
    target = tmp_path / ".reshard" / "checkpoint-4"
    monkeypatch.setattr(reshard, "convert", stand_in_convert([], fail=True))
    with pytest.raises(reshard.ReshardError, match="conversion died"):
        reshard.universal_copy(ckpt, target)
    assert not target.exists() and target.with_name("checkpoint-4.partial").is_dir()
    calls: list[Path] = []
    monkeypatch.setattr(reshard, "convert", stand_in_convert(calls))
    assert reshard.universal_copy(ckpt, target) == target
    assert calls and not target.with_name("checkpoint-4.partial").exists()
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in target.iterdir()}


def test_a_foreign_target_or_an_incomplete_checkpoint_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reshard, "convert", stand_in_convert([]))
    ckpt = fake_checkpoint(tmp_path)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    with pytest.raises(reshard.ReshardError, match="not a universal copy"):
        reshard.universal_copy(ckpt, foreign)
    (ckpt / "trainer_state.json").unlink()
    with pytest.raises(reshard.ReshardError, match="trainer_state.json"):
        reshard.universal_copy(ckpt, tmp_path / "t")


def test_without_a_scheduler_file_the_copy_has_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DeepSpeed-config optimizer: the engine holds the scheduler, the Trainer writes no scheduler.pt."""
    monkeypatch.setattr(reshard, "convert", stand_in_convert([]))
    ckpt = fake_checkpoint(tmp_path)
    (ckpt / "scheduler.pt").unlink()
    target = reshard.universal_copy(ckpt, tmp_path / "t", world_size=1)
    assert not (target / "scheduler.pt").exists() and (target / "trainer_state.json").is_file()
