"""What makes a run itself, and what it is called: the run identity and its fingerprint, the Job's name, where its
checkpoints and prepared data go on the shared volume. (The image is named after its software stack, not the
run: image/stack.py.)

Two builds with equal identities are the same run: a re-submission (or a rescale to another node count at the same
global batch) finds its checkpoints, because the Job name and the output directory carry the fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from recipekit.base.errors import Problem
from recipekit.plan.layout import Layout
from recipekit.recipe.k8snames import MAX_DNS_LABEL, RENDEZVOUS_TASK, k8s_name
from recipekit.recipe.schema import to_data
from recipekit.recipe.sections import Recipe
from recipekit.runtime.volume import coldtier

#: Hex digits of the run fingerprint in the Job name and output directory: enough to keep runs of one team apart.
RUN_ID_LENGTH = 6


def _digest(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


#: The training settings that change a run's trajectory; bookkeeping (save/log cadence, trackers, workers) does not.
_TRAJECTORY_KEYS = (
    "epochs",
    "max_steps",
    "learning_rate",
    "lr_scheduler",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "seed",
)


#: The layout numbers that shape a run's trajectory. The global batch, not its factors: every step consumes the
#: same samples in the same order at any data-parallel size (runtime/data/sampler.py), so the same run may continue on
#: fewer or more nodes with accumulation raised or lowered (plan/rescale.py). TP, PP and the micro-batch stay: they
#: shape the checkpoint's files and the Trainer's own state.
TRAJECTORY_LAYOUT_KEYS = ("tensor_parallel", "pipeline_parallel", "micro_batch_size", "global_batch_size")


def run_identity(recipe: Recipe, layout: Layout, precision: str) -> dict[str, Any]:
    """What defines a run: the model, what is trained, on which data, at which global batch, with which optimisation.

    Two builds with equal identities are the same run (a re-submission resumes its checkpoints); any difference gives
    a new Job name and output directory. Descriptions, cluster placement (namespace, queue, registry), hardware names,
    the number of nodes and bookkeeping are left out: moving a run to another queue, or to fewer nodes at the same
    global batch, keeps its checkpoints.
    """
    data, train = recipe.data, to_data(recipe.train)
    return {
        # what LoRA could adapt (model.modules) is a fact about the tree, not the run: recorded options keep their ids
        "model": {k: v for k, v in to_data(recipe.model).items() if k not in ("description", "modules")},
        "mode": {k: v for k, v in to_data(recipe.mode).items() if k != "description"},
        "data": {
            "format": data.format,
            "path": data.path,
            "max_len": data.max_len,
            "packing": data.packing,
            "eval_fraction": data.eval_fraction,
            "shard_mib": data.shard_mib,  # chunks bound the packing windows, so they shape the rows
            # streaming draws rows in another order; absent when off, so existing runs keep their ids
            **({"streaming": True} if data.streaming else {}),
        },
        "layout": {k: layout.numbers()[k] for k in TRAJECTORY_LAYOUT_KEYS},
        "zero_stage": recipe.parallel.zero_stage,
        "precision": precision,
        "train": {k: train[k] for k in _TRAJECTORY_KEYS},
    }


def run_id(identity: dict[str, Any]) -> str:
    """The run fingerprint: a short hash of :func:`run_identity`, recorded in every checkpoint."""
    return _digest(identity)[:RUN_ID_LENGTH]


@dataclass(frozen=True)
class RunNames:
    """The run's fingerprint and the names and places made from it."""

    run_id: str
    job_name: str  # <recipe name>-<run id>, a DNS label with room for -<task>-<index>
    output_dir: str  # <cluster.output_dir>/<job name>: checkpoints, metrics, records
    prepared_dir: str  # prepared data: <prepared_dir>/<fingerprint>, shared by runs with equal inputs


def run_names(recipe: Recipe, layout: Layout, precision: str) -> tuple[RunNames, list[Problem]]:
    """The run's names, and the problems with them: a Job name that cannot fit Kubernetes' 63 characters with its
    pods' suffix, an output or prepared-data directory off the shared volume (it would not survive a pod)."""
    cl, data = recipe.cluster, recipe.data
    problems = []
    identity = run_id(run_identity(recipe, layout, precision))
    pods = [f"-{identity}-{cl.task_name}-{cl.nodes - 1}"]
    if cl.min_nodes is not None:  # an elastic Job's rendezvous pod (bundle/documents.py)
        pods.append(f"-{identity}-{RENDEZVOUS_TASK}-0")
        if cl.task_name == RENDEZVOUS_TASK:
            problems.append(
                Problem(
                    "cluster.task_name",
                    f"{RENDEZVOUS_TASK!r} is the task of an elastic Job's rendezvous pod (cluster.min_nodes)",
                    hint="name the training task otherwise (the default is worker)",
                )
            )
    suffix = max(pods, key=len)
    readable = k8s_name(recipe.name, limit=MAX_DNS_LABEL - len(suffix))
    if MAX_DNS_LABEL - len(suffix) < 1:
        problems.append(
            Problem("cluster.task_name", "task name too long to build <job>-<task>-<index> within 63 characters")
        )
    job_name = f"{readable}-{identity}"
    output_dir = f"{cl.output_dir.rstrip('/')}/{job_name}"
    mount = cl.mount_path.rstrip("/") + "/"
    if not (output_dir + "/").startswith(mount):
        problems.append(
            Problem(
                "cluster.output_dir",
                f"{cl.output_dir} is not under the shared volume {cl.mount_path}",
                hint="checkpoints must survive a pod: put output_dir under mount_path",
            )
        )
    prepared_dir = (data.prepared_dir or f"{cl.output_dir.rstrip('/')}/prepared").rstrip("/")
    if data.prepared_dir and not (prepared_dir + "/").startswith(mount):
        problems.append(
            Problem(
                "data.prepared_dir",
                f"{data.prepared_dir} is not under the shared volume {cl.mount_path}",
                hint="every pod prepares a share and reads every shard: put prepared_dir under mount_path",
            )
        )
    hot = recipe.train.hot_checkpoints
    hot_mount = hot.mount_path.rstrip("/") + "/"
    if hot.medium != "none" and (hot_mount.startswith(mount) or mount.startswith(hot_mount)):
        problems.append(
            Problem(
                "train.hot_checkpoints.mount_path",
                f"{hot.mount_path} overlaps the shared volume {cl.mount_path}",
                hint="the hot tier is the node's own disk: mount it apart from the shared volume",
            )
        )
    command = recipe.train.cold_checkpoints.command
    if command and not command[0].strip():
        problems.append(Problem("train.cold_checkpoints.command", "its first part, the program, is empty"))
    for problem in coldtier.unknown_fields(command):
        problems.append(Problem("train.cold_checkpoints.command", problem))
    return RunNames(identity, job_name, output_dir, prepared_dir), problems
