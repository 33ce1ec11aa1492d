"""A restart the user asked for: from a chosen checkpoint, or fresh. ``recipekit restart`` writes the request,
train.py applies it to the run's output directory, once.

launch.json fixes ``--resume auto`` (the newest complete checkpoint), and the launcher refuses run files that differ
from the digest the Job carries, so a restart cannot be asked for by editing them. A Volcano Job cannot be changed
once created either; a restart is therefore a new Job, made from the bundle by a kustomize overlay that ``recipekit
restart`` writes: the bundle's objects as they are, the Job's trainer container with one more variable,
:data:`RESTART_ENV`, holding the request as JSON (``{"id": ..., "from": "checkpoint-N" | null}``). The run files and
their digest stay as built. The request names the checkpoint by its directory name only (never a path: it is looked
up in the run's own output directory) and carries an id, so that it is applied once.

A restart from ``checkpoint-N`` makes every newer checkpoint another history: left where it is, the next ``--resume
auto`` (a pod that fails later, and Volcano's RestartJob) would continue from the old history's newest checkpoint,
and the Trainer would save the new history's checkpoints over the old ones' names. So applying a request sets the
newer checkpoints aside (all of them for a fresh start) into ``recipekit-superseded/<request id>/`` — moved, never
deleted — and lowers the run's resume mark to step N (volume/resume.py: the rollback guard would otherwise refuse
the next resume as a rollback). Then the request's id goes into :data:`APPLIED_FILE`, sealed with the run key, and
the request is done: the Job keeps the variable for its life, but a later start finds the id there and resumes as
always.

Every rank reads the same answer before the process group forms (:func:`pending`, :func:`resume_argument`); rank 0
applies the request once the group has formed (:func:`apply`), so no rank can still be choosing while the
checkpoints move. A start that fails before that leaves the request pending: the next one applies it again.
Standard library only: shipped in every bundle, and ``recipekit restart`` writes requests with it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..boundary import jsonfile
from ..boundary.filenames import CHECKPOINT_PREFIX
from ..boundary.resume.checkpointdirs import MAX_STEP_DIGITS
from . import resume, trust

#: The trainer container's variable that carries a restart request (set by the overlay ``recipekit restart`` writes).
RESTART_ENV = "RECIPEKIT_RESTART"
#: A request is a few dozen bytes; a longer value is refused unread.
MAX_BYTES = 1024
#: What ``recipekit restart --fresh`` and the dry run's ``--restart fresh`` say.
FRESH = "fresh"
_ID = re.compile(r"[0-9a-f]{8,32}")
_CHECKPOINT = re.compile(rf"{re.escape(CHECKPOINT_PREFIX)}[1-9][0-9]{{0,{MAX_STEP_DIGITS - 1}}}")


@dataclass(frozen=True)
class RestartRequest:
    """Restart from ``start_from`` (a ``checkpoint-N`` name), or fresh (None); ``id`` tells one request from another."""

    id: str
    start_from: str | None

    @property
    def label(self) -> str:
        return self.start_from or FRESH

    @property
    def step(self) -> int:
        """The step the restart continues after (0: fresh)."""
        return int(self.start_from[len(CHECKPOINT_PREFIX) :]) if self.start_from else 0

    def to_env(self) -> str:
        return json.dumps({"id": self.id, "from": self.start_from}, sort_keys=True)


def choice(text: str) -> str | None:
    """``checkpoint-N`` (returned) or ``fresh`` (None); ValueError saying what is allowed otherwise."""
    if text == FRESH:
        return None
    if not _CHECKPOINT.fullmatch(text):
        raise ValueError(
            f"{text!r}: a checkpoint's directory name ({CHECKPOINT_PREFIX}N, N a step of at most {MAX_STEP_DIGITS} "
            f"ASCII digits, no path) or {FRESH!r}"
        )
    return text


def new_request(start_from: str | None) -> RestartRequest:
    """A request with a new random id."""
    return RestartRequest(secrets.token_hex(6), start_from)


def parse(text: str) -> RestartRequest:
    """The request in ``text`` (the variable's value); ValueError naming what is wrong with it."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise ValueError(f"longer than {MAX_BYTES} bytes")
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(data, dict) or set(data) != {"id", "from"}:
        raise ValueError('not {"id": ..., "from": ...}')
    request_id, start_from = data["id"], data["from"]
    if not isinstance(request_id, str) or not _ID.fullmatch(request_id):
        raise ValueError("its id is not 8 to 32 lower-case hex digits")
    if start_from is not None and not (isinstance(start_from, str) and _CHECKPOINT.fullmatch(start_from)):
        raise ValueError(f"its from is not null or {CHECKPOINT_PREFIX}N")
    return RestartRequest(request_id, start_from)


def from_environ(environ: Mapping[str, str]) -> RestartRequest | None:
    """The request the pod was started with, or None; ValueError for a value that is not one."""
    text = environ.get(RESTART_ENV)
    return parse(text) if text else None


# ------------------------------------------------------------------------------------------- applying a request
#: In the output directory: the restart requests this run applied, sealed with the run key.
APPLIED_FILE = "recipekit-restarts.json"
#: In the output directory: the checkpoints each applied request set aside, under its id.
SUPERSEDED_DIR = "recipekit-superseded"
#: The applied ids kept (a run restarted more often than this forgets its oldest requests).
MAX_APPLIED = 256
APPLIED_MAX_BYTES = 64 << 10


class RestartRefused(Exception):
    """A restart request this run cannot apply, said in one line (train.py exits with the user-error code)."""


def applied_ids(output_dir: Path, run_id: str, key: bytes) -> list[str]:
    """The requests this run applied, as its sealed record says (empty: none, or a record that does not verify)."""
    try:
        record = jsonfile.read(Path(output_dir) / APPLIED_FILE, APPLIED_MAX_BYTES, within=Path(output_dir))
    except (OSError, ValueError):
        return []
    if not isinstance(record, dict) or trust.seal_problem(record, key) is not None or record.get("run_id") != run_id:
        return []
    ids = record.get("applied")
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []


def pending(
    output_dir: Path, run_id: str, key: bytes | None, environ: Mapping[str, str] | None = None
) -> RestartRequest | None:
    """The request this start must apply: the pod's :data:`RESTART_ENV`, unless this run applied it already."""
    try:
        request = from_environ(os.environ if environ is None else environ)
    except ValueError as exc:
        raise RestartRefused(
            f"{RESTART_ENV} is not a restart request ({exc}): write one with `recipekit restart`"
        ) from None
    if request is None:
        return None
    if key is None:
        raise RestartRefused(
            f"restart {request.id} needs the run key to record that it was applied ({trust.KEY_ENV} is unset; the "
            "Job mounts it from its Secret, docs/trust.md): without it every later start would apply it again"
        )
    return None if request.id in applied_ids(output_dir, run_id, key) else request


def resume_argument(output_dir: Path, request: RestartRequest) -> str:
    """What train.py's ``--resume`` becomes for ``request``: ``none``, or the named checkpoint's path (it must be in
    the output directory; the resume then proves it as it proves any checkpoint)."""
    if request.start_from is None:
        return "none"
    path = Path(output_dir) / request.start_from
    if not os.path.isdir(path) or os.path.islink(path):
        there = sorted(step for step, _ in resume.candidates(Path(output_dir)))
        raise RestartRefused(
            f"restart {request.id} asks for {request.start_from}, which is not in {output_dir} (checkpoints there: "
            f"{', '.join(f'checkpoint-{s}' for s in there) or 'none'}); write a new request naming one of them with "
            "`recipekit restart BUNDLE --from checkpoint-N`"
        )
    return str(path)


def apply(output_dir: Path, run_id: str, key: bytes, request: RestartRequest) -> list[str]:
    """Rank 0, once every rank has chosen: set the newer checkpoints aside (all of them when fresh), lower the resume
    mark, record the request as applied. Returns the names set aside."""
    output_dir = Path(output_dir)
    aside = output_dir / SUPERSEDED_DIR / request.id
    moved = []
    for step, path in sorted(resume.candidates(output_dir)):
        if step > request.step:
            aside.mkdir(parents=True, exist_ok=True)
            os.replace(path, aside / path.name)  # a rename: a link is moved as the link it is
            moved.append(path.name)
    resume.reset_mark(output_dir, run_id, request.step or None, key)
    ids = [i for i in applied_ids(output_dir, run_id, key) if i != request.id][-(MAX_APPLIED - 1) :] + [request.id]
    target = output_dir / APPLIED_FILE
    staging = target.with_name(f"{APPLIED_FILE}.tmp-{os.getpid()}")
    staging.write_text(json.dumps(trust.seal({"run_id": run_id, "applied": ids}, key)) + "\n", encoding="utf-8")
    os.replace(staging, target)
    return moved
