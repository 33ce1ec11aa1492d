"""Which paths a pod can see: the one rule ``build`` (through the plan) and ``validate`` (on a built Job) share.

A model or data path on no volume of the pod names a file the pods never mount: the admin puts the model there
and the run fails at start-up. Relative paths and hub ids (``meta-llama/Meta-Llama-3-8B``) are not file paths of
the pod and are left alone; ``/workspace`` is the image's own directory (the bundle's files).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: The recipe keys that name a file the pods read, besides the output and prepared directories.
INPUT_PATH_KEYS = ("model.name_or_path", "data.path")
#: The image's working directory: inside every pod without a volume.
IMAGE_DIR = "/workspace"


def under(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it (``/mnt/shared2`` is not below ``/mnt/shared``)."""
    return (path.rstrip("/") + "/").startswith(root.rstrip("/") + "/")


def off_volumes(paths: Mapping[str, str], mounts: Iterable[str]) -> list[tuple[str, str]]:
    """(key, path) for each absolute path of ``paths`` under none of ``mounts`` (nor the image's directory)."""
    roots = [*mounts, IMAGE_DIR]
    return [(k, path) for k, path in paths.items() if path.startswith("/") and not any(under(path, r) for r in roots)]
