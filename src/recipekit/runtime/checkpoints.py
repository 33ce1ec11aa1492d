"""Checkpoints and the run they belong to: the run record each save carries, and the resume decision.

The rules live in the contract (stdlib only, shared with recipekit's dry run): when a checkpoint is complete, and
:func:`contract.resume_choice`, which picks the checkpoint to continue from and refuses one of another run. This
module applies them inside a run: it stamps every checkpoint with the run record (``contract.RUN_FILE``: the plan's
run fingerprint and the world layout that wrote its states) and turns the choice into log lines and a RunError.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from . import contract
from .common import RunError, log0


def choose_resume(
    output_dir: Path, resume: str, run_id: str, *, world_size: int, zero_stage: int
) -> contract.ResumeChoice:
    """``contract.resume_choice``, logged: each skipped checkpoint and why, each warning; a refusal is a RunError."""
    try:
        choice = contract.resume_choice(output_dir, run_id, resume, world_size=world_size, zero_stage=zero_stage)
    except contract.ResumeRefused as exc:
        raise RunError(str(exc)) from None
    for name, reason in choice.skipped:
        log0("skipping %s: %s", name, reason)
    for warning in choice.warnings:
        log0(warning, level=logging.WARNING)
    return choice


class RunRecordCallback(TrainerCallback):
    """Writes the run record into every checkpoint the Trainer saves (rank 0, after the Trainer's own files).

    A checkpoint whose save was cut before the record is still complete by the contract's rules and is resumed
    with a warning, like one of an older bundle: the record proves ownership, it is not a completeness marker.
    """

    def __init__(self, record: dict[str, Any]):
        self.record = record

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        checkpoint = Path(args.output_dir) / f"{contract.CHECKPOINT_PREFIX}{state.global_step}"
        if checkpoint.is_dir():
            contract.write_run_record(checkpoint, {**self.record, "step": state.global_step})
