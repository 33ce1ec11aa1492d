"""Where the dry run's CPU redirect comes in (and why it cannot in a real pod).

The redirect (recipekit/validate/dryrun/workdir/megatroncpu.py) is no part of the runtime package: no bundle and no
image carries it. The dry run names its file in the pods' environment (:data:`REDIRECT_ENV`); this room loads it
only for a recipe that targets the CPU (``recipe.hw.torch_device: cpu``: a target only the dry run builds for this
engine) and refuses it for any other (exit 2), so a variable leaked into a cluster's pod cannot redirect anything.
It must be installed before Megatron-Bridge is imported.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ..boundary.common import RunError, log0
from ..boundary.recipeview import HardwareView

#: The environment variable naming the redirect's file (megatroncpu.REDIRECT_ENV: the dry run sets it).
REDIRECT_ENV = "RECIPEKIT_DRYRUN_CPU_REDIRECT"


def install_if_asked(hw: HardwareView) -> list[str]:
    """Load and install the redirect the environment names, for a CPU recipe only; what it patched."""
    path = os.environ.get(REDIRECT_ENV)
    if not path:
        return []
    if hw.torch_device != "cpu":
        raise RunError(
            f"{REDIRECT_ENV} is set but this bundle targets {hw.torch_device}: the CPU redirect is for dry runs of "
            "CPU recipes only; unset it"
        )
    spec = importlib.util.spec_from_file_location("recipekit_megatron_cpu_redirect", Path(path))
    if spec is None or spec.loader is None or not Path(path).is_file():
        raise RunError(f"{REDIRECT_ENV}={path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    try:
        patched = list(module.install())
    except module.OutOfDate as exc:
        raise RunError(f"the dry run's CPU redirect does not fit this engine: {exc}") from None
    log0("DRY RUN: Megatron redirected to the CPU (%d engine sites patched)", len(patched))
    return patched
