"""The runtime's operations contract inside Megatron-Bridge's loop: the same parts the Trainer's runs use
(ops/engineops.EngineOps, ops/alerts.Health, ops/phases.PhaseWatch, ops/lossguard.LossGuard,
volume/recovery.RecoveryLog), driven
from Bridge's own callback events (callbacks.py's RoomCallback calls this module; no loop of recipekit's).

At Bridge's ``on_train_start`` (its setup has formed the process group, built the model and loaded the checkpoint):

* preflight (ops/preflight.py): devices, versions, storage and the all-reduce, every rank; a failed check raises
  PreflightFailed out of ``pretrain()`` on every rank alike, exit ``preflight`` before the first step. Bridge forms
  its process group inside ``pretrain()`` and has no event between that and its model build, so on this engine the
  checks run after the model is loaded (the Trainer's run before);
* the exporter (Prometheus), the health figures and alerts, the recovery records (``loaded``, MTTR gauges) and the
  hang watchdog, armed with the startup timeout for the first step.

At each ``on_train_step_start``: the save after the step before (Bridge has no "saved" event) as the Trainer's
``checkpoint`` record and gauges, timed from that step's end; the watchdog's stall drill
(``ops.testing.stall_at_step``). At each ``on_train_step_end``, every rank: the step's figures (the last stage's
loss broadcast to the others, the wait for batches the step function timed) for the gauges and alerts, then the
loss guard, the recovery progress and the watchdog for what follows (a save at ``checkpoint.save_interval``, an
evaluation at ``train.eval_interval``: the steady timeout; else the stall one). Each checkpoint rank 0 signed goes to
the cold tier (volume/coldtier.py), whose last copy a finished run awaits.

The loss guard: the step function hands it each micro-batch's own loss (the last pipeline stage's loss function,
before Bridge averages it over the data-parallel ranks) and the token ids of every batch a rank reads; every rank
all-reduces its flag and losses (LossGuard.agree), so a loss spike's report (``loss-spike-step-N/``, as the Trainer's)
names the rank whose loss rose and each rank's batches by fingerprint, and all ranks stop at the same step by raising
:class:`NonFiniteStop` out of the callback — before Bridge saves that step (its saves follow the event), so the
poisoned weights never become a checkpoint. The room then writes the report and exits ``nonfinite`` (train.py).
Bridge's own NaN check (``rerun_state_machine.check_for_nan_in_loss``) raises on the last stage's ranks only (exit
``failed``, RestartJob, while the other ranks wait in a collective); the room turns it off, as the guard does its
work on every rank. ``ops.nonfinite_loss: skip`` cannot leave a batch out of Bridge's data order: the run stops as
under ``stop`` and says so.
"""

from __future__ import annotations

import functools
import math
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..boundary import filenames
from ..boundary import metricnames as names
from ..boundary.common import LOG, rank
from ..ops.alerts import Alerts, Health, directory_bytes
from ..ops.device import Device
from ..ops.engineops import EngineOps
from ..ops.exporter import publish_recovery
from ..ops.phases import PhaseWatch
from ..volume import coldtier
from .checkpoints import CHECKPOINTS_DIR, iter_name, iterations

#: The metrics lines the non-finite report keeps (the Trainer's keeps its last ten logs).
RECENT = 10


class NonFiniteStop(Exception):
    """Every rank saw the guard's verdict at the same step: leave Bridge's loop before it saves that step."""


def collective_device(kind: str) -> Any:
    """Where this process's collectives run once Bridge has set its device (cpu under gloo)."""
    import torch

    if kind == "cpu":
        return torch.device("cpu")
    return torch.device(kind, getattr(torch, kind).current_device())


class BridgeOps:
    """One process's operations layer at Bridge's events (see the module docstring)."""

    def __init__(self, run: Any, device: Device, world: int, resume: tuple[int | None, str | None], records: Any):
        self.run, self.device, self.world, self.resume, self.records = run, device, world, resume, records
        doc = run.megatron
        self.save_interval = int(doc.get("checkpoint", "save_interval") or 0)
        evaluates = int(doc.get("train", "eval_iters") or 0) > 0
        self.eval_interval = int(doc.get("train", "eval_interval") or 0) if evaluates else 0
        self.core: EngineOps | None = None
        self.health: Health | None = None
        self.phases: PhaseWatch | None = None
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self._first_published = False
        self._after_save = False
        self._ended_at = 0.0  # when the last step ended (perf_counter): a save after it is timed from here
        self._saving: int | None = None  # the step Bridge saves after, until the save is accounted for
        self._spike: tuple[int, str] | None = None  # a loss spike's alert, reported once the guard has the step
        self.batch_wait_s = 0.0  # this step's wait for batches (TimedBatches)
        #: global rank 0's copies of each signed checkpoint to the cold store (train.cold_checkpoints), else None
        self.cold = coldtier.cold_copier(run.recipe.train.cold_checkpoints, run.plan.run_id, rank(), self.copied)

    # -- Bridge's on_train_start
    def train_started(self, step: int) -> None:
        """Preflight, then the exporter, health, recovery records and the watchdog (``step``: resumed from)."""
        core = EngineOps(self.run, self.run.output_dir, rank(), self.device, collective_device(self.device.kind))
        self.core = core
        core.preflight()
        exporter = core.start_exporter()
        self.health = Health(Alerts(self.run.operations.alerts), exporter, self.records, self.device.kind)
        self.health.on_loss_spike = self.spiked
        core.recovery.started(self.resume[0], self.resume[1], self.world)
        core.recovery.loaded(step)
        publish_recovery(core.recovery, exporter)
        self.phases = PhaseWatch(core.watchdog(), self.run.operations.watchdog, core.faults)
        self.phases.begin(step, rank() == 0)

    # -- on_train_step_start / on_train_step_end
    def step_begins(self, step: int) -> None:
        """Step ``step`` begins: after a save (or an evaluation), the stall timeout again; the stall drill."""
        if self.phases is None:
            return
        if self._after_save:  # Bridge has no "saved" event: the next step's start is the first moment after it
            self._after_save = False
            self.phases.next_step(step - 1)
        self.phases.step_begins(step)
        self.batch_wait_s = 0.0

    def shared_loss(self, loss: float | None) -> float | None:
        """The step's loss on every rank: Bridge reports it on the last pipeline stage alone (the last rank is on
        it), and every pod's endpoint serves the loss and its jump ratio, as every rank of the Trainer's does. One
        broadcast of one number a step; None where it is not known (no process group, or no loss)."""
        import torch

        if self.core is None or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return loss
        value = torch.tensor([math.nan if loss is None else loss], dtype=torch.float32, device=self.core.torch_device)
        torch.distributed.broadcast(value, src=torch.distributed.get_world_size() - 1)
        shared = float(value.item())
        return None if math.isnan(shared) else shared

    def logged(self, step: int, record: dict[str, Any], step_time: float) -> None:
        """The step's figures on every rank, before the last rank writes them: step time, alerts, gauges."""
        record["step_time_s"] = round(step_time, 4)
        record["dataloader_wait_fraction"] = round(self.wait_fraction(step_time), 4)
        if self.health is not None:
            self.health.logged(step, record)
        self.recent.append(dict(record))

    def spiked(self, step: int, message: str) -> None:
        """The loss-spike alert fired at ``step`` (every rank, from :meth:`logged`): its report follows the guard's
        agreement on the step (:meth:`guard`), which gives every rank each rank's loss."""
        self._spike = (step, message)

    def step_ended(self, step: int, step_time: float) -> None:
        """Every rank, after the step's metrics line: the loss guard (may raise NonFiniteStop), the recovery
        progress, the gauges and the watchdog for what comes next."""
        assert self.core is not None and self.phases is not None and self.health is not None
        self.guard(step)
        self.core.recovery.step(step)
        if not self._first_published:  # the first step after a restart completes the recovery: its MTTR is known
            self._first_published = True
            publish_recovery(self.core.recovery, self.core.exporter)
        self.health.stepped(step, step_time)
        self.core.exporter.set(names.DATALOADER_WAIT, self.wait_fraction(step_time))
        self._after_save = self.save_follows(step)
        self._saving = step if self.save_interval > 0 and step % self.save_interval == 0 else None
        self.phases.step_ended(step, self._after_save)
        self._ended_at = time.perf_counter()

    def save_ended(self) -> None:
        """Bridge's save after the last step is over (Bridge has no "saved" event: called at the next step's start
        once rank 0 signed it, or at the loop's end): the seconds training stood still and the gauges (every rank),
        and from the records' writer (rank 0) its size and the checkpoint record, written once its own gauges are
        set (the dry run reads the endpoints when the record appears)."""
        if self._saving is None or self.health is None:
            return
        step, self._saving = self._saving, None
        seconds = time.perf_counter() - self._ended_at
        writer = bool(self.records.writer)
        path = Path(self.run.output_dir) / CHECKPOINTS_DIR / iter_name(step)
        self.health.saved(step, seconds, directory_bytes(path) if writer else None, writer)

    def signed(self, step: int) -> None:
        """Rank 0 signed the checkpoint of ``step``: it is final on the shared volume, and goes to the cold tier."""
        if self.cold is not None:
            self.cold.submit(Path(self.run.output_dir) / CHECKPOINTS_DIR / iter_name(step), step)

    def copied(self, copy: coldtier.ColdCopy) -> None:
        """The cold tier's copy of a checkpoint ended (called in the copier's thread): its record, or its alert."""
        if self.health is not None:
            self.health.checkpoint_cold(copy.step, copy.seconds, copy.code, copy.error)

    def wait_fraction(self, step_time: float) -> float:
        """The share of the step's ``step_time`` this rank waited for batches (0 on a stage that reads none)."""
        return min(1.0, self.batch_wait_s / step_time) if step_time > 0 else 0.0

    def save_follows(self, step: int) -> bool:
        """Whether Bridge saves or evaluates after ``step`` (train.py's checkpoint_and_decide_exit, eval_interval)."""
        saves = self.save_interval > 0 and step % self.save_interval == 0
        return saves or (self.eval_interval > 0 and step % self.eval_interval == 0)

    def guard(self, step: int) -> None:
        """Agree on a non-finite loss of ``step`` (every rank, one all-reduce of what the step function observed:
        each micro-batch's loss on the last pipeline stage, the batches on every stage that reads them); write a
        loss spike's report; stop or warn per the recipe."""
        assert self.core is not None and self.health is not None
        guard, mode = self.core.guard, self.run.operations.alerts.nonfinite_loss
        ranks = guard.agree(self.core.torch_device, step)
        if self._spike is not None:
            self.core.loss_spike(*self._spike, self.records)
            self._spike = None
        if ranks and mode in ("stop", "skip"):
            guard.stopped_at, guard.ranks = step, ranks
            guard.keep_offending()
            guard.reset()
            raise NonFiniteStop(step)
        if ranks:
            self.health.raise_alert(
                "nonfinite_loss",
                step,
                f"loss is not finite at step {step} (ranks {', '.join(map(str, ranks))}); training goes on "
                "(ops.nonfinite_loss: warn)",
            )
        guard.reset()

    # -- the end of the loop
    def export_begins(self, step: int) -> None:
        """The HF export (a collective of every rank) runs after the last step: watched with the steady timeout."""
        if self.phases is not None:
            self.phases.watchdog.arm("the HF export", float(self.run.operations.watchdog.steady_timeout_s), step)

    def done(self, step: int) -> None:
        """The run finished (``pretrain()`` returned): the watchdog stops, recovery.jsonl gets its ``done``, and the
        last checkpoint's cold copy is awaited (within its timeout) before the pod ends."""
        if self.phases is not None:
            self.phases.end()
        if self.core is not None:
            self.core.recovery.done(step)
        if self.cold is not None:
            self.cold.close()

    def stopped(self, records: Any) -> int:
        """The loss guard stopped the run: the report, the record, the exit code (``nonfinite``)."""
        assert self.core is not None
        if self.run.operations.alerts.nonfinite_loss == "skip":
            LOG.warning("ops.nonfinite_loss: skip: Megatron-Bridge's data order cannot leave a batch out; stopped")
        return self.core.nonfinite_stop(records, last_signed(self.run.output_dir), list(self.recent))

    def close(self) -> None:
        if self.phases is not None:
            self.phases.end()
        if self.core is not None:
            self.core.close()


def last_signed(output_dir: Path) -> Path | None:
    """The newest checkpoint this run signed (what a restart resumes from), else None."""
    for _, path in iterations(Path(output_dir) / CHECKPOINTS_DIR):
        if not path.is_symlink() and (path / filenames.RUN_FILE).is_file():
            return path
    return None


class TimedBatches:
    """The step function's data iterator with its waits summed into ``ops.batch_wait_s``: the share of a step spent
    waiting for batches, which the Trainer measures in its own loop (guard.py) and Bridge's loop does not report."""

    def __init__(self, batches: Any, ops: BridgeOps):
        self.batches, self.ops = batches, ops
        self.last: Any = None  # the micro-batch read last (its token ids go to the loss guard)

    def __iter__(self) -> TimedBatches:
        return self

    def __next__(self) -> Any:
        started = time.perf_counter()
        try:
            self.last = next(self.batches)
            return self.last
        finally:
            self.ops.batch_wait_s += time.perf_counter() - started

    def __getattr__(self, name: str) -> Any:  # what else Bridge asks of its iterator
        if name == "batches":  # not set yet (a copy made without __init__): no recursion
            raise AttributeError(name)
        return getattr(self.batches, name)


def step_function(forward_step: Any, ops: BridgeOps | None) -> Any:
    """Bridge's forward step as the room runs it, in training (an evaluation's passes go through untouched): its
    batches timed (:class:`TimedBatches`) and handed to the loss guard by their token ids, its loss function's result
    observed by the guard (:func:`observed_loss`: each micro-batch's own loss, before Bridge averages it over the
    data-parallel ranks, so a spike names the rank whose batch rose). TESTING ONLY (``ops.testing``): the output NaN
    at ``nan_at_step``, so the loss, the gradients and the update are poisoned as a real divergence poisons them;
    ``spike_rank``'s loss (and so its gradients) ten times at ``spike_at_step``."""
    if ops is None:
        return forward_step

    @functools.wraps(forward_step)  # Bridge reads the step function's signature (forward_step_func_types)
    def step(state: Any, data_iterator: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        batches = TimedBatches(data_iterator, ops) if data_iterator is not None else None
        output, loss_func = forward_step(state, batches, model, *args, **kwargs)
        core = ops.core
        if core is None or not getattr(model, "training", True):
            return output, loss_func
        if batches is not None and batches.last is not None:
            core.guard.observe_batch(_token_ids(batches.last))
        next_step = int(state.train_state.step) + 1
        if core.faults.poison_loss(next_step):
            output = output * float("nan")
        return output, observed_loss(loss_func, core.guard, core.faults.spike(next_step))

    return step


def _token_ids(batch: Any) -> Any:
    """A Megatron micro-batch's token ids (its ``tokens``; the labels where a stage was handed those alone)."""
    if not isinstance(batch, dict):
        return None
    return batch.get("tokens") if batch.get("tokens") is not None else batch.get("labels")


def observed_loss(loss_func: Any, guard: Any, factor: float = 1.0) -> Any:
    """``loss_func`` (Bridge's, called on the last pipeline stage with the step's output) with its result seen by
    the loss guard: the micro-batch's summed loss and its label tokens (Megatron's ``(loss, num_tokens, report)``),
    copied before Megatron's schedule divides the loss in place. ``factor``: the spike drill's, on the loss and
    its report alike (the logged loss shows the spike, the gradients carry it)."""
    import torch

    if loss_func is None:  # a step function without one: Megatron keeps the output as it is
        return None

    @functools.wraps(loss_func)
    def observed(*args: Any, **kwargs: Any) -> Any:
        result = loss_func(*args, **kwargs)
        if kwargs.get("non_loss_data") or not isinstance(result, tuple) or not isinstance(result[0], torch.Tensor):
            return result
        loss, *rest = result
        if factor != 1.0:
            loss = loss * factor
            rest[-1] = _scaled_report(rest[-1], factor)
        tokens = rest[0] if len(rest) == 2 and isinstance(rest[0], torch.Tensor) else None
        guard.observe(loss.detach().clone(), None, tokens)
        return (loss, *rest)

    return observed


def _scaled_report(report: Any, factor: float) -> Any:
    """A loss function's report (``{"lm loss": [summed loss, tokens]}``) with its losses times ``factor``."""
    if not isinstance(report, dict):
        return report
    scaled = {}
    for name, value in report.items():
        if hasattr(value, "clone") and value.numel() == 2:
            value = value.clone()
            value[0] = value[0] * factor
        scaled[name] = value
    return scaled
