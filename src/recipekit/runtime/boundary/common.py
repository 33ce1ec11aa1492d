"""What every runtime module shares: the one-line error, rank-0 logging, package versions. Standard library only.

Every rank of a run makes the same decisions from the same recipe.yaml, so one report of them (rank 0's) is enough;
the others log warnings and errors only (see train.setup_logging).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any

#: The logger of every runtime module: one name, so a log line reads ``train: ...`` whichever module wrote it.
LOG = logging.getLogger("train")


class RunError(Exception):
    """A problem the user can fix; train.main prints it as one line and exits 2, without a traceback."""


def rank() -> int:
    """This process's global rank, as torchrun sets it (0 when started alone)."""
    return int(os.environ.get("RANK", "0"))


def volcano_pod_index(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's pod, as a person finds it: its index in the Volcano task (``VC_TASK_INDEX``: the pod's name
    ends with it, and it stays the pod's when an elastic run's agents regroup and number their nodes anew), else
    torchrun's node rank (``GROUP_RANK``: a bundle started by hand), else None. Not the pods' numbering within a
    worker group, which preflight's markers need (ops/preflight/nodefacts.pod_index: the node rank first)."""
    env = os.environ if environ is None else environ
    for name in ("VC_TASK_INDEX", "GROUP_RANK"):
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def log0(message: str, *args: Any, level: int = logging.INFO) -> None:
    """Log on global rank 0 only."""
    if rank() == 0:
        LOG.log(level, message, *args)


def version(package: str) -> str:
    """The installed version of ``package`` (for error messages), or ``?``."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    with contextlib.suppress(PackageNotFoundError):
        return installed(package)
    return "?"


def precision(args: Any) -> str:
    """The precision a ``TrainingArguments`` trains in, in the recipe's words: bf16, fp16 or fp32."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
