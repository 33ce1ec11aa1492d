"""Each simulated pod's file system as the Job gives it: the image's runtime, the run files mounted read-only.

On the cluster the image holds the runtime package in the working directory and the bundle's ConfigMap is mounted
read-only at ``<workdir>/run`` (bundle/runfiles.py). A dry-run pod gets the same layout under
``<work root>/pods/pod-<i>``: ``runtime`` is the work copy's (the image's content), ``run/`` holds a read-only copy of
the ConfigMap's data written from the work copy's ``run-files.yaml`` — the object itself, not the files beside it —
and the pod runs the Job's own container command (the image's launcher, ``python3 -m runtime.launch
run/launch.json``, its paths in the image's working directory read as the pod's root) with the digest the work
copy's Job carries, so the launcher's check of the mounted files is the one a cluster pod makes.

The pods' directories are the dry run's own, but a work directory is reused: :func:`unmount` opens each entry it
makes writable again without following a link, so a link planted at ``pods/pod-0`` is never chmodded through.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

from recipekit.bundle.files import (
    JOB,
    POD_COMMAND,
    RUN,
    RUN_FILES,
    RUN_FILES_CONFIGMAP,
    RUN_FILES_MOUNT,
    RUNTIME,
    WORKDIR,
)
from recipekit.bundle.runfiles import FILE_MODE, job_digest

#: The mount's directory inside a pod's root (``run`` of ``/workspace/run``).
MOUNT_DIR = RUN_FILES_MOUNT.rsplit("/", 1)[-1]


def pod_root(root: Path, index: int, task: str | None = None) -> Path:
    """Pod ``index``'s stand-in for the image's working directory (of the training task, or of task ``task``)."""
    return root / "pods" / (f"pod-{index}" if task is None else f"{task}-{index}")


def run_script(root: Path, index: int) -> Path:
    """run.sh as mounted in pod ``index`` (what a person would start by hand there; the pod's command is
    :func:`pod_command`)."""
    return pod_root(root, index) / MOUNT_DIR / RUN


def pod_command(bundle: Path, root: Path, index: int, task: str | None = None) -> list[str]:
    """What pod ``index`` of the training task (or of the Job's task named ``task``) starts: the work copy's Job's
    container command (the image's launcher where the Job sets none) and its arguments, each inside the image's
    working directory mapped to the pod's root."""
    try:
        job = yaml.safe_load((bundle / JOB).read_text(encoding="utf-8")) or {}
        tasks = job["spec"]["tasks"]
        chosen = tasks[0] if task is None else next(t for t in tasks if t["name"] == task)
        container = chosen["template"]["spec"]["containers"][0]
        command = [str(word) for word in [*(container.get("command") or POD_COMMAND), *(container.get("args") or [])]]
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError, AttributeError, StopIteration):
        command = list(POD_COMMAND)
    pod = pod_root(root, index, task)
    return [str(pod / word[len(WORKDIR) + 1 :]) if word.startswith(WORKDIR + "/") else word for word in command]


def mount(bundle: Path, root: Path, index: int, task: str | None = None) -> str | None:
    """(Re)lay out pod ``index`` (of the training task, or of task ``task``) from the work copy ``bundle``: its
    runtime, and the ConfigMap's data as read-only files; return the digest the Job carries (None when it carries
    none)."""
    pod = pod_root(root, index, task)
    pod.mkdir(parents=True, exist_ok=True)
    for path in (pod.parent, pod, pod / MOUNT_DIR):
        if path.is_symlink():
            raise OSError(f"{path} is a link: the dry run lays out its pods itself (remove it)")
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
    """Make the pods' read-only mounts removable again (the next dry run clears the work directory). Every entry is
    opened without following a link (``pods``, each ``pod-<i>``, its ``run``) and changed through its descriptor: a
    link planted in a used work directory is left as it is, and nothing it points to is touched."""
    try:
        pods = os.open(root / "pods", _DIRECTORY)
    except OSError:
        return
    try:
        for name in os.listdir(pods):
            try:
                pod = os.open(name, _DIRECTORY, dir_fd=pods)
            except OSError:
                continue  # a link, a file: not a pod this module laid out
            try:
                mounted = os.open(MOUNT_DIR, _DIRECTORY, dir_fd=pod)
            except OSError:
                continue
            finally:
                os.close(pod)
            try:
                os.fchmod(mounted, 0o755)
            finally:
                os.close(mounted)
    finally:
        os.close(pods)


#: A directory opened to be changed through its descriptor, never through a link.
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
