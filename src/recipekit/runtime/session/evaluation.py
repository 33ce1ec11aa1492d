"""The evaluation after training (``eval.enabled``): lm-evaluation-harness on the model this run saved.

It runs here, in the Trainer's own process on global rank 0, after the final save (and the merge of
``lora.merge_on_save``) and after every other rank has left the process group, rather than as a second Job or a
launcher step: the model is then on the pod's local device already and read back from exactly the files the run
delivers (what is scored is what ships), the image already holds the harness beside the training stack, and the
result lands in the same output directory, under the same run id, with no second scheduling round on a busy
cluster. The price: the evaluation holds pod 0 for as long as it takes, and a model must fit one device (the
harness's ``hf`` model on one device, the same as inference).

The harness is EleutherAI's lm-evaluation-harness (``lm_eval``), called through its Python API:
``simple_evaluate(model="hf", model_args={"pretrained": <dir>, ...}, tasks=..., task_manager=TaskManager(
include_path=eval.task_dir))`` — the ``hf`` model type loads a local directory with transformers, and a task YAML
of ``task_dir`` may read a local dataset (``dataset_path: json`` with ``data_files``), which is how a cluster
without the Hugging Face Hub, and the dry run, evaluate. A failure of any kind (the harness missing, a task not
found, a dataset not reachable, the device out of memory) is recorded with its reason and logged, never raised: the
model is saved by now, and a failed benchmark must not turn a finished run into a failed Job.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ..boundary.common import log0, version
from ..boundary.recipeview import EvalView, RecipeView
from ..volume.evalrecord import EvalRecord, scores_of, write_eval

HARNESS = "lm_eval"
#: The harness's dtype name for each precision the recipe trains in.
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def evaluated_model(output_dir: Path, model_path: str, merged: Path | None, adapter: bool) -> dict[str, Any]:
    """The harness's ``hf`` arguments for what the run saved: the merged model, the base with the saved adapter
    (``peft``), or the full weights in the output directory; the tokenizer the run saved beside them."""
    if merged is not None:
        return {"pretrained": str(merged), "tokenizer": str(merged)}
    if adapter:
        return {"pretrained": model_path, "peft": str(output_dir), "tokenizer": str(output_dir)}
    return {"pretrained": str(output_dir), "tokenizer": str(output_dir)}


def harness_call(view: EvalView, model_args: dict[str, Any], device: str) -> dict[str, Any]:
    """``simple_evaluate``'s keyword arguments (without the task manager): the recipe's tasks, item limit, few-shot
    count and batch size, on ``device``; no per-item log (the record keeps the scores) and no bootstrap (its
    stderr on a handful of items would take longer than the scoring)."""
    return {
        "model": "hf",
        "model_args": model_args,
        "tasks": list(view.tasks),
        "num_fewshot": view.num_fewshot,
        "limit": view.limit,
        "batch_size": view.batch_size,
        "device": device,
        "log_samples": False,
        "bootstrap_iters": 0 if view.limit is not None else 1000,
    }


def run_harness(view: EvalView, model_args: dict[str, Any], device: str) -> dict[str, Any]:
    """lm-evaluation-harness's results for the recipe's tasks (imported here: only a run that evaluates needs it)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=view.task_dir) if view.task_dir else None
    results = lm_eval.simple_evaluate(**harness_call(view, model_args, device), task_manager=manager)
    if not isinstance(results, dict):  # simple_evaluate returns None on ranks other than its own rank 0
        raise RuntimeError("lm_eval.simple_evaluate returned no results")
    return results


def evaluate_after_training(
    recipe: RecipeView,
    output_dir: Path,
    model_path: str,
    merged: Path | None,
    precision: str,
    device_kind: str,
) -> EvalRecord | None:
    """Score the saved model when ``eval.enabled`` (on the calling process: rank 0) and record the result in the
    output directory; None when evaluation is off."""
    view = recipe.eval
    if view is None or not view.enabled:
        return None
    adapter = recipe.mode.lora is not None
    model_args = evaluated_model(output_dir, model_path, merged, adapter)
    model_args.update(dtype=DTYPES.get(precision, "auto"), trust_remote_code=recipe.model.trust_remote_code)
    device = "cpu" if device_kind == "cpu" else f"{device_kind}:0"
    log0("evaluating %s on %s (%s)", model_args["pretrained"], ", ".join(view.tasks), HARNESS)
    started = time.monotonic()
    ok, reason, results = True, "", {}
    try:
        results = run_harness(view, model_args, device)
    except Exception as exc:  # noqa: BLE001 — any failure is recorded, never raised: the model is saved
        ok, reason = False, f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
    record = EvalRecord(
        harness=HARNESS,
        version=version(HARNESS),
        model=str(model_args.get("peft") or model_args["pretrained"]),
        ok=ok,
        reason=reason,
        seconds=round(time.monotonic() - started, 2),
        limit=view.limit,
        scores=scores_of(results) if ok else (),
    )
    write_eval(output_dir, record)
    if not ok:
        log0("evaluation failed (the model is saved): %s", reason, level=logging.WARNING)
    for score in record.scores:
        log0("eval %s %s: %.4f", score.task, score.metric, score.value)
    return record
