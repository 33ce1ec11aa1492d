"""Where `recipekit model import`'s FLOP count spends its time: architectures whose reference kernels loop over the
positions, against a dense baseline measured in the same run.

Run from the repository root: ``.venv/bin/python benchmarks/bench_model_import.py [model_type ...]``. For each
architecture (transformers' default config, on the meta device) it times ``modelflops.measure`` (what the import runs:
the depth cut, three lengths) and counts the operators one forward and backward pass dispatches at the first length.
On the meta device an operator costs about the same at any width (its Python meta kernel only computes shapes), so
the time follows the operator count, and the count follows the positions for a kernel that loops over them (a
state-space scan), where a vectorized layer dispatches the same operators at any length.
"""

from __future__ import annotations

import datetime
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from recipekit.recipe.measured import modelflops  # noqa: E402

#: The dense baseline first, then the sweep's slowest architectures (tests/unit/recipe/test_model_sweep.py).
DEFAULT = ("llama", "qwen3_next", "falcon_mamba", "jamba", "rwkv", "zamba")


def meta_model(model_type: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type), experts_implementation="batched_mm")


def operators(model: Any, seq_len: int) -> int:
    """The operators one counted forward and backward pass of ``model`` dispatches at ``seq_len`` tokens."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            Counting.count += 1
            return func(*args, **(kwargs or {}))

    cut = modelflops.DepthCut.of(model)
    counted = cut.model if cut is not None else model
    with modelflops.counting(counted), Counting():
        modelflops.sample(counted, seq_len)
    return Counting.count


def main(argv: list[str]) -> int:
    import torch

    torch.set_num_threads(1)
    types = argv or list(DEFAULT)
    print(f"# bench_model_import {datetime.date.today()} {platform.machine()} torch {torch.__version__}")
    print(f"{'architecture':<16} {'measure s':>10} {'ops at the first length':>24} {'× baseline':>11}")
    baseline = None
    for model_type in types:
        model = meta_model(model_type)
        unit = modelflops.sequences(model.config)[0]
        started = time.perf_counter()
        modelflops.measure(model)
        seconds = time.perf_counter() - started
        ops = operators(meta_model(model_type), unit)
        baseline = baseline or seconds
        print(f"{model_type:<16} {seconds:>10.1f} {ops:>24,} {seconds / baseline:>10.1f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
