"""How fast a 200-bundle matrix build is, against 200 separate `recipekit build` processes measured in the same run.

The matrix: 5 presets × 5 accelerators × 2 seeds × 4 learning rates = 200 bundles, every one of which fits:

    recipekit build -m recipe=llama3_8b_lora,llama3_8b_sft,qwen2.5_14b_sft,qwen2.5_7b_pretrain,tiny_sft \\
        hw=ascend910b,h100,h200,h800,a100_80g train.seed=1,2 train.learning_rate=1e-5,2e-5,3e-5,5e-5

Prints, for both ways (each a cold process, as a user or CI runs it): wall time, CPU time of all processes, per
bundle; the ratio; whether the goal (matrix ≤ 10 s on a 2-core machine) is met; and checks that every matrix bundle
is byte-identical to its separate build. The baseline runs `--baseline-jobs` processes at a time (default 2: both
cores, as fair to the baseline as the matrix's own pool of 2). The machine's load average is printed first: on a
shared machine other work inflates wall times (CPU times are what recipekit itself spent).
recipekit is byte-compiled first, as an installed package is (see bench_build.py).
Run: .venv/bin/python benchmarks/bench_matrix.py [--baseline-jobs 2] [--sample N]
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PY = sys.executable
SWEEP = [
    "recipe=llama3_8b_lora,llama3_8b_sft,qwen2.5_14b_sft,qwen2.5_7b_pretrain,tiny_sft",
    "hw=ascend910b,h100,h200,h800,a100_80g",
    "train.seed=1,2",
    "train.learning_rate=1e-5,2e-5,3e-5,5e-5",
]
GOAL_S = 10.0


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(commands: list[list[str]], jobs: int) -> tuple[float, float]:
    """Wall and CPU seconds of running ``commands`` (each must exit 0), ``jobs`` at a time."""

    def one(argv: list[str]) -> None:
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}{result.stderr}")

    cpu, start = children_cpu(), time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, commands))
    return time.perf_counter() - start, children_cpu() - cpu


def _contents(bundle: Path) -> dict[str, bytes]:
    """Every file of a bundle by its path inside it (bundles have subdirectories: runtime/)."""
    return {str(p.relative_to(bundle)): p.read_bytes() for p in sorted(bundle.rglob("*")) if p.is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-jobs", type=int, default=2, help="separate builds run at a time (default 2)")
    parser.add_argument("--sample", type=int, default=0, help="time only N separate builds and scale (default: all)")
    options = parser.parse_args()
    import recipekit
    from recipekit.bundle.sweep import combinations

    compileall.compile_dir(Path(recipekit.__file__).parent, quiet=1)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load} (1, 5, 15 min) before the run")
    found = combinations(SWEEP)
    cli = [PY, "-m", "recipekit.cli", "build"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        matrix_wall, matrix_cpu = timed([[*cli, "-m", *SWEEP, "-o", str(root / "matrix")]], jobs=1)
        names = sorted(p.name for p in (root / "matrix").iterdir())
        chosen = found if not options.sample else found[:: max(1, len(found) // options.sample)][: options.sample]
        singles = []
        for combination in chosen:
            name = f"{combination.recipe_option}{combination.suffix}"
            singles.append([*cli, *combination.overrides, "-o", str(root / "single" / name)])
        single_wall, single_cpu = timed(singles, jobs=options.baseline_jobs)
        scale = len(found) / len(chosen)
        different = [
            path.name
            for path in sorted((root / "single").iterdir())
            if _contents(path) != _contents(root / "matrix" / path.name)
        ]
    print(f"matrix of {len(found)} combinations: {len(names)} bundles written")
    print(f"{'':44} {'wall s':>8} {'CPU s':>8} {'wall ms/bundle':>15}")
    rows = [
        ("recipekit build -m (one process, pool of 2)", matrix_wall, matrix_cpu),
        (
            f"{len(found)} separate builds, {options.baseline_jobs} at a time"
            + (f" (x{scale:.1f} of {len(chosen)})" if scale != 1 else ""),
            single_wall * scale,
            single_cpu * scale,
        ),
    ]
    for label, wall, cpu in rows:
        print(f"{label:44} {wall:8.2f} {cpu:8.2f} {wall / len(found) * 1000:15.1f}")
    print(
        f"ratio: the matrix takes {matrix_wall / (single_wall * scale):.3f}x the wall time of separate builds "
        f"({single_wall * scale / matrix_wall:.1f}x faster), {matrix_cpu / (single_cpu * scale):.3f}x the CPU time"
    )
    verdict = "met" if matrix_wall <= GOAL_S else "NOT met"
    print(
        f"goal: matrix <= {GOAL_S:g} s on this machine -> {verdict} ({matrix_wall:.2f} s wall, "
        f"{matrix_cpu / 2:.2f} s if both cores were free)"
    )
    if different:
        raise SystemExit(f"matrix bundles differ from their separate builds: {', '.join(different[:5])}")
    print(f"every matrix bundle checked ({len(chosen)}) is byte-identical to its separate build")


if __name__ == "__main__":
    main()
