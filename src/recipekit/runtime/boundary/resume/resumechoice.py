"""Which run wrote a checkpoint, and which checkpoint a restart continues from (:func:`resume_choice`).

train.py acts on the choice, the dry run predicts with it: both run this code (standard library only, shipped in
every bundle).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import jsonfile
from ..filenames import RUN_FILE
from .checkpointdirs import checkpoint_problem, checkpoint_step, checkpoints

#: The remedies a refusal names, each one a user can apply to a built bundle (``recipekit restart``; the request it
#: writes: runtime/volume/restart.py).
FRESH_REMEDY = "start over with `recipekit restart BUNDLE --fresh` (its checkpoints are set aside, not deleted)"
FROM_REMEDY = "restart from an older one with `recipekit restart BUNDLE --from checkpoint-N`"


def run_record(
    run_id: str, *, world_size: int, zero_stage: int, global_batch_size: int | None = None, **extra: Any
) -> dict[str, Any]:
    """What :data:`RUN_FILE` holds: the run fingerprint (``plan.run_id``: model, data, global batch, optimisation),
    the world layout the checkpoint's states were written in and the global batch they were trained at, plus
    anything else worth reading (step, accumulation, recipe name)."""
    record = {"run_id": run_id, "world_size": world_size, "zero_stage": zero_stage}
    if global_batch_size is not None:
        record["global_batch_size"] = global_batch_size
    return {**record, **extra}


def write_run_record(directory: Path, record: dict[str, Any]) -> None:
    """Write :data:`RUN_FILE` into ``directory`` atomically: a reader sees the whole record or none (never through
    a link planted there: :func:`.jsonfile.append`)."""
    jsonfile.replace_text(Path(directory) / RUN_FILE, json.dumps(record, indent=2) + "\n")


def read_run_record(directory: Path) -> dict[str, Any] | None:
    """The run record of a checkpoint, or None when it has none (written by an older bundle) or it is unreadable."""
    try:
        record = jsonfile.read(Path(directory) / RUN_FILE)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


class ResumeRefused(Exception):
    """A checkpoint that must not be resumed from, said in one line (train.py exits :data:`EXIT_USER_ERROR`)."""


@dataclass(frozen=True)
class ResumeChoice:
    """Where a run continues from, and why not from anything newer."""

    path: Path | None  # None: from scratch
    #: (checkpoint name, why it cannot be resumed) of every newer checkpoint passed over, newest first
    skipped: tuple[tuple[str, str], ...] = ()
    #: things worth a warning about the chosen checkpoint (e.g. it was saved at another world size)
    warnings: tuple[str, ...] = ()
    #: the checkpoint's ZeRO partitions were written at another world size: they must be re-sharded before they
    #: load (runtime/volume/reshard.py: DeepSpeed's universal checkpoint)
    reshard: bool = False
    #: the world size the chosen checkpoint was saved at (None: from scratch)
    saved_world_size: int | None = None

    @property
    def step(self) -> int | None:
        return checkpoint_step(self.path) if self.path is not None else None


#: Why a tensor-parallel run is not resumed at another world size: DeepSpeed AutoTP's checkpoints at another
#: data-parallel size were not proven here (plan/rescale.py refuses the rebuild, session.py the resume).
TP_RESIZE_REFUSAL = "resuming a tensor-parallel (AutoTP) checkpoint at another world size has not been proven here"


@dataclass(frozen=True)
class WorldLayout:
    """How this process's run is laid out: what a checkpoint's record is compared with."""

    world_size: int
    zero_stage: int
    global_batch_size: int | None = None  # micro × accumulation × data-parallel size; None: not compared
    streaming: bool = False  # the stream's position is kept per rank: no other world size can continue it


def resume_choice(
    output_dir: Path,
    run_id: str,
    resume: str = "auto",
    *,
    layout: WorldLayout | None = None,
) -> ResumeChoice:
    """The checkpoint a run of ``run_id`` continues from; raises :class:`ResumeRefused` for one it must not touch.

    ``resume``: ``none`` (from scratch), ``auto`` (the newest complete ``checkpoint-N`` of ``output_dir``; incomplete
    ones are skipped with their reason) or a checkpoint path (it must be complete). The chosen checkpoint must belong
    to this run: a run record naming another run is refused rather than skipped, because continuing from an older
    checkpoint of a directory another run has written into would silently lose work. Given this run's ``layout``, a
    checkpoint trained at another global batch is refused (another trajectory), and one saved at another world size
    is accepted: whole states load anywhere, ZeRO partitions are marked for re-sharding. A checkpoint without a
    record is refused: nothing proves who wrote it (train.py then also checks the record's signature,
    runtime/session/checkpoints.py). Pure apart from reading the directory: train.py acts on the answer and the dry run
    predicts with it.
    """
    if resume == "none":
        return ResumeChoice(None)
    skipped: list[tuple[str, str]] = []
    if resume == "auto":
        path = None
        for _, candidate, problem in checkpoints(output_dir):
            if problem is None:
                path = candidate
                break
            skipped.append((candidate.name, problem))
        if path is None:
            return ResumeChoice(None, tuple(skipped))
    else:
        path = Path(resume)
        problem = checkpoint_problem(path) if path.is_dir() else "not a directory"
        if problem:
            raise ResumeRefused(f"--resume {resume}: {problem}")
    record = read_run_record(path)
    if record is None:
        raise ResumeRefused(
            f"{path.name} has no readable {RUN_FILE}: nothing proves run {run_id} wrote it (the shared volume is "
            "writable by others, docs/trust.md); remove it to resume the newest checkpoint this run signed, or "
            f"{FRESH_REMEDY}"
        )
    if record.get("run_id") != run_id:
        raise ResumeRefused(
            f"{path.name} belongs to run {record.get('run_id')!r}, not to this bundle's run {run_id!r}: only a "
            "bundle built from the same recipe (at the same global batch) can resume it; rebuild with the recipe "
            "that wrote it (recipekit rescale keeps it on another number of nodes), or start over with --resume "
            "none or another output_dir"
        )
    saved = record.get("world_size")
    choice = ResumeChoice(path, tuple(skipped), saved_world_size=saved if isinstance(saved, int) else None)
    return _against_layout(choice, record, layout) if layout is not None else choice


def _against_layout(choice: ResumeChoice, record: dict[str, Any], ours: WorldLayout) -> ResumeChoice:
    """The choice checked against this run's layout: refused at another global batch or ZeRO stage, re-sharded at
    another world size."""
    assert choice.path is not None
    name, world, zero = choice.path.name, record.get("world_size"), record.get("zero_stage")
    batch = record.get("global_batch_size")
    if ours.global_batch_size is not None and batch is not None and batch != ours.global_batch_size:
        raise ResumeRefused(
            f"{name} was trained at global batch {batch}, this run's is {ours.global_batch_size} (micro × "
            f"accumulation × data-parallel size at world size {ours.world_size}): that is another trajectory; "
            f"launch the world the plan has, or rebuild with recipekit rescale, which keeps the global batch"
        )
    if zero != ours.zero_stage and (zero or ours.zero_stage):
        raise ResumeRefused(
            f"{name} was saved with ZeRO {zero}, this run has ZeRO {ours.zero_stage}: their optimizer states are "
            f"laid out differently; run it with the ZeRO stage it was saved with, or {FRESH_REMEDY}"
        )
    if world == ours.world_size or not isinstance(world, int):
        return choice
    if ours.streaming:
        raise ResumeRefused(
            f"{name} was saved at world size {world}, this run has {ours.world_size}: a streamed run keeps its "
            f"position in the stream per rank, so only world size {world} continues it exactly; run it at that "
            f"size, or {FRESH_REMEDY}"
        )
    kept = f"global batch {batch} kept" if batch is not None else "global batch unrecorded"
    warning = f"{name} was saved at world size {world}, this run has {ours.world_size} ({kept})"
    if not zero:
        return replace(choice, warnings=(*choice.warnings, warning + ": whole optimizer states load at any size"))
    return replace(
        choice,
        warnings=(*choice.warnings, warning + f": its ZeRO {zero} partitions are re-sharded first"),
        reshard=True,
    )
