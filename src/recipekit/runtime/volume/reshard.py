"""Resume a DeepSpeed ZeRO checkpoint at another world size, through DeepSpeed's universal checkpoint.

A ZeRO checkpoint holds one optimizer partition per data-parallel rank, and DeepSpeed refuses to load it with
another rank count. DeepSpeed's ``ds_to_universal`` rewrites those partitions as whole per-parameter tensors
(``zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt``), which an engine started with
``"checkpoint": {"load_universal": true}`` re-partitions for whatever world it runs in.

The source ``checkpoint-N`` is signed file by file, so nothing is written into it: :func:`universal_copy` builds a
sibling directory holding what ``Trainer.train(resume_from_checkpoint=...)`` reads on a DeepSpeed resume (the
trainer state, the scheduler, the RNG states) next to the converted tag directory and the ``latest_universal`` file
DeepSpeed's ``load_checkpoint`` reads in universal mode. Verify the source before calling it: DeepSpeed unpickles it.

Only the standard library is imported here; DeepSpeed runs in a child process (see :func:`convert`).
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

#: Files of a checkpoint the Trainer itself reads when it resumes under DeepSpeed (the engine reads the rest). The
#: scheduler file exists only when the Trainer's scheduler is not handed to DeepSpeed, which is the case when the
#: DeepSpeed config names an optimizer: the engine then saves the scheduler in its own model states.
TRAINER_STATE = "trainer_state.json"
SCHEDULER = "scheduler.pt"
TRAINER_FILES = (TRAINER_STATE, SCHEDULER)
RNG_SINGLE = "rng_state.pth"
RNG_RANK = re.compile(r"rng_state_(\d+)\.pth")
#: The file DeepSpeed's engine reads, in universal mode, for the tag to load (``latest`` in normal mode).
LATEST_UNIVERSAL = "latest_universal"
UNIVERSAL_SUFFIX = "_universal"
PARTIAL_SUFFIX = ".partial"


class ReshardError(RuntimeError):
    """The checkpoint cannot be turned into a universal one; the message says why."""


def reshard_refusal(
    zero_stage: int,
    *,
    offload_optimizer: str = "none",
    offload_param: str = "none",
    tensor_parallel: int = 1,
) -> str | None:
    """None when a checkpoint of this layout can be resumed at another world size through a universal checkpoint
    with this DeepSpeed (0.19.x) and the HF Trainer; otherwise the reason, in one sentence.

    Proven on CPU with bf16 (tests/integration/test_reshard.py and by hand): ZeRO 1, 2 and 3 with the Trainer's
    torch AdamW, 2 ranks to 1 and 1 to 2; ZeRO-2 with CPU optimizer offload and ZeRO-3 with CPU optimizer and
    parameter offload, both with DeepSpeed's AdamW from the config, 2 ranks to 1."""
    if zero_stage == 0:
        return "ZeRO stage 0 checkpoints hold whole optimizer states: any world size resumes them as they are"
    if zero_stage not in (1, 2, 3):
        return f"ZeRO stage {zero_stage} does not exist"
    if offload_optimizer == "nvme":
        return (
            "with optimizer states on NVMe, DeepSpeed's load_checkpoint copies each rank's swap folder back instead "
            "of loading a universal checkpoint"
        )
    if offload_param == "nvme":
        return "resuming a universal checkpoint with parameters offloaded to NVMe has not been proven here"
    if offload_optimizer != "none" and zero_stage == 1:
        return "resuming a universal checkpoint of ZeRO-1 with CPU offload has not been proven here"
    if offload_param != "none" and offload_optimizer == "none":
        return (
            "resuming a universal checkpoint with parameters offloaded but not the optimizer has not been proven here"
        )
    if tensor_parallel > 1:
        return "resuming an AutoTP checkpoint through a universal checkpoint has not been proven here"
    return None


def ds_config_for_universal(ds: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config for the one run that resumes from a universal copy: the same config with
    ``checkpoint.load_universal`` on. Only that run may use it: in universal mode the engine looks for
    ``latest_universal``, which the normal checkpoints it then saves do not have, so a later resume of those needs
    the original config again."""
    out = copy.deepcopy(ds)
    section = dict(out.get("checkpoint") or {})
    section["load_universal"] = True
    out["checkpoint"] = section
    return out


def checkpoint_tag(checkpoint: Path) -> str:
    """The DeepSpeed tag directory of a Trainer checkpoint: the one its ``latest`` file names, else its only
    ``global_step*`` directory."""
    latest = checkpoint / "latest"
    if latest.is_file():
        tag = latest.read_text().strip()
    else:
        tags = sorted(p.name for p in checkpoint.glob("global_step*") if p.is_dir())
        if len(tags) != 1:
            raise ReshardError(f"{checkpoint}: no 'latest' file and {len(tags)} global_step* directories")
        tag = tags[0]
    if not tag or "/" in tag or tag.startswith(".") or not (checkpoint / tag).is_dir():
        raise ReshardError(f"{checkpoint}: tag {tag!r} is not a directory of the checkpoint")
    return tag


def convert(tag_dir: Path, output_folder: Path, timeout_s: float = 3600.0) -> None:
    """Run DeepSpeed's own ``ds_to_universal`` on one tag directory, as a ``python -P -m`` child.

    A child and not ``ds_to_universal.main(namespace)`` in-process: the converter loads every rank's partition at
    once and its memory goes back to the system when the child exits; it runs no process pool inside a rank that
    holds a process group; its namespace is its argparse (fields change between DeepSpeed versions); ``-P`` keeps
    the working directory off ``sys.path``. ``--inject_missing_state``: the HF Trainer's engine saves no
    ``universal_checkpoint_info`` (only Megatron-style clients do), which the converter otherwise asserts on. It
    writes ``latest_universal`` next to ``output_folder``."""
    cmd = [
        sys.executable,
        "-P",
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(tag_dir),
        "--output_folder",
        str(output_folder),
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
        "--inject_missing_state",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise ReshardError(f"ds_to_universal failed on {tag_dir} (exit {done.returncode}): " + " | ".join(tail))


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hardlink (no extra disk) where the filesystem allows one, else a copy; never a symlink out of the dir."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _rng_files(checkpoint: Path, world_size: int | None) -> dict[str, Path]:
    """RNG state files for the new world, by name. The Trainer reads ``rng_state.pth`` at world 1 and
    ``rng_state_<rank>.pth`` above; a rank with no file of its own logs that and keeps its seeded generators."""
    per_rank = {int(m.group(1)): p for p in checkpoint.iterdir() if (m := RNG_RANK.fullmatch(p.name))}
    single = checkpoint / RNG_SINGLE
    if single.is_file():
        per_rank.setdefault(0, single)
    if world_size is None:
        out = {p.name: p for p in per_rank.values()}
        if single.is_file():
            out[RNG_SINGLE] = single
        return out
    if world_size == 1:
        return {RNG_SINGLE: per_rank[0]} if 0 in per_rank else {}
    return {f"rng_state_{rank}.pth": per_rank[rank] for rank in range(world_size) if rank in per_rank}


def universal_copy(checkpoint: Path, target: Path, *, world_size: int | None = None) -> Path:
    """Build ``target``: a directory the Trainer resumes from at any world size (with :func:`ds_config_for_universal`).

    It holds the trainer files of ``checkpoint`` (hardlinked), its RNG states renamed for ``world_size`` (None: as
    they are), ``<tag>_universal/`` converted by DeepSpeed and ``latest_universal`` naming it. ``checkpoint`` is
    only read. Idempotent: a finished ``target`` is returned as it is; an unfinished attempt (``<target>.partial``)
    is removed and redone, and ``target`` appears only complete, by one rename. Call it on one process (rank 0 on a
    shared volume) while the others wait."""
    checkpoint, target = Path(checkpoint), Path(target)
    if (target / LATEST_UNIVERSAL).is_file():
        return target
    if target.exists():
        raise ReshardError(f"{target} exists but holds no {LATEST_UNIVERSAL}: not a universal copy, left alone")
    tag = checkpoint_tag(checkpoint)
    if not (checkpoint / TRAINER_STATE).is_file():
        raise ReshardError(f"{checkpoint} lacks {TRAINER_STATE}: not a complete Trainer checkpoint")

    work = target.with_name(target.name + PARTIAL_SUFFIX)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for name in TRAINER_FILES:
        if (checkpoint / name).is_file():
            _link_or_copy(checkpoint / name, work / name)
    for name, src in _rng_files(checkpoint, world_size).items():
        _link_or_copy(src, work / name)
    universal_tag = tag + UNIVERSAL_SUFFIX
    convert(checkpoint / tag, work / universal_tag)
    written = (work / LATEST_UNIVERSAL).read_text().strip() if (work / LATEST_UNIVERSAL).is_file() else None
    if written != universal_tag or not (work / universal_tag / "zero").is_dir():
        raise ReshardError(f"ds_to_universal left no usable {universal_tag} in {work} (latest_universal: {written!r})")
    os.replace(work, target)
    return target


def extra_disk_bytes(path: Path) -> int:
    """Bytes the files under ``path`` add to the disk: those not hardlinked to a file elsewhere (the checkpoint)."""
    total = 0
    for p in Path(path).rglob("*"):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            if st.st_nlink == 1:
                total += st.st_size
    return total
