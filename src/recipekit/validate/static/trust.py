"""What a bundle's pods trust, said in ``validate``: the run key that proves which checkpoints this run wrote.

The Job must mount the run-key Secret read-only where launch.json's ``RECIPEKIT_RUN_KEY_FILE`` points: without it
train.py saves unsigned checkpoints and refuses every resume (runtime/session/checkpoints.py, docs/trust.md). A
hand-edited Job that dropped the mount, made it optional or left the key out of it is a failure here rather than a
surprise at the first restart.

The bundle never holds the key, so ``kubectl apply -k`` of it cannot create the Secret: the kustomization lists the
run files' ConfigMap and the Job, and no Secret or generator (a key written into the bundle would be shared with
everyone who gets the bundle). What this check proves is that shape, and that the README says which Secret to make
and how; whether the Secret exists in the cluster needs the cluster, and ``recipekit submit`` checks it. The passing
line says exactly that.
"""

from __future__ import annotations

from typing import Any

import yaml

from recipekit.base import yamlfile
from recipekit.bundle.documents import run_key_command
from recipekit.bundle.files import JOB, KUSTOMIZATION, LAUNCH, README
from recipekit.runtime.volume import trust
from recipekit.validate.shared.loader import Bundle, task_of
from recipekit.validate.shared.results import Finding, Result

#: What a kustomization may list for ``kubectl apply -k`` to create: the run files and the Job, nothing that could
#: carry the key (a Secret, or a generator of one).
_GENERATORS = ("secretGenerator", "configMapGenerator", "generators")


def check_trust(bundle: Bundle) -> Result:
    result = Result(
        "trust.run-key",
        "the Job mounts the run-key Secret read-only; the bundle holds no key; the README says how to make it",
    )
    if bundle.job is None or bundle.launch is None:
        return result.skip(f"{JOB} or {LAUNCH} missing or unparseable")
    wanted = (bundle.launch.get("env") or {}).get(trust.KEY_ENV)
    if wanted != f"{trust.KEY_MOUNT}/{trust.KEY_NAME}":
        result.fail(LAUNCH, f"env.{trust.KEY_ENV}", f"is {wanted!r}, not {trust.KEY_MOUNT}/{trust.KEY_NAME}")
    located = task_of(bundle.job)  # the trainers' task; an elastic Job's rendezvous pod signs nothing
    if located is not None:
        index, task = located
        where = f"spec.tasks[{index}].template.spec"
        problem = _mount_problem((task.get("template") or {}).get("spec") or {})
        if problem:
            result.fail(JOB, where, problem, f"mount Secret {trust.SECRET_NAME} read-only at {trust.KEY_MOUNT}")
    namespace = ((bundle.job.get("metadata") or {}).get("namespace")) or "default"
    result.fail_all(kustomization_findings(bundle) + _readme_findings(bundle, namespace))
    if not result.failed:
        result.reason = (
            f"kubectl apply -k creates the run files and the Job, not Secret {trust.SECRET_NAME} (no key in the "
            f"bundle): make it once in namespace {namespace} as the README says; not checked here (`recipekit "
            "submit` checks it); still trusted: the image, the bundle, whoever can read the Secret (docs/trust.md)"
        )
    return result


def _mount_problem(spec: dict[str, Any]) -> str | None:
    volumes = {str(v.get("name")): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    secrets: dict[str, dict[str, Any]] = {
        n: v["secret"] for n, v in volumes.items() if isinstance(v.get("secret"), dict)
    }
    secret_volumes = {name for name, s in secrets.items() if s.get("secretName") == trust.SECRET_NAME}
    if not secret_volumes:
        return f"no volume from Secret {trust.SECRET_NAME}"
    for name in sorted(secret_volumes):
        if secrets[name].get("optional"):
            return f"volume {name!r} is optional: a pod without the Secret would start and sign nothing"
        keys = [item.get("key") for item in secrets[name].get("items") or [] if isinstance(item, dict)]
        if secrets[name].get("items") and trust.KEY_NAME not in keys:
            return f"volume {name!r} lists items without {trust.KEY_NAME!r}: the key file would be missing"
    for container in spec.get("containers") or []:
        for mount in (container or {}).get("volumeMounts") or []:
            if mount.get("name") in secret_volumes and mount.get("mountPath") == trust.KEY_MOUNT:
                return None if mount.get("readOnly") else f"the run key is mounted writable at {trust.KEY_MOUNT}"
    return f"the Secret {trust.SECRET_NAME} is not mounted at {trust.KEY_MOUNT}"


def kustomization_findings(bundle: Bundle) -> list[Finding]:
    """``kubectl apply -k`` of the bundle: its resources are bundle files, none a Secret, no generator; every
    ConfigMap the pods mount is among them (so apply creates it), and the Job is."""
    raw = bundle.raw.get(KUSTOMIZATION)
    if raw is None:
        return [Finding(KUSTOMIZATION, "", "missing: `kubectl apply -k` of the bundle has nothing to apply")]
    try:
        document = yamlfile.load(raw.decode("utf-8", errors="replace"), KUSTOMIZATION)
    except yaml.YAMLError as exc:
        return [Finding(KUSTOMIZATION, "", yamlfile.one_line(exc))]
    if not isinstance(document, dict):
        return [Finding(KUSTOMIZATION, "", "not a mapping")]
    out = [
        Finding(KUSTOMIZATION, key, "would generate objects beside the bundle's files", hint="list files in resources")
        for key in _GENERATORS
        if key in document
    ]
    resources = document.get("resources")
    kinds: dict[str, str] = {}
    for i, name in enumerate(resources if isinstance(resources, list) else []):
        kind, problem = _resource_kind(bundle, name)
        if problem:
            out.append(Finding(KUSTOMIZATION, f"resources[{i}]", problem))
        elif kind == "Secret":
            out.append(Finding(KUSTOMIZATION, f"resources[{i}]", f"{name} is a Secret: a key in the bundle"))
        kinds[str(name)] = kind or ""
    if JOB not in kinds:
        out.append(Finding(KUSTOMIZATION, "resources", f"does not list {JOB}: apply -k would start nothing"))
    listed = {_name(bundle, name) for name, kind in kinds.items() if kind == "ConfigMap"}
    for mounted in sorted(_mounted_configmaps(bundle.job or {}) - listed):
        out.append(Finding(KUSTOMIZATION, "resources", f"no file makes ConfigMap {mounted}, which the pods mount"))
    return out


def _resource_kind(bundle: Bundle, name: Any) -> tuple[str | None, str | None]:
    """The kind of the bundle file ``name`` lists (one document), or what is wrong with the entry."""
    if not isinstance(name, str) or name not in bundle.raw:
        return None, f"{name!r} is not a file of the bundle"
    try:
        document = yamlfile.load(bundle.raw[name].decode("utf-8", errors="replace"), name)
    except yaml.YAMLError:
        return None, f"{name} does not parse (files.parse says why)"
    kind = document.get("kind") if isinstance(document, dict) else None
    return (str(kind), None) if isinstance(kind, str) else (None, f"{name} is not one Kubernetes object")


def _name(bundle: Bundle, file: str) -> str:
    metadata = yamlfile.load(bundle.raw[file].decode("utf-8", errors="replace"), file).get("metadata")
    return str(metadata.get("name")) if isinstance(metadata, dict) else ""


def _mounted_configmaps(job: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    for task in (job.get("spec") or {}).get("tasks") or []:
        for volume in (((task or {}).get("template") or {}).get("spec") or {}).get("volumes") or []:
            config = volume.get("configMap") if isinstance(volume, dict) else None
            if isinstance(config, dict) and not config.get("optional"):
                found.add(str(config.get("name")))
    return found


def _readme_findings(bundle: Bundle, namespace: str) -> list[Finding]:
    """The README tells the one thing apply -k cannot do: the command that makes the Secret, in its first screen."""
    text = bundle.text(README)
    command = run_key_command(namespace)
    if text is None:
        return [Finding(README, "", f"missing: nothing tells a user to run {command}")]
    first_screen = "\n".join(text.splitlines()[:24])
    if command not in first_screen:
        return [Finding(README, "", f"its first screen does not say how to make the run key: {command}")]
    return []
