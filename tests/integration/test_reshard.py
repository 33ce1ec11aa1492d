"""A ZeRO checkpoint written by 2 ranks resumes on 1 rank through DeepSpeed's universal checkpoint
(runtime/volume/reshard.py).

Each case trains a tiny random Llama with the real Trainer + DeepSpeed under torchrun (reshard_train.py): 2 ranks for
8 steps, saving checkpoint-4 and checkpoint-8 (the uninterrupted reference). ``universal_copy`` converts
checkpoint-4 into a sibling directory, and 1 rank with 2 accumulated micro-batches (the same global batch and the
same samples) resumes from it. The optimizer's moments first act on the update of step 5, so the losses from step 6
on must match the reference, and must differ from a resume that drops the moments (a fresh AdamW), or the test would
pass with no optimizer state at all. For ZeRO-3 the resumed run's one-rank checkpoint-8 then goes the other way, to 2
ranks, against a normal one-rank resume of it. Slow: deselect with ``-m 'not slow'``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipekit.runtime.volume import reshard

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("deepspeed")

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("reshard_train.py")
RUN_TIMEOUT_S = 300
#: Observed: stages 1 and 2 match the reference exactly, stage 3 within 3e-3; a fresh optimizer is 0.14 off at step 6.
TOLERANCE = 0.01
FRESH_GAP = 0.05


def _env() -> dict[str, str]:
    from recipekit.validate.dryrun.workdir.extensions import extensions_dir

    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "DS_ACCELERATOR": "cpu",
        "CUDA_VISIBLE_DEVICES": "",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "HF_HUB_OFFLINE": "1",
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR") or str(extensions_dir()),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }


def train(processes: int, tmp: Path, name: str, *args: str) -> dict:
    """Run reshard_train.py under torchrun; its per-step losses and final global step."""
    losses = tmp / f"{name}.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # torchrun picks a free port itself: no window for another job to take it
        f"--nproc_per_node={processes}",
        str(SCRIPT),
        "--losses",
        str(losses),
        *args,
    ]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-6000:]}"
    result = json.loads(losses.read_text())
    return {"global_step": result["global_step"], "losses": {int(k): v for k, v in result["losses"].items()}}


def digests(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def layout(world: int) -> tuple[str, ...]:
    """The same global batch of 4 at any world size: 2 per rank, accumulated over 2 micro-batches on one rank."""
    return ("--ga", str(2 // world))


def optim_files(tag_dir: Path) -> list[str]:
    return sorted(p.name for p in tag_dir.glob("*optim_states.pt"))


def reshard_and_resume(stage: int, tmp_path: Path, before: int, after: int) -> None:
    """Train ``before`` ranks for 8 steps (the reference; checkpoint-4 on the way), resume checkpoint-4 on ``after``
    ranks through a universal copy and, as a control, with a fresh optimizer; check the losses and the next save."""
    run = tmp_path / "run"
    ref = train(before, tmp_path, "reference", "--out", str(run), "--stage", str(stage), *layout(before))
    assert ref["global_step"] == 8 and sorted(ref["losses"]) == list(range(1, 9))

    source = run / "checkpoint-4"
    assert len(optim_files(source / "global_step4")) == before
    signed = digests(source)
    copy = reshard.universal_copy(source, run / ".reshard" / "checkpoint-4", world_size=after)
    assert digests(source) == signed, "the source checkpoint was written to"
    assert not any(p.is_symlink() for p in copy.rglob("*"))
    assert (copy / reshard.LATEST_UNIVERSAL).read_text() == "global_step4_universal"
    assert (copy / ("rng_state.pth" if after == 1 else "rng_state_0.pth")).is_file()
    assert not (copy / "latest").exists()
    assert reshard.universal_copy(source, copy, world_size=after) == copy  # done once: returned as it is

    resume = ("--stage", str(stage), *layout(after), "--resume", str(copy), "--universal")
    resumed = train(after, tmp_path, "universal", "--out", str(tmp_path / "resumed"), *resume)
    assert resumed["global_step"] == 8
    assert sorted(resumed["losses"]) == list(range(1, 9))  # steps 1-4 from trainer_state.json, 5-8 trained here
    ref_l, got = ref["losses"], resumed["losses"]
    assert abs(got[5] - ref_l[5]) < 1e-3, "the weights were not restored"
    for step in (6, 7, 8):
        assert abs(got[step] - ref_l[step]) < TOLERANCE, (step, got, ref_l)
    ctl = train(after, tmp_path, "fresh", "--out", str(tmp_path / "fresh"), *resume, "--fresh-optimizer")["losses"]
    assert abs(ctl[5] - ref_l[5]) < 1e-3
    assert abs(ctl[6] - ref_l[6]) > FRESH_GAP, ("a fresh optimizer gives the reference loss", ctl)
    assert abs(got[6] - ref_l[6]) < abs(ctl[6] - ref_l[6]) / 5

    # The resumed run's next save is an ordinary checkpoint of the new world: `latest`, one partition per rank.
    saved = tmp_path / "resumed" / "checkpoint-8"
    assert (saved / "latest").read_text().strip() == "global_step8"
    assert not (saved / reshard.LATEST_UNIVERSAL).exists()
    assert optim_files(saved / "global_step8") == [
        f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in range(after)
    ]
    if stage == 3:
        scale_back_up(tmp_path, saved)


def scale_back_up(tmp_path: Path, saved: Path) -> None:
    """The one-rank checkpoint-8 resumes normally on one rank to step 12 (the reference), and through a universal
    copy on two: step 9 shows the weights, steps 10-12 the optimizer's moments."""
    normal = ("--stage", "3", "--max-steps", "12", "--resume")
    again = train(1, tmp_path, "again", "--out", str(tmp_path / "again"), *layout(1), *normal, str(saved))
    assert again["global_step"] == 12 and sorted(again["losses"]) == list(range(1, 13))
    copy = reshard.universal_copy(saved, tmp_path / "resumed" / ".reshard" / "checkpoint-8", world_size=2)
    up = train(2, tmp_path, "up", "--out", str(tmp_path / "up"), *layout(2), *normal, str(copy), "--universal")
    assert up["global_step"] == 12
    for step in (9, 10, 11, 12):
        assert abs(up["losses"][step] - again["losses"][step]) < TOLERANCE, (step, up, again)
    assert optim_files(tmp_path / "up" / "checkpoint-12" / "global_step12") == [
        f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in range(2)
    ]


# ZeRO-2, both ways, is the rescale dry run's (test_dryrun_rescale.py); ZeRO-1 shares ZeRO-2's optimizer code and
# was proven the same way by hand (bit for bit), so the suite's time goes to ZeRO-3 alone.
@pytest.mark.parametrize("stage", [3])
def test_world2_zero_checkpoint_resumes_on_one_rank(stage: int, tmp_path: Path) -> None:
    reshard_and_resume(stage, tmp_path, before=2, after=1)
