"""``recipekit submit BUNDLE``: the bundle's run files and Volcano Job on the cluster, or every reason they would
not be, before anything is created.

In order: a Job of the same name is this run already (a re-submission would not restart it: say so); then the
server-side dry run (``dryRun=All``) of both objects — the API server's schema and validation, and the admission
webhooks, Volcano's ``validatejob.volcano.sh`` among them (its webhooks declare ``sideEffects: NoneOnDryRun``, so a
dry run reaches them) — and what the pods need that the bundle cannot bring: the run-key Secret (with a key of at
least 16 bytes), the claim, the pull Secrets, the service account and the priority class. Every refusal and every
missing object is reported together, and nothing is created while there is one. Then the ConfigMap is applied
(server-side apply: a rebuilt bundle of the same run replaces its files) and the Job is created. A read that RBAC
forbids is a warning, not a refusal: the check is skipped and said so.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from recipekit.bundle.documents import run_key_command
from recipekit.cluster.connect import TIMEOUT, Connection, api_error, custom_object, forbidden_or_raise
from recipekit.cluster.objects import JOB_API, BundleObjects
from recipekit.runtime.volume import trust

#: The field manager of recipekit's server-side apply (``kubectl get --show-managed-fields`` names it).
FIELD_MANAGER = "recipekit"
#: What submit asks of the API server: unknown or duplicate fields are errors, as ``kubectl apply`` asks.
VALIDATION = "Strict"
APPLY = "application/apply-patch+yaml"


class Refused(Exception):
    """The cluster said no, or something the pods need is missing: one line each (exit 1); nothing was created."""

    def __init__(self, lines: list[str], warnings: list[str] | None = None) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines
        self.warnings = warnings or []


@dataclass(frozen=True)
class Submitted:
    name: str
    namespace: str
    queue: str
    run_id: str | None
    warnings: list[str] = field(default_factory=list)


def submit(conn: Connection, objects: BundleObjects) -> Submitted:
    """Dry-run, check, then create (see the module); Refused with every reason when anything would fail."""
    phase = existing_phase(conn, objects.name, objects.namespace)
    if phase is not None:
        ns = objects.namespace
        raise Refused(
            [
                f"Job {objects.name} already exists in namespace {ns} ({phase}): it is this run. Watch it with "
                f"`recipekit status {objects.name} -n {ns}`, or `recipekit cancel {objects.name} -n {ns}` to "
                "start it over"
            ]
        )
    refusals = [line for line in (_configmap(conn, objects, "All"), _job(conn, objects, "All")) if line]
    missing, warnings = prerequisites(conn, objects)
    if refusals or missing:
        raise Refused(refusals + missing, warnings)
    for line in (_configmap(conn, objects, None), _job(conn, objects, None)):
        if line:  # the dry run passed but the real request did not (a race): say which, and what exists now
            raise Refused([line + " (after the dry run passed: check what exists with `recipekit status`)"], warnings)
    return Submitted(objects.name, objects.namespace, objects.queue, objects.run_id, warnings)


def existing_phase(conn: Connection, name: str, namespace: str) -> str | None:
    """The phase of the Volcano Job ``name`` when it exists ("Unknown" before Volcano has set one), else None."""
    job = custom_object(conn, JOB_API, namespace, name, f"Job {name}")
    if job is None:
        return None
    return str(((job.get("status") or {}).get("state") or {}).get("phase") or "Unknown")


def _refusal(exc: Exception, kind: str, name: str, dry_run: str | None) -> str:
    status, message = api_error(exc)
    who = "Volcano's admission webhook" if "validatejob.volcano.sh" in message else "the API server"
    return f"{who} refused {kind} {name}{' (dry run)' if dry_run else ''}: {message} (HTTP {status})"


def _configmap(conn: Connection, objects: BundleObjects, dry_run: str | None) -> str | None:
    """Server-side apply of the run files' ConfigMap; the refusal as a line, or None."""
    from kubernetes.client.exceptions import ApiException

    meta = objects.configmap["metadata"]
    try:
        conn.ask(
            lambda: conn.core().patch_namespaced_config_map(
                str(meta["name"]),
                objects.namespace,
                objects.configmap,
                dry_run=dry_run,
                field_manager=FIELD_MANAGER,
                field_validation=VALIDATION,
                force=True,
                _content_type=APPLY,
                _request_timeout=TIMEOUT,
            )
        )
    except ApiException as exc:
        return _refusal(exc, "ConfigMap", str(meta["name"]), dry_run)
    return None


def _job(conn: Connection, objects: BundleObjects, dry_run: str | None) -> str | None:
    """Creation of the Volcano Job (it is new: :func:`existing_phase` said so); the refusal as a line, or None."""
    from kubernetes.client.exceptions import ApiException

    group, version, plural = JOB_API
    try:
        conn.ask(
            lambda: conn.custom().create_namespaced_custom_object(
                group,
                version,
                objects.namespace,
                plural,
                objects.job,
                dry_run=dry_run,
                field_manager=FIELD_MANAGER,
                field_validation=VALIDATION,
                _request_timeout=TIMEOUT,
            )
        )
    except ApiException as exc:
        return _refusal(exc, "Job", objects.name, dry_run)
    return None


def prerequisites(conn: Connection, objects: BundleObjects) -> tuple[list[str], list[str]]:
    """What the pods need that is not there (one line each, with what makes it) and the checks RBAC forbade."""
    ns, needs = objects.namespace, objects.needs()
    core, timeout = conn.core(), {"_request_timeout": TIMEOUT}
    wanted: list[tuple[str, Callable[[], Any], str]] = []
    read: Callable[[], Any]
    for name in needs.secrets:
        absent = f"make it once with {run_key_command(ns)}" if name == trust.SECRET_NAME else "the pods mount it"
        wanted.append((f"Secret {name}", partial(core.read_namespaced_secret, name, ns, **timeout), absent))
    for claim in needs.claims:
        read = partial(core.read_namespaced_persistent_volume_claim, claim, ns, **timeout)
        wanted.append((f"PersistentVolumeClaim {claim}", read, "the pods mount it (cluster.pvc_claim)"))
    for name in needs.pull_secrets:
        read = partial(core.read_namespaced_secret, name, ns, **timeout)
        wanted.append((f"Secret {name}", read, "the image is pulled with it (cluster.image_pull_secrets)"))
    if needs.service_account:
        read = partial(core.read_namespaced_service_account, needs.service_account, ns, **timeout)
        wanted.append((f"ServiceAccount {needs.service_account}", read, "the pods run as it (cluster.service_account)"))
    if needs.priority_class:
        read = partial(conn.scheduling().read_priority_class, needs.priority_class, **timeout)
        wanted.append((f"PriorityClass {needs.priority_class}", read, "the pods name it (cluster.priority_class)"))
    missing: list[str] = []
    warnings: list[str] = []
    asked: dict[str, tuple[Callable[[], Any], str]] = {}
    for what, read, absent in wanted:  # a pull Secret may be the run key: asked once, for the first reason
        asked.setdefault(what, (read, absent))
    for what, (read, absent) in asked.items():
        found, warning = _read(conn, what, read)
        where = "" if what.startswith("PriorityClass") else f" in namespace {ns}"
        if warning:
            warnings.append(warning)
        elif found is None:
            missing.append(f"{what} is missing{where}: {absent}")
        else:
            missing += _unfit(what, found, ns, warnings)
    return missing, warnings


def _unfit(what: str, found: Any, namespace: str, warnings: list[str]) -> list[str]:
    """An object that exists but will not do: a run key too short to sign with; a claim not bound (a warning)."""
    if what == f"Secret {trust.SECRET_NAME}" and not _holds_key(found):
        return [
            f"{what} holds no '{trust.KEY_NAME}' of at least {trust.MIN_KEY_BYTES} bytes: the pods would refuse to "
            f"sign with it; delete it and make it with {run_key_command(namespace)}"
        ]
    phase = getattr(getattr(found, "status", None), "phase", None)
    if what.startswith("PersistentVolumeClaim") and phase != "Bound":
        warnings.append(f"{what} is {phase or 'not bound'}: the pods wait until it binds")
    return []


def _read(conn: Connection, what: str, read: Callable[[], Any]) -> tuple[Any, str | None]:
    """The object, or (None, None) when it does not exist, or (None, warning) when RBAC forbids reading it."""
    from kubernetes.client.exceptions import ApiException

    try:
        return conn.ask(read), None
    except ApiException as exc:
        if exc.status == 404:
            return None, None
        return None, forbidden_or_raise(exc, what)


def _holds_key(secret: Any) -> bool:
    """Whether the run-key Secret's ``key`` decodes to a key the runtime accepts (never printed, never kept)."""
    value = (getattr(secret, "data", None) or {}).get(trust.KEY_NAME)
    try:
        return isinstance(value, str) and len(base64.b64decode(value, validate=True)) >= trust.MIN_KEY_BYTES
    except ValueError:
        return False
