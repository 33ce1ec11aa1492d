"""``recipekit logs RUN [-f] [--pod N]`` and ``recipekit cancel RUN``.

A pod's log is anyone's text — the training script's, a library's, a user's data echoed back — so every line is made
safe for a terminal before it is printed: a carriage return keeps what a terminal would show (the text after the
last ``\\r``, as a progress bar leaves it), tabs become spaces, and every other control character, escape sequence
introducer included, is written as its escape (``\\x1b``); a line longer than 64 KiB is cut, said so. The log is
streamed as the API server sends it (``follow``: until the container ends).

Cancel deletes the Volcano Job: Volcano's controller and the garbage collector then delete its pods and PodGroup;
each pod gets SIGTERM and its grace period (the bundle's ``terminationGracePeriodSeconds``) to write a last
checkpoint. The run files' ConfigMap stays (the next submit of the bundle replaces it; ``kubectl delete -k BUNDLE``
removes both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from recipekit.base.errors import Problem, RecipeError
from recipekit.cluster.connect import TIMEOUT, ClusterError, Connection, api_error, custom_object
from recipekit.cluster.objects import JOB_API, RunRef
from recipekit.recipe.schema import printable

#: The container every pod of a bundle runs (bundle/documents.py's trainer).
CONTAINER = "trainer"
#: A log line longer than this is cut (a Trainer log line is a few hundred bytes).
MAX_LINE = 64 * 1024
_CHUNK = 64 * 1024
#: How long ``--follow`` waits for a pod's next line before it gives up (the client takes no unbounded wait): longer
#: than any quiet stretch of a training log (a checkpoint of a large model, a slow evaluation).
FOLLOW_SILENCE_S = 24 * 3600


class NoLog(Exception):
    """The pod has no log yet (its container is waiting to start): one line, exit 1."""


def terminal_line(raw: bytes) -> str:
    """One log line as a terminal may print it: the last carriage-return segment, tabs expanded, the rest escaped."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    text = text.rsplit("\r", 1)[-1].expandtabs(8)
    return printable(text)


def lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """The lines of a byte stream, each at most :data:`MAX_LINE` bytes (a longer one is cut and said so)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield _cut(line)
        if len(pending) > MAX_LINE:  # a line that never ends: show its start, drop the rest of it
            yield _cut(pending)
            pending = b""
    if pending:
        yield _cut(pending)


def _cut(line: bytes) -> str:
    if len(line) <= MAX_LINE:
        return terminal_line(line)
    return terminal_line(line[:MAX_LINE]) + f" [line cut at {MAX_LINE} bytes]"


def pod_name(conn: Connection, run: RunRef, index: int) -> tuple[str, str]:
    """The namespace and name of pod ``index`` of the run's task (``<job>-<task>-<index>``, as Volcano names it)."""
    namespace = run.namespace or conn.namespace
    job = _job(conn, run, namespace)
    tasks = (job.get("spec") or {}).get("tasks") or [{}]
    task, replicas = str(tasks[0].get("name") or "worker"), int(tasks[0].get("replicas") or 1)
    if not 0 <= index < replicas:
        raise RecipeError([Problem("--pod", f"{index}: the run has pods 0 to {replicas - 1}")])
    return namespace, f"{run.job_name}-{task}-{index}"


def stream(conn: Connection, namespace: str, pod: str, follow: bool, emit: Callable[[str], None]) -> None:
    """The pod's log, line by line to ``emit``; NoLog when its container has not started."""
    from kubernetes.client.exceptions import ApiException

    try:
        response = conn.ask(
            lambda: conn.core().read_namespaced_pod_log(
                pod,
                namespace,
                container=CONTAINER,
                follow=follow,
                _preload_content=False,
                _request_timeout=(TIMEOUT[0], FOLLOW_SILENCE_S) if follow else TIMEOUT,
            )
        )
    except ApiException as exc:
        status, message = api_error(exc)
        if status == 404:
            gone = f"no such pod in namespace {namespace} (not created yet, or deleted)"
            raise RecipeError([Problem(pod, gone)]) from None
        if status == 400:  # "container ... is waiting to start: ContainerCreating", as kubectl says it
            raise NoLog(f"{pod}: no log yet: {message}") from None
        raise ClusterError(f"reading the log of {pod}: {message} (HTTP {status})") from None
    try:
        for line in lines(response.stream(_CHUNK)):
            emit(line)
    finally:
        response.release_conn()


def cancel(conn: Connection, run: RunRef) -> str:
    """Delete the run's Job; its phase before, as the API server had it."""
    from kubernetes.client.exceptions import ApiException

    namespace = run.namespace or conn.namespace
    phase = str(((_job(conn, run, namespace).get("status") or {}).get("state") or {}).get("phase") or "Pending")
    group, version, plural = JOB_API
    try:
        conn.ask(
            lambda: conn.custom().delete_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                run.job_name,
                propagation_policy="Background",
                _request_timeout=TIMEOUT,
            )
        )
    except ApiException as exc:
        status, message = api_error(exc)
        if status != 404:  # gone meanwhile: what cancel wanted
            raise ClusterError(f"deleting Job {run.job_name}: {message} (HTTP {status})") from None
    return phase


def _job(conn: Connection, run: RunRef, namespace: str) -> dict[str, Any]:
    job = custom_object(conn, JOB_API, namespace, run.job_name, f"Job {run.job_name}")
    if job is None:
        raise RecipeError([Problem(run.job_name, f"no Volcano Job of that name in namespace {namespace}")])
    return job
