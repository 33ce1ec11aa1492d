"""One training session, start to end: arguments, resume choice, data, model, Trainer, records, final save.

train.py imports this module only after it has found the target device (see device.py), because importing it
imports the training stack: transformers, datasets, tokenizers, peft when LoRA is used.

Every rank runs the same code and reaches the same decisions; rank 0 alone writes the structured records of
metrics.jsonl (``metricslog.EVENT_*``) and logs the human-readable lines next to them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..boundary import exitcodes, filenames, metricslog, recipeview
from ..boundary.common import RunError, log0, precision, rank
from ..boundary.config import RunConfig
from ..boundary.recipeview import RecipeView
from ..boundary.resume import resumechoice
from ..data.sampler import PreparedTrainer
from ..data.samples import SequenceCollator
from ..data.stream import ResumeRandomState, StreamDataset, StreamStateCallback
from ..model.loader import load_model, parameter_counts, save_merged
from ..ops.device import Device
from ..ops.guard import OpsTrainer
from ..ops.opskit import OpsLayer
from ..ops.preflight import make_output_dir
from ..ops.trackers import guarded as trackers
from ..volume import coldtier, hottier, restart
from ..volume.recovery import skipped_batches
from ..volume.reshard import ds_config_for_universal, reshard_refusal
from ..volume.rowledger import RowIndexed, RowLedger
from .arguments import make_training_arguments, trainer_kwargs
from .callbacks import (
    HoldAtStepCallback,
    MetricsFileCallback,
    PeakMemoryCallback,
    PreemptionCallback,
    ThroughputCallback,
)
from .checkpoints import HotTierSaves, RunRecordCallback, choose_resume, resharded, run_key
from .distributed import join_deepspeed_group, launched, leave_process_group, prepare_environment
from .evaluation import evaluate_after_training
from .rundata import prepare_for_run, world


class Records:
    """metrics.jsonl's structured records, appended by rank 0 only."""

    def __init__(self, output_dir: Path, writer: bool):
        self.path, self.writer = output_dir / filenames.METRICS_FILE, writer

    def add(self, kind: str, **fields: Any) -> None:
        if self.writer:
            metricslog.append_record(self.path, metricslog.stamped(metricslog.event(kind, **fields)))


def training_arguments(run: RunConfig, device: Device, universal: bool = False) -> tuple[Any, list[str]]:
    """The plan's Trainer arguments for how this process was launched, and the notes on what that changed
    (``universal``: this start resumes a re-sharded checkpoint, reshard.py). Creating them joins the process
    group."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    kwargs, notes = trainer_kwargs(
        run.training_arguments,
        device_kind=device.kind,
        bundle_dir=run.bundle_dir,
        world_size=world_size,
        planned_world_size=run.plan.world_size,
        launched=launched(),
        tensor_parallel=tensor_parallel(run),
        elastic_steps=recipeview.elastic_accumulation(run.plan, world_size),
    )
    if universal and isinstance(kwargs.get("deepspeed"), dict):
        kwargs["deepspeed"] = ds_config_for_universal(kwargs["deepspeed"])
        notes.append("resuming a checkpoint re-sharded for this world size: checkpoint.load_universal for this start")
    if hot_tier(run) is not None:  # the drain keeps each tier's count (volume/hottier.py), the Trainer none
        kwargs["save_total_limit"] = None
    if "report_to" in kwargs:  # a tracker whose client is missing: not reported to, said so
        kwargs["report_to"], missing = trackers.importable(kwargs["report_to"])
        notes += missing
    prepare_environment(run.uses_deepspeed, run.recipe.hw.ds_accelerator, notes)
    args = make_training_arguments(kwargs)
    if run.uses_deepspeed and args.world_size > 1:
        join_deepspeed_group(args.ddp_backend or run.plan.comm_backend)
    return args, notes


def world_layout(run: RunConfig, zero_stage: int) -> resumechoice.WorldLayout:
    """This process's world, ZeRO stage and global batch (micro × accumulation × data-parallel size), known before
    the process group forms: what a checkpoint's run record is compared with."""
    size, arguments = world(), run.training_arguments
    micro, accumulation = arguments.get("per_device_train_batch_size"), arguments.get("gradient_accumulation_steps")
    accumulation = recipeview.elastic_accumulation(run.plan, size) or accumulation  # an elastic run's size keeps it
    batch = None
    if isinstance(micro, int) and isinstance(accumulation, int):
        batch = micro * accumulation * recipeview.data_parallel_size(size, tensor_parallel(run))
    return resumechoice.WorldLayout(size, zero_stage, batch, streaming=run.recipe.data.streaming)


def tensor_parallel(run: RunConfig) -> int:
    """The plan's TP degree (DeepSpeed AutoTP, set up from ds_config)."""
    return run.plan.tensor_parallel


def hot_tier(run: RunConfig) -> hottier.HotTier | None:
    """The checkpoints' node-local hot tier recipe.yaml asks for (None: straight to the shared volume)."""
    return hottier.hot_tier(run.recipe.train.hot_checkpoints, run.plan.job_name)


class SessionTrainer(HotTierSaves, OpsTrainer, PreparedTrainer):
    """The Trainer with recipekit's changes: rows drawn in the resumable order (sampler.py), each step's loss
    guarded, batch wait timed and faults injected for drills (guard.py), and checkpoints saved into the hot tier
    when there is one (checkpoints.py)."""

    def _run_epoch(self, *args: Any, **kwargs: Any) -> None:
        """No epoch once ``max_steps`` are done. transformers' loop checks the step count only after a step, so a run
        resumed from the checkpoint of its last step (a SIGTERM at that step saved it, and the pod was stopped before
        the final save) would train one step more than the recipe asks, on a batch past the plan's rows. The
        checkpoint is loaded all the same (``train`` does that before any epoch), so the final save is its weights."""
        if self.state.global_step >= self.state.max_steps > 0:
            self.control.should_training_stop = True
            return
        super()._run_epoch(*args, **kwargs)


def make_trainer(
    run: RunConfig,
    args: Any,
    model: Any,
    tokenizer: Any,
    train_set: Any,
    eval_set: Any,
    device_kind: str,
) -> tuple[SessionTrainer, PreemptionCallback]:
    """The Trainer (drawing rows in the resumable order, sampler.py) with recipekit's callbacks: throughput and
    measured memory first (reporters run in list order and must see their figures), then metrics.jsonl and SIGTERM
    handling. The run
    record's callback is added last of all (run_training), so that it signs every file the others wrote."""
    preemption = PreemptionCallback()
    trainer = SessionTrainer(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        data_collator=SequenceCollator(tokenizer.pad_token_id),
        processing_class=tokenizer,
        callbacks=[
            MetricsFileCallback(Path(args.output_dir) / filenames.METRICS_FILE),
            preemption,
        ],
    )
    throughput = ThroughputCallback.from_plan(run.plan.flops, args.world_size, tensor_parallel(run))
    trainer.callback_handler.callbacks.insert(0, throughput)
    trainer.callback_handler.callbacks.insert(1, PeakMemoryCallback(device_kind))
    if isinstance(train_set, StreamDataset):  # each checkpoint keeps the stream's chunk counts, for an exact resume
        trainer.add_callback(StreamStateCallback(train_set))
    for hold in HoldAtStepCallback.from_env(preemption, run.plan.world_size):  # testing only: the dry run's drills
        trainer.add_callback(hold)
    return trainer, preemption


def summary_lines(
    run: RunConfig,
    args: Any,
    device: Device,
    model_path: str,
    counts: tuple[int, int],
    train: Any,
    evaluation: Any,
    resume_from: str | None,
) -> list[str]:
    """The startup block rank 0 logs: what runs where, and how big it is."""
    recipe, trainable, total = run.recipe, *counts
    data = recipe.data
    zero = run.zero_stage
    tp = tensor_parallel(run)
    dp = recipeview.data_parallel_size(args.world_size, tp)
    batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * dp
    if data.format == "text":
        rows, packing = "blocks", "documents concatenated into blocks"
    else:
        rows = "packed rows" if data.packing else "samples"
        packing = "on, no attention across samples" if data.packing else "off"
    if isinstance(train, StreamDataset):
        sizes = f"streamed from {len(train.chunks):,} chunks, {rows} made while training, no eval"
    else:
        sizes = f"{len(train):,} train {rows}, {len(evaluation) if evaluation is not None else 0:,} eval"
    return [
        f"recipe {recipe.name} (run {run.plan.run_id}): {recipe.mode.kind} of {recipe.model.name} "
        f"({recipe.model.init} init) from {model_path}",
        (
            f"world size {args.world_size}{f' = TP {tp} × DP {dp}' if tp > 1 else ''} | device {device.kind} | "
            f"backend {args.ddp_backend or run.plan.comm_backend}"
            f" | precision {precision(args)} | ZeRO {zero} | optimizer {getattr(args.optim, 'value', args.optim)}"
        ),
        (
            f"global batch {batch} = micro {args.per_device_train_batch_size} × accumulation "
            f"{args.gradient_accumulation_steps} × data-parallel {dp}"
        ),
        f"parameters: {trainable:,} trainable of {total:,} ({100 * trainable / max(total, 1):.2f}%)",
        f"data: {sizes} ({data.format}, max_len {data.max_len}, packing {packing})",
        f"output {args.output_dir} | resume from {resume_from or 'scratch'}",
    ]


def save_results(
    trainer: Any, recipe: RecipeView, args: Any, model_path: str, tokenizer: Any, identity: dict[str, Any]
) -> Path | None:
    """The final model (full weights, gathered under ZeRO-3, or the LoRA adapter) with its tokenizer, state and run
    record; for ``lora.merge_on_save`` also the merged model, written by rank 0 alone once the others have left.
    Returns where the merged model went (rank 0), else None."""
    output_dir = Path(args.output_dir)
    trainer.save_model(str(output_dir))
    trainer.save_state()
    if args.process_index == 0:
        resumechoice.write_run_record(output_dir, {**identity, "step": trainer.state.global_step})
    lora = recipe.mode.lora
    merge_here = lora is not None and lora.merge_on_save and args.process_index == 0
    leave_process_group()
    if not merge_here:
        return None
    merged = save_merged(model_path, output_dir, recipe, precision(args), tokenizer)
    log0("merged model written to %s", merged)
    return merged


def run_training(run: RunConfig, device: Device, resume: str) -> int:
    """Train as recipe.yaml says, on ``device``, continuing from ``resume`` (auto | none | a checkpoint path)."""
    recipe, plan = run.recipe, run.plan
    output_dir = Path(run.training_arguments["output_dir"])
    make_output_dir(output_dir)
    records = Records(output_dir, rank() == 0)
    zero = run.zero_stage
    key = run_key()
    request = restart_request(output_dir, plan.run_id, key)  # every rank, the same answer, before the group forms
    if request is not None:
        resume = resume_argument(output_dir, request)
        log0("restart %s asked for (%s): --resume %s for this start", request.id, request.label, resume)
    layout, choice, load_from = resume_point(run, output_dir, resume)
    resume_from = str(choice.path) if choice.path is not None else None
    # The data before the process group: preparing a corpus takes as long as it takes, and no collective (with its
    # ddp_timeout) may be waiting meanwhile. Every rank prepares its share, or all reuse what is there (dataprep.py).
    data = prepare_for_run(run, output_dir, records.add, resume=choice)
    model_path, tokenizer, train_set, eval_set = data.model_path, data.tokenizer, data.train, data.eval
    if run.operations.testing.record_rows and not isinstance(train_set, StreamDataset):
        train_set = RowIndexed(train_set)  # testing only: the row ledger (rowledger.py)

    args, notes = training_arguments(run, device, universal=choice.reshard)  # joins the process group
    for note in notes:
        log0("adapted: %s", note)
        records.add(metricslog.EVENT_ADAPTED, note=note)
    ops = OpsLayer(run, args, device)
    if request is not None and key is not None and args.process_index == 0:  # every rank has chosen by now
        _apply_restart(output_dir, plan.run_id, key, request, ops)
    ops.preflight()  # every pod checks devices, versions, storage and the collective before the model is loaded
    model = load_model(model_path, run, args, device.kind)
    _warn_remote_packing(recipe)
    trainable, total = parameter_counts(model)
    identity = resumechoice.run_record(
        plan.run_id,
        world_size=args.world_size,
        zero_stage=zero,
        global_batch_size=layout.global_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        recipe=recipe.name,
    )
    trainer, preemption = make_trainer(run, args, model, tokenizer, train_set, eval_set, device.kind)
    ops.install(trainer, records)
    trainer.skipped_batches = skipped_batches(output_dir)  # ops.nonfinite_loss: skip (recovery.jsonl)
    if isinstance(train_set, RowIndexed):
        trainer.ledger = RowLedger(output_dir, args.process_index, args.world_size, tensor_parallel(run))
    if isinstance(train_set, StreamDataset) and resume_from:  # the stream skips itself; the random state is ours
        trainer.add_callback(ResumeRandomState(trainer, resume_from))
    saves = install_checkpoints(trainer, run, output_dir, (identity, key), ops, restarted=request is not None)
    for line in summary_lines(run, args, device, model_path, (trainable, total), train_set, eval_set, resume_from):
        log0(line)
    records.add(metricslog.EVENT_START, **start_fields(run, args, device, layout, choice, (trainable, total)))
    # recovery.jsonl: where the previous attempt stopped, if it did
    ops.recovery.started(choice.step, resume_from, args.world_size, request.id if request else None)

    preemption.install()
    try:
        trainer.train(resume_from_checkpoint=load_from)
    finally:
        saves.drained()  # the last checkpoint reaches the shared volume before anything ends
        ops.close()
    code = ops.stopped(trainer, records)
    if code is not None:  # the loss guard stopped every rank at the same step
        leave_process_group()
        return code
    if preemption.stopped_at is not None:  # every rank stopped at this step (the flag is all-reduced)
        return preempted(preemption.stopped_at, records)
    merged = save_results(trainer, recipe, args, model_path, tokenizer, identity)
    step = trainer.state.global_step
    ops.recovery.done(step)
    records.add(metricslog.EVENT_DONE, step=step, output=str(output_dir), merged=str(merged) if merged else None)
    log0("done: %d steps; model in %s", step, output_dir)
    if args.process_index == 0:  # eval.enabled: the benchmark on what was saved (the other ranks have left)
        evaluate_after_training(recipe, output_dir, model_path, merged, precision(args), device.kind)
    saves.copied()  # a finished run's last checkpoint is in the cold store before the pod ends (within its timeout)
    return exitcodes.EXIT_OK


def _warn_remote_packing(recipe: Any) -> None:
    """Packing keeps samples apart by position_ids: a remote model's own code may not mask by them."""
    if recipe.data.packing and recipe.model.trust_remote_code:
        log0(
            "packing with remote model code: samples stay apart only if that code masks by position_ids as "
            "transformers' own models do",
            level=logging.WARNING,
        )


def _apply_restart(output_dir: Path, run_id: str, key: bytes, request: Any, ops: OpsLayer) -> None:
    """Rank 0: the restart asked for sets the superseded checkpoints aside, recorded in recovery.jsonl."""
    superseded = restart.apply(output_dir, run_id, key, request)
    ops.recovery.restarted(request.id, request.start_from, superseded)
    log0("restart %s applied; set aside: %s", request.id, ", ".join(superseded) or "nothing")


def install_checkpoints(
    trainer: SessionTrainer,
    run: RunConfig,
    output_dir: Path,
    signing: tuple[dict[str, Any], bytes | None],
    ops: OpsLayer,
    restarted: bool,
) -> CheckpointTiers:
    """Where checkpoints go (the hot tier, when there is one) and the callbacks that sign (``signing``: the run
    record and the run key) and time them, added last: the run record's signs what every other callback wrote, and
    the timer counts it. ``restarted``: a restart was asked for, so this pod's hot checkpoints are forgotten.
    Returns the hot tier's drain and the cold tier's copier, the background work the end of training waits for."""
    identity, key = signing
    if restarted:
        forget_hot_tier(run)  # its checkpoints belong to the trajectory the restart leaves
    tier = hot_tier(run)
    cold = coldtier.cold_copier(run.recipe.train.cold_checkpoints, run.plan.run_id, rank(), ops.checkpoint_cold)
    drainer = make_drainer(tier, output_dir, identity, key, run, ops, cold)
    trainer.hot_dir = str(tier.directory) if tier is not None else None
    trainer.add_callback(RunRecordCallback(identity, key, drainer, cold))
    ops.time_saves(trainer, trainer.checkpoint_dir(), drained_later=drainer is not None)
    return CheckpointTiers(drainer, cold)


@dataclass(frozen=True)
class CheckpointTiers:
    """The checkpoints' background work: the hot tier's drain and the cold tier's copies (each None when off)."""

    drainer: hottier.Drainer | None
    cold: coldtier.ColdCopier | None

    def drained(self) -> None:
        """Wait for the last drain (every run's end: a restart resumes what is on the shared volume)."""
        if self.drainer is not None:
            self.drainer.wait()

    def copied(self) -> None:
        """Wait for the last cold copy (a finished run's end only: a failed or preempted pod ends at once, and its
        copy, a daemon thread's, ends with it)."""
        if self.cold is not None:
            self.cold.close()


def forget_hot_tier(run: RunConfig) -> None:
    """Remove this pod's hot checkpoints (its local rank 0): a restart asked for (``recipekit restart``) leaves their
    trajectory, and a later automatic resume must not find them newer than the shared volume's."""
    tier = hot_tier(run)
    if tier is not None and hottier.PodPlace.from_env().drains and tier.directory.is_dir():
        removed = hottier.retain(tier.directory, 0)
        log0("restart: removed from the hot tier: %s", ", ".join(removed) or "nothing")


def make_drainer(
    tier: hottier.HotTier | None,
    output_dir: Path,
    identity: dict[str, Any],
    key: bytes | None,
    run: RunConfig,
    ops: OpsLayer,
    cold: coldtier.ColdCopier | None = None,
) -> hottier.Drainer | None:
    """The background drain of this pod's hot tier to the shared volume (None without a hot tier); each drained
    checkpoint then goes to ``cold``, the cold tier's copier (global rank 0's)."""
    if tier is None:
        return None
    tier.directory.mkdir(parents=True, exist_ok=True)
    keep = run.training_arguments.get("save_total_limit")  # the shared volume's count (train.save_total_limit)
    keep = keep if isinstance(keep, int) and keep > 0 else 3
    log0(
        "checkpoints: saved to the hot tier %s (keeps %d), drained to %s (keeps %d)",
        tier.directory,
        tier.keep,
        output_dir,
        keep,
    )
    place = hottier.PodPlace.from_env()

    def drained(checkpoint: hottier.Drained) -> None:
        ops.checkpoint_drained(checkpoint)
        if cold is not None:
            cold.submit(coldtier.checkpoint_path(output_dir, checkpoint.step), checkpoint.step)

    return hottier.Drainer(tier, output_dir, place, identity, key, keep, done=drained)


def restart_request(output_dir: Path, run_id: str, key: bytes | None) -> restart.RestartRequest | None:
    """The restart the pod was started with (``recipekit restart``), unless this run applied it already."""
    try:
        return restart.pending(output_dir, run_id, key)
    except restart.RestartRefused as exc:
        raise RunError(str(exc)) from None


def resume_argument(output_dir: Path, request: restart.RestartRequest) -> str:
    try:
        return restart.resume_argument(output_dir, request)
    except restart.RestartRefused as exc:
        raise RunError(str(exc)) from None


def resume_point(
    run: RunConfig, output_dir: Path, resume: str
) -> tuple[resumechoice.WorldLayout, resumechoice.ResumeChoice, str | None]:
    """This process's layout, the checkpoint the run continues from, and what the Trainer loads: that checkpoint, or
    its copy re-sharded for this world.

    Called before any data or model is loaded: a checkpoint of another run, or one this run cannot prove it wrote (its
    signed record, checkpoints.py), is refused in seconds and before any of its bytes is parsed.
    """
    layout = world_layout(run, run.zero_stage)
    choice = choose_resume(output_dir, resume, run.plan.run_id, layout, hot_tier(run))
    load_from = str(choice.path) if choice.path is not None else None
    resized = choice.saved_world_size not in (None, layout.world_size)
    if resized and tensor_parallel(run) > 1:
        name, saved = choice.path.name if choice.path else "the checkpoint", choice.saved_world_size
        raise RunError(
            f"{name} was saved at world size {saved}, this run has {layout.world_size}: "
            f"{resumechoice.TP_RESIZE_REFUSAL}; run it at world size {saved}, or {resumechoice.FRESH_REMEDY}"
        )
    if choice.reshard:
        parallel = run.recipe.parallel
        refusal = reshard_refusal(
            run.zero_stage,
            offload_optimizer=parallel.offload_optimizer,
            offload_param=parallel.offload_param,
            tensor_parallel=tensor_parallel(run),
        )
        load_from = str(resharded(choice, output_dir, layout.world_size, rank(), refusal))
    return layout, choice, load_from


def start_fields(
    run: RunConfig,
    args: Any,
    device: Device,
    layout: resumechoice.WorldLayout,
    choice: resumechoice.ResumeChoice,
    parameters: tuple[int, int],
) -> dict[str, Any]:
    """The ``start`` record's fields (metricslog.EVENT_START), in the order metrics.jsonl has always listed them."""
    trainable, total = parameters
    return {
        "run_id": run.plan.run_id,
        "world_size": args.world_size,
        "tensor_parallel": tensor_parallel(run),
        "device": device.kind,
        "precision": precision(args),
        "zero_stage": run.zero_stage,
        "parameters_total": total,
        "parameters_trainable": trainable,
        "resume_from": str(choice.path) if choice.path is not None else None,
        "resume_step": choice.step,
        "global_batch_size": layout.global_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "saved_world_size": choice.saved_world_size,
        "skipped": [{"checkpoint": name, "reason": reason} for name, reason in choice.skipped],
    }


def preempted(step: int, records: Records) -> int:
    """A SIGTERM stopped every rank at ``step`` after its checkpoint: say so, leave the group, exit for a restart."""
    log0(
        "SIGTERM: saved checkpoint-%d; exiting %d so the job restarts and resumes from it",
        step,
        exitcodes.EXIT_PREEMPTED,
    )
    records.add(metricslog.EVENT_PREEMPTED, step=step)
    leave_process_group()
    return exitcodes.EXIT_PREEMPTED
