"""The experiment trackers' client modules, and keeping those a run does not report to out of its processes.

DeepSpeed imports ``mlflow`` whenever it is installed (its autotuner, at ``import deepspeed``), and the images
install every tracker's client (images/matrix.yaml ``trackers``): about 1.6 s of every rank's start on a CPU, paid
again at each restart, for a client the run may never use. A module set to ``None`` in ``sys.modules`` is the
import system's own "not importable": ``import mlflow`` raises ImportError (DeepSpeed's guard expects that) and
``importlib.util.find_spec`` answers None (transformers' ``is_mlflow_available``). Light on purpose: imported
before the training stack.
"""

from __future__ import annotations

import sys
from typing import Any

#: The module each tracker's client is imported as (MLflow's client package is mlflow-skinny: module mlflow).
MODULES = {"wandb": "wandb", "mlflow": "mlflow", "swanlab": "swanlab"}


def reported_to(report_to: Any) -> set[str]:
    """The trackers ``report_to`` names: the Trainer's "all" is every one, its "none" (and no value) none."""
    if report_to == "all":
        return set(MODULES)
    names = [report_to] if isinstance(report_to, str) else report_to if isinstance(report_to, list) else []
    return {name for name in names if name in MODULES}


def keep_out_unused(report_to: Any) -> list[str]:
    """Make the clients of the trackers ``report_to`` does not name unimportable in this process (unless one is
    imported already); the modules kept out."""
    used = reported_to(report_to)
    kept_out = []
    for tracker, module in MODULES.items():
        if tracker not in used and module not in sys.modules:
            sys.modules[module] = None  # type: ignore[assignment]  # the import system's "not importable"
            kept_out.append(module)
    return kept_out
