"""The dry run: the bundle's own run.sh and train.py, as N simulated Volcano pods on this machine.

Nothing in the bundle is rewritten. It is copied to a work directory and only what cannot be the same on a laptop
is substituted, each substitution recorded (``substitutions.json``) and reported:

* the model by its tiny twin of the same family (``recipes/model/tiny_<family>.yaml``: random weights, a tokenizer
  trained on the data), the data by a small generated dataset of the recipe's format (:mod:`recipekit.tinydata`);
* the shared volume (PVC) by ``<workdir>/shared``: output_dir and data keep their paths below the mount;
* the schedule by a few steps with a checkpoint midway, logging every step, no DataLoader workers;
* the world size by ``--pods`` × 1 process (run.sh honours ``RECIPEKIT_NPROC_PER_NODE``): ds_config's
  train_batch_size/gradient_accumulation_steps and recipe.yaml's plan and Trainer arguments are fixed together,
  so DeepSpeed and the Trainer still agree; run.sh's ``EXPECTED_NODES`` when ``--pods`` differs from the bundle;
* the rendezvous port in run.sh's ``MASTER_PORT=`` line by a free one (per attempt);
* on CPU: fp16 → bf16 (CPU has no fp16), ZeRO-3's ``stage3_param_persistence_threshold`` → 0 (else a tiny model
  partitions nothing), NVMe offload → CPU offload when DeepSpeed's async_io op cannot be built here.

The same ZeRO stage and offload are kept. Backend and optimizer are left to train.py, which adapts them to the
device it finds and logs each change ("adapted: ..."); those lines are collected into the report.

Each pod is ``bash run.sh`` with what Volcano's env and svc plugins inject (``VC_TASK_INDEX``, ``VK_TASK_INDEX``,
``VC_<TASK>_HOSTS`` = 127.0.0.1 per pod, ``VC_<TASK>_NUM``). With ``--kill-pod I --at-step S``, pod I's whole process
tree is SIGKILLed when the trainer logs step S; the other pods are deleted as Volcano's RestartJob does (SIGTERM,
grace period, SIGKILL), then every pod is started again and the run must resume from the last complete checkpoint.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import math
import os
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
from recipekit.bundlefiles import LAUNCH
from recipekit.paths import cache_dir
from recipekit.plan import task_env_name
from recipekit.validate.checks import Result
from recipekit.validate.static import DS, RECIPE, RUN, Bundle, check_batch, load_bundle, rehash_manifest, task_of

MARKER = ".recipekit-dryrun"
METRICS_FILE = "metrics.jsonl"  # train.py's per-log-step JSON lines, written by rank 0 into output_dir
DRY_MAX_LEN = 128
MAX_ACCUMULATION = 2
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")
_RESUME_LINE = re.compile(r"resume from (\S+)")
_ADAPTED_LINE = re.compile(r"adapted: (.+)$")
Progress = Callable[[str], None]


class DryRunUsageError(Exception):
    """Arguments or a work directory the dry run cannot use (exit code 2)."""


@dataclass
class DryRunOptions:
    pods: int = 2
    steps: int = 8
    kill_pod: int | None = None
    at_step: int | None = None
    device: str = "cpu"  # cpu | npu | cuda
    workdir: Path | None = None
    timeout: float = 900.0  # the whole dry run, seconds
    grace: float = 20.0  # SIGTERM → SIGKILL when Volcano deletes the surviving pods

    @property
    def save_steps(self) -> int:
        return max(1, self.steps // 2)

    def check(self) -> None:
        """Raise DryRunUsageError for flags that contradict each other."""
        if self.pods < 1:
            raise DryRunUsageError(f"--pods must be at least 1 (got {self.pods})")
        if self.steps < 2:
            raise DryRunUsageError(f"--steps must be at least 2 (got {self.steps})")
        if self.at_step is not None and self.kill_pod is None:
            raise DryRunUsageError("--at-step needs --kill-pod")
        if self.kill_pod is not None:
            if not 0 <= self.kill_pod < self.pods:
                raise DryRunUsageError(f"--kill-pod {self.kill_pod}: pods are numbered 0..{self.pods - 1}")
            if self.at_step is None:
                self.at_step = min(self.steps - 1, self.save_steps + max(1, self.steps // 4))
            if not 1 <= self.at_step < self.steps:
                raise DryRunUsageError(
                    f"--at-step {self.at_step}: must be between 1 and --steps - 1 ({self.steps - 1})"
                )
        if self.device not in ("cpu", "npu", "cuda"):
            raise DryRunUsageError(f"--device {self.device}: cpu, npu or cuda")


@dataclass
class Substitution:
    file: str
    field: str
    old: Any
    new: Any
    why: str

    def __str__(self) -> str:
        return f"{self.file} {self.field}: {_short(self.old)} → {_short(self.new)} ({self.why})"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "field": self.field, "old": self.old, "new": self.new, "why": self.why}


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class WorkCopy:
    root: Path
    bundle: Path
    shared: Path
    logs: Path
    output_dir: Path
    task_env: str
    substitutions: list[Substitution] = field(default_factory=list)
    deepspeed_ops: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- prerequisites
def _missing_modules(bundle: Bundle) -> list[str]:
    needed = ["torch", "transformers", "datasets", "tokenizers", "psutil"]
    if bundle.plan.get("zero_stage"):
        needed.append("deepspeed")
    if bundle.recipe is not None and bundle.recipe.mode.kind in ("lora", "qlora"):
        needed.append("peft")
    return [name for name in needed if importlib.util.find_spec(name) is None]


def _devices(kind: str) -> tuple[int, str]:
    """How many ``kind`` devices this machine has (asked in a child: importing torch_npu here is not wanted)."""
    probe = {
        "cuda": "import torch; print(torch.cuda.device_count())",
        "npu": "import torch, torch_npu; print(torch.npu.device_count())",
    }[kind]
    try:
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return 0, "probing the devices timed out"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return 0, f"{kind} is not usable here ({last[:160]})"
    try:
        return int(proc.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return 0, f"could not count {kind} devices"


def default_workdir(bundle_dir: Path) -> Path:
    return bundle_dir.resolve().parent / ".dryrun" / bundle_dir.resolve().name


def extensions_dir() -> Path:
    """Where DeepSpeed's JIT-compiled ops are cached for dry runs.

    A directory of its own: torch rebuilds an op whenever the last build in its directory was made by a different
    ninja or command (the venv's ninja 1.13 and a system ninja 1.11 alternate otherwise), and pods and the prebuild
    here always run with the same environment (:func:`pod_environment`), so they share one build.
    """
    return cache_dir("torch_extensions", "dryrun")


# ------------------------------------------------------------------------------------------------ the work copy
def find_twin(family: str) -> dict[str, Any] | None:
    """The tiny twin of ``family`` among the model options (random init, same family), tiny_<family> preferred."""
    from recipekit.compose import group_options

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
    from recipekit.recipe import ModelSpec
    from recipekit.schema import to_data, validate

    # an option spells only what differs from the record's defaults: the twin is the whole record
    return to_data(validate(ModelSpec, sorted(found, key=lambda item: item[:2])[0][2], root="model"))


def _on_volume(path: str, mount: str, shared: Path, fallback: str) -> Path:
    """Where ``path`` (a path in the pod) lives in the work copy: below ``shared`` when it is on the PVC."""
    mount = mount.rstrip("/")
    if path == mount or path.startswith(mount + "/"):
        relative = path[len(mount) :].lstrip("/")
        return shared / relative if relative else shared
    return shared / fallback / Path(path).name


@functools.cache
def _async_io_compatible() -> bool:
    """Whether DeepSpeed's async_io op (NVMe offload) can be built here (needs libaio), asked in a child."""
    code = (
        "from deepspeed.accelerator import get_accelerator as g; b = g().create_op_builder('AsyncIOBuilder'); "
        "print(bool(b and b.is_compatible(verbose=False)))"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "DS_ACCELERATOR": "cpu"},
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.stdout.strip().endswith("True")


def prepare(bundle: Bundle, options: DryRunOptions) -> WorkCopy:
    """Copy the bundle to the work directory and make the laptop substitutions; return where everything is."""
    root = (options.workdir or default_workdir(bundle.path)).resolve()
    if root == bundle.path.resolve() or bundle.path.resolve() in root.parents:
        raise DryRunUsageError(f"--workdir {root}: must be outside the bundle (the bundle is never written to)")
    if root.exists() and any(root.iterdir()) and not (root / MARKER).exists():
        raise DryRunUsageError(
            f"--workdir {root} exists and is not a recipekit dry-run directory: choose an empty or new directory"
        )
    if root.exists():
        shutil.rmtree(root)
    copy_dir = root / "bundle"
    copy_dir.mkdir(parents=True)
    (root / MARKER).write_text("recipekit validate --dry-run work directory; safe to delete\n", encoding="utf-8")
    for name, data in bundle.raw.items():
        (copy_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (copy_dir / name).write_bytes(data)
    (copy_dir / RUN).chmod(0o755)

    assert bundle.doc is not None and bundle.recipe is not None
    doc = copy.deepcopy(bundle.doc)
    recipe, plan, args = doc["recipe"], doc["plan"], doc["training_arguments"]
    ds = copy.deepcopy(bundle.ds_config) if bundle.ds_config is not None else None
    subs: list[Substitution] = []
    shared = root / "shared"
    cpu = options.device == "cpu"

    def sub(file: str, container: dict[str, Any], key: str, new: Any, why: str, path: str | None = None) -> None:
        old = container.get(key, None)
        if old == new and key in container:
            return
        container[key] = new
        subs.append(Substitution(file, path or key, old, new, why))

    # model → tiny twin of the same family
    family = bundle.recipe.model.family
    twin = find_twin(family)
    if twin is None:
        raise DryRunUsageError(
            f"no tiny twin of model family {family!r} in recipes/model (a model option with "
            f"family: {family} and init: random)"
        )
    if recipe["model"] != twin:
        subs.append(
            Substitution(
                RECIPE,
                "recipe.model",
                recipe["model"].get("name"),
                twin.get("name"),
                f"the tiny {family} twin: random weights, tokenizer trained on the data",
            )
        )
        recipe["model"] = dict(twin)

    # shared volume → <workdir>/shared; data → a tiny generated set of the same format
    mount = bundle.recipe.cluster.mount_path
    data = recipe["data"]
    data_path = _on_volume(bundle.recipe.data.path, mount, shared, "data")
    global_micro = (
        args.get("per_device_train_batch_size", 1)
        * min(args.get("gradient_accumulation_steps", 1), MAX_ACCUMULATION)
        * options.pods
    )
    samples = max(64, min(2000, options.steps * global_micro * 2))
    from recipekit.tinydata import write_tiny_dataset

    written = write_tiny_dataset(bundle.recipe.data.format, data_path, n=samples, seed=0)
    sub(
        RECIPE,
        data,
        "path",
        str(written),
        f"{samples} generated {bundle.recipe.data.format} samples on the work copy's shared volume",
        "recipe.data.path",
    )
    sub(RECIPE, data, "num_samples", samples, "the generated set's size", "recipe.data.num_samples")
    if data.get("max_len", DRY_MAX_LEN) > DRY_MAX_LEN:
        sub(RECIPE, data, "max_len", DRY_MAX_LEN, "short sequences for a CPU run", "recipe.data.max_len")
    output_dir = _on_volume(str(args["output_dir"]), mount, shared, "runs")
    sub(
        RECIPE,
        args,
        "output_dir",
        str(output_dir),
        f"the PVC {mount} is {shared} here",
        "training_arguments.output_dir",
    )
    sub(RECIPE, plan, "output_dir", str(output_dir), "the same as training_arguments.output_dir", "plan.output_dir")

    # schedule: a few steps, a checkpoint midway
    steps, save = options.steps, options.save_steps
    if "num_train_epochs" in args:
        old = args.pop("num_train_epochs")
        subs.append(Substitution(RECIPE, "training_arguments.num_train_epochs", old, None, "max_steps instead"))
    sub(RECIPE, args, "max_steps", steps, "a few steps", "training_arguments.max_steps")
    sub(RECIPE, args, "save_steps", save, "a checkpoint midway", "training_arguments.save_steps")
    if "eval_steps" in args:
        sub(RECIPE, args, "eval_steps", save, "evaluate at the checkpoint", "training_arguments.eval_steps")
    sub(RECIPE, args, "logging_steps", 1, "every step in metrics.jsonl", "training_arguments.logging_steps")
    sub(
        RECIPE,
        args,
        "dataloader_num_workers",
        0,
        "no DataLoader worker processes on a small CPU",
        "training_arguments.dataloader_num_workers",
    )
    warmup = math.ceil(bundle.recipe.train.warmup_ratio * steps)
    if isinstance(args.get("warmup_steps"), (int, float)) and args["warmup_steps"] > warmup:
        sub(
            RECIPE,
            args,
            "warmup_steps",
            warmup,
            f"warmup_ratio {bundle.recipe.train.warmup_ratio} of {steps} steps",
            "training_arguments.warmup_steps",
        )
    if "tensorboard" in (args.get("report_to") or []) and importlib.util.find_spec("tensorboard") is None:
        sub(RECIPE, args, "report_to", "none", "tensorboard is not installed here", "training_arguments.report_to")
    for key, new in (("max_steps", steps), ("save_steps", save), ("logging_steps", 1), ("dataloader_workers", 0)):
        recipe["train"][key] = new

    # world size: pods × 1 process
    micro = int(args.get("per_device_train_batch_size", 1))
    accum = int(args.get("gradient_accumulation_steps", 1))
    dry_accum = min(accum, MAX_ACCUMULATION)
    world = options.pods
    if dry_accum != accum:
        sub(
            RECIPE,
            args,
            "gradient_accumulation_steps",
            dry_accum,
            f"at most {MAX_ACCUMULATION} micro-steps per step on CPU",
            "training_arguments.gradient_accumulation_steps",
        )
    recipe["train"].update(gradient_accumulation_steps=dry_accum, global_batch_size=None)
    for key, new, why in (
        ("nodes", world, "--pods"),
        ("devices_per_pod", 1, "one process per pod"),
        ("world_size", world, f"{world} pods × 1 process"),
        ("dp_size", world, "= world size"),
        ("gradient_accumulation_steps", dry_accum, "= training_arguments"),
        ("global_batch_size", micro * dry_accum * world, f"micro {micro} × accumulation {dry_accum} × world {world}"),
        ("total_steps", steps, "--steps"),
        ("steps_per_epoch", None, "generated data"),
        ("warmup_steps", args.get("warmup_steps", plan.get("warmup_steps")), "= training_arguments"),
    ):
        if key in plan:
            sub(RECIPE, plan, key, new, why, f"plan.{key}")
    recipe["cluster"]["nodes"] = world
    recipe["cluster"]["devices_per_pod"] = 1

    # precision on CPU
    if cpu and (args.get("fp16") or plan.get("precision") == "fp16"):
        sub(RECIPE, args, "fp16", False, "CPU has no fp16", "training_arguments.fp16")
        sub(RECIPE, args, "bf16", True, "fp16 mapped to bf16 on CPU", "training_arguments.bf16")
        sub(RECIPE, plan, "precision", "bf16", "fp16 mapped to bf16 on CPU", "plan.precision")
        recipe["train"]["precision"] = "bf16"

    # ds_config: batch at the dry-run world size; CPU-specific ZeRO settings
    if ds is not None:
        sub(DS, ds, "train_micro_batch_size_per_gpu", micro, "= training_arguments")
        sub(DS, ds, "gradient_accumulation_steps", dry_accum, "= training_arguments")
        if ds.get("train_batch_size") != "auto":
            sub(
                DS,
                ds,
                "train_batch_size",
                micro * dry_accum * world,
                f"micro {micro} × accumulation {dry_accum} × world {world}",
            )
        if cpu and isinstance(ds.get("fp16"), dict) and ds["fp16"].get("enabled"):
            subs.append(Substitution(DS, "fp16", ds.pop("fp16"), None, "CPU has no fp16"))
            ds["bf16"] = {"enabled": True}
            subs.append(Substitution(DS, "bf16.enabled", None, True, "fp16 mapped to bf16 on CPU"))
        zero = ds.get("zero_optimization") or {}
        if zero.get("stage") == 3 and zero.get("stage3_param_persistence_threshold") != 0:
            sub(
                DS,
                zero,
                "stage3_param_persistence_threshold",
                0,
                "else ZeRO-3 partitions no parameter of a tiny model",
                "zero_optimization.stage3_param_persistence_threshold",
            )
        nvme_dir = root / "nvme"
        for key in ("offload_optimizer", "offload_param"):
            section = zero.get(key)
            if isinstance(section, dict) and section.get("device") == "nvme":
                if cpu and not _async_io_compatible():
                    zero[key] = {"device": "cpu", "pin_memory": False}
                    subs.append(
                        Substitution(
                            DS,
                            f"zero_optimization.{key}",
                            section,
                            zero[key],
                            "NVMe offload needs DeepSpeed's async_io op (libaio), not buildable here",
                        )
                    )
                    recipe["parallel"][key] = "cpu"
                else:
                    nvme_dir.mkdir(exist_ok=True)
                    sub(
                        DS,
                        section,
                        "nvme_path",
                        str(nvme_dir),
                        "a local directory for NVMe offload",
                        f"zero_optimization.{key}.nvme_path",
                    )

    # launch.json: the pod count and one process per pod (the port is set per attempt)
    launch = json.loads((copy_dir / LAUNCH).read_text(encoding="utf-8"))
    for key, new, why in (("nodes", world, "--pods"), ("nproc_per_node", 1, "one process per pod")):
        if launch.get(key) != new:
            subs.append(Substitution(LAUNCH, key, launch.get(key), new, why))
            launch[key] = new
    (copy_dir / LAUNCH).write_text(json.dumps(launch, indent=2) + "\n", encoding="utf-8")

    header = (
        "# recipekit validate --dry-run work copy of the bundle's recipe.yaml: the laptop substitutions are "
        "listed in ../substitutions.json\n"
    )
    (copy_dir / RECIPE).write_text(
        header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120), encoding="utf-8"
    )
    if ds is not None:
        (copy_dir / DS).write_text(json.dumps(ds, indent=2) + "\n", encoding="utf-8")
    rehash_manifest(copy_dir)

    ops = []
    if ds is not None and cpu:
        ops.append("ShareMemCommBuilder")  # DeepSpeed's CPU collectives
        zero = ds.get("zero_optimization") or {}
        if (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme") or "optimizer" in ds:
            ops.append("CPUAdamBuilder")
        if "nvme" in (
            (zero.get("offload_optimizer") or {}).get("device"),
            (zero.get("offload_param") or {}).get("device"),
        ):
            ops.append("AsyncIOBuilder")
    task = _task_name(bundle)
    work = WorkCopy(
        root=root,
        bundle=copy_dir,
        shared=shared,
        logs=root / "logs",
        output_dir=output_dir,
        task_env=task_env_name(task),
        substitutions=subs,
        deepspeed_ops=ops,
    )
    (root / "substitutions.json").write_text(
        json.dumps([s.to_json() for s in subs], indent=2, default=str) + "\n", encoding="utf-8"
    )
    return work


def _task_name(bundle: Bundle) -> str:
    located = task_of(bundle.job)
    if located is not None and located[1].get("name"):
        return str(located[1]["name"])
    return bundle.recipe.cluster.task_name if bundle.recipe else "worker"


def set_master_port(work: WorkCopy, port: int) -> None:
    path = work.bundle / LAUNCH
    launch = json.loads(path.read_text(encoding="utf-8"))
    launch["master_port"] = port
    path.write_text(json.dumps(launch, indent=2) + "\n", encoding="utf-8")
    rehash_manifest(work.bundle)


# ----------------------------------------------------------------------------------------------------- the ops
def build_ops(work: WorkCopy, options: DryRunOptions, result: Result, progress: Progress, deadline: float) -> None:
    """Build (or find cached) the DeepSpeed C++ ops the run will load, once, timed apart from the run itself."""
    if not work.deepspeed_ops:
        result.skip("no DeepSpeed C++ op to build (DDP, or a real device)")
        return
    directory = extensions_dir()
    directory.mkdir(parents=True, exist_ok=True)
    code = f"""
import json, time, sys
import deepspeed.ops
from deepspeed.accelerator import get_accelerator
from pathlib import Path
out = []
for name in {work.deepspeed_ops!r}:
    b = get_accelerator().create_op_builder(name)
    if b is None or not deepspeed.ops.__compatible_ops__.get(b.NAME, False):
        out.append({{"op": name, "status": "incompatible"}}); continue
    cached = any(Path({str(directory)!r}).rglob(b.NAME + ".so"))
    t = time.monotonic(); b.load(verbose=False)
    out.append({{"op": b.NAME, "status": "cached" if cached else "built", "seconds": round(time.monotonic() - t, 1)}})
print(json.dumps(out))
"""
    cached = [n for n in _op_names(work.deepspeed_ops) if any(directory.rglob(f"{n}.so"))]
    if len(cached) == len(work.deepspeed_ops):
        # Loading them here would only cost an import of DeepSpeed; a stale one is rebuilt by the pods themselves.
        result.details = {
            "torch_extensions_dir": str(directory),
            "ops": [{"op": n, "status": "cached"} for n in cached],
        }
        result.reason = f"{', '.join(cached)} cached in {directory}"
        return
    progress(
        f"building DeepSpeed's C++ ops ({', '.join(_op_names(work.deepspeed_ops))}) with g++ into {directory} "
        "— once per machine, about 60-80 s"
    )
    env = {**pod_environment(work, 0, options), "PYTHONWARNINGS": "ignore"}  # exactly the pods' build environment
    log = work.logs / "deepspeed-ops.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            timeout=max(30.0, deadline - time.monotonic()),
        )
    except subprocess.TimeoutExpired:
        result.fail("<dry run>", "deepspeed ops", "building DeepSpeed's ops did not finish before the timeout")
        return
    log.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    result.seconds = time.monotonic() - start
    try:
        ops = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        result.fail("<dry run>", "deepspeed ops", f"building DeepSpeed's ops failed: {tail[:400]}")
        return
    result.details = {"torch_extensions_dir": str(directory), "ops": ops}
    for op in ops:
        if op["status"] == "incompatible":
            result.fail("<dry run>", op["op"], "DeepSpeed says this op cannot be built here (ds_report shows why)")
    built = [o for o in ops if o["status"] == "built"]
    result.reason = (
        f"built {', '.join(o['op'] for o in built)} in {result.seconds:.0f} s (one-time; cached in {directory})"
        if built
        else f"cached in {directory} ({result.seconds:.1f} s to load)"
    )


def _op_names(builders: list[str]) -> list[str]:
    names = {"ShareMemCommBuilder": "deepspeed_shm_comm", "CPUAdamBuilder": "cpu_adam", "AsyncIOBuilder": "async_io"}
    return [names.get(b, b) for b in builders]


# --------------------------------------------------------------------------------------------------- the pods
def pod_environment(work: WorkCopy, index: int, options: DryRunOptions) -> dict[str, str]:
    """What Volcano's env and svc plugins inject into pod ``index``, plus the laptop's runtime settings."""
    from recipekit.validate.pods import loopback_interface

    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "NODE_RANK",
        )
        and not k.startswith(("TORCHELASTIC_", "VC_", "VK_"))
    }
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        {
            "VC_TASK_INDEX": str(index),
            "VK_TASK_INDEX": str(index),
            f"VC_{work.task_env}_HOSTS": ",".join(["127.0.0.1"] * options.pods),
            f"VC_{work.task_env}_NUM": str(options.pods),
            "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TORCH_EXTENSIONS_DIR": str(extensions_dir()),
        }
    )
    if options.device == "cpu":
        env.update(
            DS_ACCELERATOR="cpu",
            CUDA_VISIBLE_DEVICES="",
            ASCEND_RT_VISIBLE_DEVICES="",
            TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        )
        lo = loopback_interface()
        if lo:
            env["GLOO_SOCKET_IFNAME"] = lo
    elif options.device == "cuda":
        env.update(DS_ACCELERATOR="cuda", CUDA_VISIBLE_DEVICES=str(index))
    else:
        env.update(DS_ACCELERATOR="npu", ASCEND_RT_VISIBLE_DEVICES=str(index))
    return env


@dataclass
class Step:
    step: int
    loss: float | None
    at: float  # monotonic time this process saw the line


@dataclass
class Attempt:
    number: int
    port: int
    started: float
    steps: list[Step] = field(default_factory=list)
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    outcome: str = ""  # completed | failed | killed | timeout
    killed_at: float | None = None
    killed_step: int | None = None
    killed_processes: int = 0
    ended: float = 0.0
    log_offsets: dict[int, int] = field(default_factory=dict)


class MetricsTail:
    """Follows train.py's metrics.jsonl (rank 0 appends one JSON line per logging step)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:  # recreated
            self.offset, self.partial = 0, b""
        if size == self.offset:
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read(size - self.offset)
        self.offset = size
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records


def complete_checkpoints(output_dir: Path) -> list[int]:
    """Steps of the checkpoints a restart can resume from: trainer_state.json readable (the Trainer writes it
    last), model weights present, no incompleteness marker."""
    steps = []
    for path in output_dir.glob("checkpoint-*"):
        suffix = path.name.split("-")[-1]
        if not (path.is_dir() and suffix.isdigit()):
            continue
        try:
            json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (path / "checkpoint-is-incomplete.txt").exists():
            continue
        if any((path / name).is_file() and (path / name).stat().st_size for name in WEIGHT_FILES):
            steps.append(int(suffix))
    return sorted(steps)


class DryRun:
    """One dry run of a prepared work copy: attempts of N pods, an optional kill, the figures."""

    def __init__(self, work: WorkCopy, options: DryRunOptions, progress: Progress, deadline: float):
        from recipekit.validate.pods import Pod, PodSet

        self.work, self.options, self.progress, self.deadline = work, options, progress, deadline
        self.podset = PodSet()
        self.pods = [
            self.podset.add(
                Pod(
                    i,
                    ["bash", str(work.bundle / RUN)],
                    work.bundle,
                    pod_environment(work, i, options),
                    work.logs / f"pod-{i}.log",
                )
            )
            for i in range(options.pods)
        ]
        self.metrics = MetricsTail(work.output_dir / METRICS_FILE)
        self.attempts: list[Attempt] = []
        self.ports: set[int] = set()

    # -- one attempt: start every pod, watch until done / failed / killed / timed out
    def attempt(self, kill_at: int | None) -> Attempt:
        from recipekit.validate.pods import free_port

        number = len(self.attempts)
        port = free_port(self.ports)
        self.ports.add(port)
        set_master_port(self.work, port)
        attempt = Attempt(number, port, time.monotonic())
        self.attempts.append(attempt)
        label = "first start" if number == 0 else "restart (Volcano RestartJob)"
        for pod in self.pods:
            attempt.log_offsets[pod.index] = pod.log_path.stat().st_size if pod.log_path.exists() else 0
            pod.start(header=f"attempt {number}: {label}, master port {port}")
        self.progress(
            f"attempt {number}: {len(self.pods)} pod(s) running run.sh (master 127.0.0.1:{port}); "
            f"logs in {self.work.logs}"
        )
        last_remember = 0.0
        while True:
            now = time.monotonic()
            if now - last_remember > 0.5:
                self.podset.remember()
                last_remember = now
            for record in self.metrics.read():
                if "loss" in record and isinstance(record.get("step"), int):
                    loss = record.get("loss")
                    attempt.steps.append(Step(record["step"], float(loss) if loss is not None else None, now))
                    self.progress(
                        f"attempt {number}: step {record['step']}/{self.options.steps}, loss {loss:.4f}"
                        if isinstance(loss, (int, float))
                        else f"attempt {number}: step {record['step']}"
                    )
            if kill_at is not None and attempt.steps and attempt.steps[-1].step >= kill_at:
                self._kill(attempt)
                break
            codes = {pod.index: pod.poll() for pod in self.pods}
            if all(code is not None for code in codes.values()):
                attempt.outcome = "completed" if all(code == 0 for code in codes.values()) else "failed"
                break
            if any(code not in (None, 0) for code in codes.values()):
                # A failed pod: its peers fail or hang in their next collective. Give them a moment, then stop them.
                self._stop_all(grace=min(self.options.grace, 10.0))
                attempt.outcome = "failed"
                break
            if now > self.deadline:
                for pod in self.pods:
                    pod.kill()
                attempt.outcome = "timeout"
                break
            time.sleep(0.01)
        for record in self.metrics.read():  # lines written while the attempt ended
            if "loss" in record and isinstance(record.get("step"), int):
                attempt.steps.append(Step(record["step"], record.get("loss"), time.monotonic()))
        attempt.exit_codes = {pod.index: pod.poll() for pod in self.pods}
        attempt.ended = time.monotonic()
        return attempt

    def _kill(self, attempt: Attempt) -> None:
        index = self.options.kill_pod
        assert index is not None
        victim = self.pods[index]
        processes = len(victim.alive())
        victim.kill()  # SIGKILL, the whole tree: a node going away
        attempt.killed_at = time.monotonic()
        attempt.killed_step = attempt.steps[-1].step
        attempt.killed_processes = processes
        attempt.outcome = "killed"
        self.progress(
            f"killed pod {index} ({processes} processes) at step {attempt.killed_step}; deleting the "
            f"others as RestartJob does (SIGTERM, {self.options.grace:.0f} s grace, SIGKILL)"
        )
        self._stop_all(grace=self.options.grace)

    def _stop_all(self, grace: float) -> None:
        import threading

        threads = [threading.Thread(target=pod.terminate, args=(grace,)) for pod in self.pods if pod.alive()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def log_segment(self, pod_index: int, attempt: Attempt) -> str:
        path = self.pods[pod_index].log_path
        try:
            with path.open("rb") as handle:
                handle.seek(attempt.log_offsets.get(pod_index, 0))
                return handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def tails(self, result: Result, lines: int = 25) -> None:
        result.details["log_tails"] = {f"pod-{pod.index}": pod.tail(lines) for pod in self.pods}


# ------------------------------------------------------------------------------------------------ the dry run
def _adapted(text: str) -> list[str]:
    return [m.group(1).strip() for line in text.splitlines() if (m := _ADAPTED_LINE.search(line))]


def _resumed_from(text: str) -> str | None:
    for line in text.splitlines():
        match = _RESUME_LINE.search(line)
        if match:
            return match.group(1)
    return None


def _rate(steps: list[Step]) -> float | None:
    if len(steps) < 2 or steps[-1].at <= steps[0].at:
        return None
    return (steps[-1].step - steps[0].step) / (steps[-1].at - steps[0].at)


def _final_state(output_dir: Path) -> int | None:
    try:
        return int(json.loads((output_dir / "trainer_state.json").read_text(encoding="utf-8"))["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_dry_run(bundle: Bundle, options: DryRunOptions, progress: Progress = lambda message: None) -> list[Result]:
    """Prepare the work copy, build DeepSpeed's ops, run the pods (kill and restart them), and report."""
    options.check()
    started = time.monotonic()
    deadline = started + options.timeout
    prep = Result("dryrun.prepare", "dry run: work copy of the bundle with the laptop substitutions")
    ops = Result("dryrun.ops", "dry run: DeepSpeed C++ ops (built once, cached)")
    train = Result(
        "dryrun.train",
        f"dry run: {options.pods} pod(s) × run.sh → train.py, {options.steps} steps, "
        f"checkpoint at {options.save_steps}",
    )
    results = [prep, ops, train]
    resume = None
    if options.kill_pod is not None:
        resume = Result(
            "dryrun.resume",
            f"dry run: kill pod {options.kill_pod} at step {options.at_step}, RestartJob, "
            "resume from the last complete checkpoint",
        )
        results.append(resume)

    def skip_all(reason: str) -> list[Result]:
        return [r.skip(reason) for r in results]

    if bundle.doc is None or bundle.recipe is None or bundle.run_sh is None or "runtime/train.py" not in bundle.raw:
        return skip_all("needs a parseable recipe.yaml, run.sh and train.py (see files.parse)")
    if bundle.plan.get("zero_stage") and bundle.ds_config is None:
        return skip_all("a ZeRO bundle without a parseable ds_config.json (see files.parse)")
    missing = _missing_modules(bundle)
    if missing:
        return skip_all(f"{', '.join(missing)} not installed here (pip install 'recipekit[train]')")
    if shutil.which("bash") is None:
        return skip_all("bash not found")
    if options.device != "cpu":
        count, why = _devices(options.device)
        if count == 0:
            return skip_all(why or f"no {options.device} device here")
        if count < options.pods:
            return skip_all(
                f"{options.pods} pods need {options.pods} {options.device} devices (one each); found {count}"
            )

    progress(f"preparing the work copy of {bundle.path}")
    start = time.monotonic()
    work = prepare(bundle, options)
    prep.seconds = time.monotonic() - start
    prep.details = {"workdir": str(work.root), "substitutions": [s.to_json() for s in work.substitutions]}
    prep.reason = f"{len(work.substitutions)} substitutions, listed in {work.root / 'substitutions.json'}"
    copy_check = check_batch(load_bundle(work.bundle))
    for finding in copy_check.findings:  # the substitutions themselves must leave a consistent bundle
        prep.fail(finding.file, finding.field, "work copy: " + finding.message, finding.hint)

    build_ops(work, options, ops, progress, deadline)
    if ops.failed:
        train.skip("the DeepSpeed ops could not be built")
        if resume:
            resume.skip("the DeepSpeed ops could not be built")
        return results

    run = DryRun(work, options, progress, deadline)
    with run.podset:
        try:
            _train(run, train, resume)
        finally:
            run.podset.kill_all()
            left = run.podset.leftovers()
            if left:
                train.fail("<dry run>", "processes", f"processes still alive after cleanup: {left}")
    summary = {"wall_s": round(time.monotonic() - started, 1), "workdir": str(work.root)}
    train.details.update(summary)
    (work.root / "report.json").write_text(
        json.dumps([r.to_json() for r in results], indent=2, default=str) + "\n", encoding="utf-8"
    )
    return results


def _train(run: DryRun, train: Result, resume: Result | None) -> None:
    options, work = run.options, run.work
    first = run.attempt(kill_at=options.at_step if options.kill_pod is not None else None)
    train.seconds = first.ended - first.started
    pod0 = run.log_segment(0, first)
    notes = _adapted(pod0)
    losses = [s.loss for s in first.steps if s.loss is not None]
    details: dict[str, Any] = {
        "pods": options.pods,
        "exit_codes": first.exit_codes,
        "time_to_first_step_s": round(first.steps[0].at - first.started, 2) if first.steps else None,
        "steps_per_s": round(r, 2) if (r := _rate(first.steps)) else None,
        "first_loss": losses[0] if losses else None,
        "adapted_by_train_py": notes,
        "logs": str(work.logs),
    }
    train.details.update(details)
    if first.outcome == "timeout":
        train.fail(
            "<dry run>",
            "timeout",
            f"no result within --timeout {options.timeout:.0f} s "
            f"(last step seen: {first.steps[-1].step if first.steps else 'none'})",
        )
        run.tails(train)
        if resume:
            resume.skip("the first attempt timed out")
        return
    if first.outcome == "failed":
        bad = {i: c for i, c in first.exit_codes.items() if c not in (0, None)}
        train.fail(
            "<dry run>", "exit codes", f"pod(s) exited non-zero: {bad}; log tails below, full logs in {work.logs}"
        )
        run.tails(train)
        if resume:
            resume.skip("the first attempt failed")
        return

    if first.outcome == "completed":
        _judge_completion(run, train, first, losses)
        if resume is not None:
            resume.fail(
                "<dry run>",
                "--at-step",
                f"training finished before step {options.at_step} was seen in {METRICS_FILE}, so no pod was killed",
                hint="choose a smaller --at-step or more --steps",
            )
        return

    # killed: RestartJob
    assert resume is not None and first.killed_at is not None
    train.details.update(killed_pod=options.kill_pod, killed_at_step=first.killed_step)
    train.reason = (
        f"{len(first.steps)} steps before the kill; {details['time_to_first_step_s']} s to the first step, "
        f"{details['steps_per_s']} steps/s"
    )
    checkpoints = complete_checkpoints(work.output_dir)
    expected = checkpoints[-1] if checkpoints else None
    resume.details.update(
        killed_pod=options.kill_pod,
        kill_requested_at_step=options.at_step,
        killed_at_step=first.killed_step,
        killed_processes=first.killed_processes,
        complete_checkpoints_at_restart=checkpoints,
        teardown_s=round(time.monotonic() - first.killed_at, 2),
        survivor_exit_codes={i: c for i, c in first.exit_codes.items() if i != options.kill_pod},
    )
    start = time.monotonic()
    second = run.attempt(kill_at=None)
    resume.seconds = time.monotonic() - start
    text = run.log_segment(0, second)
    resumed_from = _resumed_from(text)
    resumed_step = None
    if resumed_from and resumed_from != "scratch":
        tail = resumed_from.rstrip("/").split("-")[-1]
        resumed_step = int(tail) if tail.isdigit() else None
    first_new = second.steps[0] if second.steps else None
    mttr = round(first_new.at - first.killed_at, 2) if first_new else None
    resume.details.update(
        resumed_from=resumed_from,
        resumed_step=resumed_step,
        first_step_after_restart=first_new.step if first_new else None,
        mttr_s=mttr,
        restart_to_first_step_s=round(first_new.at - second.started, 2) if first_new else None,
        exit_codes=second.exit_codes,
    )
    if second.outcome != "completed":
        what = "timed out" if second.outcome == "timeout" else f"failed (exit codes {second.exit_codes})"
        resume.fail("<dry run>", "restart", f"the restarted job {what}; full logs in {work.logs}")
        run.tails(resume)
        return
    if resumed_step != expected:
        resume.fail(
            "<dry run>",
            "resume",
            f"resumed from {resumed_from or 'nothing'}, but the last complete "
            f"checkpoint at the restart was {expected if expected is not None else 'none'}",
        )
    if first_new is not None and expected is not None and first_new.step != expected + 1:
        resume.fail(
            "<dry run>",
            "resume",
            f"the first step after the restart is {first_new.step}, expected "
            f"{expected + 1} (resuming at checkpoint-{expected})",
        )
    before = {s.step: s.loss for s in first.steps}
    replayed = [
        (s.step, before[s.step], s.loss)
        for s in second.steps
        if s.step in before and isinstance(s.loss, (int, float)) and isinstance(before[s.step], (int, float))
    ]
    if replayed:
        # Steps trained twice (after the checkpoint, before the kill): same data, same state, so the same loss.
        resume.details["replayed_steps"] = [step for step, _, _ in replayed]
        resume.details["replayed_loss_max_abs_diff"] = max(abs(a - b) for _, a, b in replayed)
    replay = resume.details.get("replayed_loss_max_abs_diff")
    resume.reason = (
        f"killed pod {options.kill_pod} at step {first.killed_step}; resumed from "
        f"{f'checkpoint-{resumed_step}' if resumed_step is not None else 'scratch'} (last complete: "
        f"{expected}); MTTR {mttr} s"
        + (f"; replayed steps' loss differs by {replay:.2g}" if replay is not None else "")
    )
    all_losses = losses + [s.loss for s in second.steps if s.loss is not None]
    _judge_completion(run, train, second, all_losses, attempts=[first, second])


def _judge_completion(
    run: DryRun, train: Result, last: Attempt, losses: list[Any], attempts: list[Attempt] | None = None
) -> None:
    options, work = run.options, run.work
    final_step = _final_state(work.output_dir)
    checkpoints = complete_checkpoints(work.output_dir)
    weights = [name for name in WEIGHT_FILES if (work.output_dir / name).is_file()]
    finite = [loss for loss in losses if isinstance(loss, (int, float)) and math.isfinite(loss)]
    train.details.update(
        final_step=final_step,
        checkpoints=checkpoints,
        final_weights=weights,
        final_loss=finite[-1] if finite else None,
        exit_codes=last.exit_codes,
    )
    if final_step != options.steps:
        train.fail("<dry run>", "trainer_state.json", f"final global_step {final_step}, expected {options.steps}")
    if options.save_steps not in checkpoints and options.kill_pod is None:
        train.fail(
            "<dry run>",
            "checkpoints",
            f"no complete checkpoint-{options.save_steps} (complete: {checkpoints or 'none'})",
        )
    if options.steps not in checkpoints:
        train.fail(
            "<dry run>", "checkpoints", f"no complete checkpoint-{options.steps} (complete: {checkpoints or 'none'})"
        )
    if not weights:
        train.fail("<dry run>", "final model", f"no model weights in {work.output_dir} after training")
    if len(finite) != len(losses) or not losses:
        train.fail("<dry run>", "loss", f"losses not all finite: {losses}")
    if train.failed:
        run.tails(train)
    elif attempts is None:
        d = train.details
        train.reason = (
            f"{options.steps} steps; {d['time_to_first_step_s']} s to the first step, {d['steps_per_s']} "
            f"steps/s; loss {_fmt(d['first_loss'])} → {_fmt(d['final_loss'])}; checkpoints {checkpoints}"
        )
    else:
        d = train.details
        train.reason = (
            f"{options.steps} steps over {len(attempts)} attempts; {d['time_to_first_step_s']} s to the first "
            f"step, {d['steps_per_s']} steps/s; loss {_fmt(d['first_loss'])} → {_fmt(d['final_loss'])}; "
            f"checkpoints {checkpoints}"
        )


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else str(value)
