"""Each simulated pod's file system as the Job gives it: the image's runtime, the run files mounted read-only.

On the cluster the image holds the runtime package in the working directory and the bundle's ConfigMap is mounted
read-only at ``<workdir>/run`` (bundle/runfiles.py). A dry-run pod gets the same layout under
``<work root>/pods/pod-<i>``: ``runtime`` is the work copy's (the image's content), ``run/`` holds a read-only copy of
the ConfigMap's data written from the work copy's ``run-files.yaml`` — the object itself, not the files beside it —
and the pod runs ``bash run/run.sh`` with the digest the work copy's Job carries, so the launcher's check of the
mounted files is the one a cluster pod makes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

from recipekit.bundle.files import JOB, RUN, RUN_FILES, RUN_FILES_CONFIGMAP, RUN_FILES_MOUNT, RUNTIME
from recipekit.bundle.runfiles import FILE_MODE, job_digest

#: The mount's directory inside a pod's root (``run`` of ``/workspace/run``).
MOUNT_DIR = RUN_FILES_MOUNT.rsplit("/", 1)[-1]


def pod_root(root: Path, index: int) -> Path:
    """Pod ``index``'s stand-in for the image's working directory."""
    return root / "pods" / f"pod-{index}"


def run_script(root: Path, index: int) -> Path:
    """What pod ``index`` starts: run.sh as mounted."""
    return pod_root(root, index) / MOUNT_DIR / RUN


def mount(bundle: Path, root: Path, index: int) -> str | None:
    """(Re)lay out pod ``index`` from the work copy ``bundle``: its runtime, and the ConfigMap's data as read-only
    files; return the digest the Job carries (None when it carries none)."""
    pod = pod_root(root, index)
    pod.mkdir(parents=True, exist_ok=True)
    runtime = pod / RUNTIME
    if not runtime.is_symlink():
        runtime.symlink_to(bundle / RUNTIME, target_is_directory=True)
    configmap = yaml.safe_load((bundle / RUN_FILES_CONFIGMAP).read_text(encoding="utf-8")) or {}
    data = configmap.get("data") or {}
    mounted = pod / MOUNT_DIR
    if mounted.exists():
        mounted.chmod(0o755)
        for entry in mounted.iterdir():
            entry.unlink()
    mounted.mkdir(exist_ok=True)
    for name in RUN_FILES:
        if name in data:
            path = mounted / name
            path.write_text(str(data[name]), encoding="utf-8")
            path.chmod(FILE_MODE)
    mounted.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    job = yaml.safe_load((bundle / JOB).read_text(encoding="utf-8")) or {}
    return job_digest(job)


def unmount(root: Path) -> None:
    """Make the pods' read-only mounts removable again (the next dry run clears the work directory)."""
    pods = root / "pods"
    if not pods.is_dir():
        return
    for pod in pods.iterdir():
        mounted = pod / MOUNT_DIR
        if mounted.is_dir() and not mounted.is_symlink():
            os.chmod(mounted, 0o755)
