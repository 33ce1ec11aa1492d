"""``recipekit status RUN``: the Volcano Job, its PodGroup, its pods and why they wait, and how far training has come.

From the API server: the Job (``batch.volcano.sh/v1alpha1``: ``status.state.phase``, ``retryCount``, and
``spec.maxRetry``, which Volcano holds the retries to: the attempt is ``retryCount + 1`` of ``maxRetry``, since the
restart that reaches ``maxRetry`` fails the Job, ``pkg/controllers/job/state/restarting.go``); its PodGroup, which
Volcano's job controller names ``<job>-<job uid>`` (``generateRelatedPodGroupName``); the Queue; the pods Volcano
labels ``volcano.sh/job-name=<job>``, each with its phase, restarts and the Job retry it was created in (annotation
``volcano.sh/job-retry-count``); and the events of the PodGroup and of the pods still waiting, read by
:mod:`~recipekit.cluster.reasons`. From the shared volume, where it is mounted here: :mod:`~recipekit.cluster.progress`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipekit.base.errors import Problem, RecipeError
from recipekit.bundle.documents import run_key_command
from recipekit.bundle.files import RECIPE
from recipekit.bundle.runfiles import configmap_name
from recipekit.cluster import progress as progressmod
from recipekit.cluster.connect import (
    TIMEOUT,
    ClusterError,
    Connection,
    api_error,
    custom_object,
    forbidden_or_raise,
)
from recipekit.cluster.objects import JOB_API, RunRef
from recipekit.cluster.reasons import Note, Reason, gang_message, why_pending

PODGROUP_API = ("scheduling.volcano.sh", "v1beta1", "podgroups")
QUEUE_API = ("scheduling.volcano.sh", "v1beta1", "queues")
#: Phases in which the Job ended without completing: ``status`` exits 1.
ENDED_BADLY = ("Failed", "Aborted", "Terminated")
#: Pending pods whose events are read (each is one request; the first few say why the others wait too).
EVENT_PODS = 4
RETRY_ANNOTATION = "volcano.sh/job-retry-count"


@dataclass(frozen=True)
class PodLine:
    name: str
    phase: str
    restarts: int
    node: str
    attempt: int | None
    waiting: tuple[str, str] | None  # the container's waiting reason and message


@dataclass
class RunStatus:
    name: str
    namespace: str
    queue: str
    phase: str
    attempt: int
    max_retry: int
    message: str | None = None
    podgroup_phase: str | None = None
    running: int = 0
    min_member: int | None = None
    reasons: list[Reason] = field(default_factory=list)
    pods: list[PodLine] = field(default_factory=list)
    progress: progressmod.Progress | None = None
    progress_note: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def ended_badly(self) -> bool:
        return self.phase in ENDED_BADLY


def status(conn: Connection, run: RunRef, volume: Path | None) -> RunStatus:
    namespace = run.namespace or conn.namespace
    job = custom_object(conn, JOB_API, namespace, run.job_name, f"Job {run.job_name}")
    if job is None:
        raise RecipeError([Problem(run.job_name, f"no Volcano Job of that name in namespace {namespace}")])
    spec, state = job.get("spec") or {}, (job.get("status") or {}).get("state") or {}
    found = RunStatus(
        name=run.job_name,
        namespace=namespace,
        queue=str(spec.get("queue") or "default"),
        phase=str(state.get("phase") or "Pending"),
        attempt=int((job.get("status") or {}).get("retryCount") or 0) + 1,
        max_retry=int(spec.get("maxRetry") or 3),  # Volcano's default (0 is rewritten to 3 too)
        message=" ".join(str(state.get(k)) for k in ("reason", "message") if state.get(k)) or None,
    )
    podgroup = custom_object(conn, PODGROUP_API, namespace, f"{run.job_name}-{job['metadata'].get('uid')}", "PodGroup")
    pods = _pods(conn, namespace, run.job_name)
    found.pods = [_pod_line(pod, run.job_name) for pod in pods]
    notes: list[Note] = []
    if podgroup is not None:
        pg_status = podgroup.get("status") or {}
        found.podgroup_phase = str(pg_status.get("phase") or "Pending")
        found.running = int(pg_status.get("running") or 0)
        found.min_member = (podgroup.get("spec") or {}).get("minMember")
        notes += _events(conn, namespace, "PodGroup", podgroup["metadata"]["name"], found.warnings)
    if found.phase not in ("Running", "Completed", *ENDED_BADLY):
        waiting = [p for p in found.pods if p.phase == "Pending"][:EVENT_PODS]
        for pod in waiting:
            notes += _events(conn, namespace, "Pod", pod.name, found.warnings)
        queue_state = _queue_state(conn, found.queue, found.warnings)
        gang = gang_message(list((podgroup or {}).get("status", {}).get("conditions") or []), notes)
        waits = {p.name: p.waiting for p in found.pods if p.waiting}
        found.reasons = why_pending(gang, found.queue, queue_state, notes, waits, run_key_command(namespace))
    found.progress, found.progress_note = _progress(conn, run, namespace, volume)
    return found


def _pods(conn: Connection, namespace: str, job: str) -> list[Any]:
    from kubernetes.client.exceptions import ApiException

    selector = f"volcano.sh/job-name={job}"
    try:
        listed = conn.ask(
            lambda: conn.core().list_namespaced_pod(namespace, label_selector=selector, _request_timeout=TIMEOUT)
        )
    except ApiException as exc:
        status, message = api_error(exc)
        raise ClusterError(f"listing the pods of {job}: {message} (HTTP {status})") from None
    return sorted(listed.items or [], key=lambda pod: _index(pod.metadata.name))


def _index(name: str) -> tuple[int, str]:
    tail = name.rsplit("-", 1)[-1]
    return (int(tail), name) if tail.isdigit() else (1 << 30, name)


def _pod_line(pod: Any, job: str) -> PodLine:
    statuses = list(getattr(pod.status, "container_statuses", None) or [])
    waiting = None
    for container in statuses:
        state = getattr(container.state, "waiting", None) if container.state else None
        if state is not None and state.reason:
            waiting = (str(state.reason), str(state.message or ""))
            break
    retry = (pod.metadata.annotations or {}).get(RETRY_ANNOTATION)
    return PodLine(
        name=pod.metadata.name,
        phase=str(getattr(pod.status, "phase", None) or "Unknown"),
        restarts=sum(int(c.restart_count or 0) for c in statuses),
        node=str(getattr(pod.spec, "node_name", None) or "-"),
        attempt=int(retry) + 1 if isinstance(retry, str) and retry.isdigit() else None,
        waiting=waiting,
    )


def _events(conn: Connection, namespace: str, kind: str, name: str, warnings: list[str]) -> list[Note]:
    """The events about one object, oldest first (the newest last: :mod:`reasons` reads the last of each)."""
    from kubernetes.client.exceptions import ApiException

    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    try:
        listed = conn.ask(
            lambda: conn.core().list_namespaced_event(namespace, field_selector=selector, _request_timeout=TIMEOUT)
        )
    except ApiException as exc:
        warnings.append(forbidden_or_raise(exc, f"the events of {kind} {name}"))
        return []
    items = sorted(listed.items or [], key=_when)
    return [Note(kind, name, str(e.reason or ""), str(e.message or ""), str(e.type or "Normal")) for e in items]


def _when(event: Any) -> str:
    for value in (event.last_timestamp, event.event_time, event.metadata.creation_timestamp):
        if value is not None:
            return value.isoformat()
    return ""


def _queue_state(conn: Connection, queue: str, warnings: list[str]) -> str | None:
    """The Queue's state ("missing" when there is none); None when RBAC forbids reading it (cluster-scoped: many
    users may not), said in a warning: the webhook's check at submit then stands alone."""
    try:
        found = custom_object(conn, QUEUE_API, None, queue, f"queue {queue}")
    except ClusterError as err:
        if "(HTTP 403)" not in str(err):
            raise
        warnings.append(f"cannot check queue {queue}: {err}")
        return None
    return "missing" if found is None else str((found.get("status") or {}).get("state") or "Unknown")


def _progress(conn: Connection, run: RunRef, namespace: str, volume: Path | None) -> tuple[Any, str | None]:
    """The run's figures from the volume: through its bundle when RUN was one, else through the run files the Job
    mounts (its ConfigMap's recipe.yaml names the output directory)."""
    from kubernetes.client.exceptions import ApiException

    if run.bundle is not None:
        return progressmod.from_bundle(run.bundle, volume)
    name = configmap_name(run.job_name)
    try:
        configmap = conn.ask(lambda: conn.core().read_namespaced_config_map(name, namespace, _request_timeout=TIMEOUT))
    except ApiException as exc:
        status, message = api_error(exc)
        return None, f"ConfigMap {name} cannot be read ({message}): give the bundle as RUN"
    text = (configmap.data or {}).get(RECIPE)
    if not isinstance(text, str):
        return None, f"ConfigMap {name} holds no {RECIPE}"
    return progressmod.from_recipe(text, volume)
