"""The run files' digest: what ties the files mounted into a pod to the Job that mounts them.

The image holds one software stack; the run's own files (recipe.yaml, launch.json, ds_config.json, run.sh) come
from a ConfigMap the bundle renders beside the Job, and the Job carries the digest of exactly that content in
:data:`DIGEST_ENV`. A ConfigMap edited by hand, or one left over from another build of the same Job name, would make
the pods train something other than what the Job (and validate, and the bundle's manifest) describe; the launcher
compares the mounted files with the digest before anything else and refuses to start (exit 2, one line).

Both sides compute the digest here (standard library only: shipped in every bundle and in the image).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from .filenames import DS_CONFIG_FILE, LAUNCH_FILE, RECIPE_FILE, RUN_SCRIPT

#: The run files, in the order the ConfigMap lists them (ds_config.json only when the bundle runs DeepSpeed).
RUN_FILE_NAMES = (DS_CONFIG_FILE, LAUNCH_FILE, RECIPE_FILE, RUN_SCRIPT)
#: The trainer container's variable that carries the digest of the run files the Job was rendered with.
DIGEST_ENV = "RECIPEKIT_RUN_FILES_DIGEST"
#: A run file is a few KiB; the ConfigMap holding them all is at most 1 MiB (Kubernetes' limit).
_MAX_FILE_BYTES = 1 << 20


def digest(files: Mapping[str, bytes]) -> str:
    """``sha256:<hex>`` of the run files among ``files``: each present name with the sha256 of its bytes, in name
    order, so a file edited, added or taken away changes it."""
    lines = "".join(
        f"{name}\0{hashlib.sha256(files[name]).hexdigest()}\n" for name in sorted(RUN_FILE_NAMES) if name in files
    )
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def read_mounted(directory: Path) -> dict[str, bytes]:
    """The run files present in ``directory`` (a ConfigMap mount: each key a link into its ``..data``), each read
    up to the ConfigMap's limit."""
    found: dict[str, bytes] = {}
    for name in RUN_FILE_NAMES:
        path = directory / name
        if path.is_file():
            with open(path, "rb") as handle:
                found[name] = handle.read(_MAX_FILE_BYTES + 1)
    return found


def mismatch(directory: Path, expected: str | None) -> str | None:
    """Why the run files in ``directory`` are not the ones the Job was rendered with, in one line; None when they
    are, or when no digest is expected (a bundle run by hand, outside a Job)."""
    if not expected:
        return None
    try:
        found = digest(read_mounted(directory))
    except OSError as exc:
        return f"cannot read the run files in {directory}: {exc.strerror or exc}"
    if found == expected:
        return None
    return (
        f"the run files in {directory} ({found[:19]}) differ from the digest the Job carries ({DIGEST_ENV}="
        f"{expected[:19]}): the ConfigMap was edited or belongs to another build; apply the bundle again "
        "(kubectl apply -k <the bundle>)"
    )
