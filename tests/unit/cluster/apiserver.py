"""A local HTTP server that answers as a Kubernetes API server with Volcano would, from recorded responses.

The cluster commands talk to it through the real ``kubernetes`` client library — its kubeconfig loader, its
ApiClient, its urllib3 transport, its models — over real HTTP on 127.0.0.1; nothing of the library is mocked. The
responses are the scenario files of tests/data/cluster (written from the APIs' published types; its README names the
versions), expanded here into whole objects: a scenario's pods and events are listed there in short, and
:func:`pod` and :func:`event` write them out as a v1 Pod and a v1 Event, with the labels and annotations Volcano's
job controller puts on every pod. An object the scenario does not have is answered as the API server answers a
missing one: a ``NotFound`` Status (apimachinery ``errors.NewNotFound``: ``<resource>[.<group>] "<name>" not
found``, code 404). Every request is recorded, so a test can say what was asked, in which order.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

DATA = Path(__file__).resolve().parents[2] / "data" / "cluster"
NAMESPACE = "team-a"
JOB = "phi4-lora-5d41a7"
JOB_PATH = f"/apis/batch.volcano.sh/v1alpha1/namespaces/{NAMESPACE}/jobs/{JOB}"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    content_type: str

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


Answer = tuple[int, Any]  # status, body (a dict is sent as JSON, a str or bytes as text)


def status(code: int, message: str, reason: str = "", **details: Any) -> dict[str, Any]:
    """A meta/v1 Status as the API server sends it for an error."""
    found: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    found["message"] = message
    if reason:
        found["reason"] = reason
    if details:
        found["details"] = details
    found["code"] = code
    return found


def not_found(path: str) -> dict[str, Any]:
    """What the API server says for an object that does not exist at ``path``."""
    parts = path.strip("/").split("/")
    group = parts[1] if parts[0] == "apis" else ""
    resource, name = (parts[-2], parts[-1]) if len(parts) >= 2 else (parts[-1], "")
    qualified = f"{resource}.{group}" if group else resource
    details = {"name": name, "kind": resource, **({"group": group} if group else {})}
    return status(404, f'{qualified} "{name}" not found', "NotFound", **details)


@dataclass
class RecordedAPIServer:
    routes: dict[tuple[str, str], Callable[[Request], Answer]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)

    def answer(self, method: str, path: str, body: Any, code: int = 200) -> None:
        self.routes[(method, path)] = lambda request: (code, copy.deepcopy(body))

    def handle(self, method: str, path: str, handler: Callable[[Request], Answer]) -> None:
        self.routes[(method, path)] = handler

    def asked(self, method: str | None = None) -> list[tuple[str, str]]:
        return [(r.method, r.path) for r in self.requests if method is None or r.method == method]

    def __enter__(self) -> RecordedAPIServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                split = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                request = Request(
                    self.command, split.path, parse_qs(split.query), json.loads(raw) if raw else None,
                    self.headers.get("Content-Type", ""),
                )  # fmt: skip
                server.requests.append(request)
                route = server.routes.get((self.command, split.path))
                code, body = route(request) if route else (404, not_found(split.path))
                data = body if isinstance(body, bytes) else body.encode() if isinstance(body, str) else None
                if data is None:
                    data = json.dumps(body).encode()
                    kind = "application/json"
                else:
                    kind = "text/plain"
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def kubeconfig(self, directory: Path, namespace: str | None = NAMESPACE) -> Path:
        """A kubeconfig whose current context is this server (a bearer token, as a cloud login leaves one)."""
        context: dict[str, Any] = {"cluster": "recorded", "user": "alice"}
        if namespace:
            context["namespace"] = namespace
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "recorded", "cluster": {"server": self.url}}],
            "users": [{"name": "alice", "user": {"token": "recorded-token"}}],
            "contexts": [{"name": "recorded", "context": context}],
            "current-context": "recorded",
        }
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path


# ------------------------------------------------------------------------------------------------ the scenarios
def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((DATA / name).read_text())


def pod(entry: dict[str, Any], job: dict[str, Any], pg_name: str) -> dict[str, Any]:
    """A scenario's short pod as the v1 Pod Volcano's job controller creates (createJobPod) and the kubelet reports."""
    name, index = entry["name"], entry["name"].rsplit("-", 1)[-1]
    template = job["spec"]["tasks"][0]["template"]
    container_state: dict[str, Any] = {"running": {"startedAt": "2026-11-03T11:40:01Z"}}
    if "waiting" in entry:
        container_state = {"waiting": entry["waiting"]}
    elif "terminated" in entry:
        container_state = {"terminated": {"startedAt": "2026-11-03T11:40:01Z", **entry["terminated"]}}
    statuses = []
    if entry.get("node"):
        statuses = [
            {
                "name": "trainer",
                "state": container_state,
                "ready": "running" in container_state,
                "restartCount": entry.get("restarts", 0),
                "image": template["spec"]["containers"][0]["image"],
                "imageID": "",
                "started": "running" in container_state,
            }
        ]
    found: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"a0000000-0000-4000-8000-00000000000{index}",
            "resourceVersion": "918400",
            "creationTimestamp": "2026-11-03T11:39:12Z",
            "labels": {
                **template["metadata"]["labels"],
                "volcano.sh/job-name": JOB,
                "volcano.sh/job-namespace": NAMESPACE,
                "volcano.sh/queue-name": job["spec"]["queue"],
                "volcano.sh/task-index": index,
                "volcano.sh/task-spec": "worker",
            },
            "annotations": {
                **template["metadata"]["annotations"],
                "scheduling.k8s.io/group-name": pg_name,
                "volcano.sh/job-name": JOB,
                "volcano.sh/job-retry-count": entry["retry"],
                "volcano.sh/job-version": str(int(entry["retry"]) + 1),
                "volcano.sh/queue-name": job["spec"]["queue"],
                "volcano.sh/task-index": index,
                "volcano.sh/task-spec": "worker",
                "volcano.sh/template-uid": f"{JOB}-worker",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch.volcano.sh/v1alpha1",
                    "kind": "Job",
                    "name": JOB,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],  # fmt: skip
        },
        "spec": {**copy.deepcopy(template["spec"]), "schedulerName": "volcano", "hostname": name, "subdomain": JOB},
        "status": {"phase": entry["phase"], "conditions": entry.get("conditions", []), "qosClass": "Guaranteed"},
    }
    if entry.get("node"):
        found["spec"]["nodeName"] = entry["node"]
        found["status"].update(hostIP="10.0.3.3", podIP=f"192.168.3.1{index}", containerStatuses=statuses)
    return found


def event(kind: str, name: str, number: int, entry: dict[str, Any]) -> dict[str, Any]:
    """A scenario's short event as a core/v1 Event about ``kind``/``name``."""
    api = {"PodGroup": "scheduling.volcano.sh/v1beta1", "Job": "batch.volcano.sh/v1alpha1"}.get(kind, "v1")
    metadata = {
        "name": f"{name}.18a4{number:012x}",
        "namespace": NAMESPACE,
        "resourceVersion": str(918500 + number),
        "creationTimestamp": entry.get("firstTimestamp") or entry["lastTimestamp"],
    }
    return {
        "metadata": metadata,
        "involvedObject": {"kind": kind, "namespace": NAMESPACE, "name": name, "apiVersion": api},
        "reportingComponent": entry["source"]["component"],
        "reportingInstance": "",
        **entry,
    }


def serve(server: RecordedAPIServer, scenario: str, *, job_status: str = "job_status") -> dict[str, Any]:
    """Put a scenario's objects at their API paths: the Job, its PodGroup, the Queue, the pods, the events."""
    moment = load(scenario)
    job = load("job.yaml")
    job["status"] = moment[job_status]
    pg = moment["podgroup"]
    ns_api = f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{NAMESPACE}"
    server.answer("GET", JOB_PATH, job)
    server.answer("GET", f"{ns_api}/podgroups/{pg['metadata']['name']}", pg)
    if moment.get("queue"):
        server.answer("GET", "/apis/scheduling.volcano.sh/v1beta1/queues/llm", moment["queue"])
    pods = [pod(entry, job, pg["metadata"]["name"]) for entry in moment.get("pods") or []]

    def list_pods(request: Request) -> Answer:
        chosen = pods if request.arg("labelSelector") == f"volcano.sh/job-name={JOB}" else []
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "918600"}, "items": chosen}

    events = [
        event(*about.split("/", 1), i, entry)
        for about, entries in (moment.get("events") or {}).items()
        for i, entry in enumerate(entries)
    ]

    def list_events(request: Request) -> Answer:
        wanted = dict(part.split("=", 1) for part in (request.arg("fieldSelector") or "").split(",") if "=" in part)
        chosen = [
            e for e in events
            if e["involvedObject"]["kind"] == wanted.get("involvedObject.kind")
            and e["involvedObject"]["name"] == wanted.get("involvedObject.name")
        ]  # fmt: skip
        return 200, {
            "kind": "EventList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "918700"},
            "items": chosen,
        }

    server.handle("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", list_pods)
    server.handle("GET", f"/api/v1/namespaces/{NAMESPACE}/events", list_events)
    return job
