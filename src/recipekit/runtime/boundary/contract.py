"""The runtime contract: what build time and run time must agree on, written down once.

recipekit's planner and validator (build time) and the bundle's launcher and train.py (run time, inside the image)
meet at a boundary the run side cannot cross: a bundle never imports recipekit. So the knowledge both sides need lives
here, in a module that imports only the standard library. ``recipekit build`` copies it into every bundle (as
``runtime/boundary/contract.py``); recipekit imports it as ``recipekit.runtime.boundary.contract``. Both sides therefore
run the same code for:

* the bundle's and the output directory's file names;
* the exit codes the launcher and train.py use, and what Volcano's policies make of them;
* what a FLOP count, MFU and HFU mean (one definition for the planner's time estimate and the metrics a run logs);
* when a checkpoint is complete enough to resume from, which run wrote it, and so which checkpoint a restart
  continues from (:func:`resume_choice`: train.py acts on its answer, the dry run predicts with it);
* the structured records train.py appends to ``metrics.jsonl`` (start, resume, adaptations), so that nothing has to
  scrape log text.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from . import jsonfile

# ---------------------------------------------------------------------------------------------------------- modes
#: The modes that train a LoRA adapter on a frozen base (QLoRA: a 4-bit base). recipekit plans, sizes and pins them
#: by this; the runtime wraps the model in peft by it.
ADAPTER_MODES = ("lora", "qlora")


def trains_adapter(mode_kind: str) -> bool:
    """Whether a recipe's ``mode.kind`` trains a LoRA adapter (and not every parameter)."""
    return mode_kind in ADAPTER_MODES


# ------------------------------------------------------------------------------------------- recipe.yaml's plan
@dataclass(frozen=True, slots=True)
class PlanFlops:
    """recipe.yaml ``plan.flops``: the FLOPs per token the run's MFU is measured against."""

    model_per_token: float
    hardware_per_token: float
    peak_tflops: float


@dataclass(frozen=True, slots=True)
class RunPlan:
    """recipe.yaml's ``plan``, as the runtime reads it: the plan's numbers a run needs. recipekit writes these keys
    (``Plan.summary()``, which also carries numbers for people; a test holds the two together)."""

    job_name: str
    run_id: str
    prepared_dir: str
    world_size: int
    global_batch_size: int
    tensor_parallel: int
    zero_stage: int
    comm_backend: str
    flops: PlanFlops

    @classmethod
    def from_dict(cls, plan: dict[str, Any]) -> RunPlan:
        """The typed plan; a missing key is a KeyError naming it (:func:`plan_keys` lists them all up front)."""
        values = {f.name: plan[f.name] for f in fields(cls) if f.name != "flops"}
        flops = plan["flops"]
        return cls(**values, flops=PlanFlops(**{f.name: float(flops[f.name]) for f in fields(PlanFlops)}))


def data_parallel_size(world_size: int, model_parallel: int = 1) -> int:
    """How many ranks see different data: the world over the ranks of one model replica (TP × PP). The one
    definition: the plan's layout, the runtime's global batch, the dry run's sample count and the Trainer's check."""
    return max(1, world_size // max(1, model_parallel))


def plan_keys() -> tuple[str, ...]:
    """The dotted keys of recipe.yaml's ``plan`` the runtime reads (``plan.flops.model_per_token``, ...)."""
    flat = [f"plan.{f.name}" for f in fields(RunPlan) if f.name != "flops"]
    return (*flat, *(f"plan.flops.{f.name}" for f in fields(PlanFlops)))


# ----------------------------------------------------------------------------------------------------- file names
#: The bundle's files that the launcher and train.py read.
RECIPE_FILE = "recipe.yaml"
LAUNCH_FILE = "launch.json"
DS_CONFIG_FILE = "ds_config.json"
#: The package beside train.py that holds the runtime modules (this one among them).
RUNTIME_PACKAGE = "runtime"
#: The contract itself inside the runtime package (every bundle must carry it).
CONTRACT_MODULE = "boundary/contract.py"
#: The devices a bundle can target (``recipe.hw.torch_device``), which train.py finds or refuses before training.
DEVICE_TARGETS = ("npu", "cuda", "cpu")
#: Where the bundle lives inside the image and the pods (the Dockerfile's WORKDIR, the Job's workingDir).
POD_WORKDIR = "/workspace"

#: What train.py writes into the run's output directory.
METRICS_FILE = "metrics.jsonl"
#: metrics.jsonl's measured memory of each logged step, GiB, the largest over ranks: the device's peak allocated
#: tensors since the last log (torch's own counter, what the plan's memory per device estimates; absent on a CPU) and
#: the process's peak resident memory (the high-water mark of the whole run so far: what a CPU dry run measures).
PEAK_DEVICE_MEMORY_KEY = "peak_device_memory_gib"
PEAK_HOST_MEMORY_KEY = "peak_rss_gib"
RANDOM_INIT_DIR = "random-init"
CHECKPOINT_PREFIX = "checkpoint-"
#: The most digits a checkpoint's step may have in its name (2^63 has 19): a longer name is no checkpoint.
MAX_STEP_DIGITS = 18
#: The Trainer writes this last into a checkpoint; its absence marks an interrupted save.
TRAINER_STATE_FILE = "trainer_state.json"
#: Which run wrote a checkpoint (or the final output): run_id and world layout, see :func:`run_record`.
RUN_FILE = "recipekit-run.json"
#: A streaming run's place in its input (runtime/data/stream.py): each chunk's row count, so a resume skips whole
#: chunks.
STREAM_STATE_FILE = "recipekit-stream.json"
#: transformers marks a checkpoint whose save did not finish with this file.
INCOMPLETE_MARKER = "checkpoint-is-incomplete.txt"
#: The operations layer's outputs (runtime/ops/preflight.py, watchdog.py, health.py, profiling.py, faults.py).
CLUSTER_CHECK_FILE = "cluster-check.json"  # preflight's report
PREFLIGHT_CHECKS = ("devices", "versions", "storage", "allreduce")  # what every report lists, in order
PREFLIGHT_DIR = "preflight"  # each pod's storage marker, removed once every pod has read the others'
HANG_DIR = "hang"  # the stack dumps of a stalled run: stall-step-<N>-rank-<R>.txt
NONFINITE_PREFIX = "nonfinite-step-"  # nonfinite-step-<N>/: the report and batches of a NaN/inf loss
PROFILE_DIR = "profile"  # profile/steps-<a>-<b>/: the profiler's traces
FAULTS_DIR = "faults"  # markers of injected faults (ops.testing), so a restarted job is not broken again
#: Model weights as the Trainer, PEFT and DeepSpeed save them: single files and sharded indexes.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_model.safetensors",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.bin",
)


# ----------------------------------------------------------------------------------------------------- exit codes
@dataclass(frozen=True)
class ExitCode:
    """One exit code of a pod: the contract between the run and the scheduler.

    ``action`` is the Volcano action the Job's exitCode policy takes for it; None means no policy of its own, so the
    Job's ``PodFailed → RestartJob`` applies (or nothing, for 0). The launcher exits with the worker's code, the
    Job's policies are rendered from this table (:func:`exit_code_policies`), and the bundle README and the docs
    list it: nothing else spells a code.
    """

    name: str
    code: int
    meaning: str
    action: str | None = None


#: Every code a pod can exit with, in the order the docs list them.
EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode("ok", 0, "training finished and the model is saved"),
    ExitCode("failed", 1, "a bug or an environment failure (a traceback is in the log); restarting may heal it"),
    ExitCode(
        "user_error",
        2,
        "something the user must fix (recipe, data, checkpoint, missing device or driver, a Job edited by hand), "
        "said in one line: restarting cannot heal it, so the Job ends without a retry",
        "TerminateJob",
    ),
    ExitCode(
        "preflight",
        3,
        "preflight found this pod or the cluster unfit to train (one line in the log and in the report): restart "
        "on other devices (MindCluster isolates the faulty device or node first, where it runs)",
        "RestartJob",
    ),
    ExitCode(
        "stalled",
        4,
        "the hang watchdog saw no step complete within the stall timeout (every rank's stacks are in hang/): restart "
        "from the last checkpoint",
        "RestartJob",
    ),
    ExitCode(
        "nonfinite",
        5,
        "the loss became NaN or infinite (ops.nonfinite_loss: stop); the last good checkpoint is kept",
    ),
    ExitCode(
        "preempted",
        128 + 15,
        "stopped by SIGTERM after saving a checkpoint (the pod was deleted or evicted): non-zero, so the Job "
        "restarts instead of completing",
    ),
)
_BY_NAME = {c.name: c for c in EXIT_CODES}


def exit_code(name: str) -> int:
    """The code of ``name`` in :data:`EXIT_CODES` (a KeyError for a name it lacks: a typo must not pass)."""
    return _BY_NAME[name].code


def exit_code_name(code: int | None) -> str:
    """The table's name of ``code``; a signal death (128 + N) not in it reads ``signal N``."""
    for entry in EXIT_CODES:
        if entry.code == code:
            return entry.name
    if code is not None and code > 128:
        return f"signal {code - 128}"
    return f"exit {code}"


def exit_code_policies() -> list[dict[str, Any]]:
    """The Job's exitCode policies, one per code with an action of its own.

    Volcano's controller takes the first policy that matches a pod's failure, in list order (task policies before
    the Job's), and a PodFailed event matches ``event: PodFailed`` before any exitCode policy listed after it: so
    these must precede the Job's event policies.
    """
    return [{"exitCode": c.code, "action": c.action} for c in EXIT_CODES if c.action and c.code != 0]


EXIT_OK = exit_code("ok")
#: A bug or an environment failure (a traceback is in the log).
EXIT_FAILED = exit_code("failed")
#: Something the user must fix (recipe, data, checkpoint, missing device or driver), said in one line.
EXIT_USER_ERROR = exit_code("user_error")
#: Stopped by SIGTERM after saving a checkpoint: non-zero, so Volcano restarts the job instead of completing it.
EXIT_PREEMPTED = exit_code("preempted")
#: Preflight found this pod or the cluster unfit to train (the reason is one line in the log and in the report).
EXIT_PREFLIGHT = exit_code("preflight")
#: The hang watchdog saw no step complete within the stall timeout; every rank's stacks are in HANG_DIR.
EXIT_STALLED = exit_code("stalled")
#: The loss became NaN or infinite (ops.nonfinite_loss: stop); the last good checkpoint is kept.
EXIT_NONFINITE = exit_code("nonfinite")

#: Where each training process writes the code it exits with (set by the launcher for torchrun's workers):
#: torchrun itself exits 1 whatever its worker's code, so the launcher reads the workers' codes from here.
EXIT_DIR_ENV = "RECIPEKIT_EXIT_DIR"


def record_exit(code: int, environ: Any = None) -> None:
    """Write this process's exit code where the launcher reads it (nothing when not started by the launcher).

    One small file per global rank, written before the process exits: ``rank-<R>.json`` with the code and the wall
    time, so the launcher can tell the first failure (the cause) from the ones torchrun's teardown caused.
    """
    env = os.environ if environ is None else environ
    directory = env.get(EXIT_DIR_ENV)
    if not directory:
        return
    rank = env.get("RANK", str(os.getpid()))
    try:
        target = Path(directory) / f"rank-{rank}.json"
        staging = target.with_name(target.name + ".tmp")
        staging.write_text(json.dumps({"code": int(code), "time": time.time(), "rank": rank}), encoding="utf-8")
        os.replace(staging, target)
    except (OSError, ValueError):
        pass


def worker_exit_code(directory: Path) -> int | None:
    """The code of the first worker that exited non-zero (the cause), from the files :func:`record_exit` wrote.

    A SIGTERM exit (:data:`EXIT_PREEMPTED`) counts only when no worker failed otherwise: torchrun sends SIGTERM to
    a failed worker's peers, and their exits are the consequence, not the cause. None when no worker failed.
    """
    found: list[tuple[float, int]] = []
    try:
        files = sorted(Path(directory).glob("rank-*.json"))
    except OSError:
        return None
    for file in files:
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
            code, at = int(data["code"]), float(data["time"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if code != EXIT_OK:
            found.append((at, code))
    causes = sorted(f for f in found if f[1] != EXIT_PREEMPTED) or sorted(found)
    return causes[0][1] if causes else None


# ------------------------------------------------------------------------------------------------ FLOPs and MFU
#: Tensor cores run fp32 (as TF32) at about half their 16-bit rate; the planner and the metrics share the figure.
FP32_PEAK_FRACTION = 0.5


def flops_per_token(
    *,
    matmul_params: int,
    trainable_params: int,
    full_training: bool,
    layers: int,
    hidden: int,
    seq_len: int,
    recompute: bool = False,
) -> float:
    """Training FLOPs per token of a decoder-only transformer.

    ``matmul_params`` are the parameters that cost FLOPs: all but the input embedding, which is a lookup (a tied head
    is a matmul and counts). Full training: forward 2·N, backward 4·N (gradients of activations and of weights).
    LoRA: the frozen base runs forward (2·N) and passes activation gradients back (2·N) but computes no weight
    gradient; the adapters train fully (6 × adapter parameters). Attention scores and their weighted sum add
    4·L·h·s forward and twice that backward: 12·L·h·s.

    ``recompute=False`` counts the model's FLOPs: the numerator of **MFU** (model FLOPs utilisation, PaLM appendix B),
    independent of how the run saves memory. ``recompute=True`` adds the forward pass that activation checkpointing
    runs again in backward: the FLOPs the hardware really executes, the numerator of **HFU**. The planner's
    ``hw.assumed_mfu`` is an HFU (it times the work actually done); metrics.jsonl logs both.
    """
    attention = 12 * layers * hidden * seq_len
    if full_training:
        per_token = 6 * matmul_params + attention
        forward = 2 * matmul_params + attention / 3
    else:
        per_token = 4 * matmul_params + 6 * trainable_params + attention
        forward = 2 * matmul_params + 2 * trainable_params + attention / 3
    return float(per_token + forward) if recompute else float(per_token)


def peak_tflops(precision: str, *, bf16: float, fp16: float) -> float:
    """The utilisation denominator per device: the hardware's 16-bit peak for its precision; fp32 at a fraction."""
    if precision == "fp16":
        return fp16
    if precision == "bf16":
        return bf16
    return bf16 * FP32_PEAK_FRACTION


def utilisation(tokens_per_s_per_device: float, flops_per_token: float, peak: float) -> float:
    """Achieved FLOP/s over the peak: MFU with model FLOPs, HFU with hardware FLOPs."""
    return tokens_per_s_per_device * flops_per_token / (peak * 1e12) if peak > 0 else 0.0


# ---------------------------------------------------------------------------------------------------- checkpoints
def checkpoint_step(path: Path) -> int | None:
    """N of a ``checkpoint-N`` directory name, else None."""
    name = path.name
    if not name.startswith(CHECKPOINT_PREFIX):
        return None
    tail = name[len(CHECKPOINT_PREFIX) :]
    # ASCII digits only: str.isdigit() also takes '²' (which int() refuses) and other scripts' digits (which it takes)
    return int(tail) if 0 < len(tail) <= MAX_STEP_DIGITS and tail.isascii() and tail.isdigit() else None


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` cannot be resumed from, or None when it is complete.

    Complete means: the Trainer's state parses (it is written last, so an interrupted save lacks it or has it cut),
    no incompleteness marker, and at least one weights file, each of them whole: a safetensors file holds every
    byte its header points to, a sharded index names only shards that exist and are whole, a .bin is not empty.
    """
    try:
        jsonfile.read(path / TRAINER_STATE_FILE)
    except (OSError, ValueError):  # jsonfile's refusals (too big, too deep, not UTF-8) are ValueErrors
        return f"{TRAINER_STATE_FILE} missing, unreadable or not a regular file"
    if (path / INCOMPLETE_MARKER).exists():
        return "marked incomplete"
    weights = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
    if not weights:
        return "no model weights"
    for file in weights:
        problem = _weights_file_problem(file)
        if problem:
            return problem
    return None


def _weights_file_problem(file: Path) -> str | None:
    if file.name.endswith(".index.json"):
        try:
            shards = set(jsonfile.read(file)["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"{file.name} unreadable"
        for shard in sorted(str(s) for s in shards):
            if "/" in shard or shard.startswith(".") or shard.endswith(".json"):  # itself, another index, elsewhere
                return f"{file.name} names {shard!r} as a shard: not a weights file beside it"
            shard_path = file.parent / shard
            if not shard_path.is_file():
                return f"shard {shard} missing"
            problem = _weights_file_problem(shard_path)
            if problem:
                return problem
        return None
    if file.suffix == ".safetensors":
        return _safetensors_problem(file)
    return None if file.stat().st_size else f"{file.name} is empty"


#: safetensors' own bound on a header (100 MB): a larger one is refused unread.
SAFETENSORS_MAX_HEADER = 100_000_000


def _safetensors_problem(file: Path) -> str | None:
    """A safetensors file is complete when it holds its header and every byte the header points to."""
    size = file.stat().st_size
    header: Any = None
    header_len = 0
    try:
        with file.open("rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            if 8 + header_len <= size and header_len <= SAFETENSORS_MAX_HEADER:
                header = jsonfile.loads(handle.read(header_len), file.name)
    except (OSError, ValueError):
        header = None
    if not isinstance(header, dict):
        return f"{file.name} has a truncated header"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        return f"{file.name} has a malformed header"
    if 8 + header_len + end > size:
        return f"{file.name} truncated ({size} of {8 + header_len + end} bytes)"
    return None


def checkpoints(output_dir: Path) -> Iterator[tuple[int, Path, str | None]]:
    """(step, path, problem) of every ``checkpoint-N`` directory, newest first; problem None when complete."""
    found = []
    try:
        entries = list(Path(output_dir).iterdir())
    except OSError:
        return
    for path in entries:
        step = checkpoint_step(path)
        if step is not None and path.is_dir():
            found.append((step, path))
    for step, path in sorted(found, reverse=True):
        yield step, path, checkpoint_problem(path)


def latest_complete_checkpoint(output_dir: Path) -> Path | None:
    """The checkpoint ``--resume auto`` continues from: the newest complete one."""
    for _, path, problem in checkpoints(output_dir):
        if problem is None:
            return path
    return None


# ------------------------------------------------------------------------------------------ run identity, resume
def run_record(
    run_id: str, *, world_size: int, zero_stage: int, global_batch_size: int | None = None, **extra: Any
) -> dict[str, Any]:
    """What :data:`RUN_FILE` holds: the run fingerprint (``plan.run_id``: model, data, global batch, optimisation),
    the world layout the checkpoint's states were written in and the global batch they were trained at, plus
    anything else worth reading (step, accumulation, recipe name)."""
    record = {"run_id": run_id, "world_size": world_size, "zero_stage": zero_stage}
    if global_batch_size is not None:
        record["global_batch_size"] = global_batch_size
    return {**record, **extra}


def write_run_record(directory: Path, record: dict[str, Any]) -> None:
    """Write :data:`RUN_FILE` into ``directory`` atomically: a reader sees the whole record or none."""
    target = Path(directory) / RUN_FILE
    staging = target.with_name(f"{RUN_FILE}.tmp-{os.getpid()}")
    staging.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(staging, target)


def read_run_record(directory: Path) -> dict[str, Any] | None:
    """The run record of a checkpoint, or None when it has none (written by an older bundle) or it is unreadable."""
    try:
        record = jsonfile.read(Path(directory) / RUN_FILE)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


class ResumeRefused(Exception):
    """A checkpoint that must not be resumed from, said in one line (train.py exits :data:`EXIT_USER_ERROR`)."""


@dataclass(frozen=True)
class ResumeChoice:
    """Where a run continues from, and why not from anything newer."""

    path: Path | None  # None: from scratch
    #: (checkpoint name, why it cannot be resumed) of every newer checkpoint passed over, newest first
    skipped: tuple[tuple[str, str], ...] = ()
    #: things worth a warning about the chosen checkpoint (e.g. it was saved at another world size)
    warnings: tuple[str, ...] = ()
    #: the checkpoint's ZeRO partitions were written at another world size: they must be re-sharded before they
    #: load (runtime/volume/reshard.py: DeepSpeed's universal checkpoint)
    reshard: bool = False
    #: the world size the chosen checkpoint was saved at (None: from scratch)
    saved_world_size: int | None = None

    @property
    def step(self) -> int | None:
        return checkpoint_step(self.path) if self.path is not None else None


#: Why a tensor-parallel run is not resumed at another world size: DeepSpeed AutoTP's checkpoints at another
#: data-parallel size were not proven here (plan/rescale.py refuses the rebuild, session.py the resume).
TP_RESIZE_REFUSAL = "resuming a tensor-parallel (AutoTP) checkpoint at another world size has not been proven here"


@dataclass(frozen=True)
class WorldLayout:
    """How this process's run is laid out: what a checkpoint's record is compared with."""

    world_size: int
    zero_stage: int
    global_batch_size: int | None = None  # micro × accumulation × data-parallel size; None: not compared
    streaming: bool = False  # the stream's position is kept per rank: no other world size can continue it


def resume_choice(
    output_dir: Path,
    run_id: str,
    resume: str = "auto",
    *,
    layout: WorldLayout | None = None,
) -> ResumeChoice:
    """The checkpoint a run of ``run_id`` continues from; raises :class:`ResumeRefused` for one it must not touch.

    ``resume``: ``none`` (from scratch), ``auto`` (the newest complete ``checkpoint-N`` of ``output_dir``; incomplete
    ones are skipped with their reason) or a checkpoint path (it must be complete). The chosen checkpoint must belong
    to this run: a run record naming another run is refused rather than skipped, because continuing from an older
    checkpoint of a directory another run has written into would silently lose work. Given this run's ``layout``, a
    checkpoint trained at another global batch is refused (another trajectory), and one saved at another world size
    is accepted: whole states load anywhere, ZeRO partitions are marked for re-sharding. A checkpoint without a
    record is refused: nothing proves who wrote it (train.py then also checks the record's signature,
    runtime/session/checkpoints.py). Pure apart from reading the directory: train.py acts on the answer and the dry run
    predicts with it.
    """
    if resume == "none":
        return ResumeChoice(None)
    skipped: list[tuple[str, str]] = []
    if resume == "auto":
        path = None
        for _, candidate, problem in checkpoints(output_dir):
            if problem is None:
                path = candidate
                break
            skipped.append((candidate.name, problem))
        if path is None:
            return ResumeChoice(None, tuple(skipped))
    else:
        path = Path(resume)
        problem = checkpoint_problem(path) if path.is_dir() else "not a directory"
        if problem:
            raise ResumeRefused(f"--resume {resume}: {problem}")
    record = read_run_record(path)
    if record is None:
        raise ResumeRefused(
            f"{path.name} has no readable {RUN_FILE}: nothing proves run {run_id} wrote it (the shared volume is "
            "writable by others, docs/trust.md); start over with --resume none or another output_dir"
        )
    if record.get("run_id") != run_id:
        raise ResumeRefused(
            f"{path.name} belongs to run {record.get('run_id')!r}, not to this bundle's run {run_id!r}: only a "
            "bundle built from the same recipe (at the same global batch) can resume it; rebuild with the recipe "
            "that wrote it (recipekit rescale keeps it on another number of nodes), or start over with --resume "
            "none or another output_dir"
        )
    saved = record.get("world_size")
    choice = ResumeChoice(path, tuple(skipped), saved_world_size=saved if isinstance(saved, int) else None)
    return _against_layout(choice, record, layout) if layout is not None else choice


def _against_layout(choice: ResumeChoice, record: dict[str, Any], ours: WorldLayout) -> ResumeChoice:
    """The choice checked against this run's layout: refused at another global batch or ZeRO stage, re-sharded at
    another world size."""
    assert choice.path is not None
    name, world, zero = choice.path.name, record.get("world_size"), record.get("zero_stage")
    batch = record.get("global_batch_size")
    if ours.global_batch_size is not None and batch is not None and batch != ours.global_batch_size:
        raise ResumeRefused(
            f"{name} was trained at global batch {batch}, this run's is {ours.global_batch_size} (micro × "
            f"accumulation × data-parallel size at world size {ours.world_size}): that is another trajectory; "
            f"launch the world the plan has, or rebuild with recipekit rescale, which keeps the global batch"
        )
    if zero != ours.zero_stage and (zero or ours.zero_stage):
        raise ResumeRefused(
            f"{name} was saved with ZeRO {zero}, this run has ZeRO {ours.zero_stage}: their optimizer states are "
            "laid out differently; run it with the ZeRO stage it was saved with, or start over with --resume none"
        )
    if world == ours.world_size or not isinstance(world, int):
        return choice
    if ours.streaming:
        raise ResumeRefused(
            f"{name} was saved at world size {world}, this run has {ours.world_size}: a streamed run keeps its "
            f"position in the stream per rank, so only world size {world} continues it exactly; run it at that "
            "size, or start over with --resume none"
        )
    kept = f"global batch {batch} kept" if batch is not None else "global batch unrecorded"
    warning = f"{name} was saved at world size {world}, this run has {ours.world_size} ({kept})"
    if not zero:
        return replace(choice, warnings=(*choice.warnings, warning + ": whole optimizer states load at any size"))
    return replace(
        choice,
        warnings=(*choice.warnings, warning + f": its ZeRO {zero} partitions are re-sharded first"),
        reshard=True,
    )


# -------------------------------------------------------------------------------------------------------- records
#: ``metrics.jsonl`` holds one JSON object per line. Training logs carry ``step`` and the Trainer's figures (loss,
#: learning_rate, ...); the records below carry ``event`` instead, so readers never parse log text.
#: run_id, world size, device, precision, parameters, resume_from (None: scratch), resume_step, global batch and
#: accumulation, saved_world_size (the world the resumed checkpoint was saved at)
EVENT_START = "start"
EVENT_ADAPTED = "adapted"  # one change to the plan for how train.py was launched (no torchrun): ``note``
EVENT_PREEMPTED = "preempted"  # SIGTERM: checkpoint saved at ``step``
EVENT_DONE = "done"  # final ``step``, where the model went
#: The training data, prepared or reused before the process group formed: fingerprint, directory, reused, workers,
#: chunks, train/eval rows and tokens, records read/bad/dropped, seconds (see runtime/dataprep.py).
EVENT_DATA = "data"
#: What ``rank`` begins now (``phase``: a short name such as "load data", "build model", "train"; extra fields are
#: shown beside it). Optional: the dry run prints each as it arrives, so minutes before step 1 are not silent.
EVENT_PHASE = "phase"
#: The operations layer's records. ``preflight``: rank 0's verdict and every check (also cluster-check.json);
#: ``stalled``: the hang watchdog fired (written by *each* rank that detects it: rank 0 may be the one that hangs);
#: ``nonfinite``: a NaN/inf loss stopped or warned; ``alert``: an in-process warning (``alert``, ``step``,
#: ``message``); ``checkpoint``: a save's ``seconds`` and ``bytes``; ``profile``: where a trace went.
EVENT_PREFLIGHT = "preflight"
EVENT_STALLED = "stalled"
EVENT_NONFINITE = "nonfinite"
EVENT_ALERT = "alert"
EVENT_CHECKPOINT = "checkpoint"
EVENT_PROFILE = "profile"


def event(kind: str, **fields: Any) -> dict[str, Any]:
    """One structured record for metrics.jsonl."""
    return {"event": kind, **fields}


def stamped(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with ``time`` (Unix seconds) added: a run report places attempts and restarts on the clock."""
    return {**record, "time": round(time.time(), 3)}


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one record as a JSON line (rank 0 only writes; a reader may see a partial last line).

    The line goes out in one ``write`` on an append-mode descriptor, so the one record other ranks may write (the
    watchdog's ``stalled``, when rank 0 may be the rank that hangs) does not interleave with rank 0's lines.
    """
    line = (json.dumps(record, sort_keys=False) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON object line of a metrics file; unreadable lines (a write in progress) are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return parse_records(text.splitlines())


def parse_records(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The JSON objects among ``lines`` (a reader following the file as it grows passes the new lines)."""
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def events(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The records of one event kind, in file order."""
    return [r for r in records if r.get("event") == kind]
