"""The dry run's work copy: the bundle re-planned for a laptop, with every difference recorded.

Nothing in the bundle is edited by hand. The bundle's resolved recipe (recipe.yaml) is parsed into the typed Recipe,
only what cannot be the same on this machine is substituted *in the recipe*, and the work copy is planned and
rendered by the same code that built the bundle, so every derived number (world size, batch arithmetic, launch data,
Trainer arguments, ds_config) follows from the substitutions exactly as it would on a cluster:

* the model by its tiny twin of the same family (``recipes/model/tiny_<family>.yaml``: random weights, a tokenizer
  trained on the data), the data by a small generated dataset of the recipe's format
  (:mod:`~recipekit.validate.dryrun.workdir.tinydata`), cut into small prepare chunks so that every pod prepares a share
  of it, as every pod of the Job does;
* the shared volume (PVC) by ``<workdir>/shared``: output_dir and data keep their paths below the mount;
* the schedule by a few steps with a checkpoint midway, logging every step, no DataLoader workers, at most
  two accumulation micro-steps;
* the world by ``--pods`` pods × ``--procs-per-pod`` processes, and — on CPU — the hardware by the ``cpu`` option
  (gloo, CPU AdamW, DeepSpeed's CPU accelerator; fp16 becomes bf16, which CPUs have; as many "devices" per node as
  processes per pod), NVMe offload by CPU offload when DeepSpeed's async_io op cannot be built here;
* a TP group may span the simulated pods (TP 2 on 2 pods of one process): on one machine every link is local, so
  the rule that keeps TP inside a node is lifted for the work copy, and said so.

Two edits stay explicit because they are about this machine, not the recipe: ZeRO-3's
``stage3_param_persistence_threshold`` → 0 (else a tiny model partitions nothing), and the rendezvous port (a free
one per attempt, in launch.json). ``substitutions.json`` lists the recipe substitutions with their reasons, then
the difference between the bundle's files and the work copy's, key by key.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import math
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import RecipeError
from recipekit.bundle.files import DS_CONFIG, LAUNCH, RECIPE, RUN
from recipekit.recipe.compose import Composed, group_options
from recipekit.recipe.schema import to_data, validate
from recipekit.recipe.sections import HardwareSpec, ModelSpec, Recipe
from recipekit.runtime.boundary import contract
from recipekit.validate.dryrun.options import DryRunOptions, DryRunUsageError
from recipekit.validate.shared.childpython import python_argv, safe_env
from recipekit.validate.shared.loader import Bundle, rehash_manifest

if TYPE_CHECKING:
    from recipekit.bundle.build import Compiled
    from recipekit.plan.plan import Plan

MARKER = ".recipekit-dryrun"
DRY_MAX_LEN = 128
MAX_ACCUMULATION = 2
#: The generated data is cut into about this many prepare chunks per pod, each at least DRY_MIN_CHUNK bytes.
DRY_CHUNKS_PER_POD = 4
DRY_MIN_CHUNK = 1024
#: Files whose structure is compared key by key between the bundle and its work copy.
_STRUCTURED = (RECIPE, DS_CONFIG, LAUNCH)


@dataclass
class Substitution:
    """One difference between the bundle and its work copy: a recipe substitution (with its reason) or a file
    value that follows from them."""

    file: str
    field: str
    old: Any
    new: Any
    why: str
    derived: bool = False  # a consequence of the substitutions, found by comparing the two bundles

    def __str__(self) -> str:
        return f"{self.file} {self.field}: {_short(self.old)} → {_short(self.new)} ({self.why})"

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "field": self.field,
            "old": self.old,
            "new": self.new,
            "why": self.why,
            "derived": self.derived,
        }


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class WorkCopy:
    """Where a dry run's copy of the bundle, its shared volume and its logs are."""

    root: Path
    bundle: Path
    shared: Path
    logs: Path
    output_dir: Path
    task_env: str
    run_id: str
    #: the work copy's own plan, as it was compiled (re-planned by a rescale)
    plan: Plan
    substitutions: list[Substitution] = field(default_factory=list)
    deepspeed_extensions: list[str] = field(default_factory=list)
    records_rows: bool = False  # the pods write the row ledger (ops.testing.record_rows, prepared data)

    @property
    def run_key(self) -> Path:
        """The simulated cluster's Secret: the run key every pod reads (trust.KEY_ENV), as the Job mounts it."""
        return self.root / "secrets" / "run-key"


def default_workdir(bundle_dir: Path) -> Path:
    return bundle_dir.resolve().parent / ".dryrun" / bundle_dir.resolve().name


# ------------------------------------------------------------------------------------------- the substitutions
def find_twin(family: str) -> ModelSpec | None:
    """The tiny twin of ``family`` among the model options (random init, same family), tiny_<family> preferred."""
    found = []
    for name, path in group_options("model").items():
        try:
            data = yamlfile.read(path) or {}
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and data.get("family") == family and data.get("init") == "random":
            found.append((name != f"tiny_{family}", name, data))
    if not found:
        return None
    return validate(ModelSpec, sorted(found, key=lambda item: item[:2])[0][2], root="model")


def cpu_hardware() -> HardwareSpec:
    """The ``cpu`` hardware option: what a laptop is, in the recipe's own terms."""
    return validate(HardwareSpec, yamlfile.read(group_options("hw")["cpu"]), root="hw")


def _on_volume(path: str, mount: str, shared: Path, fallback: str) -> Path:
    """Where ``path`` (a path in the pod) lives in the work copy: below ``shared`` when it is on the PVC."""
    mount = mount.rstrip("/")
    if path == mount or path.startswith(mount + "/"):
        relative = path[len(mount) :].lstrip("/")
        return shared / relative if relative else shared
    return shared / fallback / Path(path).name


@functools.cache
def async_io_compatible() -> bool:
    """Whether DeepSpeed's async_io op (NVMe offload) can be built here (needs libaio), asked in a child."""
    code = (
        "from deepspeed.accelerator import get_accelerator as g; b = g().create_op_builder('AsyncIOBuilder'); "
        "print(bool(b and b.is_compatible(verbose=False)))"
    )
    try:
        proc = subprocess.run(
            python_argv("-c", code),
            capture_output=True,
            text=True,
            timeout=120,
            env=safe_env({**os.environ, "DS_ACCELERATOR": "cpu"}),
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.stdout.strip().endswith("True")


class _Substituter:
    """Collects recipe substitutions, each with its reason, as dotted recipe keys."""

    def __init__(self) -> None:
        self.found: list[Substitution] = []

    def section(self, recipe: Recipe, name: str, why: str, **changes: Any) -> Recipe:
        """``recipe`` with ``changes`` applied to section ``name``, each change that changes something recorded."""
        old = getattr(recipe, name)
        real = {k: v for k, v in changes.items() if getattr(old, k) != v}
        for key, value in real.items():
            self.found.append(
                Substitution(RECIPE, f"recipe.{name}.{key}", _plain(getattr(old, key)), _plain(value), why)
            )
        return replace(recipe, **{name: replace(old, **real)}) if real else recipe

    def whole(self, recipe: Recipe, name: str, new: Any, why: str) -> Recipe:
        old = getattr(recipe, name)
        if old == new:
            return recipe
        self.found.append(Substitution(RECIPE, f"recipe.{name}", old.name, new.name, why))
        return replace(recipe, **{name: new})


def _plain(value: Any) -> Any:
    return to_data(value) if hasattr(value, "__dataclass_fields__") else value


def substitute(recipe: Recipe, options: DryRunOptions, root: Path) -> tuple[Recipe, list[Substitution]]:
    """The dry-run recipe: ``recipe`` with only what a laptop must change, and why each change was made."""
    from recipekit.validate.dryrun.workdir.tinydata import write_tiny_dataset

    sub = _Substituter()
    twin = find_twin(recipe.model.family)
    if twin is None:
        raise DryRunUsageError(
            f"no tiny twin of model family {recipe.model.family!r} in recipes/model (a model option with "
            f"family: {recipe.model.family} and init: random)"
        )
    dry = sub.whole(
        recipe, "model", twin, f"the tiny {recipe.model.family} twin: random weights, tokenizer trained on the data"
    )
    procs = options.procs_per_pod
    tp = recipe.parallel.tensor_parallel
    if (options.pods * procs) % tp:
        raise DryRunUsageError(
            f"TP {tp} needs a simulated world that is a multiple of {tp}, got --pods {options.pods} × "
            f"--procs-per-pod {procs} = {options.pods * procs} processes (e.g. --pods 2 --procs-per-pod "
            f"{max(1, tp // 2)})"
        )
    heads = _twin_heads(twin, tp)
    if heads is not None:
        attention, kv, hidden = heads
        dry = sub.section(
            dry,
            "model",
            f"TP {tp} gives each rank whole heads: the twin gets {attention} attention and {kv} key/value heads",
            num_attention_heads=attention,
            num_kv_heads=kv,
            hidden_size=hidden,
            params=None,  # the stored counts were the twin's own shape: count the new one from its numbers
            flops=None,  # and its FLOPs, in the counter's convention (plan.modelsize.model_flops)
        )

    shared = root / "shared"
    mount = recipe.cluster.mount_path
    micro = recipe.train.micro_batch_size
    accum = min(_accumulation(recipe), MAX_ACCUMULATION)
    # samples follow the data-parallel ranks, so a TP run and a run without TP at the same DP see the same data
    dp = contract.data_parallel_size(options.pods * procs, tp)
    samples = max(64, min(2000, options.steps * micro * accum * dp * 2))
    data_path = write_tiny_dataset(recipe.data.format, _tiny_data_path(recipe.data.path, mount, shared), n=samples)
    dry = sub.section(
        dry,
        "data",
        f"{samples} generated {recipe.data.format} samples on the work copy's volume",
        path=str(data_path),
        num_samples=samples,
        num_rows=None,
        num_tokens=None,
    )
    dry = sub.section(
        dry,
        "data",
        "small chunks, so that the stream crosses several"
        if recipe.data.streaming
        else "small chunks, so that every pod prepares a share of the generated data",
        shard_mib=dry_shard_mib(data_path, options.pods),
    )
    if recipe.data.prepared_dir:
        prepared = _on_volume(recipe.data.prepared_dir, mount, shared, "prepared")
        dry = sub.section(dry, "data", f"the PVC {mount} is {shared} here", prepared_dir=str(prepared))
    if recipe.data.max_len > DRY_MAX_LEN:
        dry = sub.section(dry, "data", "short sequences for a CPU run", max_len=DRY_MAX_LEN)
    dry = sub.section(
        dry,
        "cluster",
        f"the PVC {mount} is {shared} here",
        mount_path=str(shared),
        output_dir=str(_on_volume(recipe.cluster.output_dir, mount, shared, "runs")),
    )
    dry = sub.section(
        dry,
        "cluster",
        f"{options.pods} simulated pods of {procs} process{'es' if procs > 1 else ''} each",
        nodes=options.pods,
        devices_per_pod=procs,
    )

    # schedule: a few steps, a checkpoint midway, every step logged
    report_to = list(recipe.train.report_to)
    if "tensorboard" in report_to and importlib.util.find_spec("tensorboard") is None:
        report_to = [r for r in report_to if r != "tensorboard"] or ["none"]
    dry = sub.section(
        dry,
        "train",
        "a few steps, a checkpoint midway, every step in metrics.jsonl, no DataLoader workers",
        max_steps=options.steps,
        save_steps=options.save_steps,
        logging_steps=1,
        dataloader_workers=0,
    )
    dry = sub.section(
        dry,
        "train",
        f"at most {MAX_ACCUMULATION} micro-steps per step on a small machine",
        gradient_accumulation_steps=accum,
        global_batch_size=None,
    )
    dry = sub.section(dry, "train", "tensorboard is not installed here", report_to=report_to)

    if options.device == "cpu":
        dry = sub.whole(dry, "hw", cpu_hardware(), "this machine's CPU: gloo, CPU AdamW, DeepSpeed's CPU accelerator")
        if procs > dry.hw.devices_per_node:
            dry = sub.section(dry, "hw", f"a CPU 'node' runs {procs} processes per pod", devices_per_node=procs)
        if dry.train.precision == "fp16":
            dry = sub.section(dry, "train", "CPUs have no fp16", precision="bf16")
    dry = _operations(sub, dry, options)
    if not dry.data.streaming and not dry.ops.testing.record_rows:
        testing = replace(dry.ops.testing, record_rows=True)
        dry = replace(dry, ops=replace(dry.ops, testing=testing))
        sub.found.append(
            Substitution(
                RECIPE,
                "recipe.ops.testing.record_rows",
                False,
                True,
                "every rank records the rows of each micro-batch, so a resume is checked row by row",
            )
        )
    par = dry.parallel
    if "nvme" in (par.offload_optimizer, par.offload_param):
        if options.device == "cpu" and not async_io_compatible():
            moved = {k: "cpu" for k in ("offload_optimizer", "offload_param") if getattr(par, k) == "nvme"}
            dry = sub.section(
                dry, "parallel", "NVMe offload needs DeepSpeed's async_io op (libaio), not buildable here", **moved
            )
        else:
            (root / "nvme").mkdir(parents=True, exist_ok=True)
            dry = sub.section(dry, "parallel", "a local directory for NVMe offload", nvme_path=str(root / "nvme"))
    if tp > 1 and procs % tp:
        sub.found.append(
            Substitution(
                RECIPE,
                "plan.tensor_parallel",
                f"TP {tp} inside a pod",
                f"TP {tp} across {tp // math.gcd(tp, procs)} simulated pods",
                "on one machine every link is local; the bundle keeps each TP group inside a node",
            )
        )
    return dry, sub.found


def _tiny_data_path(path: str, mount: str, shared: Path) -> Path:
    """Where the generated data goes: the recipe's path on the work copy's volume; for a glob, a directory of
    several files below the pattern's fixed part."""
    if not any(mark in path for mark in "*?["):
        return _on_volume(path, mount, shared, "data")
    parts = Path(path).parts
    fixed = parts[: next(i for i, part in enumerate(parts) if any(mark in part for mark in "*?["))]
    return _on_volume(str(Path(*fixed)) if fixed else mount, mount, shared, "data") / "tiny"


def dry_shard_mib(data: Path, pods: int) -> float:
    """Input MiB per chunk for about four chunks per pod of the generated data (at least 1 KiB each)."""
    files = [data] if data.is_file() else [p for p in data.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    return round(max(DRY_MIN_CHUNK, size // (DRY_CHUNKS_PER_POD * pods)) / 2**20, 6)


def _twin_heads(twin: ModelSpec, tp: int) -> tuple[int, int, int] | None:
    """(attention heads, key/value heads, hidden size) for the twin under TP ``tp``, or None when its own divide:
    the fewest heads that TP divides (and the key/value heads divide), at least 8 dimensions per head."""
    if twin.num_attention_heads % tp == 0 and twin.num_kv_heads % tp == 0:
        return None
    kv = math.lcm(twin.num_kv_heads, tp)
    attention = math.lcm(twin.num_attention_heads, kv)
    hidden = max(twin.hidden_size, 8 * attention)
    return attention, kv, hidden + (-hidden % attention)


#: The dry run's all-reduce test on CPU: small messages (gloo on one host measures memory copies, not a link).
DRY_ALLREDUCE_SIZES_MB = [1.0, 4.0]
#: The hang watchdog's floor when the recipe injects a stall: detected in half a minute, not the bundle's minutes.
DRY_STALL_TIMEOUT_S = 30


def _operations(sub: _Substituter, dry: Recipe, options: DryRunOptions) -> Recipe:
    """The operations layer on a laptop: a quick bandwidth test on CPU, and a fault injected by the recipe
    (``ops.testing``) within the dry run's steps and detected quickly."""
    if options.device == "cpu":
        dry = sub.section(
            dry,
            "ops",
            "a short all-reduce test: gloo on one host copies memory, it measures no link",
            allreduce_sizes_mb=DRY_ALLREDUCE_SIZES_MB,
            allreduce_iterations=5,
        )
    testing = dry.ops.testing
    for name in ("stall_at_step", "nan_at_step"):
        step = getattr(testing, name)
        if step is not None and step >= options.steps:
            raise DryRunUsageError(
                f"ops.testing.{name} is {step}, past the dry run's {options.steps} steps: use --steps {step + 2}"
            )
    if testing.stall_at_step is not None and dry.ops.stall_timeout_floor_s > DRY_STALL_TIMEOUT_S:
        dry = sub.section(
            dry,
            "ops",
            "the injected stall is detected in seconds (the bundle's floor is for real steps)",
            stall_timeout_floor_s=DRY_STALL_TIMEOUT_S,
        )
    return dry


def _accumulation(recipe: Recipe) -> int:
    from recipekit.plan.layout import recipe_layout

    return recipe_layout(recipe)[0].gradient_accumulation_steps


# ------------------------------------------------------------------------------------------------ the work copy
def prepare(bundle: Bundle, options: DryRunOptions) -> WorkCopy:
    """Re-plan the bundle's recipe for this machine into ``<workdir>/bundle``; record every difference."""
    root = (options.workdir or default_workdir(bundle.path)).resolve()
    if root == bundle.path.resolve() or bundle.path.resolve() in root.parents:
        raise DryRunUsageError(f"--workdir {root}: must be outside the bundle (the bundle is never written to)")
    if root.exists() and any(root.iterdir()) and not (root / MARKER).exists():
        raise DryRunUsageError(
            f"--workdir {root} exists and is not a recipekit dry-run directory: choose an empty or new directory"
        )
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / MARKER).write_text("recipekit validate --dry-run work directory; safe to delete\n", encoding="utf-8")

    assert bundle.recipe is not None
    dry, subs = substitute(bundle.recipe, options, root)
    copy_dir = root / "bundle"
    compiled, explicit = _compile_into(copy_dir, dry, bundle.manifest)
    plan = compiled.plan
    derived = file_differences(bundle.raw, compiled.files, covered={s.field for s in explicit})
    work = WorkCopy(
        root=root,
        bundle=copy_dir,
        shared=root / "shared",
        logs=root / "logs",
        output_dir=Path(plan.output_dir),
        task_env=plan.task_env,
        run_id=plan.run_id,
        substitutions=subs + explicit + derived,
        plan=plan,
        deepspeed_extensions=deepspeed_extensions(compiled.documents.ds_config, options.device),
        records_rows=dry.ops.testing.record_rows and not dry.data.streaming,
    )
    write_substitutions(work)
    work.run_key.parent.mkdir(mode=0o700)
    work.run_key.write_text(secrets.token_hex(32) + "\n", encoding="ascii")
    work.run_key.chmod(0o400)
    return work


def _compile_into(copy_dir: Path, dry: Recipe, manifest: dict[str, Any]) -> tuple[Compiled, list[Substitution]]:
    """Plan and render ``dry`` with the code that built the bundle, with this machine's explicit edits to its
    documents, and write the files into ``copy_dir``; returns the compiled bundle and the explicit edits."""
    from recipekit.bundle.build import Resolved, compile_bundle
    from recipekit.bundle.render import render
    from recipekit.image.matrix import load_images
    from recipekit.plan.plan import make_plan

    images = load_images()
    try:
        plan = make_plan(dry, images, tp_across_pods=True)
    except RecipeError as err:
        raise DryRunUsageError(f"the substituted recipe does not plan: {err}") from None
    composed = Composed(
        raw={}, choices=dict(manifest.get("choices") or {}), overrides=list(manifest.get("overrides") or [])
    )
    compiled = compile_bundle(Resolved(composed, dry, plan, images), allow_oom=True)
    ds_config, explicit = _tiny_model_ds_config(compiled.documents.ds_config)
    if explicit:
        documents = replace(compiled.documents, ds_config=ds_config)
        files = render(dry, plan, documents, composed, compiled.estimate, compiled.operations)
        compiled = replace(compiled, documents=documents, files=files)
    for name, data in compiled.files.items():
        path = copy_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (copy_dir / RUN).chmod(0o755)
    return compiled, explicit


def _tiny_model_ds_config(ds: dict[str, Any] | None) -> tuple[dict[str, Any] | None, list[Substitution]]:
    """The ds_config a tiny twin needs: ZeRO-3 must partition its parameters, which are all below the persistence
    threshold a real model's bundle sets."""
    zero = (ds or {}).get("zero_optimization") or {}
    if ds is None or zero.get("stage") != 3 or zero.get("stage3_param_persistence_threshold") == 0:
        return ds, []
    old = zero["stage3_param_persistence_threshold"]
    why = "else ZeRO-3 partitions no parameter of a tiny model"
    change = Substitution(DS_CONFIG, "zero_optimization.stage3_param_persistence_threshold", old, 0, why)
    return {**ds, "zero_optimization": {**zero, "stage3_param_persistence_threshold": 0}}, [change]


def rescaled_or_refused(recipe: Recipe, pods: int) -> Recipe:
    """``recipe`` on ``pods`` pods at its global batch (plan/rescale.py), or DryRunUsageError with every reason it
    cannot be: asked before any pod starts, and again when the work copy is re-planned."""
    from recipekit.plan.rescale import rescaled

    target, problems = rescaled(recipe, pods)
    if problems:
        raise DryRunUsageError(f"--resume-pods {pods}: " + "; ".join(str(p) for p in problems))
    return target


def rescale_work_copy(work: WorkCopy, pods: int) -> Substitution:
    """The work copy re-planned on ``pods`` pods at its own global batch, by the rule ``recipekit rescale`` rebuilds
    a bundle with (plan/rescale.py): the Job continuing on fewer (or more) nodes after one is lost for good. It must
    be the same run (same run id, so the same output directory and checkpoints)."""
    from recipekit.validate.shared.loader import load_bundle

    copy = load_bundle(work.bundle)
    assert copy.recipe is not None
    before = copy.recipe.cluster.nodes
    target = rescaled_or_refused(copy.recipe, pods)
    compiled, _ = _compile_into(work.bundle, target, copy.manifest)
    plan = work.plan = compiled.plan
    if plan.run_id != work.run_id:
        raise DryRunUsageError(f"--resume-pods {pods}: the rescaled work copy is run {plan.run_id}, not {work.run_id}")
    change = Substitution(
        RECIPE,
        "recipe.cluster.nodes",
        before,
        pods,
        f"a pod lost for good: the Job continues on {pods} pod(s) at the same global batch (recipekit rescale)",
    )
    work.substitutions.append(change)
    write_substitutions(work)
    return change


def write_substitutions(work: WorkCopy) -> None:
    """``substitutions.json``: every difference between the bundle and its work copy, as the dry run made them."""
    (work.root / "substitutions.json").write_text(
        json.dumps([s.to_json() for s in work.substitutions], indent=2, default=str) + "\n", encoding="utf-8"
    )


def deepspeed_extensions(ds: dict[str, Any] | None, device: str) -> list[str]:
    """The DeepSpeed C++ ops the pods will JIT-build on this CPU: prebuilt once, timed apart from the run."""
    if ds is None or device != "cpu":
        return []
    ops = ["ShareMemCommBuilder"]  # DeepSpeed's CPU collectives
    zero = ds.get("zero_optimization") or {}
    devices = {(zero.get(k) or {}).get("device") for k in ("offload_optimizer", "offload_param")}
    if devices & {"cpu", "nvme"} or "optimizer" in ds:
        ops.append("CPUAdamBuilder")
    if "nvme" in devices:
        ops.append("AsyncIOBuilder")
    return ops


def set_master_port(work: WorkCopy, port: int) -> None:
    """A free rendezvous port for one attempt: the launcher reads it from launch.json."""
    path = work.bundle / LAUNCH
    launch = json.loads(path.read_text(encoding="utf-8"))
    launch["master_port"] = port
    path.write_text(json.dumps(launch, indent=2) + "\n", encoding="utf-8")
    rehash_manifest(work.bundle)


# ------------------------------------------------------------------------------------------------- the diff
def file_differences(before: dict[str, bytes], after: dict[str, bytes], covered: set[str]) -> list[Substitution]:
    """How the work copy's pod-side files differ from the bundle's, key by key (the recipe section is described by
    the substitutions themselves, so recipe.yaml's ``recipe`` keys are left out)."""
    found: list[Substitution] = []
    for name in _STRUCTURED:
        old, new = _load(name, before.get(name)), _load(name, after.get(name))
        if name == RECIPE:
            old, new = {k: v for k, v in old.items() if k != "recipe"}, {k: v for k, v in new.items() if k != "recipe"}
        for key, a, b in _leaf_changes(old, new):
            if key not in covered:
                found.append(Substitution(name, key, a, b, "follows from the substitutions (re-planned)", derived=True))
    for name in (RUN,):
        if before.get(name) != after.get(name):
            changed = sum(
                1
                for line in difflib.unified_diff(
                    (before.get(name) or b"").decode().splitlines(), (after.get(name) or b"").decode().splitlines(), n=0
                )
                if line[:1] in "+-" and not line.startswith(("+++", "---"))
            )
            why = f"re-rendered for the substituted hardware ({changed} lines)"
            found.append(Substitution(name, "", None, None, why, derived=True))
    return found


def _load(name: str, data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {}
    loaded = json.loads(data) if name.endswith(".json") else yaml.safe_load(data)
    return loaded if isinstance(loaded, dict) else {}


def _leaf_changes(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        changes = []
        for key in list(old) + [k for k in new if k not in old]:
            path = f"{prefix}.{key}" if prefix else str(key)
            changes.extend(_leaf_changes(old.get(key), new.get(key), path))
        return changes
    return [] if old == new else [(prefix, old, new)]
