"""The cluster the user's kubeconfig names, as kubectl finds it, and every way a request can fail, in one line.

kubectl's rules: ``--kubeconfig``, else every file ``$KUBECONFIG`` lists, else ``~/.kube/config`` (inside a pod
without any of them: the pod's service account); ``--context``, else the current context; ``--namespace``, else the
context's namespace, else ``default``. The client is the official library's own ApiClient: its HTTP transport
(urllib3), its authentication (tokens, client certificates, exec plugins) and its models; recipekit never writes to
the kubeconfig (``persist_config=False``: a refreshed token is not saved back).

A request fails in one of three ways, each said in one line: the server cannot be reached or refuses who you are
(:class:`ClusterError`, exit 4: nothing about the run is known), or it answers with a ``Status`` that
:func:`api_error` reads (the caller decides what that means: a missing Secret, a webhook's refusal).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import Problem, RecipeError
from recipekit.recipe.schema import printable

T = TypeVar("T")

#: Seconds to connect, and to wait for an answer (a list of a thousand pods comes well within it).
TIMEOUT = (10, 60)
#: The longest Status message kept (a webhook may explain at length; the line stays readable).
MAX_MESSAGE = 2000
#: Where a pod's service account puts its namespace (in-cluster configuration).
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ClusterError(Exception):
    """The cluster could not be asked: unreachable, or it refused who you are or what you asked (exit 4)."""


@dataclass(frozen=True)
class Connection:
    """One API server, through the client library's ApiClient."""

    client: Any  # kubernetes.client.ApiClient
    context: str
    namespace: str
    server: str

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.client)

    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.client)

    def scheduling(self) -> Any:
        from kubernetes import client

        return client.SchedulingV1Api(self.client)

    def ask(self, request: Callable[[], T]) -> T:
        """``request()``; a server out of reach, or one that refuses the credentials (401), is a ClusterError. Other
        answers (404, 403, a webhook's 400) are the caller's to judge: the ApiException passes."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            return request()
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ClusterError(
                f"cannot reach the API server {self.server} (context {self.context}): {reason}"
            ) from None
        except ApiException as exc:
            if exc.status == 401:
                raise ClusterError(
                    f"the API server {self.server} refused the credentials of context {self.context} "
                    f"(401 Unauthorized): log in again, or choose another --context"
                ) from None
            raise


def kubeconfig_files(given: Path | None) -> list[Path]:
    """The kubeconfig files kubectl would read: ``given``, else $KUBECONFIG's list, else ~/.kube/config."""
    if given is not None:
        return [given]
    listed = [Path(p).expanduser() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [Path("~/.kube/config").expanduser()]


def connect(kubeconfig: Path | None = None, context: str | None = None, namespace: str | None = None) -> Connection:
    """A connection as kubectl would make it; RecipeError (exit 2) for a kubeconfig or context that cannot be used."""
    from kubernetes import client, config

    files = [f for f in kubeconfig_files(kubeconfig) if f.is_file()]
    configuration = client.Configuration()
    if not files and kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and context is None:
        config.load_incluster_config(client_configuration=configuration)
        own = POD_NAMESPACE_FILE.read_text().strip() if POD_NAMESPACE_FILE.is_file() else "default"
        return Connection(client.ApiClient(configuration), "(in-cluster)", namespace or own, configuration.host)
    if not files:
        wanted = ", ".join(str(f) for f in kubeconfig_files(kubeconfig))
        raise RecipeError([Problem("kubeconfig", f"{wanted}: not found", hint="--kubeconfig FILE or $KUBECONFIG")])
    where = os.pathsep.join(str(f) for f in files)
    contexts, current = _contexts(files)
    chosen = context or current
    if chosen is None or chosen not in contexts:
        raise RecipeError([_no_context(chosen, list(contexts), where)])
    try:
        config.load_kube_config(where, chosen, client_configuration=configuration, persist_config=False)
    except Exception as exc:  # the library's ConfigException, a file it names: the user's kubeconfig is unusable
        raise RecipeError([Problem(where, f"context {chosen} cannot be used: {_line(exc)}")]) from None
    given = contexts[chosen].get("namespace")
    return Connection(client.ApiClient(configuration), chosen, namespace or given or "default", configuration.host)


def _contexts(files: list[Path]) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Every context of the kubeconfig files and the current one, merged as kubectl merges them: the first file to
    name a context, or the current context, wins. Read as recipekit reads any YAML (bounded, no tags or aliases)."""
    contexts: dict[str, dict[str, Any]] = {}
    current: str | None = None
    for file in files:
        try:
            document = yamlfile.read(file)
        except (OSError, yaml.YAMLError) as exc:
            raise RecipeError([Problem(str(file), f"kubeconfig cannot be read: {_line(exc)}")]) from None
        document = document if isinstance(document, dict) else {}
        for entry in document.get("contexts") or []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                found = entry.get("context")
                contexts.setdefault(entry["name"], found if isinstance(found, dict) else {})
        if current is None and isinstance(document.get("current-context"), str) and document["current-context"]:
            current = document["current-context"]
    return contexts, current


def _line(exc: Exception) -> str:
    return printable(" ".join(str(exc).split()))[:300]


def _no_context(chosen: Any, names: list[str], where: str) -> Problem:
    if chosen is None:
        return Problem(where, "no current context", hint="--context NAME; contexts: " + (", ".join(names) or "none"))
    return Problem(
        "--context", f"{chosen!r} is not a context of {where}", hint="contexts: " + (", ".join(names) or "none")
    )


def api_error(exc: Exception) -> tuple[int, str]:
    """An ApiException's HTTP status and the message of the ``Status`` it carries, one printable line."""
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None)
    message = ""
    if isinstance(body, (str, bytes)) and len(body) <= 1 << 20:
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        if isinstance(document, dict) and isinstance(document.get("message"), str):
            message = document["message"]
    if not message:
        message = str(getattr(exc, "reason", "") or f"HTTP {status}")
    text = " ".join(printable(message).split())
    return status, text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def forbidden_or_raise(exc: Exception, what: str) -> str:
    """The warning for a read that RBAC forbids (403): the check is skipped, said so; any other error is raised as a
    ClusterError, since the request itself could not be made sense of."""
    status, message = api_error(exc)
    if status == 403:
        return f"cannot check {what}: {message}"
    raise ClusterError(f"reading {what}: {message} (HTTP {status})")


def custom_object(
    conn: Connection, api: tuple[str, str, str], namespace: str | None, name: str, what: str
) -> dict[str, Any] | None:
    """A custom object (``api``: group, version, plural; ``namespace`` None for a cluster-scoped one), None when it
    does not exist; any other refusal is a ClusterError naming ``what``."""
    from kubernetes.client.exceptions import ApiException

    group, version, plural = api
    api_objects = conn.custom()

    def get() -> Any:
        if namespace is None:
            return api_objects.get_cluster_custom_object(group, version, plural, name, _request_timeout=TIMEOUT)
        return api_objects.get_namespaced_custom_object(
            group, version, namespace, plural, name, _request_timeout=TIMEOUT
        )

    try:
        found = conn.ask(get)
    except ApiException as exc:
        status, message = api_error(exc)
        if status == 404:
            return None
        where = f" in namespace {namespace}" if namespace else ""
        raise ClusterError(f"reading {what}{where}: {message} (HTTP {status})") from None
    return found if isinstance(found, dict) else None
