"""A bundle's Kubernetes objects as ``kubectl apply -k`` would apply them, and a run named by its bundle or its Job.

Submit sends exactly what the bundle's kustomization lists — the run files' ConfigMap and the Volcano Job — read
from the bundle under the same bounds as every reader of a bundle (a bundle may come from another team), and refuses
anything else there: a Secret (a key must never travel in a bundle), another kind (apply it with kubectl yourself).
From the Job come the names the pods need to exist before they can start: the run-key Secret, the claim, the pull
Secrets, the service account and the priority class.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import Problem, RecipeError
from recipekit.bundle.files import JOB, KUSTOMIZATION, RECIPE
from recipekit.recipe.k8snames import is_dns_label

#: The objects submit applies, by kind: what a bundle's kustomization lists.
KINDS = ("ConfigMap", "Job")
JOB_API = ("batch.volcano.sh", "v1alpha1", "jobs")


@dataclass(frozen=True)
class Needs:
    """What the pods mount or name that the bundle does not create: it must exist before they can start."""

    secrets: tuple[str, ...]  # secret volumes (the run key)
    claims: tuple[str, ...]
    pull_secrets: tuple[str, ...]
    service_account: str | None
    priority_class: str | None


@dataclass(frozen=True)
class BundleObjects:
    """What submit sends: the ConfigMap of the run files and the Job, from one bundle."""

    path: Path
    configmap: dict[str, Any]
    job: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.job["metadata"].get("namespace") or "default")

    @property
    def run_id(self) -> str | None:
        value = (self.job["metadata"].get("labels") or {}).get("recipekit.io/run")
        return str(value) if value else None

    @property
    def queue(self) -> str:
        return str(self.job.get("spec", {}).get("queue") or "default")

    def needs(self) -> Needs:
        pods = [((t or {}).get("template") or {}).get("spec") or {} for t in self.job["spec"].get("tasks") or []]
        volumes = [v for pod in pods for v in pod.get("volumes") or [] if isinstance(v, dict)]
        pod = pods[0] if pods else {}
        return Needs(
            secrets=_unique(str((v.get("secret") or {}).get("secretName")) for v in volumes if v.get("secret")),
            claims=_unique(
                str((v.get("persistentVolumeClaim") or {}).get("claimName"))
                for v in volumes
                if v.get("persistentVolumeClaim")
            ),
            pull_secrets=_unique(str((r or {}).get("name")) for p in pods for r in p.get("imagePullSecrets") or []),
            service_account=pod.get("serviceAccountName"),
            priority_class=pod.get("priorityClassName") or self.job["spec"].get("priorityClassName"),
        )


def _unique(names: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


def _yaml(path: Path) -> Any:
    try:
        return yamlfile.read(path)
    except OSError as exc:
        raise RecipeError([Problem(str(path), f"cannot be read ({exc.strerror or exc})")]) from None
    except yaml.YAMLError as exc:
        raise RecipeError([Problem(str(path), yamlfile.one_line(exc))]) from None


def read_bundle(path: Path) -> BundleObjects:
    """The objects ``path``'s kustomization lists; RecipeError (exit 2) naming what makes the bundle unusable."""
    kustomization = _yaml(path / KUSTOMIZATION) if (path / KUSTOMIZATION).is_file() else None
    if not isinstance(kustomization, dict):
        raise RecipeError([Problem(str(path), f"not a bundle: no {KUSTOMIZATION}", hint="recipekit build first")])
    found: dict[str, dict[str, Any]] = {}
    problems: list[Problem] = []
    for name in kustomization.get("resources") or []:
        file = path / str(name)
        outside = Path(str(name)).is_absolute() or ".." in Path(str(name)).parts or file.is_symlink()
        if outside or not file.is_file():
            problems.append(Problem(str(path / KUSTOMIZATION), f"resource {name!r} is not a file of the bundle"))
            continue
        document = _yaml(file)
        kind = document.get("kind") if isinstance(document, dict) else None
        if kind not in KINDS or kind in found or not isinstance(document.get("metadata"), dict):
            allowed = "one ConfigMap (the run files) and one Volcano Job"
            problems.append(Problem(str(file), f"a {kind or 'non-object'} among the resources", hint=allowed))
            continue
        found[str(kind)] = document
    for key in sorted(kustomization.keys() & {"secretGenerator", "configMapGenerator", "generators"}):
        problems.append(Problem(str(path / KUSTOMIZATION), f"{key}: submit applies the bundle's files only"))
    if not problems and set(found) != set(KINDS):
        problems.append(Problem(str(path / KUSTOMIZATION), f"lists no {' or '.join(sorted(set(KINDS) - set(found)))}"))
    if problems:
        raise RecipeError(problems)
    job = found["Job"]
    if job.get("apiVersion") != "/".join(JOB_API[:2]) or not isinstance(job.get("spec"), dict):
        raise RecipeError([Problem(str(path / JOB), "not a batch.volcano.sh/v1alpha1 Job with a spec")])
    return BundleObjects(path, found["ConfigMap"], job)


@dataclass(frozen=True)
class RunRef:
    """A run as the commands name it: its Job's name, the namespace the bundle fixes (None: the connection's), and
    the bundle when RUN was one."""

    job_name: str
    namespace: str | None
    bundle: Path | None


def locate(run: str) -> RunRef:
    """RUN: a bundle directory (its Job's name and namespace) or a Job's name."""
    path = Path(run)
    if path.is_dir() and (path / KUSTOMIZATION).is_file():
        objects = read_bundle(path)
        return RunRef(objects.name, objects.namespace, path)
    if path.is_dir() and (path / RECIPE).is_file():
        raise RecipeError([Problem(run, f"a bundle without {KUSTOMIZATION}: rebuild it with this recipekit")])
    if not is_dns_label(run):
        raise RecipeError(
            [Problem(run, "neither a bundle directory nor a Job name (a DNS-1123 label)", hint="what submit printed")]
        )
    return RunRef(run, None, None)
