"""A ZeRO checkpoint written by 2 ranks resumes on 1 rank through DeepSpeed's universal checkpoint (runtime/reshard.py).

Each case trains a tiny random Llama with the real Trainer + DeepSpeed under torchrun (reshard_train.py): 2 ranks for
8 steps, saving checkpoint-4 and checkpoint-8 (the uninterrupted reference). ``universal_copy`` converts
checkpoint-4 into a sibling directory, and 1 rank with 2 accumulated micro-batches (the same global batch and the
same samples) resumes from it. The optimizer's moments first act on the update of step 5, so the losses from step 6
on must match the reference, and must differ from a resume that drops the moments (a fresh AdamW), or the test would
pass with no optimizer state at all. Slow: deselect with ``-m 'not slow'``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from recipekit.runtime import reshard

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
    from recipekit.validate.extensions import extensions_dir

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train(processes: int, tmp: Path, name: str, *args: str) -> dict:
    """Run reshard_train.py under torchrun; its per-step losses and final global step."""
    losses = tmp / f"{name}.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc_per_node={processes}",
        f"--master_port={_free_port()}",
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


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_world2_zero_checkpoint_resumes_on_one_rank(stage: int, tmp_path: Path) -> None:
    run = tmp_path / "run"
    ref = train(2, tmp_path, "reference", "--out", str(run), "--stage", str(stage))
    assert ref["global_step"] == 8 and sorted(ref["losses"]) == list(range(1, 9))

    source = run / "checkpoint-4"
    signed = digests(source)
    copy = reshard.universal_copy(source, run / ".reshard" / "checkpoint-4", world_size=1)
    assert digests(source) == signed, "the source checkpoint was written to"
    assert not any(p.is_symlink() for p in copy.rglob("*"))
    assert (copy / reshard.LATEST_UNIVERSAL).read_text() == "global_step4_universal"
    assert (copy / "rng_state.pth").is_file() and not (copy / "latest").exists()
    assert reshard.universal_copy(source, copy, world_size=1) == copy  # done once: returned as it is

    resume = ("--stage", str(stage), "--ga", "2", "--resume", str(copy), "--universal")
    resumed = train(1, tmp_path, "universal", "--out", str(tmp_path / "resumed"), *resume)
    fresh = train(1, tmp_path, "fresh", "--out", str(tmp_path / "fresh"), *resume, "--fresh-optimizer")

    assert resumed["global_step"] == 8
    assert sorted(resumed["losses"]) == list(range(1, 9))  # steps 1-4 from trainer_state.json, 5-8 trained here
    ref_l, got, ctl = ref["losses"], resumed["losses"], fresh["losses"]
    assert abs(got[5] - ref_l[5]) < 1e-3 and abs(ctl[5] - ref_l[5]) < 1e-3, "the weights were not restored"
    for step in (6, 7, 8):
        assert abs(got[step] - ref_l[step]) < TOLERANCE, (step, got, ref_l)
    assert abs(ctl[6] - ref_l[6]) > FRESH_GAP, ("a fresh optimizer gives the reference loss: the test cannot fail", ctl)
    assert abs(got[6] - ref_l[6]) < abs(ctl[6] - ref_l[6]) / 5

    # The resumed run's next save is an ordinary one-rank checkpoint: normal config, normal resume.
    saved = tmp_path / "resumed" / "checkpoint-8"
    assert (saved / "latest").read_text().strip() == "global_step8"
    assert not (saved / reshard.LATEST_UNIVERSAL).exists()
    optim = sorted(p.name for p in (saved / "global_step8").glob("*optim_states.pt"))
    assert optim == ["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    again = train(
        1,
        tmp_path,
        "again",
        "--out",
        str(tmp_path / "resumed"),
        "--stage",
        str(stage),
        "--ga",
        "2",
        "--max-steps",
        "9",
        "--resume",
        str(saved),
    )
    assert again["global_step"] == 9 and 9 in again["losses"]
