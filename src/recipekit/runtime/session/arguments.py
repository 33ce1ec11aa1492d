"""The Trainer's arguments: the plan's, with the DeepSpeed config resolved and a start without torchrun allowed for.

The plan rendered recipe.yaml's ``training_arguments`` for the bundle's target device (backend, optimizer,
precision), and train.py has already checked that this process reaches that device; nothing here second-guesses
those choices. What remains is what only the running process knows: where the bundle lies (ds_config.json is named
relative to recipe.yaml) and how it was launched. A run started without torchrun is one process: it needs no
process group, and its global batch follows a world size of one. Each such change is returned as a note, which
train.py logs and records in metrics.jsonl (``metricslog.EVENT_ADAPTED``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..boundary.common import RunError, version


def trainer_kwargs(
    planned: dict[str, Any],
    *,
    device_kind: str,
    bundle_dir: Path,
    world_size: int,
    planned_world_size: int,
    launched: bool,
    tensor_parallel: int = 1,
    elastic_steps: int | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The keyword arguments for ``TrainingArguments`` and one human-readable note per change to the plan's.

    ``elastic_steps``: the accumulation an elastic plan keeps its global batch with at this world size
    (plan/rescale.py); without it, another world's global batch follows the world size. A world the plan's TP degree
    does not divide is refused here, in one line: DeepSpeed would fail later, deep in building its device mesh."""
    if world_size % tensor_parallel:
        raise RunError(
            f"world size {world_size} is not divisible by the plan's tensor-parallel degree {tensor_parallel} "
            f"(DeepSpeed AutoTP needs whole TP groups): launch {planned_world_size} processes as planned"
        )
    kwargs, notes = dict(planned), []
    if device_kind == "cpu":
        kwargs["use_cpu"] = True  # the target, not a fallback: a CPU bundle stays on the CPU where a GPU is present
    if not launched and not kwargs.get("deepspeed") and kwargs.pop("ddp_backend", None) is not None:
        notes.append("not started by torchrun: training as one process, without a process group")
    resized = world_size != planned_world_size
    kept = resized and elastic_steps is not None
    if kept:
        kwargs["gradient_accumulation_steps"] = elastic_steps
        notes.append(
            f"elastic: world size {world_size} of the plan's {planned_world_size}: accumulation {elastic_steps} "
            "keeps the global batch"
        )
    elif resized:
        notes.append(
            f"world size is {world_size}, the plan's is {planned_world_size}: the global batch follows the world size"
        )
    if kwargs.get("deepspeed"):
        kwargs["deepspeed"] = deepspeed_config(
            kwargs["deepspeed"], bundle_dir, resized and not kept, elastic_steps if kept else None
        )
    return kwargs, notes


def deepspeed_config(
    name: str, bundle_dir: Path, other_world_size: bool, accumulation: int | None = None
) -> dict[str, Any]:
    """The DeepSpeed config as a dict: ``name`` is relative to the bundle (the Trainer would resolve it against the
    working directory). In a world of another size than planned its fixed ``train_batch_size`` cannot hold, so it
    follows the Trainer's ("auto"); an elastic world keeps it with ``accumulation``, which the config must then
    say too (the Trainer refuses a config whose accumulation differs from its own)."""
    path = Path(name)
    path = path if path.is_absolute() else bundle_dir / path
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunError(f"cannot read the DeepSpeed config {path}: {exc}") from None
    if accumulation is not None and "gradient_accumulation_steps" in config:
        config["gradient_accumulation_steps"] = accumulation
    if other_world_size and isinstance(config.get("train_batch_size"), int):
        config["train_batch_size"] = "auto"
    return config


def make_training_arguments(kwargs: dict[str, Any]) -> Any:
    """``TrainingArguments(**kwargs)``; creating them joins the process group torchrun describes."""
    from transformers import TrainingArguments

    try:
        return TrainingArguments(**kwargs)
    except TypeError as exc:  # an argument this transformers version does not know
        raise RunError(f"training_arguments: {exc} (the image has transformers {version('transformers')})") from None
