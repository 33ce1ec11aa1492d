"""``recipekit restart BUNDLE --from checkpoint-N | --fresh``: what a restart of a built bundle's run needs, written.

A Volcano Job cannot be changed once created, and a bundle's run files are fixed by the digest its Job carries
(their ConfigMap, runtime/boundary/runfiles.py), so a restart is a new Job made from the same bundle, as a Helm user
upgrades a release with one value changed: a kustomize overlay beside the bundle whose base is the bundle (every
object as built, the run files and their digest untouched) and whose one patch adds the restart request
(runtime/volume/restart.py) to the trainer container's environment. ``kubectl delete vcjob`` of the
running Job and ``kubectl apply -k`` of the overlay start it; the pods apply the request once
(the same module) and record it in the run's ``recovery.jsonl``, which ``recipekit runs history`` shows.

Where the run's output directory is reachable from here (a dry run's work copy, a volume mounted at the path the
bundle names), the named checkpoint is looked for first; elsewhere the first pod checks it and refuses with the
checkpoints it has. The overlay directory holds only what this module writes (``restart.json`` marks it), so writing
the next restart replaces it and nothing else.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import Problem, RecipeError
from recipekit.runtime.boundary import filenames
from recipekit.runtime.volume import resume
from recipekit.runtime.volume.restart import RESTART_ENV, RestartRequest, choice, new_request

#: The files every overlay holds; ``restart.json`` (the request, for people and for the next restart) marks one.
KUSTOMIZATION = "kustomization.yaml"
REQUEST_FILE = "restart.json"
_JOB_FILE = "volcano-job.yaml"


@dataclass(frozen=True)
class Restart:
    """A written restart: the request, the overlay, the Job it replaces, and whether the checkpoint was seen here."""

    request: RestartRequest
    overlay: Path
    job: str
    namespace: str
    output_dir: str
    checked: str  # what was checked here about the checkpoint (or why nothing could be)

    def kubectl_lines(self) -> list[str]:
        ns, job, overlay = shlex.quote(self.namespace), shlex.quote(self.job), shlex.quote(str(self.overlay))
        return [f"kubectl -n {ns} delete vcjob {job} --ignore-not-found", f"kubectl apply -k {overlay}"]


def _job(bundle: Path) -> tuple[str, str, str]:
    """The bundle's Job name, namespace and output directory; RecipeError when it is not a bundle restart can use."""
    where = bundle / _JOB_FILE
    if not (bundle / KUSTOMIZATION).is_file() or not where.is_file():
        raise RecipeError([Problem(str(bundle), f"not a bundle: no {KUSTOMIZATION} and {_JOB_FILE} in it")])
    job = yamlfile.read(where)
    try:
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        env = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"]
        recipe = yamlfile.read(bundle / filenames.RECIPE_FILE)
        output = recipe["training_arguments"]["output_dir"]
    except (KeyError, IndexError, TypeError, OSError):
        raise RecipeError(
            [Problem(str(where), "not a bundle's Job (no name, namespace or trainer environment)")]
        ) from None
    if not all(isinstance(v, str) for v in (name, namespace, output)) or not isinstance(env, list):
        raise RecipeError([Problem(str(where), "not a bundle's Job (no name, namespace or trainer environment)")])
    return name, namespace, output


def _checked(output_dir: str, start_from: str | None) -> str:
    """What can be said here about the checkpoint: found, missing (a RecipeError naming those there) or unseen."""
    here = Path(output_dir)
    if not here.is_dir():
        return f"{output_dir} is not reachable from here: the first pod checks the request"
    if start_from is None:
        found = [f"checkpoint-{step}" for step, _ in sorted(resume.candidates(here))]
        return f"every checkpoint is set aside: {', '.join(found) or 'none there yet'}"
    if not (here / start_from).is_dir():
        there = [f"checkpoint-{step}" for step, _ in sorted(resume.candidates(here))]
        raise RecipeError(
            [
                Problem(
                    "--from",
                    f"{start_from} is not in {output_dir}",
                    hint=f"checkpoints there: {', '.join(there) or 'none'}",
                )
            ]
        )
    newer = [f"checkpoint-{s}" for s, _ in sorted(resume.candidates(here)) if s > int(start_from.split("-")[1])]
    return f"{start_from} is there; set aside: {', '.join(newer) or 'nothing newer'}"


def _kustomization(bundle: Path, overlay: Path, job: str, request: RestartRequest) -> str:
    patch = [
        {
            "op": "add",
            "path": "/spec/tasks/0/template/spec/containers/0/env/-",
            "value": {"name": RESTART_ENV, "value": request.to_env()},
        }
    ]
    document = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(bundle.resolve(), overlay.resolve())],
        "patches": [
            {
                "target": {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job", "name": job},
                "patch": yaml.safe_dump(patch, sort_keys=False),
            }
        ],
    }
    header = (
        f"# Written by `recipekit restart` (request {request.id}: {request.label}). The bundle's objects as\n"
        f"# built; the Job's trainer gets {RESTART_ENV}, which the pods apply once. Apply it after deleting\n"
        "# the running Job.\n"
    )
    return header + yaml.dump(document, Dumper=_Literal, sort_keys=False)


class _Literal(yaml.SafeDumper):
    """Multi-line text as a literal block (the patch reads as the YAML it is)."""


_Literal.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None),
)


def write_restart(bundle: Path, start_from: str, overlay: Path | None = None) -> Restart:
    """Write the overlay of a restart of ``bundle``'s run from ``start_from`` (``checkpoint-N`` or ``fresh``)."""
    try:
        wanted = choice(start_from)
    except ValueError as exc:
        raise RecipeError([Problem("--from", str(exc))]) from None
    bundle = Path(bundle)
    job, namespace, output_dir = _job(bundle)
    checked = _checked(output_dir, wanted)
    target = Path(overlay) if overlay is not None else bundle.resolve().parent / f"{bundle.resolve().name}-restart"
    if target.resolve() == bundle.resolve() or bundle.resolve() in target.resolve().parents:
        raise RecipeError([Problem(str(target), "inside the bundle: the bundle is never written to")])
    if target.is_symlink() or (target.exists() and not (target / REQUEST_FILE).is_file()):
        raise RecipeError([Problem(str(target), "exists and is not a restart overlay: not replaced", hint="-o DIR")])
    request = new_request(wanted)
    files = {
        KUSTOMIZATION: _kustomization(bundle, target, job, request),
        REQUEST_FILE: json.dumps({"id": request.id, "from": request.start_from, "bundle": str(bundle.resolve())})
        + "\n",
    }
    _replace(target, files)
    return Restart(request, target, job, namespace, output_dir, checked)


def _replace(target: Path, files: dict[str, str]) -> None:
    """``files`` as the whole of directory ``target``, swapped in at once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        staging.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
