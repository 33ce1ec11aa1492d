"""The checkpoints' hot tier (runtime/volume/hottier.py): the drain signs and renames into place, each tier keeps its
own count, several pods' files become one signed checkpoint, and a resume takes whichever tier is newer and proves
itself — a forged or unsigned hot copy is passed over with its reason, never trusted."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from recipekit.runtime.boundary import filenames
from recipekit.runtime.boundary.recipeview import HotCheckpointsView
from recipekit.runtime.boundary.resume import resumechoice
from recipekit.runtime.volume import hottier, resume, trust

KEY = b"hot-tier-test-key-" + b"0" * 32
RUN = "run-hot"
RECORD = resumechoice.run_record(RUN, world_size=1, zero_stage=0)
LAYOUT = resumechoice.WorldLayout(1, 0)
ONE_POD = hottier.PodPlace(pod=0, pods=1, drains=True, signs=True)


def saved(root: Path, step: int, files: dict[str, bytes] | None = None) -> Path:
    """What the Trainer's save leaves in the hot tier: a checkpoint without its run record."""
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True, exist_ok=True)
    (path / filenames.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step}))
    for name, data in (files if files is not None else {"pytorch_model.bin": b"\x80\x04weights-%d" % step}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


def tier(tmp_path: Path, keep: int = 1) -> hottier.HotTier:
    return hottier.HotTier(tmp_path / "hot", keep, "hostPath")


def drain(hot: hottier.HotTier, shared: Path, step: int, place: hottier.PodPlace = ONE_POD, keep: int = 3) -> None:
    hottier.drain_one(hot, shared, step, place, RECORD, KEY, keep)


def test_a_drained_checkpoint_is_signed_in_both_tiers_and_proves_itself(tmp_path: Path) -> None:
    hot, shared = tier(tmp_path), tmp_path / "shared"
    saved(hot.directory, 3)
    drained = hottier.drain_one(hot, shared, 3, ONE_POD, RECORD, KEY, 3)
    assert drained is not None and drained.step == 3 and drained.bytes > 0
    for copy in (hot.directory / "checkpoint-3", shared / "checkpoint-3"):
        resume.prove(copy, 3, RUN, KEY)  # signed by this run, every digest, its step
    assert not hottier.staging_dir(shared, 3).exists()  # renamed into place, no staging left


def test_each_tier_keeps_its_own_count_newest_first(tmp_path: Path) -> None:
    hot, shared = tier(tmp_path, keep=2), tmp_path / "shared"
    for step in (2, 4, 6, 8, 10):
        saved(hot.directory, step)
        drain(hot, shared, step, keep=3)
    assert sorted(p.name for p in hot.directory.iterdir()) == ["checkpoint-10", "checkpoint-8"]
    assert sorted(p.name for p in shared.iterdir()) == ["checkpoint-10", "checkpoint-6", "checkpoint-8"]
    # a restart asked for forgets the hot tier (session.forget_hot_tier): nothing of it is kept
    assert hottier.retain(hot.directory, 0) == ["checkpoint-10", "checkpoint-8"] and not any(hot.directory.iterdir())


def test_several_pods_files_become_one_checkpoint_signed_by_global_rank_0(tmp_path: Path) -> None:
    """Each pod's hot tier holds its own partitions; the shared copy holds all of them under one signature, and no
    pod's partial hot copy is ever signed (it could not be resumed by itself)."""
    shared = tmp_path / "shared"
    hots = [hottier.HotTier(tmp_path / f"node-{i}", 1, "hostPath") for i in range(2)]
    saved(hots[0].directory, 5, {"rank0.pt": b"zero", "pytorch_model.bin": b"\x80\x04w"})
    saved(hots[1].directory, 5, {"rank1.pt": b"one"})
    places = [hottier.PodPlace(0, 2, True, True), hottier.PodPlace(1, 2, True, False)]
    signer = threading.Thread(target=drain, args=(hots[0], shared, 5, places[0]))
    signer.start()  # global rank 0 waits for pod 1's files
    time.sleep(0.3)
    assert not (shared / "checkpoint-5").exists()
    drain(hots[1], shared, 5, places[1])
    signer.join(timeout=10)
    resume.prove(shared / "checkpoint-5", 5, RUN, KEY)
    assert {"rank0.pt", "rank1.pt", "pytorch_model.bin"} <= {p.name for p in (shared / "checkpoint-5").iterdir()}
    assert not any(p.name.endswith(".drained") for p in (shared / "checkpoint-5").iterdir())
    for hot in hots:
        assert not (hot.directory / "checkpoint-5" / filenames.RUN_FILE).exists()


def test_a_pod_that_never_drains_fails_the_gather_naming_the_step(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / hottier.MARKER.format(0)).touch()
    with pytest.raises(OSError, match="checkpoint-7: 1 pod"):
        hottier._gather(staging, 2, 7, timeout_s=0.3)


def resume_choice(hot: hottier.HotTier, shared: Path, pods: int = 1) -> resumechoice.ResumeChoice:
    return hottier.choose(hot, shared, RUN, "auto", LAYOUT, KEY, pods)


def test_a_restart_resumes_whichever_tier_is_newer_and_verified(tmp_path: Path) -> None:
    hot, shared = tier(tmp_path, keep=2), tmp_path / "shared"
    saved(hot.directory, 3)
    drain(hot, shared, 3)
    assert resume_choice(hot, shared).path == shared / "checkpoint-3"  # equal steps: the shared volume's copy
    # checkpoint-6 signed in the hot tier, the pod killed before its drain reached the shared volume
    saved(hot.directory, 6)
    signed = hottier._sign(hot.directory / "checkpoint-6", {**RECORD, "step": 6}, KEY)
    resumechoice.write_run_record(hot.directory / "checkpoint-6", signed)
    choice = resume_choice(hot, shared)
    assert choice.path == hot.directory / "checkpoint-6" and choice.step == 6
    # on several pods a pod's hot copy is partial: the shared volume decides
    assert resume_choice(hot, shared, pods=2).path == shared / "checkpoint-3"


def test_an_unsigned_or_forged_hot_copy_is_passed_over_with_its_reason(tmp_path: Path) -> None:
    hot, shared = tier(tmp_path, keep=2), tmp_path / "shared"
    saved(hot.directory, 3)
    drain(hot, shared, 3)
    saved(hot.directory, 6)  # saved, never signed (killed before the drain signed it): an interrupted save
    choice = resume_choice(hot, shared)
    assert choice.path == shared / "checkpoint-3"
    why = "saved, never signed (the pod stopped before its drain signed it)"
    assert choice.skipped == (("checkpoint-6 (hot tier)", why),)
    forged = resumechoice.run_record(RUN, world_size=1, zero_stage=0, step=6)
    forged = trust.sign(forged, b"another-key-" + b"1" * 32, trust.digests(hot.directory / "checkpoint-6"))
    resumechoice.write_run_record(hot.directory / "checkpoint-6", forged)
    choice = resume_choice(hot, shared)
    assert choice.path == shared / "checkpoint-3"
    assert choice.skipped[-1][0] == "hot tier" and "does not verify" in choice.skipped[-1][1]


def test_a_hot_copy_older_than_the_step_already_resumed_is_a_rollback_passed_over(tmp_path: Path) -> None:
    """The rollback mark lives on the shared volume, and it judges the hot tier too."""
    hot, shared = tier(tmp_path, keep=2), tmp_path / "shared"
    saved(hot.directory, 6)
    drain(hot, shared, 6)
    resume.mark_resumed(shared, RUN, 6, KEY)
    hottier.remove_tree(shared / "checkpoint-6")
    saved(tmp_path / "elsewhere", 4)
    os.replace(tmp_path / "elsewhere" / "checkpoint-4", hot.directory / "checkpoint-4")
    hottier.remove_tree(hot.directory / "checkpoint-6")
    with pytest.raises(resumechoice.ResumeRefused, match="rollback refused"):
        resume_choice(hot, shared)


def test_the_hot_tier_is_a_directory_of_this_jobs_pod_under_the_mount() -> None:
    view = HotCheckpointsView(medium="hostPath", mount_path="/var/lib/recipekit/hot", keep=2)
    found = hottier.hot_tier(view, "job-a", {"GROUP_RANK": "3"})
    assert found == hottier.HotTier(Path("/var/lib/recipekit/hot/job-a/pod-3"), 2, "hostPath")
    moved = hottier.hot_tier(view, "job-a", {hottier.HOT_DIR_ENV: "/tmp/node-1", "VC_TASK_INDEX": "1"})
    assert moved is not None and moved.directory == Path("/tmp/node-1/job-a/pod-1")
    assert hottier.hot_tier(HotCheckpointsView("none", "/x", 1), "job-a", {}) is None
    assert hottier.hot_tier(None, "job-a", {}) is None


def test_a_link_in_the_hot_copy_is_refused_not_followed(tmp_path: Path) -> None:
    hot, shared = tier(tmp_path), tmp_path / "shared"
    path = saved(hot.directory, 3)
    (tmp_path / "secret").write_text("not a checkpoint file")
    (path / "extra.bin").symlink_to(tmp_path / "secret")
    with pytest.raises(trust.Untrusted, match="symlink"):
        drain(hot, shared, 3)
    assert not (shared / "checkpoint-3").exists()


def test_the_drainer_waits_for_the_previous_drain_and_keeps_failures(tmp_path: Path) -> None:
    hot, shared = tier(tmp_path), tmp_path / "shared"
    done: list[hottier.Drained] = []
    drainer = hottier.Drainer(hot, shared, ONE_POD, RECORD, KEY, 3, done=done.append)
    saved(hot.directory, 2)
    drainer.submit(2)
    saved(hot.directory, 4)
    drainer.submit(4)  # waits for checkpoint-2's drain first
    drainer.wait()
    assert [d.step for d in done] == [2, 4]
    drainer.submit(9)  # never saved: the failure is kept, training is not stopped
    drainer.wait()
    assert drainer.failures and "checkpoint-9 was not drained" in drainer.failures[0]
