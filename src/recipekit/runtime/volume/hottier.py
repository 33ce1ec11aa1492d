"""The checkpoints' hot tier: saved to node-local storage, drained to the shared volume in the background.

Why this and not an asynchronous writer of the stack (docs/operations.md says it at length): the Trainer saves a
checkpoint through several writers — its own (weights, trainer state, rng, scheduler) and DeepSpeed's engine (the
ZeRO partitions) — and recipekit signs the finished directory. DeepSpeed's decoupled checkpoint engine covers only
DeepSpeed's own files, needs its async-IO op (libaio) and commits at the *next* step, after the Trainer's ``on_save``
would have signed a half-written directory; Nebula is a service of Azure; ``torch.distributed.checkpoint.async_save``
needs state dicts the Trainer does not build for a DeepSpeed engine. So the Trainer's own save path stays as it is,
pointed at a fast local disk (its output for checkpoints only), and the slow part — the shared volume — happens in a
thread that copies plain files: no collective, no tensor, nothing of the training stack.

One drain per pod (the pod's local rank 0 drains the files its node wrote):

* one pod: the thread hashes the hot copy, signs its record with the run key (volume/trust.py; the hot copy is now a
  checkpoint a restart may resume), copies it to ``.drain-checkpoint-N`` on the shared volume and renames that to
  ``checkpoint-N`` (a reader never sees half of it), then applies each tier's retention;
* several pods: each copies its node's files into the same staging directory and leaves a marker; global rank 0's
  thread waits for every pod's marker, signs the union and renames it. A pod's hot copy holds only its node's
  partitions, so it is never signed and never resumed (:func:`choose` considers the hot tier on one pod only).

Standard library only, like the rest of the runtime.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..boundary import filenames
from ..boundary.recipeview import HotCheckpointsView
from ..boundary.resume import resumechoice
from . import trust
from .resume import RECORD_EXCLUDED, candidates
from .resume import choose as choose_in

LOG = logging.getLogger("recipekit.hottier")

#: The pod's environment may move the hot tier (the dry run's pods share one host, each is its own "node").
HOT_DIR_ENV = "RECIPEKIT_HOT_DIR"
#: On the shared volume: a checkpoint being drained (never a ``checkpoint-N`` name, so never a resume candidate).
STAGING_PREFIX = ".drain-"
#: In the staging directory: pod R copied its files (several pods only).
MARKER = ".pod-{}.drained"
#: TESTING ONLY: the drain of this step signs the hot copy and stops there, as a pod killed before its copy reached
#: the shared volume would (the dry run's proof that a restart resumes the newer hot copy).
HOLD_DRAIN_ENV = "RECIPEKIT_TESTING_HOLD_DRAIN_AT_STEP"
#: How long global rank 0's drain waits for the other pods' files before it gives that checkpoint up.
GATHER_TIMEOUT_S = 3600.0
_POLL_S = 0.2
_CHUNK = 1 << 20


@dataclass(frozen=True)
class HotTier:
    """Where this pod's hot tier is and how many checkpoints it keeps."""

    directory: Path
    keep: int
    medium: str


def hot_tier(view: HotCheckpointsView | None, job: str, environ: Mapping[str, str] | None = None) -> HotTier | None:
    """The hot tier recipe.yaml asks for (None: checkpoints go straight to the shared volume): a directory of this
    Job's pod under the mount, so that two Jobs, or two pods of one Job, placed on one node never share one."""
    if view is None or view.medium == "none":
        return None
    env = os.environ if environ is None else environ
    pod = PodPlace.from_env(env).pod
    return HotTier(Path(env.get(HOT_DIR_ENV) or view.mount_path) / job / f"pod-{pod}", view.keep, view.medium)


@dataclass(frozen=True)
class PodPlace:
    """This process's place among the pods: which pod, of how many, and whether it drains (local rank 0) and signs
    (global rank 0)."""

    pod: int
    pods: int
    drains: bool
    signs: bool

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PodPlace:
        env = os.environ if environ is None else environ
        world, local_world = _number(env, "WORLD_SIZE", 1), _number(env, "LOCAL_WORLD_SIZE", 1)
        pod = next((int(env[k]) for k in ("GROUP_RANK", "VC_TASK_INDEX", "NODE_RANK") if env.get(k, "").isdigit()), 0)
        pods = max(1, world // max(1, local_world))
        return cls(pod, pods, _number(env, "LOCAL_RANK", 0) == 0, _number(env, "RANK", 0) == 0)


def _number(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "")
    return int(value) if value.isdigit() else default


# ----------------------------------------------------------------------------------------------------- copying
def copy_tree(source: Path, target: Path) -> int:
    """Copy every regular file under ``source`` into ``target`` (created), returning the bytes copied. A link or
    special file in ``source`` is an :class:`trust.Untrusted` error; no write follows a link in ``target``: each file
    is written under a name of this process's and renamed into place."""
    total = 0
    for relative, path in sorted(trust.regular_files(source, frozenset()).items()):
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging = destination.with_name(f"{destination.name}.tmp-{os.getpid()}")
        flags = os.O_RDONLY | os.O_NOFOLLOW
        with os.fdopen(os.open(path, flags), "rb") as reader:
            fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as writer:
                for block in iter(lambda: reader.read(_CHUNK), b""):
                    writer.write(block)
                    total += len(block)
        os.replace(staging, destination)
    return total


def remove_tree(path: Path) -> None:
    """Remove a directory this run wrote; a link there is unlinked, never followed."""
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def retain(directory: Path, keep: int, spare: Path | None = None) -> list[str]:
    """Remove every ``checkpoint-N`` of ``directory`` but the newest ``keep`` (and ``spare``: the checkpoint being
    drained or resumed), returning the names removed."""
    removed = []
    for step_path in [p for _, p in candidates(directory)][keep:]:
        if spare is not None and step_path.name == spare.name:
            continue
        remove_tree(step_path)
        removed.append(step_path.name)
    return removed


# ------------------------------------------------------------------------------------------------------ draining
@dataclass(frozen=True)
class Drained:
    """One checkpoint on the shared volume: its step, seconds from the hand-over to the rename, bytes copied."""

    step: int
    seconds: float
    bytes: int


def staging_dir(shared_dir: Path, step: int) -> Path:
    return Path(shared_dir) / f"{STAGING_PREFIX}{filenames.CHECKPOINT_PREFIX}{step}"


def drain_one(
    tier: HotTier,
    shared_dir: Path,
    step: int,
    place: PodPlace,
    record: dict[str, Any],
    key: bytes | None,
    shared_keep: int,
) -> Drained | None:
    """Drain ``checkpoint-<step>`` of this pod's hot tier to the shared volume (see the module's docstring);
    returns what global rank 0 renamed into place (None on the other pods)."""
    started = time.monotonic()
    name = f"{filenames.CHECKPOINT_PREFIX}{step}"
    source, staging = tier.directory / name, staging_dir(shared_dir, step)
    if place.pods == 1:
        signed = _sign(source, {**record, "step": step}, key)
        resumechoice.write_run_record(source, signed)  # the hot copy is resumable from here on
        if os.environ.get(HOLD_DRAIN_ENV) == str(step):
            LOG.warning("TESTING: checkpoint-%d signed in the hot tier and not drained (%s)", step, HOLD_DRAIN_ENV)
            return None
        remove_tree(staging)
        copied = copy_tree(source, staging)
    else:
        copied = copy_tree(source, staging)
        (staging / MARKER.format(place.pod)).touch()
        if place.signs:
            _gather(staging, place.pods, step)
            resumechoice.write_run_record(staging, _sign(staging, {**record, "step": step}, key))
    retain(tier.directory, tier.keep, spare=source)
    if not place.signs:
        return None
    target = Path(shared_dir) / name
    remove_tree(target)  # the same step saved again (a restart that resumed from before it)
    os.rename(staging, target)
    retain(Path(shared_dir), shared_keep)
    return Drained(step, time.monotonic() - started, copied)


def _sign(directory: Path, record: dict[str, Any], key: bytes | None) -> dict[str, Any]:
    """``record`` signed over every file of ``directory`` (unsigned without a run key: never resumed)."""
    return record if key is None else trust.sign(record, key, trust.digests(directory, RECORD_EXCLUDED))


def _gather(staging: Path, pods: int, step: int, timeout_s: float = GATHER_TIMEOUT_S) -> None:
    """Wait until every pod has copied its files into ``staging``, then remove the markers."""
    markers = [staging / MARKER.format(pod) for pod in range(pods)]
    deadline = time.monotonic() + timeout_s
    while not all(marker.exists() for marker in markers):
        if time.monotonic() > deadline:
            missing = [m.name for m in markers if not m.exists()]
            raise OSError(f"checkpoint-{step}: {len(missing)} pod(s) did not drain within {timeout_s:.0f} s")
        time.sleep(_POLL_S)
    for marker in markers:
        marker.unlink()


class Drainer:
    """The background drain of one pod: one checkpoint at a time, in a daemon thread.

    :meth:`submit` hands a saved checkpoint over; it first waits for the previous one (a volume slower than the save
    interval shows as blocking time, not as an ever longer queue). :meth:`wait` returns the seconds it waited.
    ``done`` is called in the thread with each :class:`Drained` of global rank 0; a failure is logged and kept in
    :attr:`failures` (the checkpoint stays in the hot tier; the next one is drained as usual).
    """

    def __init__(
        self,
        tier: HotTier,
        shared_dir: Path,
        place: PodPlace,
        record: dict[str, Any],
        key: bytes | None,
        shared_keep: int,
        done: Callable[[Drained], None] | None = None,
    ):
        self.tier, self.shared_dir, self.place = tier, Path(shared_dir), place
        self.record, self.key, self.shared_keep, self.done = record, key, shared_keep, done
        self.failures: list[str] = []
        self._thread: threading.Thread | None = None

    def submit(self, step: int) -> float:
        waited = self.wait()
        self._thread = threading.Thread(target=self._drain, args=(step,), name=f"drain-{step}", daemon=True)
        self._thread.start()
        return waited

    def wait(self) -> float:
        started = time.monotonic()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return time.monotonic() - started

    def _drain(self, step: int) -> None:
        try:
            drained = drain_one(self.tier, self.shared_dir, step, self.place, self.record, self.key, self.shared_keep)
        except (OSError, trust.Untrusted) as exc:
            message = f"checkpoint-{step} was not drained to {self.shared_dir}: {exc}"
            LOG.error("%s (it stays in the hot tier %s)", message, self.tier.directory)
            self.failures.append(message)
            return
        if drained is not None:
            LOG.info("checkpoint-%d drained to the shared volume in %.1f s", step, drained.seconds)
            if self.done is not None:
                self.done(drained)


# ------------------------------------------------------------------------------------------------------ resuming
def choose(
    tier: HotTier | None,
    shared_dir: Path,
    run_id: str,
    resume: str,
    layout: resumechoice.WorldLayout | None,
    key: bytes | None,
    pods: int,
) -> resumechoice.ResumeChoice:
    """The checkpoint to resume: the shared volume's choice (volume/resume.py), or the hot tier's when that one is
    newer and proves itself the same way (signed by this run, every digest, its step; rollback judged against the
    shared volume's mark). The hot tier counts on one pod only, where it holds every rank's files; a hot copy that
    does not prove itself is passed over with its reason (the shared volume still has the run)."""
    shared = choose_in(shared_dir, run_id, resume, layout, key)
    if tier is None or resume != "auto" or pods != 1 or not tier.directory.is_dir():
        return shared
    try:
        hot = choose_in(tier.directory, run_id, resume, layout, key, mark_dir=shared_dir, unsigned_passed_over=True)
    except (resumechoice.ResumeRefused, trust.Untrusted) as exc:
        return replace(shared, skipped=(*shared.skipped, ("hot tier", str(exc))))
    passed = tuple((f"{name} (hot tier)", why) for name, why in hot.skipped)
    if hot.path is None or (shared.step is not None and (hot.step or 0) <= shared.step):
        # equal steps: the shared volume's copy (complete on every pod, and where the run's files are)
        return replace(shared, skipped=passed + shared.skipped)
    return replace(hot, skipped=passed + shared.skipped)
