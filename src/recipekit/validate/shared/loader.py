"""A bundle directory read once: raw bytes, and each file parsed into the form the checks and the dry run read.

Loading never fails on a broken file: a file that does not parse becomes a
:class:`~recipekit.validate.shared.results.Finding` (reported by the ``files.parse`` check) and its parsed field stays
None, so every other check can still run and say what it needs. Only a path that is no recipekit bundle at all raises
:class:`BundleUnusable` (exit code 2).

The helpers at the end navigate the parsed files (the Job's task and container, a Dockerfile's instructions); they
live here, beside the parsing, because the consistency checks, the image check and the dry run all read them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import RecipeError
from recipekit.base.paths import did_you_mean
from recipekit.bundle.files import DOCKERFILE, JOB, LAUNCH, MANIFEST, RUN, read_files
from recipekit.bundle.files import DS_CONFIG as DS
from recipekit.bundle.files import RECIPE as RECIPE
from recipekit.bundle.write import manifest_problem
from recipekit.plan.layout import LAYOUT_KEYS
from recipekit.recipe.sections import Recipe, parse_recipe
from recipekit.runtime.boundary import jsonfile
from recipekit.validate.shared.results import Finding

#: Summary keys recipe.yaml's plan must carry (what launch.json, the Job and train.py were rendered from).
PLAN_KEYS = {
    "job_name": str,
    "run_id": str,
    **dict.fromkeys(LAYOUT_KEYS, int),
    "precision": str,
    "comm_backend": str,
    "zero_stage": int,
    "master_port": int,
    "output_dir": str,
    "prepared_dir": str,
}
#: launch.json keys the launcher reads, with their types.
LAUNCH_KEYS = {
    "task_name": str,
    "task_env": str,
    "nodes": int,
    "nproc_per_node": int,
    "master_port": int,
    "env": dict,
    "module": str,
    "args": list,
}
_KNOWN_DEVICE_PREFIXES = ("huawei.com/", "nvidia.com/", "amd.com/", "intel.com/")


class BundleUnusable(Exception):
    """The path is not something validate can look at (exit code 2)."""


@dataclass
class Bundle:
    """A bundle directory, read once: raw bytes plus whatever parsed. Parse failures are findings, not exceptions."""

    path: Path
    raw: dict[str, bytes]
    manifest: dict[str, Any]
    doc: dict[str, Any] | None = None  # recipe.yaml
    recipe: Recipe | None = None
    ds_config: dict[str, Any] | None = None
    job: dict[str, Any] | None = None
    run_sh: str | None = None
    launch: dict[str, Any] | None = None
    dockerfile: str | None = None
    parse_findings: list[Finding] = field(default_factory=list)
    extra_entries: list[str] = field(default_factory=list)

    @property
    def plan(self) -> dict[str, Any]:
        plan = (self.doc or {}).get("plan")
        return plan if isinstance(plan, dict) else {}

    @property
    def args(self) -> dict[str, Any]:
        args = (self.doc or {}).get("training_arguments")
        return args if isinstance(args, dict) else {}

    def text(self, name: str) -> str | None:
        data = self.raw.get(name)
        return data.decode("utf-8", errors="replace") if data is not None else None


def load_bundle(directory: Path) -> Bundle:
    """Read ``directory``; raise :class:`BundleUnusable` when it is not a recipekit bundle at all."""
    directory = Path(directory)
    if not directory.exists():
        raise BundleUnusable(f"{directory}: no such directory{did_you_mean(directory)}")
    if not directory.is_dir():
        raise BundleUnusable(f"{directory}: not a directory{_file_kind(directory)}")
    problem = manifest_problem(directory)
    if problem is not None:
        raise BundleUnusable(f"{directory}: {problem}: not a recipekit bundle (build one with `recipekit build`)")
    manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))

    raw, extra_entries = read_files(directory)
    bundle = Bundle(directory, raw, manifest, extra_entries=extra_entries)
    _parse(bundle)
    return bundle


def _file_kind(path: Path) -> str:
    """What to do with a file given where a bundle directory belongs: a package is verified, a bundle's own file
    names its bundle."""
    if path.name.endswith((".tar.gz", ".tgz")):
        return f": a package (`recipekit pack` makes them); check it with `recipekit verify {path}`"
    if manifest_problem(path.parent) is None:
        return f": a file of the bundle {path.parent}; validate the bundle: `recipekit validate {path.parent}`"
    return ""


# ------------------------------------------------------------------------------------------------------- parsing
def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + str(getattr(exc, "problem", None) or exc).strip()


def _parse(bundle: Bundle) -> None:
    """Parse every file the checks read; each parser records its own findings and leaves None on failure."""
    _parse_recipe(bundle)
    _parse_ds_config(bundle)
    _parse_launch(bundle)
    _parse_job(bundle)
    _parse_run_sh(bundle)
    _parse_dockerfile(bundle)
    _parse_other_files(bundle)


def _parse_recipe(bundle: Bundle) -> None:
    """recipe.yaml: a mapping; its recipe section becomes the typed Recipe, its plan must carry :data:`PLAN_KEYS`."""
    out, text = bundle.parse_findings, bundle.text(RECIPE)
    if text is None:
        return
    try:
        doc = yamlfile.load(text, RECIPE)  # refuses alias bombs, deep nesting, huge numbers before building
    except yaml.YAMLError as exc:
        out.append(Finding(RECIPE, "", f"not valid YAML: {_yaml_error(exc)}"))
        return
    if not isinstance(doc, dict):
        out.append(Finding(RECIPE, "", "must be a mapping with recipe, plan and training_arguments"))
        return
    bundle.doc = doc
    for key in ("recipekit_version", "recipe", "plan", engine_section(doc)):
        if key not in doc:
            out.append(Finding(RECIPE, key, "required section is missing"))
    if isinstance(doc.get("recipe"), dict):
        try:
            bundle.recipe = parse_recipe(doc["recipe"])
        except RecipeError as err:
            out.extend(Finding(RECIPE, f"recipe.{p.key}", p.message, p.hint) for p in err.problems)
    elif "recipe" in doc:
        out.append(Finding(RECIPE, "recipe", "must be a mapping"))
    plan = doc.get("plan")
    if isinstance(plan, dict):
        out.extend(_typed_keys(RECIPE, "plan.", plan, PLAN_KEYS, missing="required key is missing"))
    elif "plan" in doc:
        out.append(Finding(RECIPE, "plan", "must be a mapping"))
    if "training_arguments" in doc and not isinstance(doc["training_arguments"], dict):
        out.append(Finding(RECIPE, "training_arguments", "must be a mapping"))


#: The section of recipe.yaml each engine's entrypoint reads (bundle/engines: the Trainer's arguments, the Megatron
#: room's document).
ENGINE_SECTIONS = {"trainer": "training_arguments", "megatron": "megatron"}


def engine_section(doc: dict[str, Any]) -> str:
    """The engine section a bundle's recipe.yaml must hold, by its ``recipe.engine.kind`` (the Trainer's before the
    seam)."""
    recipe = doc.get("recipe")
    engine = recipe.get("engine") if isinstance(recipe, dict) else None
    kind = engine.get("kind") if isinstance(engine, dict) else None
    return ENGINE_SECTIONS.get(kind if isinstance(kind, str) else "trainer", "training_arguments")


def _typed_keys(
    file: str, prefix: str, data: dict[str, Any], keys: dict[str, type], missing: str | None = None
) -> list[Finding]:
    """A finding per key of ``keys`` that is absent (when ``missing`` says how to word it) or of another type
    (a bool is no int here, though Python says it is)."""
    found = []
    for key, kind in keys.items():
        if key not in data and missing is not None:
            found.append(Finding(file, prefix + key, missing))
        elif not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            found.append(Finding(file, prefix + key, f"must be {kind.__name__}, got {data.get(key)!r}"))
    return found


def _parse_json_object(bundle: Bundle, name: str) -> dict[str, Any] | None:
    text = bundle.text(name)
    if text is None:
        return None
    try:
        data = jsonfile.loads(text, name)
    except jsonfile.UntrustedJSON as exc:  # not JSON, or nested deeper than anything may walk
        bundle.parse_findings.append(Finding(name, "", exc.reason))
        return None
    if not isinstance(data, dict):
        bundle.parse_findings.append(Finding(name, "", "must be a JSON object"))
        return None
    return data


def _parse_ds_config(bundle: Bundle) -> None:
    bundle.ds_config = _parse_json_object(bundle, DS)


def _parse_launch(bundle: Bundle) -> None:
    """launch.json: an object with every key the launcher reads, each of its type."""
    bundle.launch = _parse_json_object(bundle, LAUNCH)
    if bundle.launch is not None:
        bundle.parse_findings.extend(_typed_keys(LAUNCH, "", bundle.launch, LAUNCH_KEYS))


def _parse_job(bundle: Bundle) -> None:
    text = bundle.text(JOB)
    if text is None:
        return
    try:
        job = yamlfile.load(text, JOB)
    except yaml.YAMLError as exc:
        bundle.parse_findings.append(Finding(JOB, "", f"not valid YAML: {_yaml_error(exc)}"))
        return
    if isinstance(job, dict):
        bundle.job = job
    else:
        bundle.parse_findings.append(Finding(JOB, "", "must be a YAML mapping (one Job document)"))


def _parse_run_sh(bundle: Bundle) -> None:
    """run.sh: bash's own parser (``bash -n``) where bash is installed."""
    bundle.run_sh = bundle.text(RUN)
    bash = shutil.which("bash")
    if bundle.run_sh is None or not bash:
        return
    proc = subprocess.run([bash, "-n", str(bundle.path / RUN)], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["syntax error"])[0]
        bundle.parse_findings.append(Finding(RUN, "", f"bash -n: {first}"))


def _parse_dockerfile(bundle: Bundle) -> None:
    bundle.dockerfile = bundle.text(DOCKERFILE)
    if bundle.dockerfile is not None and not dockerfile_instructions(bundle.dockerfile, "FROM"):
        bundle.parse_findings.append(Finding(DOCKERFILE, "FROM", "no FROM instruction"))


def _parse_other_files(bundle: Bundle) -> None:
    """Any other structured file (plan.json, ...) must parse too, and every Python file must compile."""
    out = bundle.parse_findings
    for name in sorted(bundle.raw):
        if name in (RECIPE, DS, JOB, MANIFEST, LAUNCH):
            continue
        if name.endswith(".json"):
            try:
                jsonfile.loads(bundle.raw[name], name)
            except jsonfile.UntrustedJSON as exc:
                out.append(Finding(name, "", exc.reason))
        elif name.endswith((".yaml", ".yml")):
            try:
                yamlfile.load(bundle.raw[name].decode("utf-8", errors="replace"), name)
            except yaml.YAMLError as exc:
                out.append(Finding(name, "", f"not valid YAML: {_yaml_error(exc)}"))
    for name in sorted(n for n in bundle.raw if n.endswith(".py")):
        try:
            compile(bundle.raw[name], name, "exec")
        except SyntaxError as exc:
            out.append(Finding(name, f"line {exc.lineno}", f"Python syntax error: {exc.msg}"))


# ------------------------------------------------------------------------------------------------------- helpers
def dockerfile_instructions(text: str, keyword: str) -> list[str]:
    """Arguments of every ``keyword`` instruction, continuation lines joined, comments dropped."""
    logical: list[str] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    if current:
        logical.append(current)
    found = []
    for instruction in logical:
        head, _, rest = instruction.partition(" ")
        if head.upper() == keyword.upper():
            found.append(rest.strip())
    return found


def task_of(job: dict[str, Any] | None) -> tuple[int, dict[str, Any]] | None:
    """(index, task) of the Job's training task — the first; None when the Job has no task to check."""
    tasks = ((job or {}).get("spec") or {}).get("tasks") if isinstance((job or {}).get("spec"), dict) else None
    if isinstance(tasks, list) and tasks and isinstance(tasks[0], dict):
        return 0, tasks[0]
    return None


def container_of(task: dict[str, Any]) -> dict[str, Any]:
    """The task's first container (the trainer), or {} when the template has none."""
    spec = (task.get("template") or {}).get("spec") if isinstance(task.get("template"), dict) else None
    containers = spec.get("containers") if isinstance(spec, dict) else None
    return containers[0] if isinstance(containers, list) and containers and isinstance(containers[0], dict) else {}


def device_resources(container: dict[str, Any]) -> dict[str, Any]:
    """Extended device resources in the container's limits (falling back to requests)."""
    resources = container.get("resources") if isinstance(container.get("resources"), dict) else {}
    found = {}
    for section in ("requests", "limits"):
        for key, value in (resources.get(section) or {}).items():
            if str(key).startswith(_KNOWN_DEVICE_PREFIXES):
                found[key] = value
    return found


def as_int(value: Any) -> int | None:
    """An int from a YAML value that may be a string ("2") or absent; None when it is no integer."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def rehash_manifest(directory: Path) -> None:
    """Recompute manifest.json's hashes after an intentional edit (used by tests and the dry run's work copy)."""
    path = Path(directory) / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["files"] = {
        name: hashlib.sha256((Path(directory) / name).read_bytes()).hexdigest()
        for name in sorted(manifest["files"])
        if (Path(directory) / name).is_file()
    }
    path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
