"""Checkpoints and the run they belong to: the run record each save carries, and the resume decision.

The choice is volume/resume.py's (stdlib only): it proves a checkpoint first (signed by this run, every digest, the
step it says it is, no rollback), then applies the boundary's rules (:func:`resumechoice.resume_choice`: complete, this
run's id, this run's layout; the dry run predicts with them). This module applies them inside a run: it stamps every
checkpoint with the run record (``filenames.RUN_FILE``: the plan's run fingerprint and the world layout that wrote
its states) and turns the choice into log lines and a RunError.

The record is signed (trust.py): the sha256 of every file of the checkpoint and an HMAC over them with the run key
the Job mounts from its Secret. A checkpoint is resumed only when that signature verifies and every file still has
its digest, checked before the Trainer or DeepSpeed open any of it: the shared volume is writable by others, and
DeepSpeed unpickles what it loads.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ..boundary import filenames
from ..boundary.common import RunError, log0, rank
from ..boundary.resume import resumechoice
from ..volume import coldtier, hottier, reshard, trust
from ..volume.resume import RECORD_EXCLUDED, mark_resumed


def choose_resume(
    output_dir: Path,
    resume: str,
    run_id: str,
    layout: resumechoice.WorldLayout,
    tier: hottier.HotTier | None = None,
) -> resumechoice.ResumeChoice:
    """The checkpoint to continue from, proven before any byte of it is parsed (volume/resume.py), logged: each
    skipped checkpoint and why, each warning; a refusal is a RunError. With a hot tier, its checkpoint when that is
    newer than the shared volume's and proves itself the same way (volume/hottier.py). Rank 0 records the step
    resumed from, so a later restart that finds only older checkpoints refuses the rollback."""
    try:
        key = trust.load_key()
        pods = hottier.PodPlace.from_env().pods
        choice = hottier.choose(tier, output_dir, run_id, resume, layout, key, pods)
    except resumechoice.ResumeRefused as exc:
        raise RunError(str(exc)) from None
    except trust.Untrusted as exc:
        raise RunError(f"refusing to resume: {exc}") from None
    for name, reason in choice.skipped:
        log0("skipping %s: %s", name, reason)
    if choice.path is not None:
        where = " (hot tier)" if tier is not None and choice.path.parent == tier.directory else ""
        log0("%s%s: signed record and %s verified", choice.path.name, where, "file digests")
        if key is not None and choice.step is not None and rank() == 0:
            mark_resumed(output_dir, run_id, choice.step, key)
    for warning in choice.warnings:
        log0(warning, level=logging.WARNING)
    return choice


def verify_checkpoint(path: Path) -> None:
    """The checkpoint (or a re-sharded copy of one) was written by this run — its signed record verifies under the
    run key and every file has the digest the record gives — else a RunError naming why: no byte of it has been
    parsed yet."""
    try:
        key = trust.load_key()
        if key is None:
            raise trust.Untrusted(
                f"cannot prove {path.name} was written by this run: no run key ({trust.KEY_ENV} is unset; the Job "
                "mounts it from its Secret): apply the bundle's Job as built, see docs/trust.md"
            )
        if path.is_symlink():
            raise trust.Untrusted(f"{path.name} is a symlink: a checkpoint is a directory this run wrote")
        trust.verify_directory(path, resumechoice.read_run_record(path), key, RECORD_EXCLUDED, path.name)
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


#: Below the output directory: checkpoints re-sharded for another world size (reshard.py), one per checkpoint and
#: world size. Removed once the run has saved a checkpoint of its own.
RESHARD_DIR = ".reshard"
#: How long the other ranks wait for rank 0's re-sharded copy (converting a large model's states takes a while).
RESHARD_WAIT_S = 6 * 3600.0
RESHARD_POLL_S = 2.0


def resharded(
    choice: resumechoice.ResumeChoice, output_dir: Path, world_size: int, rank: int, refusal: str | None
) -> Path:
    """The chosen ZeRO checkpoint as a universal copy for ``world_size`` (reshard.py), signed like a checkpoint:
    global rank 0 converts it while the other ranks wait for it to appear, then every rank verifies it. Runs before
    the process group forms, since converting takes longer than a collective's timeout. ``refusal`` (reshard.py's
    reason this layout cannot be re-sharded) ends the run with that reason."""
    assert choice.path is not None
    source, name = choice.path, choice.path.name
    if refusal:
        raise RunError(
            f"cannot resume {name} (saved at world size {choice.saved_world_size}) at world size {world_size}: "
            f"{refusal}; run it at world size {choice.saved_world_size}, or {resumechoice.FRESH_REMEDY}"
        )
    target = output_dir / RESHARD_DIR / f"{name}-world{world_size}"
    if rank == 0 and not _usable(target, source):
        shutil.rmtree(target, ignore_errors=True)
        log0(
            "re-sharding %s (world size %s) for world size %d: DeepSpeed universal checkpoint",
            name,
            choice.saved_world_size,
            world_size,
        )
        started = time.monotonic()
        try:
            reshard.universal_copy(source, target, world_size=world_size)
        except reshard.ReshardError as exc:
            raise RunError(f"cannot re-shard {name}: {exc}") from None
        key = trust.load_key()
        assert key is not None  # the source verified under it (choose_resume)
        record = {**(resumechoice.read_run_record(source) or {}), "world_size": world_size, "resharded_from": name}
        record["source_signature"] = _signature(source)
        resumechoice.write_run_record(target, trust.sign(record, key, trust.digests(target, RECORD_EXCLUDED)))
        log0("%s re-sharded in %.0f s, into %s", name, time.monotonic() - started, target)
    else:
        deadline = time.monotonic() + RESHARD_WAIT_S
        while not _usable(target, source):
            if time.monotonic() > deadline:
                raise RunError(f"rank 0 did not re-shard {name} into {target} within {RESHARD_WAIT_S:.0f} s")
            time.sleep(RESHARD_POLL_S)
    verify_checkpoint(target)
    return target


def _signature(checkpoint: Path) -> Any:
    return (resumechoice.read_run_record(checkpoint) or {}).get(trust.HMAC_FIELD)


def _usable(target: Path, source: Path) -> bool:
    """A complete re-sharded copy of ``source`` as it is now (an earlier attempt's, or rank 0's of this one), whose
    record this run signed (its files are checked by :func:`verify_checkpoint` after)."""
    record = resumechoice.read_run_record(target)
    key = trust.load_key()
    if record is None or key is None or record.get("resharded_from") != source.name:
        return False
    try:
        trust.check_record(record, key, target.name)
    except trust.Untrusted:
        return False
    return _signature(source) is not None and record.get("source_signature") == _signature(source)


def drop_resharded(output_dir: Path) -> None:
    """Remove the re-sharded copies: the run has saved a checkpoint of its own at its world size."""
    shutil.rmtree(Path(output_dir) / RESHARD_DIR, ignore_errors=True)


class RunRecordCallback(TrainerCallback):
    """Writes the signed run record into every checkpoint the Trainer saves (rank 0, once every rank has written
    its files: the callback is the last one, and it waits for all ranks first).

    A checkpoint whose save was cut before the record is complete by the contract's rules but cannot be resumed:
    without the signed record nothing proves this run wrote it. Without a run key the record is written unsigned
    (a run started by hand), and such a checkpoint is refused on resume.

    With a hot tier (``drainer``) the checkpoint was saved to node-local storage: each pod's local rank 0 hands it
    to its drain (volume/hottier.py), which signs it and copies it to the shared volume in the background. Without
    one, a signed checkpoint goes to the cold tier's copier (``cold``, volume/coldtier.py; the drain hands it over
    itself).
    """

    def __init__(
        self,
        record: dict[str, Any],
        key: bytes | None,
        drainer: hottier.Drainer | None = None,
        cold: coldtier.ColdCopier | None = None,
    ):
        self.record, self.key, self.drainer, self.cold = record, key, drainer, cold

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _barrier()  # every rank's files (DeepSpeed partitions, rng states) are written before they are hashed
        if self.drainer is not None:
            self._hand_over(args, state.global_step)
            return
        if not state.is_world_process_zero:
            return
        checkpoint = Path(args.output_dir) / f"{filenames.CHECKPOINT_PREFIX}{state.global_step}"
        if checkpoint.is_dir():
            record = {**self.record, "step": state.global_step}
            if self.key is not None:
                record = trust.sign(record, self.key, trust.digests(checkpoint, RECORD_EXCLUDED))
            resumechoice.write_run_record(checkpoint, record)
            drop_resharded(Path(args.output_dir))
            if self.cold is not None:  # signed and final: the cold tier copies it in the background
                self.cold.submit(checkpoint, state.global_step)

    def _hand_over(self, args: Any, step: int) -> None:
        """Every pod's files of ``step`` to the drains: a stale staging copy (an earlier attempt's) removed first by
        global rank 0, while the others wait at a barrier, so no pod's copy lands in it."""
        assert self.drainer is not None
        place = self.drainer.place
        if place.signs:
            self.drainer.wait()  # the previous checkpoint is on the shared volume before its staging is touched
            hottier.remove_tree(hottier.staging_dir(Path(args.output_dir), step))
            drop_resharded(Path(args.output_dir))
        _barrier()
        if place.drains:
            self.drainer.submit(step)


class HotTierSaves:
    """Trainer mixin: the Trainer's own save path writes checkpoints into the hot tier's directory (``hot_dir``)
    instead of ``output_dir``; everything else (metrics, the final model) stays in ``output_dir``. The Trainer's
    rotation is off (``save_total_limit`` None, session.training_arguments): the drain keeps each tier's count, and
    never removes the checkpoint it is copying."""

    hot_dir: str | None = None
    _saving_checkpoint = False

    def checkpoint_dir(self) -> Path:
        """Where this process's checkpoints are saved."""
        return Path(self.hot_dir or self.args.output_dir)  # type: ignore[attr-defined]  # the Trainer's

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        self._saving_checkpoint = True
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]  # the Trainer's
        finally:
            self._saving_checkpoint = False

    def _get_output_dir(self, trial: Any) -> str:
        if self._saving_checkpoint and self.hot_dir:
            return self.hot_dir
        return str(super()._get_output_dir(trial))  # type: ignore[misc]  # the Trainer's


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
