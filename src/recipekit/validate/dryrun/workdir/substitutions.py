"""The dry run's substitutions: what a laptop must change in the bundle's recipe, each change with its reason.

Only what cannot be the same on this machine is substituted, *in the typed recipe* (the work copy is then planned
and rendered from it, :mod:`~recipekit.validate.dryrun.workdir.workcopy`): the model by its tiny twin (with whole
heads per rank under TP), the data by a small generated dataset on the work copy's volume, the PVC by a local
directory, the schedule by a few steps with a checkpoint midway, the world by the simulated pods, and on CPU the
hardware by the ``cpu`` option, with the operations layer's tests made quick.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import subprocess
from dataclasses import replace
from pathlib import Path

from recipekit.base import yamlfile
from recipekit.bundle.files import RECIPE
from recipekit.recipe.compose import group_options
from recipekit.recipe.schema import validate
from recipekit.recipe.sections import TRACKERS, HardwareSpec, Recipe
from recipekit.runtime.boundary import recipeview
from recipekit.validate.dryrun.options import DryRunOptions, DryRunUsageError
from recipekit.validate.dryrun.workdir import twinmodel
from recipekit.validate.dryrun.workdir.changes import Substituter, Substitution
from recipekit.validate.shared.childpython import python_argv, safe_env

DRY_MAX_LEN = 128
#: The module each reporter of train.report_to needs here (MLflow's client, mlflow-skinny, is the module mlflow).
_CLIENTS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "swanlab": "swanlab"}
MAX_ACCUMULATION = 2
#: The generated data is cut into about this many prepare chunks per pod, each at least DRY_MIN_CHUNK bytes.
DRY_CHUNKS_PER_POD = 4
DRY_MIN_CHUNK = 1024
#: An elastic bundle's last call here (cluster.elastic_wait_s): long enough for every simulated pod's agent to join a
#: round it can (they start in seconds on one host), short of torchrun's 30 s that a lost pod's drill would wait out.
DRY_ELASTIC_WAIT_S = 5


#: The dry run's cold store, a directory on the work copy's volume (train.cold_checkpoints).
COLD_STORE = "cold-store"


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


def substitute(recipe: Recipe, options: DryRunOptions, root: Path) -> tuple[Recipe, list[Substitution]]:
    """The dry-run recipe: ``recipe`` with only what a laptop must change, and why each change was made (the
    engine's own layout scaling first: the twin's heads follow its TP)."""
    from recipekit.validate.dryrun.workdir.engines import dryrun_engine

    sub = Substituter()
    engine = dryrun_engine(recipe.engine.kind)
    recipe = engine.layout(sub, recipe, options)
    dry = _model(sub, recipe, options, root)
    dry = _data_and_world(sub, dry, recipe, options, root)
    dry = _schedule(sub, dry, recipe, options)
    dry = _machine(sub, dry, recipe, options, root)
    dry = _evaluation(sub, dry, root)
    dry = _cold_tier(sub, dry, root)
    return dry, sub.found


def _cold_tier(sub: Substituter, dry: Recipe, root: Path) -> Recipe:
    """``train.cold_checkpoints``: the command copies into a directory of the work copy (no object store here)."""
    cold = dry.train.cold_checkpoints
    if not cold.command:
        return dry
    store = root / "shared" / COLD_STORE
    store.mkdir(parents=True, exist_ok=True)
    command = ["cp", "-r", "{checkpoint}", f"{store}/{{name}}"]
    dry = replace(dry, train=replace(dry.train, cold_checkpoints=replace(cold, command=command)))
    sub.found.append(
        Substitution(
            RECIPE,
            "recipe.train.cold_checkpoints.command",
            " ".join(cold.command),
            " ".join(command),
            f"no object store here: the cold store is {store} (the command's program, {cold.command[0]}, is the "
            "image's and is not run)",
        )
    )
    return dry


def _evaluation(sub: Substituter, dry: Recipe, root: Path) -> Recipe:
    """``eval.enabled``: the benchmark's tasks by a tiny local one on the work copy's volume (no Hub here)."""
    if not dry.eval.enabled:
        return dry
    from recipekit.validate.dryrun.workdir.tinyeval import ITEMS, TASK, write_tiny_task

    task_dir = write_tiny_task(root / "shared" / "eval-tasks")
    why = f"no dataset hub here: {ITEMS} generated multiple-choice items, a local lm-evaluation-harness task"
    return sub.section(dry, "eval", why, tasks=[TASK], task_dir=str(task_dir), limit=ITEMS, num_fewshot=0)


def _model(sub: Substituter, recipe: Recipe, options: DryRunOptions, root: Path) -> Recipe:
    """The tiny twin of the recipe's model (:func:`.twinmodel.choose_twin`), with whole heads per rank under TP."""
    procs = options.procs_per_pod
    tp = recipe.parallel.tensor_parallel
    if (options.pods * procs) % tp:
        raise DryRunUsageError(
            f"TP {tp} needs a simulated world that is a multiple of {tp}, got --pods {options.pods} × "
            f"--procs-per-pod {procs} = {options.pods * procs} processes (e.g. --pods 2 --procs-per-pod "
            f"{max(1, tp // 2)})"
        )
    twin, what = twinmodel.choose_twin(recipe.model, tp, root / "twin")
    dry = sub.whole(recipe, "model", twin, what)
    heads = twinmodel.twin_heads(twin, tp)
    if heads is not None:
        attention, kv, hidden = heads
        dry = sub.section(
            dry,
            "model",
            f"TP {tp} gives each rank whole heads: the twin gets {attention} attention and {kv} key/value heads",
            num_attention_heads=attention,
            num_kv_heads=kv,
            hidden_size=hidden,
            config=twinmodel.config_with_heads(twin.config, heads),
            params=None,  # the stored counts were the twin's own shape: count the new one from its numbers
            flops=None,  # and its FLOPs, in the counter's convention (plan.modelsize.model_flops)
            activations=None,  # and the activations measured on the old shape: the estimate's formula
        )
    return _deep_enough(sub, dry, recipe.parallel.pipeline_parallel * recipe.parallel.virtual_pipeline_stages)


def _deep_enough(sub: Substituter, dry: Recipe, stages: int) -> Recipe:
    """The twin deepened so that each of the layout's ``stages`` model chunks (pipeline stages × virtual stages, as
    the engine's layout kept them) holds whole layers of it."""
    layers = twinmodel.twin_depth(dry.model, stages)
    if layers is None:
        return dry
    return sub.section(
        dry,
        "model",
        f"{stages} model chunks (pipeline × virtual stages) each need whole layers: the twin gets {layers}",
        num_layers=layers,
        config=twinmodel.config_with_depth(dry.model.config, layers),
        params=None,
        flops=None,
        activations=None,
    )


def _data_and_world(sub: Substituter, dry: Recipe, recipe: Recipe, options: DryRunOptions, root: Path) -> Recipe:
    """Generated data on the work copy's volume (the PVC is a local directory), and the simulated pods."""
    from recipekit.validate.dryrun.workdir.tinydata import write_tiny_dataset

    procs = options.procs_per_pod
    tp = recipe.parallel.tensor_parallel
    shared = root / "shared"
    mount = recipe.cluster.mount_path
    micro = recipe.train.micro_batch_size
    accum = min(_accumulation(recipe), MAX_ACCUMULATION)
    # samples follow the data-parallel ranks, so a TP run and a run without TP at the same DP see the same data
    dp = recipeview.data_parallel_size(options.pods * procs, tp)
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
    low = recipe.cluster.min_nodes
    if low is not None and options.pods == 1:
        return sub.section(dry, "cluster", "one simulated pod: nothing to shrink to", min_nodes=None)
    if low is not None and low >= options.pods:
        dry = sub.section(
            dry,
            "cluster",
            f"elastic on {options.pods} simulated pods: it goes on with as few as {options.pods - 1}",
            min_nodes=options.pods - 1,
        )
    if low is not None and recipe.cluster.elastic_wait_s > DRY_ELASTIC_WAIT_S:
        dry = sub.section(
            dry,
            "cluster",
            f"a shrink waits {DRY_ELASTIC_WAIT_S} s for pods that may still come, not {recipe.cluster.elastic_wait_s}: "
            "a simulated pod starts in seconds",
            elastic_wait_s=DRY_ELASTIC_WAIT_S,
        )
    return dry


def _schedule(sub: Substituter, dry: Recipe, recipe: Recipe, options: DryRunOptions) -> Recipe:
    """A few steps, a checkpoint midway, every step logged, at most two micro-steps per step."""
    accum = min(_accumulation(recipe), MAX_ACCUMULATION)
    report_to = list(recipe.train.report_to)
    missing = [r for r in report_to if r in _CLIENTS and importlib.util.find_spec(_CLIENTS[r]) is None]
    report_to = [r for r in report_to if r not in missing] or ["none"]
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
    dry = sub.section(dry, "train", f"{' and '.join(missing) or 'a tracker'} not installed here", report_to=report_to)
    if set(report_to) & set(TRACKERS) and dry.train.tracking.mode != "offline":
        tracking = replace(dry.train.tracking, mode="offline")
        dry = replace(dry, train=replace(dry.train, tracking=tracking))
        sub.found.append(
            Substitution(
                RECIPE,
                "recipe.train.tracking.mode",
                "online",
                "offline",
                "no tracker server is reached from a dry run: the trackers write their files under the output "
                "directory, and the dry run reads the losses back from them",
            )
        )

    return dry


def _machine(sub: Substituter, dry: Recipe, recipe: Recipe, options: DryRunOptions, root: Path) -> Recipe:
    """This machine's hardware (the ``cpu`` option on CPU), quick operations tests, rows recorded for the resume
    check (where the engine's room records them), offload a laptop can do, and TP across the simulated pods (said
    so)."""
    from recipekit.validate.dryrun.workdir.engines import dryrun_engine

    procs = options.procs_per_pod
    tp = recipe.parallel.tensor_parallel
    if options.device == "cpu":
        dry = sub.whole(dry, "hw", cpu_hardware(), "this machine's CPU: gloo, CPU AdamW, DeepSpeed's CPU accelerator")
        if procs > dry.hw.devices_per_node:
            dry = sub.section(dry, "hw", f"a CPU 'node' runs {procs} processes per pod", devices_per_node=procs)
        if dry.train.precision == "fp16":
            dry = sub.section(dry, "train", "CPUs have no fp16", precision="bf16")
    dry = _operations(sub, dry, options)
    if not dry.data.streaming and not dry.ops.testing.record_rows and dryrun_engine(dry.engine.kind).records_rows:
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
    return dry


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


#: The dry run's all-reduce test on CPU: small messages (gloo on one host measures memory copies, not a link).
DRY_ALLREDUCE_SIZES_MB = [1.0, 4.0]
#: The dry run's point-to-point exchange and storage probe on CPU: 4 MB each. The bundle's sizes (64 MB a pair, 256 MB
#: a pod) measure links and volumes; on one host they copy memory and fill the page cache, seconds of every attempt.
DRY_P2P_MB, DRY_STORAGE_PROBE_MB = 4.0, 4
#: The hang watchdog's floor when the recipe injects a stall: detected in half a minute, not the bundle's minutes.
DRY_STALL_TIMEOUT_S = 30
#: The grad-norm alert's limit in a dry run: each logged step there is one step of a random tiny twin on a batch of a
#: few samples, whose gradient norm moves by a third from one step to the next by noise alone (a passing default dry
#: run of tiny_sft: 6.1, 4.9, 3.8, 4.3, 4.7, 3.1, 2.2, 4.5 — alerts at -34% and +104%). The bundle's limit is for real
#: batches; here only a change past 3× (a blow-up, not noise) is one.
DRY_GRAD_NORM_JUMP = 3.0


def _operations(sub: Substituter, dry: Recipe, options: DryRunOptions) -> Recipe:
    """The operations layer on a laptop: a quick bandwidth test on CPU, and a fault injected by the recipe
    (``ops.testing``) within the dry run's steps and detected quickly."""
    if options.device == "cpu":
        dry = sub.section(
            dry,
            "ops",
            "short all-reduce and point-to-point tests and a small storage probe: gloo on one host copies memory, "
            "it measures no link, and this machine's disk is not the shared volume",
            allreduce_sizes_mb=DRY_ALLREDUCE_SIZES_MB,
            allreduce_iterations=5,
            p2p_size_mb=min(dry.ops.p2p_size_mb, DRY_P2P_MB),
            storage_probe_mb=min(dry.ops.storage_probe_mb, DRY_STORAGE_PROBE_MB),
        )
    if dry.ops.grad_norm_jump_ratio < DRY_GRAD_NORM_JUMP:
        dry = sub.section(
            dry,
            "ops",
            "a random tiny twin's grad norm on a few samples moves by a third a step by noise alone: only a 3× "
            "change is an alert here",
            grad_norm_jump_ratio=DRY_GRAD_NORM_JUMP,
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
