"""The operations contract inside Bridge's loop, through Bridge's own callback hook (Bridge's ``Callback``):
metrics.jsonl, the signing of each saved checkpoint, where this attempt got to, the HF export at
the end, and the dry run's hold at a step.

* metrics.jsonl: one line per step, written by the global last rank (the last pipeline stage is where Bridge has the
  loss; every rank has the same figures for its gauges and alerts, the loss broadcast to them): ``step``, ``loss``,
  ``grad_norm``, ``learning_rate``, ``tokens_per_second_per_device``, ``tflops_per_device``, ``mfu``, ``hfu`` (the
  plan's FLOPs per token, recipe.yaml ``plan.flops``, through ``flopcount.step_figures`` as the Trainer's throughput
  callback), ``step_time_s``, ``dataloader_wait_fraction``, the alerts' figures and the process's peak resident
  memory. Tokens are the global batch's, padding included (the device computed them): global batch × sequence
  length per step.
* each checkpoint Bridge saved is signed by rank 0 at the start of the next step (checkpoints.py says why then),
  then timed as the save training waited for and handed to the cold tier (ops.py);
* the operations contract (ops.py's BridgeOps): preflight, exporter, recovery records and the hang watchdog at
  ``on_train_start``; the stall drill at each step's start; the loss guard, the recovery progress (and so
  ``attemptends.stepped``), the gauges and the watchdog's next phase at each step's end;
* ``on_train_end`` (a run that finished, not one a SIGTERM stopped): the HF export, a collective of every rank
  (Bridge's ``AutoBridge.save_hf_pretrained``: gathers TP/PP/EP shards, merges LoRA adapters into the base);
* TESTING ONLY, ``exitcodes.HOLD_AT_STEP_ENV`` = S: every rank holds before step S + 1 (after step S was saved and
  signed) until the dry run kills it, so the kill lands at step S whatever the machine's load.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from megatron.bridge.training.callbacks import Callback

from ..boundary import exitcodes, filenames, flopcount, metricslog
from ..boundary.common import log0, rank
from .checkpoints import CHECKPOINTS_DIR, Layout, sign_new
from .ops import BridgeOps

#: Below the output directory: the exported HF model.
HF_DIR = "hf"
GIB = 1024**3


class RoomCallback(Callback):
    """recipekit's side of a Bridge run (see the module docstring)."""

    def __init__(
        self, output_dir: Path, layout: Layout, key: bytes | None, flops: Any, tokens_per_step: int, ops: BridgeOps
    ):
        self.output_dir, self.layout, self.key, self.ops = output_dir, layout, key, ops
        self.flops, self.tokens_per_step = flops, tokens_per_step
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.writer = rank() == self.world - 1
        self.state: Any = None
        self.export: Any = None  # (bridge, directory): set when the run exports HF weights
        self.exported: Path | None = None
        self._clock = time.perf_counter()
        hold = os.environ.get(exitcodes.HOLD_AT_STEP_ENV, "")
        self.hold_at = int(hold) if hold.isdigit() else None

    # -- Bridge's events
    def on_train_start(self, context: Any) -> None:
        self.state = context.state
        self.ops.train_started(int(context.state.train_state.step))
        install_signal_handler(context.state)
        self._clock = time.perf_counter()

    def on_train_step_start(self, context: Any) -> None:
        step = context.state.train_state.step  # steps completed so far
        self.sign(step)
        self.ops.save_ended()  # the save after the step before, signed: what training waited for
        if self.hold_at is not None and step == self.hold_at:
            self._hold(context)
        self.ops.step_begins(step + 1)
        self._clock = time.perf_counter()

    def on_train_step_end(self, context: Any) -> None:
        """Every rank: the step's figures (the loss is the last pipeline stage's, shared with the others) for its
        gauges and alerts, as each of the Trainer's ranks has them; the last rank writes the metrics line."""
        step = context.state.train_state.step + 1  # Bridge counts the step after this event
        elapsed = time.perf_counter() - self._clock
        losses = {name: float(_scalar(value)) for name, value in (context.loss_dict or {}).items()}
        record: dict[str, Any] = {"step": step}
        for name, value in losses.items():
            record["loss" if name == "lm loss" else name.replace(" ", "_")] = round(value, 6)
        shared = self.ops.shared_loss(record.get("loss"))
        if "loss" not in record and shared is not None:
            record["loss"] = round(shared, 6)
        if context.grad_norm is not None:
            record["grad_norm"] = round(float(context.grad_norm), 6)
        if context.optimizer is not None:
            record["learning_rate"] = float(context.optimizer.param_groups[0]["lr"])
        record.update(self.throughput(elapsed))
        record[metricslog.PEAK_HOST_MEMORY_KEY] = round(_peak_rss() / GIB, 4)
        self.ops.logged(step, record, elapsed)
        if self.writer and losses:
            metricslog.append_record(self.output_dir / filenames.METRICS_FILE, metricslog.stamped(record))
        self.ops.step_ended(step, elapsed)  # the loss guard may end the loop here

    def on_train_end(self, context: Any) -> None:
        self.ops.save_ended()  # the save after the last step
        if self.export is None:
            return
        bridge, directory = self.export
        self.ops.export_begins(int(context.state.train_state.step))
        log0("exporting HF weights to %s", directory)
        bridge.save_hf_pretrained(context.model, str(directory), show_progress=False)
        self.exported = directory

    # -- the parts
    def throughput(self, elapsed: float) -> dict[str, float]:
        """tokens/s and TFLOP/s per device, MFU and HFU against the plan's peak, over this step."""
        if elapsed <= 0:
            return {}
        per_device = self.tokens_per_step / elapsed / self.world
        flops = self.flops
        return flopcount.step_figures(per_device, flops.model_per_token, flops.hardware_per_token, flops.peak_tflops)

    def sign(self, upto: int) -> list[int]:
        """Rank 0 signs the checkpoints saved up to step ``upto`` (every rank's save returned: Bridge barriers)."""
        if rank() != 0:
            return []
        signed = sign_new(self.output_dir / CHECKPOINTS_DIR, self.layout, self.key, upto)
        for step in signed:
            log0("checkpoint of step %d signed", step)
            self.ops.signed(step)
        return signed

    def signalled(self) -> bool:
        """Whether this process received the SIGTERM Bridge's handler watches for."""
        handler = getattr(self.state, "_signal_handler", None) or getattr(self.state, "signal_handler", None)
        return bool(getattr(handler, "_signal_received", False))

    def _hold(self, context: Any, limit_s: float = 300.0) -> None:
        print(f"TESTING: holding after step {self.hold_at} until this pod is killed", file=sys.stderr, flush=True)
        self.state = context.state
        until = time.monotonic() + limit_s
        while time.monotonic() < until and not self.signalled():
            time.sleep(0.05)
        self.hold_at = None


def install_signal_handler(state: Any) -> bool:
    """Enter Bridge's own SIGTERM handler (``train.exit_signal_handler``): Bridge 0.3.1 creates its
    ``DistributedSignalHandler`` (state.py) and polls it after each step (train.py's checkpoint_and_decide_exit), but
    never enters it for training (only its dataloader workers do, data/loaders.py), so a SIGTERM killed the process
    without the checkpoint. Megatron-LM enters it at initialisation; this is that, once the loop begins."""
    train = getattr(getattr(state, "cfg", None), "train", None)
    if not getattr(train, "exit_signal_handler", False):
        return False
    state.signal_handler.__enter__()
    return True


def shield_checkpoint_writer() -> bool:
    """Start megatron-core's torch_dist writer's results queue (a multiprocessing Manager: a spawned process of its
    own, created at the first save and kept) with SIGTERM ignored, which a spawned process inherits. On SIGTERM
    torchrun signals each worker's whole process group, that process included; killed, it breaks the very save
    Bridge's signal handler makes at the step (BrokenPipeError, measured here). Every rank calls this before its
    first save; False where the writer has no such queue (another megatron-core: nothing to shield)."""
    import signal

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    start = getattr(filesystem_async, "_get_write_results_queue", None)
    if start is None:
        return False
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        start()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return True


def _scalar(value: Any) -> float:
    """A loss entry as Bridge reports it: a tensor (a sum and a count for per-token losses) or a number."""
    if hasattr(value, "numel"):
        flat = value.detach().float().reshape(-1)
        return float(flat[0] / flat[1]) if flat.numel() == 2 else float(flat.mean())
    return float(value)


def _peak_rss() -> int:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
