"""The bundle's training entrypoint: recipe.yaml in, a trained model (or LoRA adapter) and checkpoints out.

``recipekit build`` copies the runtime package (this module and its siblings) verbatim into every bundle as
``runtime/``; the launcher starts one process per device with ``torchrun ... -m runtime.train --recipe recipe.yaml
--resume auto`` and the bundle directory on PYTHONPATH. The package imports only the standard library, yaml and
the training stack of the image (torch, transformers, datasets, tokenizers; peft, deepspeed, bitsandbytes and
torch_npu only when the recipe needs them), never recipekit: a bundle must run wherever its image runs.

The Hugging Face ``Trainer`` does the training. The runtime decides what the Trainer cannot know from the recipe:
whether the target device is really there (device.py; checked before the training stack is imported, so a broken
torch_npu is reported in one line), how the data is read, validated, tokenised, masked, packed and stored as
shards once for every run that needs it (sources.py, data.py, chat.py, samples.py, prepare.py, shards.py,
workers.py, dataprep.py), the order rows are drawn in (sampler.py), how the model is built (model.py; twin.py for
a random twin with a tokenizer trained here), which checkpoint to resume from and whether it belongs to this run
(checkpoints.py; boundary/resume/resumechoice.py), and what to do on SIGTERM (callbacks.py). session.py strings these
together; this module parses the command line, maps failures to exit codes and starts the session once the device is
known to work.

Outputs in ``training_arguments.output_dir``:
  checkpoint-N/     Trainer checkpoints (save_steps, save_total_limit), each with the run record
                    (``filenames.RUN_FILE``); one more on SIGTERM
  metrics.jsonl     one JSON object per logging step (loss, learning_rate, tokens/s, TFLOPS, MFU, HFU, ...) and the
                    structured records ``metricslog.EVENT_*`` (start, adapted, preempted, done): the file tests and dry
                    runs read; trainer_state.json's log_history lacks the throughput figures
  random-init/      the random twin's initial weights and tokenizer (``model.init: random`` only), so that resume,
                    adapters and merges all refer to one base
  the final model   full weights, or the LoRA adapter (plus merged/ when ``lora.merge_on_save``), and the run record
  runs/             TensorBoard event files (when ``report_to`` has tensorboard)
  cluster-check.json  preflight's report (every check; opskit.py, preflight.py)
  hang/             the stack dumps of every rank when the hang watchdog fired (watchdog.py)
  nonfinite-step-N/ the report and offending batches of a NaN/inf loss (guard.py)
  profile/          the profiler's traces of ``train.profile_steps`` (profiling.py)

The training data is prepared into memory-mapped shards under ``plan.prepared_dir``/<fingerprint> (dataprep.py),
shared by every run whose data, tokenizer and row settings are equal; each rank prepares its share before the
process group forms, or reuses what an earlier run (or ``recipekit data prepare``) left there.

Exit codes: ``exitcodes.EXIT_CODES`` is the one table (name, code, meaning, the Job's policy for it). Each process
also writes its code where the launcher reads it (``exitcodes.record_exit``), since torchrun exits 1 whatever its
workers' codes are and the pod must exit with the run's own code for the Job's exitCode policies to act on it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from . import matmulmode
from .boundary import exitcodes, filenames
from .boundary.common import LOG, RunError, log0, rank
from .boundary.config import load_run_config
from .ops.device import detect
from .ops.trackers import clients as trackerclients
from .volume import attemptends, recovery  # noqa: F401  (recovery first: it notes when this worker began)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train from a recipekit bundle's recipe.yaml with the HF Trainer.")
    parser.add_argument("--recipe", type=Path, default=Path(filenames.RECIPE_FILE), help="the bundle's recipe.yaml")
    parser.add_argument(
        "--resume",
        default="auto",
        help="auto: newest complete checkpoint of this run in output_dir; none: start over; or a checkpoint path",
    )
    return parser.parse_args(argv)


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO if rank() == 0 else logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s [rank {rank()}] %(name)s: %(message)s",
    )


def train(options: argparse.Namespace) -> int:
    run = load_run_config(options.recipe)
    device = detect(run.recipe.hw)
    log0(matmulmode.apply(run.recipe.hw.fp32_matmul))
    trackerclients.keep_out_unused(run.training_arguments.get("report_to"))
    # Only now the training stack: transformers probes torch_npu by itself, and a broken one must have been
    # reported by detect() in one line rather than by transformers' import in a traceback.
    from .session.session import run_training

    return run_training(run, device, options.resume)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    setup_logging()
    try:
        return train(options)
    except RunError as exc:  # one line; a subclass may carry its own exit code (preflight: EXIT_PREFLIGHT)
        print("train.py: " + " ".join(str(exc).split()), file=sys.stderr)
        return getattr(exc, "code", exitcodes.EXIT_USER_ERROR)
    except Exception as exc:  # a bug or an environment failure: keep the traceback, end with one line
        LOG.exception("training failed")
        print(f"train.py: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exitcodes.EXIT_FAILED
    # A rank that failed on its own does not destroy the process group: that is collective, and with its peers
    # blocked in a collective it would hang (NCCL/HCCL) instead of exiting. Exiting non-zero lets torchrun stop
    # the pod's other workers and Volcano restart the job.


def in_process_group() -> bool:
    """Whether this process still belongs to a torch.distributed group (never imported: it never joined one)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def exit_now(code: int) -> None:
    """End the process with ``code`` without the interpreter's finalization, once the process group is left.

    Everything the run writes is written and closed by now, and every rank has left the group at the same point.
    What finalization would still do is free the objects DeepSpeed and the Trainer keep: communicator work items
    holding tensors, whose release needs the GIL while the interpreter is being torn down. Now and then that aborts
    the process (SIGABRT, seen on a finished ZeRO-3 rank under load), and a finished run becomes a failed pod that
    Volcano restarts.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said anyway
            pass
    os._exit(code)


if __name__ == "__main__":
    code = main()
    exitcodes.record_exit(code)  # torchrun exits 1 whatever this code is: the launcher reads it from here
    attemptends.record_end(code)  # and why this attempt ended stays in the run's directory (runs history)
    if not in_process_group():
        exit_now(code)
    # A rank that failed on its own keeps its group (leaving it is collective) and exits through finalization as it
    # always has: the policy dry runs show its pod is then the first to fail, the failure the Job's exitCode policies
    # act on. Ended at once, a peer's broken collective failed first (exit 1, RestartJob instead of TerminateJob).
    sys.exit(code)
