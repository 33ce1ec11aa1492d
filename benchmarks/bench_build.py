"""How fast `recipekit build` answers, against the floor of importing what it must import.

Prints, measured side by side in this run (median of N cold processes each):
  - baseline: `python -c "import hydra, jinja2, omegaconf"` (goal: build ≤ 2× this);
  - a full cold `recipekit build` of a preset into a temp dir;
  - time to the error for a mistyped key (goal: the same bound);
  - `recipekit show` (compose + plan, no files).
recipekit is byte-compiled first, as ``pip install`` does and as Python itself does on the first run: the libraries
of the baseline are byte-compiled too, and an environment with PYTHONDONTWRITEBYTECODE set (this one has) would
otherwise make every "cold" run recompile recipekit's sources, which no installed user pays.
Run: .venv/bin/python benchmarks/bench_build.py [--runs 7]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable


def timed(argv: list[str], expect: int) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != expect:
        raise SystemExit(f"{argv} exited {result.returncode}, expected {expect}:\n{result.stderr}")
    return elapsed


def interleaved_medians(runs: int, cases: dict[str, tuple[list[str], int]]) -> dict[str, float]:
    """Median of ``runs`` rounds, each round running every case once: drift in the machine's speed (a shared VM)
    then hits the baseline and recipekit alike instead of skewing their ratio."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, (argv, expect) in cases.items():
            times[name].append(timed(argv, expect))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    import recipekit

    package = Path(recipekit.__file__).parent
    compileall.compile_dir(package, quiet=1)
    flag = os.environ.get("PYTHONDONTWRITEBYTECODE", "")
    print(f"recipekit byte-compiled in place ({package}); PYTHONDONTWRITEBYTECODE={flag!r}")
    cli = [PY, "-m", "recipekit.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "bundle")
        cases = {
            "baseline: import hydra, jinja2, omegaconf": ([PY, "-c", "import hydra, jinja2, omegaconf"], 0),
            "recipekit build recipe=llama3_8b_sft hw=ascend910b": (
                [*cli, "build", "recipe=llama3_8b_sft", "hw=ascend910b", "-o", out, "--force"],
                0,
            ),
            "recipekit build with a mistyped key (to error)": (
                [*cli, "build", "recipe=llama3_8b_sft", "train.micro_bach_size=2", "-o", out],
                2,
            ),
            "recipekit show recipe=qwen2.5_14b_sft": ([*cli, "show", "recipe=qwen2.5_14b_sft", "--json"], 0),
        }
        results = interleaved_medians(runs, cases)
    baseline = results["baseline: import hydra, jinja2, omegaconf"]
    print(f"median of {runs} interleaved rounds of cold runs, measured in this run")
    print(f"{'case':58} {'seconds':>8} {'× baseline':>11}")
    for name, seconds in results.items():
        print(f"{name:58} {seconds:8.3f} {seconds / baseline:10.2f}×")
    worst = max(v for k, v in results.items() if k.startswith("recipekit build")) / baseline
    print(f"goal: build and error ≤ 2.00× baseline -> {'met' if worst <= 2 else 'NOT met'} ({worst:.2f}×)")


if __name__ == "__main__":
    main()
