"""Why a run waits, in Volcano's and the kubelet's own words, sorted into what the user can do about it.

Read from what Volcano writes (volcano-sh/volcano, v1.16 main; the types of volcano-sh/apis):

* the PodGroup's condition ``Unschedulable`` (reason ``NotEnoughResources``), set by the gang plugin
  (``pkg/scheduler/plugins/gang/gang.go``) with the message ``"<n>/<m> tasks in gang unschedulable: <fit error>"``,
  and the same text in the PodGroup's ``Unschedulable`` Warning events (``cache.RecordJobStatusEvent``) and each
  pending pod's ``FailedScheduling`` event (``cache.taskUnschedulable``). Its tail, after ``Origin reason is
  <pod>:``, is the node histogram of ``api.FitErrors.Error()``: ``0/<N> nodes are unavailable: <k> <reason>, ...``,
  with ``Insufficient <resource>`` (``api.WrapInsufficientResourceReason``), kube-scheduler's ``node(s) had
  untolerated taint {key: value}`` and ``node(s) didn't match Pod's node affinity/selector`` among the reasons;
* the enqueue plugins' Normal ``Unschedulable`` events on the PodGroup: ``queue resource quota insufficient:
  insufficient <resource>, ...`` (proportion, capacity; ``util.FormatResourceNames``) and ``resource in cluster is
  overused`` (overcommit);
* the Queue's ``status.state`` (a job waits in a queue that is not ``Open``);
* and, once a pod is placed, the kubelet: a container waiting in ``ErrImagePull``/``ImagePullBackOff``, or a
  ``FailedMount`` event (``MountVolume.SetUp failed for volume "run-key" : secret "recipekit-run-key" not found``).

Pure functions of plain records, so each sentence Volcano writes is a unit test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from recipekit.recipe.schema import printable

#: The node histogram of ``api.FitErrors.Error()``.
_NODES = re.compile(r"0/(\d+) nodes are unavailable: (.+?)\.(?:\s|$)")
#: One ``<count> <reason>`` item of that histogram (items are joined with ", " and each starts with its count).
_ITEM = re.compile(r"(\d+) (.+?)(?:, (?=\d+ )|$)")
_QUOTA = "queue resource quota insufficient"
_OVERUSED = "resource in cluster is overused"
_MISSING_SECRET = re.compile(r'secret "([^"]+)" not found')
_MISSING_CLAIM = re.compile(r'persistentvolumeclaim "([^"]+)" not found')
_IMAGE_WAITS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")


@dataclass(frozen=True)
class Note:
    """One event (or condition) as read from the cluster: about which object, its reason and message."""

    kind: str  # PodGroup, Pod, Job
    name: str
    reason: str
    message: str
    type: str = "Warning"


@dataclass(frozen=True)
class Reason:
    """Why the run waits, in one line: what (the kind of obstacle), the detail, and what would change it."""

    what: str
    detail: str
    hint: str = ""

    def line(self) -> str:
        return f"{self.what}: {self.detail}" + (f" ({self.hint})" if self.hint else "")


def node_reasons(message: str) -> list[Reason]:
    """The reasons of a fit error's node histogram, one per kind of obstacle, each with its node count."""
    found = _NODES.search(message)
    if found is None:
        return []
    total, histogram = found.group(1), found.group(2)
    out: list[Reason] = []
    for count, text in _ITEM.findall(histogram):
        nodes = f"{count} of {total} nodes"
        if text.startswith("Insufficient "):
            resource = text.removeprefix("Insufficient ").strip()
            out.append(Reason("devices", f"{nodes}: not enough {resource} free", "fewer cluster.nodes, or wait"))
        elif "untolerated taint" in text:
            taint = text[text.find("{") :] if "{" in text else "(the taint is not named)"
            out.append(Reason("taints", f"{nodes}: taint {taint} not tolerated", "cluster.placement.tolerations"))
        elif "node affinity/selector" in text:
            out.append(Reason("selector", f"{nodes}: not matched by the node selector or affinity", "hw.node_selector"))
        elif "were unschedulable" in text:
            out.append(Reason("cordoned", f"{nodes}: cordoned (unschedulable)"))
        else:
            out.append(Reason("nodes", f"{nodes}: {text}"))
    return out


def queue_reasons(queue: str, state: str | None, notes: list[Note]) -> list[Reason]:
    """A queue that is not open, and the enqueue plugins' quota refusals (the newest of each)."""
    out: list[Reason] = []
    if state == "missing":
        out.append(Reason("queue", f"queue {queue} does not exist", "an open queue: cluster.queue"))
    elif state is not None and state != "Open":
        out.append(Reason("queue", f"queue {queue} is {state}: no job of it starts", "an open queue: cluster.queue"))
    for marker, what in ((_QUOTA, "quota"), (_OVERUSED, "cluster overused")):
        said = [n.message for n in notes if n.kind == "PodGroup" and n.message.startswith(marker)]
        if said:
            detail = said[-1].removeprefix(marker).lstrip(": ") or "no resource named"
            out.append(Reason("queue", f"queue {queue}'s {what}: {detail}", "wait, or a queue with room"))
    return out


def pod_reasons(notes: list[Note], waiting: dict[str, tuple[str, str]], run_key_hint: str) -> list[Reason]:
    """Once pods are placed: volumes that cannot be mounted (a missing Secret or claim) and images not pulled.
    ``waiting`` is each pod's container waiting reason and message."""
    out: list[Reason] = []
    mounts = [n for n in notes if n.kind == "Pod" and n.reason == "FailedMount"]
    secrets = sorted({m.group(1) for n in mounts for m in [_MISSING_SECRET.search(n.message)] if m})
    claims = sorted({m.group(1) for n in mounts for m in [_MISSING_CLAIM.search(n.message)] if m})
    for secret in secrets:
        hint = run_key_hint if secret == "recipekit-run-key" else "make it in the Job's namespace"
        out.append(Reason("volume", f"Secret {secret} is missing: the pods cannot mount it", hint))
    for claim in claims:
        out.append(Reason("volume", f"PersistentVolumeClaim {claim} is missing", "cluster.pvc_claim"))
    if mounts and not secrets and not claims:
        out.append(Reason("volume", _one_line(mounts[-1].message)))
    pulls = {pod: why for pod, why in waiting.items() if why[0] in _IMAGE_WAITS}
    if pulls:
        pod, (reason, message) = sorted(pulls.items())[0]
        detail = f"{len(pulls)} pod(s) cannot pull the image ({reason}): {_one_line(message)}"
        out.append(Reason("image", detail, "cluster.image_pull_secrets, or push the image"))
    return out


def gang_message(conditions: list[dict[str, object]], notes: list[Note]) -> str | None:
    """The gang plugin's sentence: the PodGroup's Unschedulable condition, else its newest Unschedulable Warning."""
    for condition in conditions:
        if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
            return str(condition.get("message") or "")
    warned = [n.message for n in notes if n.kind == "PodGroup" and n.reason == "Unschedulable" and n.type == "Warning"]
    return warned[-1] if warned else None


def why_pending(
    gang: str | None,
    queue: str,
    queue_state: str | None,
    notes: list[Note],
    waiting: dict[str, tuple[str, str]],
    run_key_hint: str,
) -> list[Reason]:
    """Every reason the run is not running, most specific first; Volcano's own sentence when none is recognised."""
    scheduling = [n.message for n in notes if n.kind == "Pod" and n.reason == "FailedScheduling"]
    fit = gang if gang and _NODES.search(gang) else next((m for m in reversed(scheduling) if _NODES.search(m)), gang)
    found = queue_reasons(queue, queue_state, notes) + node_reasons(fit or "")
    found += pod_reasons(notes, waiting, run_key_hint)
    if not found and fit:
        found.append(Reason("scheduler", _one_line(fit)))
    return found


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(printable(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
