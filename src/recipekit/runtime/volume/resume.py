"""The checkpoint a run resumes, proven before any byte of it is parsed: signed by this run, the step it says it is.

The shared volume is writable by others (docs/trust.md), so a checkpoint directory is untrusted until proven. The
order matters: a planted directory must not crash the reader before it is refused (a restart would crash again until
the Job gives up), so nothing of a checkpoint is parsed before its signature and digests verify — names are read,
links refused, bytes hashed. Then the checkpoint must be the step it says it is: the signed record's ``step``, the
directory's name and ``trainer_state.json``'s ``global_step`` agree, so a genuine older checkpoint copied (or linked)
under a newer name is refused with both steps named rather than resumed as new. And a run that already resumed from
step N refuses to continue from an older one (a rollback: newer checkpoints removed or renamed away); the step it
resumed from is kept in a record this run signs (:data:`MARK_FILE`).

Only after that does :func:`resumechoice.resume_choice` judge the proven checkpoint (complete, this run's id, this
run's layout): it is the one rule the dry run predicts with. Standard library only, like the rest of the runtime.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..boundary import filenames, jsonfile
from ..boundary.resume import checkpointdirs, resumechoice
from . import trust

#: In the output directory: the newest step this run resumed from, sealed with the run key.
MARK_FILE = "recipekit-resumed.json"
#: The record a checkpoint carries is small (run id, layout, one digest per file): a larger one is refused unread.
RECORD_MAX_BYTES = 16 << 20
MARK_MAX_BYTES = 64 << 10
#: Not covered by the digests: the record itself.
RUN_FILE = filenames.RUN_FILE
RECORD_EXCLUDED = frozenset({RUN_FILE})


def candidates(output_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every entry named ``checkpoint-N`` (N in ASCII digits), newest first; links included, so
    that they are refused rather than passed over. A name that only looks like one (digits of another script, a
    superscript, more digits than a step has) is no checkpoint by any reading, so it cannot stand for a newer one
    than those listed: it is passed over (refusing it would let anyone who can write to the volume stop the run)."""
    try:
        names = os.listdir(output_dir)
    except OSError:
        return []
    found = []
    for name in sorted(names):
        step = checkpointdirs.checkpoint_step(Path(name))
        if step is not None:
            found.append((step, Path(output_dir) / name))
    return sorted(found, reverse=True)


def _exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except OSError:
        return False
    return True


def interrupted(path: Path) -> str | None:
    """Why ``path`` is an interrupted save (the Trainer's or DeepSpeed's files are there, the run record never
    was), by names alone; None when it is not one (then it must prove itself)."""
    if os.path.islink(path) or not path.is_dir() or _exists(path / filenames.RUN_FILE):
        return None
    if _exists(path / filenames.INCOMPLETE_MARKER):
        return "marked incomplete (an interrupted save, never signed)"
    if not _exists(path / filenames.TRAINER_STATE_FILE):
        return f"{filenames.TRAINER_STATE_FILE} missing (an interrupted save, never signed)"
    if not any(_exists(path / name) for name in filenames.WEIGHT_FILES):
        return "no model weights (an interrupted save, never signed)"
    return None


def prove(path: Path, step: int, run_id: str, key: bytes | None) -> None:
    """``path`` is a directory (not a link) this run signed, every file has its digest, and it is step ``step``:
    :class:`trust.Untrusted` or :class:`resumechoice.ResumeRefused` otherwise. Parses the record before anything else,
    and ``trainer_state.json`` only after its digest verified."""
    name = path.name
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise trust.Untrusted(f"{name}: cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISLNK(info.st_mode):
        raise trust.Untrusted(f"{name} is a symlink: a checkpoint is a directory this run wrote, not a link to one")
    if not stat.S_ISDIR(info.st_mode):
        raise trust.Untrusted(f"{name} is not a directory")
    if not _exists(path / filenames.RUN_FILE):
        raise resumechoice.ResumeRefused(
            f"{name} has no readable {filenames.RUN_FILE}: nothing proves run {run_id} wrote it (the shared volume is "
            "writable by others, docs/trust.md); remove it to resume the newest checkpoint this run signed, or "
            f"{resumechoice.FRESH_REMEDY}"
        )
    if key is None:
        raise trust.Untrusted(
            f"cannot prove {name} was written by this run: no run key ({trust.KEY_ENV} is unset; the Job mounts it "
            "from its Secret): apply the bundle's Job as built, see docs/trust.md"
        )
    trust.regular_files(path, RECORD_EXCLUDED)  # links anywhere refused before any read
    record = _read(path / filenames.RUN_FILE, RECORD_MAX_BYTES, name)
    trust.verify_directory(path, record, key, RECORD_EXCLUDED, name)
    said = record.get("step")
    if type(said) is not int:
        raise trust.Untrusted(f"{name}: its signed record states no step")
    if said != step:
        raise trust.Untrusted(
            f"{name}: its signed record says step {said}, its name says step {step}: a copy of "
            f"{filenames.CHECKPOINT_PREFIX}{said} under another name (replayed); remove {name}"
        )
    if _exists(path / filenames.TRAINER_STATE_FILE):  # signed now: safe to parse
        state = _read(path / filenames.TRAINER_STATE_FILE, jsonfile.MAX_BYTES, name)
        global_step = state.get("global_step")
        if global_step != step or type(global_step) is not int:
            raise trust.Untrusted(
                f"{name}: its {filenames.TRAINER_STATE_FILE} says global_step {global_step!r}, its record step {step}"
            )


def _read(path: Path, max_bytes: int, where: str) -> dict[str, Any]:
    try:
        value = jsonfile.read(path, max_bytes)
    except (OSError, ValueError) as exc:
        raise trust.Untrusted(f"{where}: {path.name} cannot be read ({exc})") from None
    if not isinstance(value, dict):
        raise trust.Untrusted(f"{where}: {path.name} is not a JSON object")
    return value


def choose(
    output_dir: Path,
    run_id: str,
    resume: str,
    layout: resumechoice.WorldLayout | None,
    key: bytes | None,
    mark_dir: Path | None = None,
    unsigned_passed_over: bool = False,
) -> resumechoice.ResumeChoice:
    """The checkpoint this run continues from (``resume``: auto | none | a checkpoint path), proven first.

    ``auto``: the newest ``checkpoint-N``; an interrupted save (never signed) is passed over with its reason, as is
    a proven one that is incomplete; any other that does not prove itself is refused, not passed over. A choice
    older than the step this run already resumed from (the mark in ``mark_dir``, default ``output_dir``: the shared
    volume's, also for the hot tier, volume/hottier.py) is a rollback, refused. A path: it must prove itself.
    ``unsigned_passed_over``: a checkpoint without a record is an unfinished save too (the hot tier, where the
    drain signs after the save: volume/hottier.py), passed over rather than refused."""
    if resume == "none":
        return resumechoice.ResumeChoice(None)
    if resume != "auto":
        path = Path(resume)
        step = checkpointdirs.checkpoint_step(path)
        if step is None:
            raise resumechoice.ResumeRefused(f"--resume {resume}: not a directory named {filenames.CHECKPOINT_PREFIX}N")
        prove(path, step, run_id, key)
        return resumechoice.resume_choice(output_dir, run_id, resume, layout=layout)
    skipped: list[tuple[str, str]] = []
    chosen: tuple[int, Path] | None = None
    for step, path in candidates(output_dir):
        reason = interrupted(path)
        if reason is None and unsigned_passed_over and not os.path.islink(path) and not _exists(path / RUN_FILE):
            reason = "saved, never signed (the pod stopped before its drain signed it)"
        if reason is None:
            prove(path, step, run_id, key)
            reason = checkpointdirs.checkpoint_problem(path)
        if reason is None:
            chosen = (step, path)
            break
        skipped.append((path.name, reason))
    _no_rollback(output_dir if mark_dir is None else mark_dir, run_id, key, chosen)
    if chosen is None:
        return resumechoice.ResumeChoice(None, tuple(skipped))
    choice = resumechoice.resume_choice(output_dir, run_id, str(chosen[1]), layout=layout)
    return replace(choice, skipped=tuple(skipped))


def resumed_step(output_dir: Path, run_id: str, key: bytes | None) -> int | None:
    """The newest step this run resumed from, as its sealed :data:`MARK_FILE` says (None: none, or not provable)."""
    if key is None:
        return None
    try:
        mark = jsonfile.read(Path(output_dir) / MARK_FILE, MARK_MAX_BYTES)
    except (OSError, ValueError):
        return None
    if not isinstance(mark, dict) or trust.seal_problem(mark, key) is not None or mark.get("run_id") != run_id:
        return None
    step = mark.get("step")
    return step if type(step) is int else None


def _no_rollback(output_dir: Path, run_id: str, key: bytes | None, chosen: tuple[int, Path] | None) -> None:
    before = resumed_step(output_dir, run_id, key)
    step = chosen[0] if chosen is not None else 0
    if before is not None and step < before:
        now = chosen[1].name if chosen is not None else "no checkpoint (from scratch)"
        raise resumechoice.ResumeRefused(
            f"rollback refused: the newest checkpoint this run can resume is {now} (step {step}), but it already "
            f"resumed from step {before}: newer checkpoints were removed or renamed; to go back on purpose, "
            f"{resumechoice.FROM_REMEDY}, or remove {MARK_FILE} from the output directory"
        )


def reset_mark(output_dir: Path, run_id: str, step: int | None, key: bytes) -> None:
    """Set the step this run resumed from to ``step`` (None: remove the mark), whatever it was: a restart the user
    asked for goes back on purpose (volume/restart.py)."""
    target = Path(output_dir) / MARK_FILE
    if step is None:
        target.unlink(missing_ok=True)
        return
    staging = target.with_name(f"{MARK_FILE}.tmp-{os.getpid()}")
    staging.write_text(json.dumps(trust.seal({"run_id": run_id, "step": step}, key)) + "\n", encoding="utf-8")
    os.replace(staging, target)


def mark_resumed(output_dir: Path, run_id: str, step: int, key: bytes) -> None:
    """Record (sealed) that this run resumed from ``step``, unless it already resumed from a newer one."""
    before = resumed_step(output_dir, run_id, key)
    if before is not None and before >= step:
        return
    try:
        record = json.dumps(trust.seal({"run_id": run_id, "step": step}, key)) + "\n"
        jsonfile.replace_text(Path(output_dir) / MARK_FILE, record)
    except OSError:
        pass  # the mark guards against a rollback; failing to write it must not stop the run
