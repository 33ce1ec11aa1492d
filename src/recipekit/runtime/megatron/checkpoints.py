"""Megatron's checkpoints (``<output_dir>/checkpoints/iter_NNNNNNN``, torch_dist) under the runtime's trust rules: each
is signed by this run once Bridge has written it, and a restart resumes the newest one that proves itself.

The shared volume is writable by others and Megatron's checkpoints are unpickled when loaded (``common.pt``), so the
rules are the Trainer's (volume/trust.py, volume/resume.py): a checkpoint carries the run record
(``filenames.RUN_FILE``) with the sha256 of every file and an HMAC under the run key; before any byte of it is
parsed its record must verify, every file must have its digest, nothing extra may be there, links are refused, the
record's step must be the directory's, its run id and layout this run's; a run that already resumed from step N
refuses an older one (volume/resume.py's mark). Bridge then loads exactly the chosen one (``checkpoint.ckpt_step``),
never what its own tracker file names.

Bridge has no "checkpoint saved" callback. Its saves are synchronous and end in a barrier, so rank 0 signs every
saved, unsigned checkpoint at the start of the next step (callbacks.py) and once more after Bridge returns (the final
save, and the one a SIGTERM makes). A process killed between a save and that moment leaves it unsigned: it is passed
over (never parsed) and the run resumes from the one before, which costs one interval of steps, never trust.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..boundary import filenames, jsonfile
from ..boundary.common import RunError, log0
from ..boundary.resume import resumechoice
from ..volume import trust
from ..volume.resume import RECORD_EXCLUDED, RECORD_MAX_BYTES, mark_resumed, resumed_step

#: Below the output directory: Bridge's save/load directory, and the HF weights imported as a Megatron checkpoint.
CHECKPOINTS_DIR = "checkpoints"
INIT_DIR = "megatron-init"
#: Bridge's checkpoint directories (megatron.bridge.training.utils.checkpoint_utils.get_checkpoint_name).
_ITER = re.compile(r"^iter_(\d{7,18})$")


def iter_name(step: int) -> str:
    """Megatron's directory name of the checkpoint of ``step`` (``iter_NNNNNNN``, seven digits at least)."""
    return f"iter_{step:07d}"


def iter_step(name: str) -> int | None:
    """N of ``iter_NNNNNNN`` (ASCII digits), else None."""
    found = _ITER.match(name)
    return int(found[1]) if found and name.isascii() else None


def iterations(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every ``iter_N`` entry under ``root``, newest first (links included, to be refused)."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    found = [(step, root / name) for name in names if (step := iter_step(name)) is not None]
    return sorted(found, reverse=True)


@dataclass(frozen=True)
class Layout:
    """What a checkpoint's states depend on: this run's id, world, parallel sizes and global batch."""

    run_id: str
    world_size: int
    parallel: dict[str, int]
    global_batch_size: int

    def record(self, step: int) -> dict[str, Any]:
        return resumechoice.run_record(
            self.run_id,
            world_size=self.world_size,
            zero_stage=0,
            global_batch_size=self.global_batch_size,
            step=step,
            engine="megatron",
            parallel=self.parallel,
        )


def sign(directory: Path, record: dict[str, Any], key: bytes | None) -> None:
    """Write ``directory``'s run record, signed under ``key`` (unsigned without one: never resumed)."""
    if key is not None:
        record = trust.sign(record, key, trust.digests(directory, RECORD_EXCLUDED))
    resumechoice.write_run_record(directory, record)


def sign_new(root: Path, layout: Layout, key: bytes | None, upto: int) -> list[int]:
    """Sign every checkpoint under ``root`` at a step ``<= upto`` that has no record yet (rank 0, after the save's
    barrier); the steps signed."""
    signed = []
    for step, path in iterations(root):
        if step <= upto and not path.is_symlink() and path.is_dir() and not (path / filenames.RUN_FILE).exists():
            sign(path, layout.record(step), key)
            signed.append(step)
    return signed


@dataclass(frozen=True)
class Choice:
    """The checkpoint a run continues from (None: from scratch) and those passed over, with why."""

    path: Path | None
    step: int | None
    skipped: tuple[tuple[str, str], ...] = ()


def prove(path: Path, step: int, layout: Layout, key: bytes | None) -> None:
    """``path`` is a directory this run signed, unchanged, step ``step``, of this run's layout: a RunError naming
    what is not (nothing of it has been parsed but its record)."""
    name = path.name
    if path.is_symlink() or not path.is_dir():
        raise RunError(f"refusing to resume: {name} is not a directory (a link or a file planted on the volume)")
    if key is None:
        raise RunError(
            f"cannot prove {name} was written by this run: no run key ({trust.KEY_ENV} is unset; the Job mounts it "
            "from its Secret, see docs/trust.md); start over with --resume none"
        )
    try:
        trust.regular_files(path, RECORD_EXCLUDED)
        record = jsonfile.read(path / filenames.RUN_FILE, RECORD_MAX_BYTES)
        trust.verify_directory(path, record, key, RECORD_EXCLUDED, name)
    except (OSError, ValueError, trust.Untrusted) as exc:
        raise RunError(f"refusing to resume: {exc}") from None
    if record.get("step") != step:
        raise RunError(f"refusing to resume: {name}'s signed record says step {record.get('step')!r} (replayed)")
    if record.get("run_id") != layout.run_id:
        raise RunError(
            f"{name} belongs to run {record.get('run_id')!r}, not to this bundle's run {layout.run_id!r}: start "
            "over with --resume none or another output directory"
        )
    ours = layout.record(step)
    for key_name in ("world_size", "parallel", "global_batch_size"):
        if record.get(key_name) != ours[key_name]:
            raise RunError(
                f"{name} was saved with {key_name} {record.get(key_name)!r}, this run has {ours[key_name]!r}: run "
                "it with the layout it was saved with, or start over with --resume none"
            )


def choose(output_dir: Path, resume: str, layout: Layout, key: bytes | None) -> Choice:
    """The checkpoint this run continues from (``resume``: auto | none | an ``iter_N`` path), proven first.

    ``auto``: the newest ``iter_N``; one without a record (a save a kill cut before rank 0 signed it) is passed over;
    any other that does not prove itself is refused. A choice older than the step this run already resumed from is a
    rollback, refused."""
    if resume == "none":
        return Choice(None, None)
    if resume != "auto":
        path = Path(resume)
        step = iter_step(path.name)
        if step is None:
            raise RunError(f"--resume {resume}: not a directory named iter_NNNNNNN")
        prove(path, step, layout, key)
        return Choice(path, step)
    skipped: list[tuple[str, str]] = []
    chosen: Choice | None = None
    for step, path in iterations(output_dir / CHECKPOINTS_DIR):
        if not path.is_symlink() and path.is_dir() and not (path / filenames.RUN_FILE).exists():
            skipped.append((path.name, "never signed (a save cut by the end of its attempt)"))
            continue
        prove(path, step, layout, key)
        chosen = Choice(path, step, tuple(skipped))
        break
    before = resumed_step(output_dir, layout.run_id, key)
    now = chosen.step if chosen is not None else 0
    if before is not None and now is not None and now < before:
        raise RunError(
            f"rollback refused: the newest checkpoint this run can resume is step {now}, but it already resumed from "
            f"step {before}: newer checkpoints were removed; resume one by its path (--resume DIR) or remove "
            "recipekit-resumed.json from the output directory"
        )
    return chosen or Choice(None, None, tuple(skipped))


def settle(output_dir: Path, choice: Choice, run_id: str, key: bytes | None) -> None:
    """Rank 0, before the process group forms: mark the step resumed from (sealed) and remove the checkpoints newer
    than it that never proved themselves, which this attempt will save again (Bridge writes into an existing
    directory as it finds it)."""
    for name, _ in choice.skipped:
        stale = output_dir / CHECKPOINTS_DIR / name
        if not stale.is_symlink() and stale.is_dir():
            shutil.rmtree(stale)
            log0("removed %s: never signed; this attempt saves that step again", name)
    if choice.step is not None and key is not None:
        mark_resumed(output_dir, run_id, choice.step, key)
