"""The Volcano ``batch.volcano.sh/v1alpha1`` Job as the API server and Volcano's admission webhook see it.

Three layers, each reported as its own check:

* :func:`schema_findings` — only the fields the Job type defines (volcano-sh/apis ``pkg/apis/batch/v1alpha1/job.go``),
  with their JSON types. The CRD is structural, so the API server would drop (or, with field validation strict,
  reject) an unknown field; a misspelled ``minAvailable`` would silently lose gang scheduling.
* :func:`webhook_findings` — the rules ``validatejob.volcano.sh`` enforces on create
  (volcano ``pkg/webhooks/admission/jobs/validate``): tasks present and uniquely named, minAvailable within
  replicas, lifecycle policies well formed, pod names valid DNS labels, known plugins, volumes with a mount path.
* :func:`pod_template_findings` — each task's pod template as Kubernetes validates a ``v1 PodTemplate``, through the
  ``kubernetes-validate`` package's bundled OpenAPI schemas (strict: unknown fields fail), plus the few semantic
  rules a JSON schema cannot express (mounts name declared volumes, extended resources request == limit, the names
  of the service account, priority class and pull Secrets, label and annotation keys and values).

The queue's existence and state need a live cluster and are not checked here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from recipekit.recipe.domains import ANNOTATION_KEY, DNS_SUBDOMAIN, LABEL_KEY, LABEL_VALUE
from recipekit.recipe.k8snames import is_dns_label
from recipekit.recipe.sections.cluster import MAX_ANNOTATION_BYTES
from recipekit.validate.shared.results import Finding
from recipekit.validate.static import volcanotopology
from recipekit.validate.static.toolpackages import install_hint
from recipekit.validate.static.volcanotopology import Constrained

FILE = "volcano-job.yaml"
API_VERSION = "batch.volcano.sh/v1alpha1"

_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DURATION = re.compile(r"^(0|[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+)$")
_INT32 = (-(2**31), 2**31 - 1)

#: Policy events and actions the webhook accepts from users (validate/util.go policyEventMap / policyActionMap).
POLICY_EVENTS = ("*", "PodFailed", "PodEvicted", "PodPending", "Unknown", "TaskCompleted", "TaskFailed", "JobUpdated")
POLICY_ACTIONS = ("AbortJob", "RestartJob", "RestartTask", "RestartPod", "TerminateJob", "CompleteJob", "ResumeJob")
#: Job plugins the controller registers (pkg/controllers/job/plugins).
KNOWN_PLUGINS = ("env", "svc", "ssh", "pytorch", "mpi", "tensorflow", "ray")
TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


# ------------------------------------------------------------------------------------------------------ schema
# A compact description of the Job's Go types: a spec is a type name, or ("list", spec), ("map", spec), or a dict
# of field -> spec for a struct (a "!" suffix on the name marks a required field). "object" is any JSON object
# (validated elsewhere, e.g. the pod template by kubernetes-validate).
Spec = Any

LIFECYCLE_POLICY: dict[str, Spec] = {
    "action": "string",
    "event": "string",
    "events": ("list", "string"),
    "exitCode": "int32",
    "timeout": "duration",
}
TASK_SPEC: dict[str, Spec] = {
    "name": "string",
    "replicas": "int32",
    "minAvailable": "int32",
    "template": "object",
    "policies": ("list", LIFECYCLE_POLICY),
    "topologyPolicy": "string",
    "maxRetry": "int32",
    "dependsOn": {"name": ("list", "string"), "iteration": "string"},
}
VOLUME_SPEC: dict[str, Spec] = {
    "mountPath!": "string",
    "volumeClaimName": "string",
    "volumeClaim": "object",
}
JOB_SPEC: dict[str, Spec] = {
    "schedulerName": "string",
    "minAvailable": "int32",
    "volumes": ("list", VOLUME_SPEC),
    "tasks": ("list", TASK_SPEC),
    "policies": ("list", LIFECYCLE_POLICY),
    "plugins": ("map", ("list", "string")),
    "runningEstimate": "duration",
    "queue": "string",
    "maxRetry": "int32",
    "ttlSecondsAfterFinished": "int32",
    "priorityClassName": "string",
    "minSuccess": "int32",
}
OBJECT_META: dict[str, Spec] = {
    "name": "string",
    "generateName": "string",
    "namespace": "string",
    "labels": ("map", "string"),
    "annotations": ("map", "string"),
    "finalizers": ("list", "string"),
    "ownerReferences": ("list", "object"),
}
JOB: dict[str, Spec] = {
    "apiVersion!": "string",
    "kind!": "string",
    "metadata!": OBJECT_META,
    "spec!": JOB_SPEC,
}
#: Fields newer Volcano releases define that older clusters reject: a Job that names no release
#: (``cluster.placement.network_topology.volcano``) holds only the core fields.
NEWER_FIELDS = {"networkTopology": "spec", "partitionPolicy": "spec.tasks[]"}

_SCALARS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "int32": lambda v: isinstance(v, int) and not isinstance(v, bool) and _INT32[0] <= v <= _INT32[1],
    "bool": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "duration": lambda v: isinstance(v, str) and bool(_DURATION.match(v)),
}
_SCALAR_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "int32": "a 32-bit integer",
    "bool": "true or false",
    "object": "an object",
    "duration": "a Go duration string such as 90s or 10m",
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(value), type(value).__name__
    )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def job_schema(release: str | None) -> dict[str, Spec]:
    """The Job's fields in Volcano ``release`` (None: the core fields every release accepts)."""
    job_extra, task_extra = volcanotopology.release_fields(release)
    spec = {**JOB_SPEC, **job_extra, "tasks": ("list", {**TASK_SPEC, **task_extra})}
    return {**JOB, "spec!": spec}


def schema_findings(job: Any) -> list[Finding]:
    """Every field of ``job`` that the v1alpha1 Job of its Volcano release (the core fields when it names none) does
    not define, or that has the wrong JSON type or a value its CRD refuses."""
    release, out = volcanotopology.job_release(job)
    _walk(job, job_schema(release), "", out, release)
    if isinstance(job, dict):
        if job.get("apiVersion") not in (None, API_VERSION):
            out.append(Finding(FILE, "apiVersion", f"{job.get('apiVersion')!r} is not {API_VERSION}"))
        if job.get("kind") not in (None, "Job"):
            out.append(Finding(FILE, "kind", f"{job.get('kind')!r} is not Job"))
    return out


def _walk(value: Any, spec: Spec, path: str, out: list[Finding], release: str | None = None) -> None:
    if isinstance(spec, Constrained):
        _walk(value, spec.kind, path, out)
        wrong = spec.problem(value) if _SCALARS[spec.kind](value) else None
        if wrong is not None:
            out.append(Finding(FILE, path, wrong[:200]))
        return
    if isinstance(spec, str):
        if not _SCALARS[spec](value):
            out.append(
                Finding(
                    FILE, path or "<document>", f"must be {_SCALAR_WORDS[spec]}, got {_kind(value)} {value!r}"[:200]
                )
            )
        return
    if isinstance(spec, tuple):
        container, item = spec
        if container == "list":
            if not isinstance(value, list):
                out.append(Finding(FILE, path, f"must be a list, got {_kind(value)}"))
                return
            for i, element in enumerate(value):
                _walk(element, item, f"{path}[{i}]", out, release)
        else:
            if not isinstance(value, dict):
                out.append(Finding(FILE, path, f"must be a map, got {_kind(value)}"))
                return
            for key, element in value.items():
                if not isinstance(key, str):
                    out.append(Finding(FILE, path, f"map key {key!r} must be a string"))
                _walk(element, item, f"{path}.{key}", out, release)
        return
    if not isinstance(value, dict):
        out.append(Finding(FILE, path or "<document>", f"must be an object, got {_kind(value)}"))
        return
    fields = {name.rstrip("!"): sub for name, sub in spec.items()}
    for name in spec:
        if name.endswith("!") and name[:-1] not in value:
            out.append(Finding(FILE, _join(path, name[:-1]), "required field is missing"))
    for key, element in value.items():
        if key in fields:
            _walk(element, fields[key], _join(path, key), out, release)
        elif key == "status" and path == "":
            continue  # written by the controller; harmless in a manifest
        else:
            close = _close(key, fields)
            hint = f"did you mean {close!r}?" if close else ""
            if key in NEWER_FIELDS and release is None:
                hint = (
                    "a newer Volcano field that older clusters reject: name the cluster's release "
                    "(cluster.placement.network_topology.volcano) or leave it out"
                )
            elif key in NEWER_FIELDS or key == "highestTierName":
                hint = f"not in Volcano {release}'s Job CRD"
            out.append(
                Finding(
                    FILE,
                    _join(path, key),
                    f"unknown field: the {API_VERSION} Job does not define it",
                    hint or "allowed: " + ", ".join(sorted(fields)),
                )
            )


def _close(key: str, fields: dict[str, Spec]) -> str | None:
    import difflib

    match = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.75)
    return match[0] if match else None


# ----------------------------------------------------------------------------------------------------- webhook
def pod_name(job: str, task: str, index: int) -> str:
    """Volcano's pod (and, with the svc plugin, host) name: ``<job>-<task>-<index>``."""
    return f"{job}-{task}-{index}"


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def webhook_findings(job: Any) -> list[Finding]:
    """The admission rules of ``validatejob.volcano.sh`` that can be checked without a cluster."""
    if not isinstance(job, dict) or not isinstance(job.get("spec"), dict):
        return [Finding(FILE, "spec", "no Job spec to admit")]
    spec = job["spec"]
    meta = job.get("metadata") if isinstance(job.get("metadata"), dict) else {}
    name = str(meta.get("name", ""))
    tasks = spec.get("tasks") if isinstance(spec.get("tasks"), list) else []
    out = _name_findings(name, spec) + _count_findings(spec)
    if not tasks:
        out.append(Finding(FILE, "spec.tasks", "no task specified: the webhook rejects a Job without tasks"))
    seen: set[str] = set()
    for i, task in enumerate(tasks):
        if isinstance(task, dict):
            out += _task_findings(task, f"spec.tasks[{i}]", name, seen)
    total = sum(_int(t.get("replicas")) for t in tasks if isinstance(t, dict))
    job_min = _int(spec.get("minAvailable"))
    if tasks and job_min > total:
        out.append(
            Finding(FILE, "spec.minAvailable", f"{job_min} is greater than the total replicas of all tasks ({total})")
        )
    out += policy_findings(spec.get("policies"), "spec.policies")
    out += volcanotopology.webhook_findings(job)
    out += _plugin_findings(spec.get("plugins"), seen) + _volume_findings(spec.get("volumes"))
    if any(isinstance(t, dict) and t.get("dependsOn") for t in tasks) and not _is_dag(tasks):
        out.append(Finding(FILE, "spec.tasks", "dependsOn between tasks does not form a directed acyclic graph"))
    return out


def _name_findings(name: str, spec: dict[str, Any]) -> list[Finding]:
    """The Job's name: a DNS label, and with the svc plugin a DNS-1035 label (its Service is named after it)."""
    if not is_dns_label(name):
        return [Finding(FILE, "metadata.name", f"{name!r} is not a valid name (lower-case DNS label, ≤ 63 characters)")]
    if "svc" in (spec.get("plugins") or {}) and not _DNS1035_LABEL.match(name):
        return [
            Finding(
                FILE,
                "metadata.name",
                f"{name!r}: the svc plugin creates a Service named after the Job, "
                "which must start with a letter (DNS-1035 label)",
            )
        ]
    return []


def _count_findings(spec: dict[str, Any]) -> list[Finding]:
    """The Job's counts the webhook bounds: none negative, minSuccess at least 1."""
    out = [
        Finding(FILE, f"spec.{key}", f"must be ≥ 0 (got {spec.get(key)})")
        for key in ("minAvailable", "maxRetry", "ttlSecondsAfterFinished")
        if _int(spec.get(key)) < 0
    ]
    if "minSuccess" in spec and _int(spec.get("minSuccess"), 1) < 1:
        out.append(Finding(FILE, "spec.minSuccess", f"must be ≥ 1 (got {spec.get('minSuccess')})"))
    return out


def _task_findings(task: dict[str, Any], where: str, job: str, seen: set[str]) -> list[Finding]:
    """One task: its replicas and minAvailable, a unique DNS-label name whose last pod's name fits, its policies,
    topology policy and dependencies. ``seen`` collects the task names."""
    out: list[Finding] = []
    tname = str(task.get("name", ""))
    replicas = _int(task.get("replicas"))
    if replicas < 0:
        out.append(Finding(FILE, f"{where}.replicas", f"must be ≥ 0 (got {replicas})"))
    if "minAvailable" in task:
        task_min = _int(task.get("minAvailable"))
        if task_min < 0:
            out.append(Finding(FILE, f"{where}.minAvailable", f"must be ≥ 0 (got {task_min})"))
        elif task_min > replicas:
            message = f"{task_min} is greater than the task's replicas ({replicas})"
            out.append(Finding(FILE, f"{where}.minAvailable", message))
    if not is_dns_label(tname):
        out.append(Finding(FILE, f"{where}.name", f"{tname!r} is not a DNS-1123 label"))
    if tname in seen:
        out.append(Finding(FILE, f"{where}.name", f"duplicated task name {tname!r}"))
    seen.add(tname)
    last = pod_name(job, tname, max(replicas - 1, 0))
    if not is_dns_label(last):
        out.append(
            Finding(
                FILE,
                f"{where}.name",
                f"pod name {last!r} ({len(last)} characters) is not a DNS label of at most 63 characters",
                hint="shorten the job or task name",
            )
        )
    out.extend(policy_findings(task.get("policies"), f"{where}.policies"))
    policy = task.get("topologyPolicy")
    if policy is not None and policy not in TOPOLOGY_POLICIES:
        out.append(Finding(FILE, f"{where}.topologyPolicy", f"{policy!r} is not one of {', '.join(TOPOLOGY_POLICIES)}"))
    depends = task.get("dependsOn")
    if isinstance(depends, dict) and depends.get("iteration") not in (None, "any", "all"):
        out.append(Finding(FILE, f"{where}.dependsOn.iteration", f"{depends.get('iteration')!r} is not any or all"))
    return out


def _plugin_findings(plugins: Any, tasks: set[str]) -> list[Finding]:
    """Known job plugins only; the mpi plugin's master and worker tasks must exist."""
    if not isinstance(plugins, dict):
        return []
    out = [
        Finding(
            FILE, f"spec.plugins.{plugin}", f"unknown job plugin {plugin!r}", hint="known: " + ", ".join(KNOWN_PLUGINS)
        )
        for plugin in plugins
        if plugin not in KNOWN_PLUGINS
    ]
    if "mpi" in plugins:
        args = plugins.get("mpi") or []
        master = next((a.split("=", 1)[1] for a in args if str(a).startswith("--master=")), "master")
        worker = next((a.split("=", 1)[1] for a in args if str(a).startswith("--worker=")), "worker")
        out += [
            Finding(FILE, "spec.plugins.mpi", f"the mpi plugin needs a task named {role!r}")
            for role in (master, worker)
            if role not in tasks
        ]
    return out


def _volume_findings(volumes: Any) -> list[Finding]:
    """The Job-level volumes: a unique mountPath each, and exactly one of volumeClaim and volumeClaimName."""
    out: list[Finding] = []
    mounts: set[str] = set()
    for i, volume in enumerate(volumes if isinstance(volumes, list) else []):
        where = f"spec.volumes[{i}]"
        if not isinstance(volume, dict):
            continue
        mount = volume.get("mountPath")
        if not mount:
            out.append(Finding(FILE, f"{where}.mountPath", "mountPath is required"))
        elif mount in mounts:
            out.append(Finding(FILE, f"{where}.mountPath", f"duplicated mountPath {mount}"))
        mounts.add(str(mount))
        if not volume.get("volumeClaim") and not volume.get("volumeClaimName"):
            out.append(Finding(FILE, where, "either volumeClaim or volumeClaimName must be specified"))
        elif volume.get("volumeClaim") and volume.get("volumeClaimName"):
            out.append(Finding(FILE, where, "volumeClaim and volumeClaimName together: give only one"))
    return out


def policy_findings(policies: Any, where: str) -> list[Finding]:
    """Lifecycle policies: event xor exitCode, exitCode ≠ 0, known events and actions, no duplicates, ``*`` alone."""
    if not isinstance(policies, list):
        return []
    out: list[Finding] = []
    events: set[str] = set()
    codes: set[int] = set()
    for i, policy in enumerate(policies):
        at = f"{where}[{i}]"
        if not isinstance(policy, dict):
            continue
        listed = ([policy["event"]] if policy.get("event") else []) + list(policy.get("events") or [])
        code = policy.get("exitCode")
        if listed and code is not None:
            out.append(Finding(FILE, at, "event and exitCode together: give one of them"))
            continue
        if not listed and code is None:
            out.append(Finding(FILE, at, "neither event nor exitCode: give one of them"))
            continue
        action = policy.get("action")
        # An event policy must name a valid action; an exitCode policy may leave it out.
        if (listed or action is not None) and action not in POLICY_ACTIONS:
            out.append(
                Finding(
                    FILE,
                    f"{at}.action",
                    f"invalid policy action {action!r}",
                    hint="valid: " + ", ".join(POLICY_ACTIONS),
                )
            )
        if listed:
            for event in dict.fromkeys(listed):
                key = f"{at}.event" if event == policy.get("event") else f"{at}.events"
                if event not in POLICY_EVENTS:
                    out.append(
                        Finding(FILE, key, f"invalid policy event {event!r}", hint="valid: " + ", ".join(POLICY_EVENTS))
                    )
                elif event in events:
                    out.append(Finding(FILE, key, f"duplicate event {event!r} across policies"))
                events.add(str(event))
        else:
            if code == 0:
                out.append(Finding(FILE, f"{at}.exitCode", "0 is not a valid error code"))
            elif code in codes:
                out.append(Finding(FILE, f"{at}.exitCode", f"duplicate exitCode {code}"))
            codes.add(code)
    if "*" in events and len(events) > 1:
        out.append(
            Finding(
                FILE, where, "event '*' must be the only event: it already covers " + ", ".join(sorted(events - {"*"}))
            )
        )
    return out


def _is_dag(tasks: list[Any]) -> bool:
    graph = {t.get("name"): list((t.get("dependsOn") or {}).get("name") or []) for t in tasks if isinstance(t, dict)}
    state: dict[Any, int] = {}

    def visit(node: Any) -> bool:
        if state.get(node) == 1:
            return False
        if state.get(node) == 2:
            return True
        state[node] = 1
        ok = all(visit(dep) for dep in graph.get(node, []))
        state[node] = 2
        return ok

    return all(visit(node) for node in graph)


# ------------------------------------------------------------------------------------------------ pod template
#: The Kubernetes version whose schemas the pod template is checked against (kubernetes-validate bundles several).
KUBERNETES_VERSION = "1.30"


def pod_template_findings(job: Any, version: str = KUBERNETES_VERSION) -> list[Finding] | str:
    """Validate each task's template as a strict ``v1 PodTemplate``; a string is the reason the check was skipped."""
    try:
        import kubernetes_validate
    except ImportError:
        return f"kubernetes-validate is not installed ({install_hint('volcano.pod-template')})"
    out: list[Finding] = []
    tasks = (job.get("spec") or {}).get("tasks") if isinstance(job, dict) else None
    for i, task in enumerate(tasks if isinstance(tasks, list) else []):
        if not isinstance(task, dict) or not isinstance(task.get("template"), dict):
            continue
        where = f"spec.tasks[{i}].template"
        document = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": str(task.get("name") or "task")},
            "template": task["template"],
        }
        for path, message in _schema_errors(document, version, kubernetes_validate):
            field = where + _path_suffix(path[1:] if path and path[0] == "template" else path)
            out.append(Finding(FILE, field, message))
        out.extend(_pod_semantics(task["template"], where))
    return out


@lru_cache(maxsize=4)
def _pod_template_validator(version: str) -> Any:
    """A strict JSON-schema validator for v1 PodTemplate from kubernetes-validate's bundled schemas (loaded once)."""
    import jsonschema
    from kubernetes_validate import utils as kv_utils
    from referencing import Registry, Resource

    schema_dir = f"v{[v for v in kv_utils.all_versions() if kv_utils.major_minor(v) <= version][-1]}-local-strict"
    schema = kv_utils.schema_contents(f"kubernetes-json-schema/{schema_dir}/podtemplate-v1.json", version)
    definitions = kv_utils.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def _schema_errors(document: dict[str, Any], version: str, kubernetes_validate: Any) -> list[tuple[list[Any], str]]:
    """All schema errors (kubernetes-validate's own ``validate`` stops at the first)."""
    try:
        validator = _pod_template_validator(version)
    except (AttributeError, IndexError, TypeError, OSError, ImportError):
        # The package's internals moved: fall back to its public API (first error only).
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return [(list(exc.absolute_path), _short(exc.message))]
        return []
    errors = sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path)))
    return [(list(e.absolute_path), _short(e.message)) for e in errors]


def _short(message: str) -> str:
    return message if len(message) <= 240 else message[:237] + "..."


def _path_suffix(parts: list[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _pod_semantics(template: dict[str, Any], where: str) -> list[Finding]:
    """What the API server's Go validation adds to the schema for this kind of pod."""
    out: list[Finding] = []
    spec = template.get("spec") if isinstance(template.get("spec"), dict) else {}
    volumes = [v.get("name") for v in spec.get("volumes") or [] if isinstance(v, dict)]
    for name in {n for n in volumes if volumes.count(n) > 1}:
        out.append(Finding(FILE, f"{where}.spec.volumes", f"duplicate volume name {name!r}"))
    names: list[str] = []
    for c, container in enumerate(spec.get("containers") or []):
        if not isinstance(container, dict):
            continue
        at = f"{where}.spec.containers[{c}]"
        cname = container.get("name")
        if cname in names:
            out.append(Finding(FILE, f"{at}.name", f"duplicate container name {cname!r}"))
        names.append(cname)
        if isinstance(cname, str) and not is_dns_label(cname):
            out.append(Finding(FILE, f"{at}.name", f"{cname!r} is not a DNS-1123 label"))
        for m, mount in enumerate(container.get("volumeMounts") or []):
            if isinstance(mount, dict) and mount.get("name") not in volumes:
                out.append(
                    Finding(
                        FILE,
                        f"{at}.volumeMounts[{m}].name",
                        f"mount of {mount.get('name')!r}, which is not among the pod's volumes",
                    )
                )
        for p, port in enumerate(container.get("ports") or []):
            value = port.get("containerPort") if isinstance(port, dict) else None
            if isinstance(value, int) and not 1 <= value <= 65535:
                out.append(Finding(FILE, f"{at}.ports[{p}].containerPort", f"{value} is not a port (1-65535)"))
        resources = container.get("resources") if isinstance(container.get("resources"), dict) else {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for key in set(requests) | set(limits):
            if "/" in str(key) and not str(key).startswith("kubernetes.io/"):  # an extended resource
                if str(requests.get(key)) != str(limits.get(key)):
                    out.append(
                        Finding(
                            FILE,
                            f"{at}.resources",
                            f"extended resource {key}: request "
                            f"{requests.get(key)} must equal limit {limits.get(key)} (no overcommit)",
                        )
                    )
    restart = spec.get("restartPolicy")
    if restart not in (None, "Always", "OnFailure", "Never"):
        out.append(Finding(FILE, f"{where}.spec.restartPolicy", f"{restart!r} is not Always, OnFailure or Never"))
    return out + _identity_semantics(template, spec, where)


def _identity_semantics(template: dict[str, Any], spec: dict[str, Any], where: str) -> list[Finding]:
    """Who the pods are, as the API server's Go validation sees it: service account, priority class and pull Secret
    names (DNS-1123 subdomains), the template's labels (``ValidateLabels``) and annotations (``ValidateAnnotations``:
    keys in lower case, 256 KiB in all) — rules a JSON schema cannot express."""
    pulls = [
        (f"imagePullSecrets[{i}].name", (r or {}).get("name")) for i, r in enumerate(spec.get("imagePullSecrets") or [])
    ]
    named = [(k, spec.get(k)) for k in ("serviceAccountName", "priorityClassName")] + pulls
    wrong = [(f"{where}.spec.{key}", DNS_SUBDOMAIN.problem(value)) for key, value in named if isinstance(value, str)]
    metadata = template.get("metadata") if isinstance(template.get("metadata"), dict) else {}
    labels, notes = (
        {} if not isinstance(v, dict) else v for v in (metadata.get("labels"), metadata.get("annotations"))
    )
    for key, value in labels.items():
        bad_value = LABEL_VALUE.problem(str(value))
        wrong += [(f"{where}.metadata.labels.{key}", LABEL_KEY.problem(str(key)) or bad_value and f"value {bad_value}")]
    wrong += [(f"{where}.metadata.annotations.{key}", ANNOTATION_KEY.problem(str(key))) for key in notes]
    size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in notes.items())
    if size > MAX_ANNOTATION_BYTES:
        wrong += [(f"{where}.metadata.annotations", f"{size} bytes: more than Kubernetes' {MAX_ANNOTATION_BYTES}")]
    return [Finding(FILE, at, problem) for at, problem in wrong if problem]
