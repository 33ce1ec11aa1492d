"""The Megatron engine's entrypoint: recipe.yaml in, Megatron-Bridge's own training loop run, HF weights out.

The launcher starts it as it starts the Trainer's (runtime/launch.py; launch.json's ``module`` is
``runtime.megatron.train``): ``torchrun ... -m runtime.megatron.train --recipe recipe.yaml --resume auto``.
recipekit writes no training loop: this module reads recipe.yaml (settings.py), finds the device (ops/device.py),
proves which checkpoint the run continues from (checkpoints.py), prepares or reuses the data shards (data.py),
imports the HF weights once as a Megatron checkpoint (hfimport.py), builds Bridge's ConfigContainer (container.py)
and calls Bridge's ``pretrain()`` with Bridge's own ``gpt_step.forward_step`` and recipekit's callbacks
(callbacks.py).

``finetune()`` is Bridge's ``pretrain()`` after it checks that a base checkpoint is given; it takes no callbacks, so
the room makes the same check and calls ``pretrain()``.

Outputs in ``megatron.recipekit.output_dir``:
  checkpoints/iter_N/  Bridge's torch_dist checkpoints, each with the signed run record (``filenames.RUN_FILE``)
  megatron-init/       the HF weights as a Megatron checkpoint, signed: the base every start loads
  random-init/         the random twin (``model.init: random``)
  hf/                  the trained model as HF weights (merged under LoRA), loadable by transformers
  metrics.jsonl        per step: loss, grad norm, learning rate, tokens/s, TFLOP/s, MFU, HFU, step time; and the
                       records (start, preflight, alert, nonfinite, preempted, done)
  attempt-ends/        why each attempt ended (a rank's non-zero exit)
  recovery.jsonl       the attempts, what each resumed and its first step (volume/recovery.py: runs history, MTTR)
  cluster-check.json   preflight's report; hang/ the stacks of a stalled rank; nonfinite-step-N/ the loss guard's

The operations contract is the Trainer's, at Bridge's callback events (ops.py). Exit codes are the runtime's
(boundary/exitcodes.py), each process's written where the launcher reads it: 0 done; 2 a recipe, checkpoint or data
problem (one line); 1 a failure (a traceback); 3 a failed preflight; 5 (``nonfinite``) a non-finite loss the guard
stopped at; 4 a rank the hang watchdog found stalled; 143 (``preempted``) after SIGTERM, when Bridge's own signal
handler has saved a checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from .. import matmulmode
from ..boundary import exitcodes, filenames, metricslog
from ..boundary.common import LOG, RunError, log0, rank
from ..boundary.megatronview import check_world
from ..ops.device import detect
from ..volume import attemptends, trust
from .settings import EngineRun, load_engine_run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train from a Megatron bundle's recipe.yaml with Megatron-Bridge.")
    parser.add_argument("--recipe", type=Path, default=Path(filenames.RECIPE_FILE), help="the bundle's recipe.yaml")
    parser.add_argument(
        "--resume",
        default="auto",
        help="auto: newest signed checkpoint of this run; none: start over; or an iter_N checkpoint path",
    )
    return parser.parse_args(argv)


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO if rank() == 0 else logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s [rank {rank()}] %(name)s: %(message)s",
    )


class Records:
    """metrics.jsonl's structured records, appended by one rank only (``writer``: rank 0 unless said)."""

    def __init__(self, output_dir: Path, writer: int = 0):
        self.path, self.writer = output_dir / filenames.METRICS_FILE, rank() == writer

    def add(self, kind: str, **fields: Any) -> None:
        if self.writer:
            metricslog.append_record(self.path, metricslog.stamped(metricslog.event(kind, **fields)))


def layout_of(run: EngineRun, world: int) -> Any:
    from .checkpoints import Layout

    model = run.megatron.sections["model"]
    parallel = {
        name: int(model.get(f"{name}_model_parallel_size") or 1)
        for name in ("tensor", "pipeline", "virtual_pipeline", "expert", "context")
    }
    return Layout(run.plan.run_id, world, parallel, int(run.megatron.get("train", "global_batch_size")))


def train(options: argparse.Namespace) -> int:
    from .redirect import install_if_asked

    run = load_engine_run(options.recipe)
    doc, world = run.megatron, int(os.environ.get("WORLD_SIZE", "1"))
    problems = check_world(doc, world)
    if problems:
        raise RunError("; ".join(problems))
    device = detect(run.recipe.hw)
    log0(matmulmode.apply(run.recipe.hw.fp32_matmul))
    install_if_asked(run.recipe.hw)  # the dry run's CPU redirect, before Bridge is imported
    output_dir = run.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    attemptends.watch(output_dir)
    records = Records(output_dir)
    try:
        key = trust.load_key()
    except trust.Untrusted as exc:
        raise RunError(str(exc)) from None
    from . import checkpoints, data

    layout = layout_of(run, world)
    choice = checkpoints.choose(output_dir, options.resume, layout, key)
    for name, reason in choice.skipped:
        log0("skipping %s: %s", name, reason)
    if rank() == 0:
        checkpoints.settle(output_dir, choice, run.plan.run_id, key)
    prepared = data.prepare(run.recipe, Path(run.plan.prepared_dir), output_dir, run.seed)
    records.add(metricslog.EVENT_DATA, **prepared.summary())
    return train_with_bridge(run, device, prepared, choice, layout, key, records)


def train_with_bridge(
    run: EngineRun, device: Any, prepared: Any, choice: Any, layout: Any, key: Any, records: Any
) -> int:
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    from . import container, hfimport
    from .callbacks import HF_DIR, RoomCallback, shield_checkpoint_writer
    from .checkpoints import INIT_DIR
    from .ops import BridgeOps, NonFiniteStop, step_function

    doc, output_dir = run.megatron, run.output_dir
    shield_checkpoint_writer()  # before any save: a SIGTERM's checkpoint must survive the SIGTERM (callbacks.py)
    backend = str(doc.get("dist", "distributed_backend"))
    model_fields = dict(doc.sections["model"])
    init_dir = hfimport.imported(
        prepared.model_path, output_dir / INIT_DIR, run.plan.run_id, key, backend, model_fields
    )
    bridge, model = container.provider(prepared.model_path, run.recipe.model.trust_remote_code)
    cfg = container.build(doc, model, prepared, output_dir, choice, init_dir)
    if doc.entry == "finetune" and cfg.checkpoint.pretrained_checkpoint is None and cfg.checkpoint.load is None:
        raise RunError("finetune needs a base: the imported HF weights or a checkpoint to resume")
    # the loss guard (ops.py) stops every rank at a non-finite loss; Bridge's own check would fail the last stage only
    cfg.rerun_state_machine.check_for_nan_in_loss = False
    tokens = int(doc.get("train", "global_batch_size")) * int(doc.get("model", "seq_length"))
    resume = (choice.step, str(choice.path) if choice.path is not None else None)
    # the operations' records (checkpoints, alerts) from rank 0, as the Trainer's: every rank has the step's figures
    # (the loss is shared, ops.shared_loss), and rank 0 sets its own gauges before its record says a save is over
    ops = BridgeOps(run, device, layout.world_size, resume, Records(output_dir))
    callback = RoomCallback(output_dir, layout, key, run.plan.flops, tokens, ops)
    if doc.export_hf:
        callback.export = (bridge, output_dir / HF_DIR)
    records.add(metricslog.EVENT_START, **start_fields(run, device, layout, choice, prepared))
    try:
        pretrain(cfg, step_function(forward_step, ops), callbacks=[callback])
    except NonFiniteStop:  # every rank, at the same step, before Bridge saved it
        return ops.stopped(records)
    except SystemExit as stop:  # Bridge ends the loop this way after its SIGTERM checkpoint
        callback.sign(1 << 62)
        if callback.signalled():
            step = int(callback.state.train_state.step) if callback.state is not None else None
            log0("SIGTERM: checkpoint of step %s saved and signed; exiting %d", step, exitcodes.EXIT_PREEMPTED)
            records.add(metricslog.EVENT_PREEMPTED, step=step)
            return exitcodes.EXIT_PREEMPTED
        raise RunError(f"Megatron-Bridge stopped the run (exit {stop.code}); its reason is logged above") from None
    finally:
        ops.close()
    callback.sign(1 << 62)
    step = int(callback.state.train_state.step) if callback.state is not None else None
    ops.done(step or 0)
    exported = str(callback.exported) if callback.exported else None
    records.add(metricslog.EVENT_DONE, step=step, output=str(output_dir), hf=exported)
    log0("done: %s steps; checkpoints in %s, HF weights in %s", step, output_dir, exported)
    return exitcodes.EXIT_OK


def start_fields(run: EngineRun, device: Any, layout: Any, choice: Any, prepared: Any) -> dict[str, Any]:
    doc = run.megatron
    return {
        "run_id": run.plan.run_id,
        "engine": "megatron",
        "entry": doc.entry,
        "world_size": layout.world_size,
        "parallel": layout.parallel,
        "device": device.kind,
        "precision": doc.mixed_precision or "fp32",
        "lora": doc.peft is not None,
        "resume_from": str(choice.path) if choice.path is not None else None,
        "resume_step": choice.step,
        "global_batch_size": layout.global_batch_size,
        "model": prepared.model_path,
        "skipped": [{"checkpoint": name, "reason": reason} for name, reason in choice.skipped],
    }


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    setup_logging()
    try:
        return train(options)
    except RunError as exc:
        print("megatron.train: " + " ".join(str(exc).split()), file=sys.stderr)
        return getattr(exc, "code", exitcodes.EXIT_USER_ERROR)
    except Exception as exc:  # a bug or an environment failure: keep the traceback, end with one line
        LOG.exception("training failed")
        print(f"megatron.train: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exitcodes.EXIT_FAILED


if __name__ == "__main__":
    code = main()
    exitcodes.record_exit(code)  # torchrun exits 1 whatever this code is: the launcher reads it from here
    attemptends.record_end(code)
    # A normal exit: the interpreter's finalization shuts down what Megatron's torch_dist writer started (a
    # multiprocessing Manager in a process of its own, which os._exit would leave running, orphaned).
    sys.exit(code)
