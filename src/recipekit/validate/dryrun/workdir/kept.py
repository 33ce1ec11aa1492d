"""Where dry runs are kept: each in a work directory of its own, named by its run id and the time it started.

A dry run of ``bundles/x`` works in ``bundles/.dryrun/x/<run id>-<UTC time>/`` unless ``--workdir`` names one: the
next dry run of the same bundle does not replace it, so a killed-and-resumed run, its logs and its report stay to be
read (``recipekit report``, ``runs history``) after the next one. The newest :data:`KEEP` of a bundle are kept;
older ones are removed when a new one starts, and ``recipekit clean`` removes them on request. A directory a running
dry run (or pods it left) still holds is never removed: its lock (the marker file, :mod:`.locks`) says so.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from recipekit.validate.dryrun.workdir.locks import FileLock
from recipekit.validate.dryrun.workdir.podmount import unmount

#: The marker of a dry run's work directory (and its lock).
MARKER = ".recipekit-dryrun"
#: Dry runs of one bundle kept when a new one starts.
KEEP = 5
#: A kept dry run's name: its run id and the UTC time it started (a suffix where two start in one second).
_NAME = re.compile(r"[0-9a-z]+-\d{8}-\d{6}(-\d+)?")


def runs_dir(bundle_dir: Path) -> Path:
    """Where the dry runs of ``bundle_dir`` are kept: ``<its parent>/.dryrun/<its name>``."""
    resolved = bundle_dir.resolve()
    return resolved.parent / ".dryrun" / resolved.name


def new_workdir(bundle_dir: Path, run_id: str, now: float | None = None) -> Path:
    """A work directory for a new dry run of ``bundle_dir``: ``<run id>-<YYYYMMDD-HHMMSS>`` (UTC), not yet taken."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    base = runs_dir(bundle_dir) / f"{run_id or 'run'}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def kept_runs(directory: Path) -> list[Path]:
    """The dry-run work directories in ``directory``, oldest first (by the time in their names)."""
    try:
        entries = [p for p in directory.iterdir() if _NAME.fullmatch(p.name) and _is_workdir(p)]
    except OSError:
        return []
    return sorted(entries, key=_started)


def _started(path: Path) -> tuple[str, str, int]:
    """A kept dry run's start, to order by (its name is :data:`_NAME`'s): its UTC date and time, then its suffix
    (``-2``, ``-10``: in number order; none is the first)."""
    _, date, clock, *suffix = path.name.split("-")
    return date, clock, int(suffix[0]) if suffix else 1


def _is_workdir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and (path / MARKER).is_file()


@dataclass(frozen=True)
class Cleaned:
    removed: list[Path]
    busy: list[Path]  # held by a running dry run: left in place
    bytes_freed: int


def prune(directory: Path, keep: int) -> Cleaned:
    """Remove all but the newest ``keep`` dry runs in ``directory``, each only when no dry run holds it."""
    runs = kept_runs(directory)
    removed, busy, freed = [], [], 0
    for old in runs[: max(0, len(runs) - keep)]:
        size = remove_workdir(old)
        if size is None:
            busy.append(old)
        else:
            removed.append(old)
            freed += size
    return Cleaned(removed, busy, freed)


def remove_workdir(root: Path) -> int | None:
    """Delete the dry run's work directory ``root`` (the bytes it held), or None when a dry run holds it."""
    try:
        lock = FileLock.open(root / MARKER)
    except OSError:
        return None
    try:
        if not lock.try_lock():
            return None
        size = _size(root)
        unmount(root)  # the pods' run files were mounted read-only
        shutil.rmtree(root, ignore_errors=True)
        return size
    finally:
        lock.close()


def _size(root: Path) -> int:
    total = 0
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue
    return total
