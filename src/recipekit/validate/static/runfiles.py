"""The run files beside the image: the bundle's ConfigMap, its mount into every pod, and the digest the Job carries.

The image holds the software stack only; what the pods run comes from ``run-files.yaml`` (bundle/runfiles.py). Three
things must hold for a pod to start from the files this bundle describes, and each is checked here:

* **the object**: a ``v1 ConfigMap`` the API server accepts (kubernetes-validate's strict schema, as the pod template
  is checked), in the Job's namespace, within Kubernetes' 1 MiB, holding exactly the bundle's run files, byte for byte;
* **the mount**: every task's pods declare a volume of that ConfigMap and the trainer mounts it read-only where the
  Job's command, the image's own launcher (``python3 -m runtime.launch``, from the image's working directory),
  reads it: a command that starts anything of the ConfigMap (run.sh) would run it before the launcher checks it;
* **the digest**: the ConfigMap's annotation and the trainer's ``RECIPEKIT_RUN_FILES_DIGEST`` are the digest of the
  bundle's run files, which the launcher compares with what it finds mounted (it refuses to start otherwise).
"""

from __future__ import annotations

from typing import Any

import yaml

from recipekit.base import yamlfile
from recipekit.bundle.files import JOB, POD_COMMAND, RUN_FILES, RUN_FILES_CONFIGMAP, RUN_FILES_MOUNT, WORKDIR
from recipekit.bundle.runfiles import CONFIGMAP_LIMIT_BYTES, DIGEST_ANNOTATION, configmap_name
from recipekit.runtime.boundary import runfiles
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Finding, Result, Status
from recipekit.validate.static.toolpackages import install_hint
from recipekit.validate.static.volcano import KUBERNETES_VERSION

FILE = RUN_FILES_CONFIGMAP


def check_run_files(bundle: Bundle) -> Result:
    result = Result(
        "runfiles.configmap",
        f"run files: a valid v1 ConfigMap (Kubernetes {KUBERNETES_VERSION}), mounted read-only, digest in the Job",
    )
    raw = bundle.raw.get(FILE)
    if raw is None:
        result.fail(FILE, "", "missing: the pods mount the run files from it", hint="rebuild the bundle")
        return result
    try:
        configmap = yamlfile.load(raw.decode("utf-8", errors="replace"), FILE)
    except yaml.YAMLError:
        return result.skip(f"{FILE} does not parse (files.parse says why)")
    if not isinstance(configmap, dict):
        result.fail(FILE, "", "must be a YAML mapping (one ConfigMap document)")
        return result
    expected = runfiles.digest(bundle.raw)
    result.fail_all(object_findings(configmap, raw, bundle))
    result.fail_all(digest_findings(configmap, bundle.job, expected))
    if isinstance(bundle.job, dict):
        result.fail_all(mount_findings(bundle.job, configmap))
    if result.status is Status.PASS:
        result.reason = f"{len(raw)} of {CONFIGMAP_LIMIT_BYTES} bytes; mounted read-only at {RUN_FILES_MOUNT}"
    return result


def object_findings(configmap: dict[str, Any], raw: bytes, bundle: Bundle) -> list[Finding]:
    """The ConfigMap as the API server takes it, and its data as the bundle's run files."""
    out = schema_findings(configmap)
    if len(raw) > CONFIGMAP_LIMIT_BYTES:
        out.append(Finding(FILE, "", f"{len(raw)} bytes, over a ConfigMap's limit of {CONFIGMAP_LIMIT_BYTES} (1 MiB)"))
    found = configmap.get("data")
    data: dict[str, Any] = found if isinstance(found, dict) else {}
    for name in RUN_FILES:
        have, want = data.get(name), bundle.raw.get(name)
        if want is None and have is not None:
            out.append(Finding(FILE, f"data.{name}", "the bundle has no such run file"))
        elif want is not None and (not isinstance(have, str) or have.encode("utf-8") != want):
            what = "missing" if have is None else f"differs from the bundle's {name}"
            out.append(Finding(FILE, f"data.{name}", what, hint="rebuild the bundle instead of editing either"))
    for name in sorted(set(data) - set(RUN_FILES)):
        out.append(Finding(FILE, f"data.{name}", "not a run file", hint=f"run files: {', '.join(RUN_FILES)}"))
    namespace = ((bundle.job or {}).get("metadata") or {}).get("namespace")
    if namespace and (configmap.get("metadata") or {}).get("namespace") != namespace:
        out.append(Finding(FILE, "metadata.namespace", f"not the Job's namespace {namespace!r}: no pod could mount it"))
    return out


def schema_findings(configmap: dict[str, Any]) -> list[Finding]:
    """kubernetes-validate's strict v1 ConfigMap schema (the first error it finds)."""
    try:
        import kubernetes_validate
    except ImportError:
        return [Finding(FILE, "", f"kubernetes-validate is not installed ({install_hint('volcano.pod-template')})")]
    if configmap.get("kind") != "ConfigMap" or configmap.get("apiVersion") != "v1":
        return [Finding(FILE, "kind", "must be apiVersion v1, kind ConfigMap")]
    try:
        kubernetes_validate.validate(configmap, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        field = ".".join(str(p) for p in exc.absolute_path)
        return [Finding(FILE, field, exc.message if len(exc.message) <= 240 else exc.message[:237] + "...")]
    return []


def digest_findings(configmap: dict[str, Any], job: Any, expected: str) -> list[Finding]:
    """The ConfigMap's annotation and every container's digest variable are the digest of the bundle's run files."""
    out = []
    annotations = (configmap.get("metadata") or {}).get("annotations") or {}
    if annotations.get(DIGEST_ANNOTATION) != expected:
        out.append(Finding(FILE, f"metadata.annotations.{DIGEST_ANNOTATION}", f"not the run files' digest {expected}"))
    for where, container, _ in _containers(job):
        env = [e for e in container.get("env") or [] if isinstance(e, dict)]
        values = [e.get("value") for e in env if e.get("name") == runfiles.DIGEST_ENV]
        if values != [expected]:
            out.append(
                Finding(
                    JOB,
                    f"{where}.env",
                    f"{runfiles.DIGEST_ENV} must be the run files' digest {expected} (it is {values or 'unset'})",
                    hint="the launcher refuses to start on any other: rebuild the bundle",
                )
            )
    return out


def mount_findings(job: dict[str, Any], configmap: dict[str, Any]) -> list[Finding]:
    """Each task's pods mount the ConfigMap read-only at the run files' path, and start the image's launcher on it
    from the image's working directory."""
    out = []
    name = (configmap.get("metadata") or {}).get("name")
    job_name = (job.get("metadata") or {}).get("name")
    if job_name and name != configmap_name(str(job_name)):
        out.append(Finding(FILE, "metadata.name", f"must be {configmap_name(str(job_name))!r}, the Job's run files"))
    for where, container, pod_spec in _containers(job):
        declared = [v for v in pod_spec.get("volumes") or [] if isinstance(v, dict)]
        volumes = {v.get("name") for v in declared if (v.get("configMap") or {}).get("name") == name}
        mounts = [m for m in container.get("volumeMounts") or [] if isinstance(m, dict) and m.get("name") in volumes]
        if not any(m.get("mountPath") == RUN_FILES_MOUNT for m in mounts):
            out.append(Finding(JOB, f"{where}.volumeMounts", f"no mount of ConfigMap {name!r} at {RUN_FILES_MOUNT}"))
        elif not all(m.get("readOnly") is True for m in mounts):
            out.append(Finding(JOB, f"{where}.volumeMounts", f"ConfigMap {name!r} must be mounted readOnly: true"))
        if container.get("command") != list(POD_COMMAND) or container.get("workingDir") != WORKDIR:
            out.append(
                Finding(
                    JOB,
                    f"{where}.command",
                    f"must be {list(POD_COMMAND)} in workingDir {WORKDIR}: the image's launcher, which checks the "
                    "run files before any of them is read or run",
                    hint="rebuild the bundle (a command that starts run.sh runs a ConfigMap file unchecked)",
                )
            )
    return out


def _containers(job: Any) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Every task's containers: their place in the Job, the container, and its pod spec."""
    found = []
    tasks = (job.get("spec") or {}).get("tasks") if isinstance(job, dict) else None
    for i, task in enumerate(tasks if isinstance(tasks, list) else []):
        spec = ((task.get("template") or {}).get("spec") or {}) if isinstance(task, dict) else {}
        spec = spec if isinstance(spec, dict) else {}
        for k, container in enumerate(spec.get("containers") or []):
            if isinstance(container, dict):
                found.append((f"spec.tasks[{i}].template.spec.containers[{k}]", container, spec))
    return found
