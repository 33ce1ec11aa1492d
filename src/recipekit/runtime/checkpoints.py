"""Checkpoints and the run they belong to: the run record each save carries, and the resume decision.

The rules live in the contract (stdlib only, shared with recipekit's dry run): when a checkpoint is complete, and
:func:`contract.resume_choice`, which picks the checkpoint to continue from and refuses one of another run. This
module applies them inside a run: it stamps every checkpoint with the run record (``contract.RUN_FILE``: the plan's
run fingerprint and the world layout that wrote its states) and turns the choice into log lines and a RunError.

The record is signed (trust.py): the sha256 of every file of the checkpoint and an HMAC over them with the run key
the Job mounts from its Secret. A checkpoint is resumed only when that signature verifies and every file still has
its digest, checked before the Trainer or DeepSpeed open any of it: the shared volume is writable by others, and
DeepSpeed unpickles what it loads.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from . import contract, trust
from .common import RunError, log0


def choose_resume(output_dir: Path, resume: str, run_id: str, layout: contract.WorldLayout) -> contract.ResumeChoice:
    """``contract.resume_choice``, logged: each skipped checkpoint and why, each warning; a refusal is a RunError."""
    try:
        choice = contract.resume_choice(output_dir, run_id, resume, layout=layout)
    except contract.ResumeRefused as exc:
        raise RunError(str(exc)) from None
    for name, reason in choice.skipped:
        log0("skipping %s: %s", name, reason)
    if choice.path is not None:
        verify_checkpoint(choice.path)
    for warning in choice.warnings:
        log0(warning, level=logging.WARNING)
    return choice


def verify_checkpoint(path: Path) -> None:
    """The checkpoint was written by this run (its signed record verifies under the run key and every file has the
    digest the record gives), else a RunError naming why: no byte of it has been parsed yet."""
    try:
        key = trust.load_key()
        if key is None:
            raise trust.Untrusted(
                f"cannot prove {path.name} was written by this run: no run key ({trust.KEY_ENV} is unset; the Job "
                "mounts it from its Secret, see docs/trust.md); start over with --resume none"
            )
        trust.verify_directory(path, contract.read_run_record(path), key, RECORD_EXCLUDED, path.name)
    except trust.Untrusted as exc:
        raise RunError(f"refusing to resume: {exc}") from None
    log0("%s: signed record and %s verified", path.name, "file digests")


def run_key() -> bytes | None:
    """The run key the Job mounts (None without one: checkpoints are then unsigned and never resumed)."""
    try:
        key = trust.load_key()
    except trust.Untrusted as exc:
        raise RunError(str(exc)) from None
    if key is None:
        log0(
            "no run key (%s unset): checkpoints are saved unsigned and cannot be resumed",
            trust.KEY_ENV,
            level=logging.WARNING,
        )
    return key


#: Not covered by the digests: the record itself.
RECORD_EXCLUDED = frozenset({contract.RUN_FILE})


class RunRecordCallback(TrainerCallback):
    """Writes the signed run record into every checkpoint the Trainer saves (rank 0, once every rank has written
    its files: the callback is the last one, and it waits for all ranks first).

    A checkpoint whose save was cut before the record is complete by the contract's rules but cannot be resumed:
    without the signed record nothing proves this run wrote it. Without a run key the record is written unsigned
    (a run started by hand), and such a checkpoint is refused on resume.
    """

    def __init__(self, record: dict[str, Any], key: bytes | None):
        self.record, self.key = record, key

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _barrier()  # every rank's files (DeepSpeed partitions, rng states) are written before they are hashed
        if not state.is_world_process_zero:
            return
        checkpoint = Path(args.output_dir) / f"{contract.CHECKPOINT_PREFIX}{state.global_step}"
        if checkpoint.is_dir():
            record = {**self.record, "step": state.global_step}
            if self.key is not None:
                record = trust.sign(record, self.key, trust.digests(checkpoint, RECORD_EXCLUDED))
            contract.write_run_record(checkpoint, record)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
