"""Trainer callbacks: throughput (tokens/s, TFLOPS, MFU, HFU), measured peak memory, the metrics file, and SIGTERM →
checkpoint → stop."""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from ..boundary import exitcodes, flopcount, metricslog


class ThroughputCallback(TrainerCallback):
    """Adds tokens/s, achieved TFLOP/s, MFU and HFU per device to every training log, over the interval since the last.

    The FLOPs per token and the peak are the plan's (recipe.yaml ``plan.flops``): torch's FLOP counter over the
    model, measured once by ``recipekit model import``, at the recipe's sequence length and precision: MFU counts
    the model's FLOPs, HFU adds the recomputation activation checkpointing runs, both against the same peak
    (``flopcount.utilisation``).
    ``tflops_per_device`` is the model FLOPs achieved. Tokens are the Trainer's ``num_input_tokens_seen`` (all
    tokens, padding included: the device computed them), summed over processes; the figures are per device. Under
    tensor parallelism every rank of a TP group sees the same batch, so that sum counts each token ``replicas``
    (= TP) times: it is divided back. It must run before the reporting callbacks, see session.make_trainer.
    """

    def __init__(
        self, model_flops: float, hardware_flops: float, peak_tflops: float, world_size: int, replicas: int = 1
    ):
        self.model_flops, self.hardware_flops = model_flops, hardware_flops
        self.peak_tflops, self.world_size, self.replicas = peak_tflops, world_size, max(1, replicas)
        self._time, self._tokens = time.perf_counter(), 0

    @classmethod
    def from_plan(cls, flops: Any, world_size: int, replicas: int = 1) -> ThroughputCallback:
        """From recipe.yaml's ``plan.flops`` (attributes model_per_token, hardware_per_token, peak_tflops)."""
        return cls(flops.model_per_token, flops.hardware_per_token, flops.peak_tflops, world_size, replicas)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._time, self._tokens = time.perf_counter(), state.num_input_tokens_seen

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs is None or "loss" not in logs:
            return
        now, tokens = time.perf_counter(), state.num_input_tokens_seen
        elapsed, seen = now - self._time, tokens - self._tokens
        self._time, self._tokens = now, tokens
        if elapsed <= 0 or seen <= 0:
            return
        per_device = seen / self.replicas / elapsed / self.world_size
        logs.update(flopcount.step_figures(per_device, self.model_flops, self.hardware_flops, self.peak_tflops))


GIB = 1024**3


class PeakMemoryCallback(TrainerCallback):
    """Adds each logged step's measured memory to the training log, the largest over ranks: the device's peak
    allocated bytes since the last log (torch's own counter for the device, ``max_memory_allocated``, reset after
    each read) and the process's peak resident memory. The plan's memory per device is an estimate of the first;
    ``recipekit report`` puts the two side by side.

    Every rank logs the same steps (the Trainer gathers the loss for each log), so the maximum over ranks is one
    all-reduce at a step every rank reaches. It must run before the reporting callbacks, as the throughput does.
    """

    def __init__(self, device_kind: str):
        self.kind = device_kind

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs is None or "loss" not in logs:
            return
        device = self._device_peak_bytes()
        values = torch.tensor([float(device or 0), float(peak_rss_bytes())], dtype=torch.float64)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            values = values.to(args.device)
            torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX)
        device_peak, rss_peak = (float(v) for v in values.cpu())
        if device is not None:
            logs[metricslog.PEAK_DEVICE_MEMORY_KEY] = round(device_peak / GIB, 4)
        logs[metricslog.PEAK_HOST_MEMORY_KEY] = round(rss_peak / GIB, 4)

    def _device_peak_bytes(self) -> int | None:
        """This process's device peak since the last read (None without a device: a CPU run), then reset."""
        backend = getattr(torch, self.kind, None) if self.kind in ("cuda", "npu") else None
        if backend is None or not backend.is_available():
            return None
        peak = int(backend.max_memory_allocated())
        backend.reset_peak_memory_stats()
        return peak


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (``getrusage``: kilobytes on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class MetricsFileCallback(TrainerCallback):
    """Appends every log (training, evaluation, final summary) as one JSON line with its ``step`` to metrics.jsonl,
    the file the dry run and the tests read (trainer_state.json's log_history lacks the throughput figures), with the
    time it was written (``recipekit report`` draws restarts on the clock)."""

    def __init__(self, path: Path):
        self.path = path

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs and state.is_world_process_zero:
            metricslog.append_record(self.path, metricslog.stamped({"step": state.global_step, **logs}))


class PreemptionCallback(TrainerCallback):
    """SIGTERM (Volcano eviction or preemption) → save a checkpoint at the end of this step, then stop training.

    Every rank receives the signal (torchrun forwards it) but maybe during different steps, so the ranks agree by
    an all-reduce at each step end: all of them save the same step, and no collective is left waiting.
    """

    def __init__(self) -> None:
        self.requested = False
        self.stopped_at: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.requested = True

    def _agreed(self, args: Any) -> bool:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return self.requested
        flag = torch.tensor([int(self.requested)], device=args.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stopped_at is None and self._agreed(args):
            control.should_save = control.should_training_stop = True
            self.stopped_at = state.global_step


class HoldAtStepCallback(TrainerCallback):
    """TESTING ONLY: with ``exitcodes.HOLD_AT_STEP_ENV`` = S (set by the dry run for an attempt it kills at step S),
    every rank waits before beginning step S + 1, after step S is logged and saved, until the dry run has killed
    its pod: the kill lands at step S however slowly the dry run reads metrics.jsonl on a loaded machine.

    SIGTERM (the other pods deleted as RestartJob does) ends the wait, and so do the release file
    (``exitcodes.HOLD_RELEASE_ENV``: an elastic run's other pods go on once the lost one is killed) and ``limit_s``
    (a dry run that never kills, e.g. one killed itself), after which the run goes on as if nothing was asked.
    """

    def __init__(
        self,
        step: int,
        preemption: PreemptionCallback,
        limit_s: float = 300.0,
        release: Path | None = None,
        below_world: int | None = None,
    ):
        self.step, self.preemption, self.limit_s, self.release = step, preemption, limit_s, release
        #: hold only in a world smaller than this (the elastic drill's return: ``exitcodes.HOLD_SHRUNK_AT_STEP_ENV``)
        self.below_world = below_world
        self.held = False

    @classmethod
    def from_env(
        cls, preemption: PreemptionCallback, planned_world: int, environ: Any = None
    ) -> list[HoldAtStepCallback]:
        """The holds the dry run asked for: at the kill's (or the lost node's) step, and at the step a shrunk
        elastic run grows back at."""
        environ = os.environ if environ is None else environ
        found = []
        value, release = environ.get(exitcodes.HOLD_AT_STEP_ENV, ""), environ.get(exitcodes.HOLD_RELEASE_ENV)
        if value.isdigit():
            found.append(cls(int(value), preemption, release=Path(release) if release else None))
        shrunk = environ.get(exitcodes.HOLD_SHRUNK_AT_STEP_ENV, "")
        if shrunk.isdigit():
            found.append(cls(int(shrunk), preemption, below_world=planned_world))
        return found

    def _released(self) -> bool:
        return self.preemption.requested or (self.release is not None and self.release.exists())

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.held or state.global_step != self.step or self._released():
            return
        if self.below_world is not None and args.world_size >= self.below_world:
            return
        self.held = True
        print(f"TESTING: holding after step {self.step} until this pod is killed", file=sys.stderr, flush=True)
        until = time.monotonic() + self.limit_s
        while time.monotonic() < until and not self._released():
            time.sleep(0.05)
