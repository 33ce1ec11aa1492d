"""The run files' digest: what ties the files mounted into a pod to the Job that mounts them.

The image holds one software stack; the run's own files (recipe.yaml, launch.json, ds_config.json, run.sh) come
from a ConfigMap the bundle renders beside the Job, and the Job carries the digest of exactly that content in
:data:`DIGEST_ENV`. A ConfigMap edited by hand, or one left over from another build of the same Job name, would make
the pods train something other than what the Job (and validate, and the bundle's manifest) describe. The pod's
command is the image's own launcher (runtime/launch.py), which reads the mounted files once, compares them with the
digest before any of them is used, and refuses to start (exit 2, one line) when they differ or when the Job carries
no digest at all; what the pod then runs is the copy it checked (:func:`verified`), never the mount again.

Both sides compute the digest here (standard library only: shipped in every bundle and in the image).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from .filenames import DS_CONFIG_FILE, LAUNCH_FILE, RECIPE_FILE, RUN_SCRIPT

#: The run files, in the order the ConfigMap lists them (ds_config.json only when the bundle runs DeepSpeed).
RUN_FILE_NAMES = (DS_CONFIG_FILE, LAUNCH_FILE, RECIPE_FILE, RUN_SCRIPT)
#: The trainer container's variable that carries the digest of the run files the Job was rendered with.
DIGEST_ENV = "RECIPEKIT_RUN_FILES_DIGEST"
#: A run file is a few KiB; the ConfigMap holding them all is at most 1 MiB (Kubernetes' limit).
_MAX_FILE_BYTES = 1 << 20
#: How much of a digest a refusal quotes (``sha256:`` and 12 hex digits).
_QUOTED = 19


class RunFilesRefused(Exception):
    """The mounted run files are not the Job's (or the Job names none): the reason, in one line."""


def digest(files: Mapping[str, bytes]) -> str:
    """``sha256:<hex>`` of the run files among ``files``: each present name with the sha256 of its bytes, in name
    order, so a file edited, added or taken away changes it."""
    lines = "".join(
        f"{name}\0{hashlib.sha256(files[name]).hexdigest()}\n" for name in sorted(RUN_FILE_NAMES) if name in files
    )
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def read_mounted(directory: Path) -> dict[str, bytes]:
    """The run files present in ``directory`` (a ConfigMap mount: each key a link into its ``..data``), each read
    once, up to the ConfigMap's limit. A name that is there but no regular file (a FIFO, a device, a directory) is an
    ``OSError``: opened without blocking, checked on the opened file."""
    found: dict[str, bytes] = {}
    for name in RUN_FILE_NAMES:
        path = Path(directory) / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            continue
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise OSError(f"{path} is not a regular file")
            found[name] = handle.read(_MAX_FILE_BYTES + 1)
    return found


def printable(value: str, most: int = _QUOTED) -> str:
    """At most ``most`` characters of ``value`` with every control character written as an escape: a variable the
    refusal quotes never reaches the log as a terminal sequence."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value[:most])


def verified(directory: Path, expected: str | None) -> dict[str, bytes]:
    """The run files in ``directory``, read once, when their digest is ``expected`` (the Job's :data:`DIGEST_ENV`);
    :class:`RunFilesRefused` with the reason otherwise, an absent or empty ``expected`` included: a pod whose Job
    carries no digest has nothing to check its files against, and is refused rather than trusted."""
    if not expected:
        raise RunFilesRefused(
            f"{DIGEST_ENV} is not set: the Job carries the digest of its run files, and without it the files in "
            f"{directory} cannot be checked; apply the bundle as built (kubectl apply -k <the bundle>)"
        )
    try:
        files = read_mounted(directory)
    except OSError as exc:
        raise RunFilesRefused(f"cannot read the run files in {directory}: {exc.strerror or exc}") from None
    found = digest(files)
    if found != expected:
        raise RunFilesRefused(
            f"the run files in {directory} ({found[:_QUOTED]}) differ from the digest the Job carries ({DIGEST_ENV}="
            f"{printable(expected)}): the ConfigMap was edited or belongs to another build; apply the bundle again "
            "(kubectl apply -k <the bundle>)"
        )
    return files
