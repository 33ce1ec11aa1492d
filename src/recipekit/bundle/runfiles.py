"""The run files beside the image: the ConfigMap that carries them, its mount, and the digest the Job carries.

Why a ConfigMap: it is namespaced like the Job, so the two travel together (``kubectl apply -k`` of the bundle:
its kustomization.yaml lists the ConfigMap first, so it exists before a pod of the Job is created); every pod
mounts it read-only, so no rank can change what another reads; a cluster admin reads it with
``kubectl get configmap``; and its 1 MiB limit is far above what four text files need (checked here, at build,
with the sizes). A Secret would hide plain configuration from the people who debug it, and a volume (PVC) would
need a copy step outside Kubernetes' own apply.

The image then holds one software stack (plan/identity.py's image tag); everything that differs between two
bundles of that stack is in these files, and the Job carries their digest (``runtime/boundary/runfiles.py``), which
the launcher checks before it reads any of them.
"""

from __future__ import annotations

import copy
from typing import Any

from recipekit.base.errors import Problem, RecipeError
from recipekit.bundle.files import RUN_FILES, RUN_FILES_CONFIGMAP, RUN_FILES_MOUNT
from recipekit.runtime.boundary import runfiles

#: Kubernetes refuses a ConfigMap whose data is larger than this (1 MiB).
CONFIGMAP_LIMIT_BYTES = 1 << 20
#: The pod volume the ConfigMap is mounted from.
VOLUME = "run-files"
#: Read-only for everyone: run.sh is started as ``bash run.sh``, so it needs no execute bit.
FILE_MODE = 0o444
#: The annotation on the ConfigMap that repeats the digest (what ``kubectl get -o yaml`` shows beside the data).
DIGEST_ANNOTATION = "recipekit.io/run-files-digest"


def configmap_name(job_name: str) -> str:
    """The ConfigMap's name: the Job's, so a rebuild of the same run (a rescale) replaces it."""
    return f"{job_name}-run-files"


def digest_of(files: dict[str, bytes]) -> str:
    """The digest of the run files among a bundle's ``files`` (the one the Job carries)."""
    return runfiles.digest(files)


def pod_volume(job_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's volume of the ConfigMap and the trainer's read-only mount of it."""
    volume = {"name": VOLUME, "configMap": {"name": configmap_name(job_name), "defaultMode": FILE_MODE}}
    mount = {"name": VOLUME, "mountPath": RUN_FILES_MOUNT, "readOnly": True}
    return volume, mount


def configmap(job_name: str, namespace: str, labels: dict[str, str], files: dict[str, bytes]) -> dict[str, Any]:
    """The ConfigMap of the run files among ``files`` (each UTF-8 text), annotated with their digest."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(job_name),
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": {DIGEST_ANNOTATION: runfiles.digest(files)},
        },
        "data": {name: files[name].decode("utf-8") for name in RUN_FILES if name in files},
    }


def with_digest(job: dict[str, Any], digest: str) -> dict[str, Any]:
    """The Job with the run files' digest in every container's environment (after what it sets already; one it had
    is replaced)."""
    job = copy.deepcopy(job)
    for task in job["spec"]["tasks"]:
        for container in task["template"]["spec"]["containers"]:
            kept = [e for e in container.get("env", []) if e.get("name") != runfiles.DIGEST_ENV]
            container["env"] = [*kept, {"name": runfiles.DIGEST_ENV, "value": digest}]
    return job


def job_digest(job: Any) -> str | None:
    """The run files' digest a Job carries (its first container that sets one), or None."""
    try:
        tasks = job["spec"]["tasks"]
        containers = [c for task in tasks for c in task["template"]["spec"]["containers"]]
    except (KeyError, TypeError):
        return None
    for container in containers:
        env = container.get("env") if isinstance(container, dict) else None
        for entry in env if isinstance(env, list) else []:
            if isinstance(entry, dict) and entry.get("name") == runfiles.DIGEST_ENV:
                value = entry.get("value")
                return value if isinstance(value, str) else None
    return None


def size_problem(files: dict[str, bytes], rendered: bytes) -> Problem | None:
    """The ConfigMap over Kubernetes' 1 MiB limit: one problem naming the sizes and the largest file."""
    if len(rendered) <= CONFIGMAP_LIMIT_BYTES:
        return None
    sizes = sorted(((len(files[n]), n) for n in RUN_FILES if n in files), reverse=True)
    largest = ", ".join(f"{name} {size} bytes" for size, name in sizes[:2])
    return Problem(
        RUN_FILES_CONFIGMAP,
        f"the run files come to {len(rendered)} bytes, over a ConfigMap's limit of {CONFIGMAP_LIMIT_BYTES} bytes "
        f"(1 MiB): {largest}",
        hint="shorten what the recipe writes into recipe.yaml (long hw.env values, data paths)",
    )


def check_size(files: dict[str, bytes], rendered: bytes) -> None:
    """Raise RecipeError when the ConfigMap cannot be applied (:func:`size_problem`)."""
    problem = size_problem(files, rendered)
    if problem is not None:
        raise RecipeError([problem])
