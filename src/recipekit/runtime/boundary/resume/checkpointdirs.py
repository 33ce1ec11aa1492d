"""The ``checkpoint-N`` directories of a run's output: which are complete enough to resume from.

train.py's ``--resume auto``, its guards and recipekit's dry run judge a checkpoint by the same rules (standard
library only: shipped in every bundle).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import jsonfile
from ..filenames import CHECKPOINT_PREFIX, INCOMPLETE_MARKER, TRAINER_STATE_FILE, WEIGHT_FILES

#: The most digits a checkpoint's step may have in its name (2^63 has 19): a longer name is no checkpoint.
MAX_STEP_DIGITS = 18


def checkpoint_step(path: Path) -> int | None:
    """N of a ``checkpoint-N`` directory name, else None."""
    name = path.name
    if not name.startswith(CHECKPOINT_PREFIX):
        return None
    tail = name[len(CHECKPOINT_PREFIX) :]
    # ASCII digits only: str.isdigit() also takes '²' (which int() refuses) and other scripts' digits (which it takes)
    return int(tail) if 0 < len(tail) <= MAX_STEP_DIGITS and tail.isascii() and tail.isdigit() else None


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` cannot be resumed from, or None when it is complete.

    Complete means: the Trainer's state parses (it is written last, so an interrupted save lacks it or has it cut),
    no incompleteness marker, and at least one weights file, each of them whole: a safetensors file holds every
    byte its header points to, a sharded index names only shards that exist and are whole, a .bin is not empty.
    """
    try:
        jsonfile.read(path / TRAINER_STATE_FILE)
    except (OSError, ValueError):  # jsonfile's refusals (too big, too deep, not UTF-8) are ValueErrors
        return f"{TRAINER_STATE_FILE} missing, unreadable or not a regular file"
    if (path / INCOMPLETE_MARKER).exists():
        return "marked incomplete"
    weights = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
    if not weights:
        return "no model weights"
    for file in weights:
        problem = _weights_file_problem(file)
        if problem:
            return problem
    return None


def _weights_file_problem(file: Path) -> str | None:
    if file.name.endswith(".index.json"):
        try:
            shards = set(jsonfile.read(file)["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"{file.name} unreadable"
        for shard in sorted(str(s) for s in shards):
            if "/" in shard or shard.startswith(".") or shard.endswith(".json"):  # itself, another index, elsewhere
                return f"{file.name} names {shard!r} as a shard: not a weights file beside it"
            shard_path = file.parent / shard
            if not shard_path.is_file():
                return f"shard {shard} missing"
            problem = _weights_file_problem(shard_path)
            if problem:
                return problem
        return None
    if file.suffix == ".safetensors":
        return _safetensors_problem(file)
    return None if file.stat().st_size else f"{file.name} is empty"


#: safetensors' own bound on a header (100 MB): a larger one is refused unread.
SAFETENSORS_MAX_HEADER = 100_000_000


def _safetensors_problem(file: Path) -> str | None:
    """A safetensors file is complete when it holds its header and every byte the header points to."""
    size = file.stat().st_size
    header: Any = None
    header_len = 0
    try:
        with file.open("rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            if 8 + header_len <= size and header_len <= SAFETENSORS_MAX_HEADER:
                header = jsonfile.loads(handle.read(header_len), file.name)
    except (OSError, ValueError):
        header = None
    if not isinstance(header, dict):
        return f"{file.name} has a truncated header"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        return f"{file.name} has a malformed header"
    if 8 + header_len + end > size:
        return f"{file.name} truncated ({size} of {8 + header_len + end} bytes)"
    return None


def checkpoints(output_dir: Path) -> Iterator[tuple[int, Path, str | None]]:
    """(step, path, problem) of every ``checkpoint-N`` directory, newest first; problem None when complete."""
    found = []
    try:
        entries = list(Path(output_dir).iterdir())
    except OSError:
        return
    for path in entries:
        step = checkpoint_step(path)
        if step is not None and path.is_dir():
            found.append((step, path))
    for step, path in sorted(found, reverse=True):
        yield step, path, checkpoint_problem(path)


def latest_complete_checkpoint(output_dir: Path) -> Path | None:
    """The checkpoint ``--resume auto`` continues from: the newest complete one."""
    for _, path, problem in checkpoints(output_dir):
        if problem is None:
            return path
    return None
