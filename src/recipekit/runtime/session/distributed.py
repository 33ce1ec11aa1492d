"""The process group: a start without torchrun made to work, DeepSpeed told about the group, and a joint exit.

torch.distributed itself is set up by the Trainer (TrainingArguments joins the group torchrun describes); this module
handles what the Trainer leaves to its caller.
"""

from __future__ import annotations

import os
import socket

import torch


def launched() -> bool:
    """Whether a launcher (torchrun) started this process: it sets LOCAL_RANK for every worker."""
    return "LOCAL_RANK" in os.environ


def prepare_environment(deepspeed: bool, ds_accelerator: str, notes: list[str]) -> None:
    """Environment DeepSpeed needs, appending one note per change to what the launcher provided.

    DeepSpeed picks its accelerator from DS_ACCELERATOR (launch.json sets the bundle's); a value naming another
    accelerator is replaced. DeepSpeed always needs a process group, so a run started without torchrun
    (``python -m runtime.train``) gets a single-process rendezvous on a free local port.
    """
    if not deepspeed:
        return
    current = os.environ.get("DS_ACCELERATOR")
    if current not in (None, ds_accelerator):
        notes.append(f"DS_ACCELERATOR={current} but this bundle targets {ds_accelerator}: using {ds_accelerator}")
    os.environ["DS_ACCELERATOR"] = ds_accelerator
    if launched():
        return
    notes.append("not started by torchrun: running DeepSpeed as a single process")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def join_deepspeed_group(backend: str) -> None:
    """Register the process group with DeepSpeed's comm layer before any model is built.

    On CPU, Accelerate starts torch.distributed itself, behind DeepSpeed's back; ZeRO-3 then partitions the model
    in ``from_pretrained`` (deepspeed.zero.Init) while DeepSpeed still believes it runs alone, and its batch check
    fails with "world_size 1". ``init_distributed`` adopts the existing group.
    """
    import deepspeed

    if not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=backend)


def leave_process_group() -> None:
    """Every rank waits for the others, then all tear the process group down together (after the final save, or
    after the checkpoint a SIGTERM asked for: paths every rank takes at the same step).

    Rank 0 saves last and the others finish first, or the reverse; a rank that destroys its gloo/HCCL/NCCL group and
    exits while another still has a collective or its teardown in flight makes that rank's transport lose its peer
    mid-operation, and the process aborts ("terminate called without an active exception", SIGABRT): a finished run
    reported as a failed pod, which Volcano restarts. Nothing after this point talks to other ranks (the LoRA merge
    is local to rank 0), so no barrier can time out on it.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
