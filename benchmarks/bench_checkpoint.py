"""What a checkpoint save costs the training step: synchronous to the shared volume against the hot tier drained in
the background (``train.hot_checkpoints``), on the dry-run twin, both measured in this run.

Two dry runs of the same bundle, one pod, the same steps, a checkpoint midway (the dry run saves at half): one as
built (the Trainer writes the checkpoint to the shared volume and rank 0 signs it there, training waits for both), one
with ``train.hot_checkpoints.medium=hostPath`` (the Trainer writes to the pod's node-local directory; the signature
and the copy to the shared volume run in a thread). From each run's metrics.jsonl:
  - the step interval with the save (from the saving step's log to the next step's) against the median interval of
    the other steps: the save's cost to the step, and the ratio of the two runs' costs;
  - the blocking seconds the runtime reports (``checkpoint`` records, recipekit_checkpoint_seconds) and, with the
    hot tier, the drain's total (``checkpoint_drained`` records, recipekit_checkpoint_total_seconds).
By default the "shared volume" is a directory of the same local disk as the "node-local" one, so the figures show
what the hot tier takes off the step (signing and the volume's write), not a network volume's bandwidth. With
``--volume-mbps N`` each dry run's work directory is a FUSE pass-through (benchmarks/slowvolume.py) whose writes to
the shared volume are held to N MB/s and whose node-local disks are not: a network volume's checkpoint cost, which
the hot tier takes off the step (needs /dev/fuse, Debian's fuse3 and ``pip install mfusepy``).
Run: .venv/bin/python benchmarks/bench_checkpoint.py [--bundle recipe=tiny_sft parallel=ddp] [--steps 16] [--runs 1]
     [--volume-mbps 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from slowvolume import slow_volume  # benchmarks/, this script's own folder: first on sys.path

HOT = "train.hot_checkpoints.medium=hostPath"


def save_cost(output_dir: Path, save_step: int) -> dict[str, float]:
    """The step intervals of one run's metrics.jsonl: the one holding the save, the median of the others, and the
    runtime's own blocking and total seconds of that save."""
    from recipekit.runtime.boundary import metricslog

    records = metricslog.read_records(output_dir / "metrics.jsonl")
    logged = {r["step"]: r["time"] for r in records if "loss" in r and "event" not in r and "time" in r}
    steps = sorted(logged)
    intervals = {s: logged[s + 1] - logged[s] for s in steps if s + 1 in logged and s > steps[0]}
    others = [v for s, v in intervals.items() if s != save_step]
    saved = next(r for r in metricslog.events(records, metricslog.EVENT_CHECKPOINT) if r["step"] == save_step)
    drained = [r for r in metricslog.events(records, metricslog.EVENT_CHECKPOINT_DRAINED) if r["step"] == save_step]
    median = statistics.median(others)
    return {
        "with_save_s": intervals[save_step],
        "median_s": median,
        "cost_s": intervals[save_step] - median,
        "blocking_s": float(saved["seconds"]),
        "total_s": float(drained[0]["total"]) if drained else float(saved["seconds"]),
    }


def one_run(overrides: list[str], steps: int, where: Path, volume_mbps: float | None = None) -> dict[str, float]:
    """One dry run's save cost; its work directory on a volume of ``volume_mbps`` (slowvolume.py) when given."""
    if volume_mbps is None:
        return _dry_run(overrides, steps, where)
    with slow_volume(where / "backing", where / "work", volume_mbps):
        return _dry_run(overrides, steps, where)


def _dry_run(overrides: list[str], steps: int, where: Path) -> dict[str, float]:
    from recipekit.bundle.build import build
    from recipekit.validate.dryrun.options import DryRunOptions
    from recipekit.validate.dryrun.run import run_dry_run
    from recipekit.validate.shared.loader import load_bundle

    bundle = build(overrides, where / "bundle", force=True).path
    options = DryRunOptions(pods=1, steps=steps, workdir=where / "work", timeout=900)
    results = list(run_dry_run(load_bundle(bundle), options))
    bad = [f"{r.id}: {[str(f) for f in r.findings]}" for r in results if r.failed]
    if bad:
        raise SystemExit("dry run failed:\n" + "\n".join(bad))
    recipe: dict[str, Any] = yaml.safe_load((where / "work" / "bundle" / "recipe.yaml").read_text())
    return save_cost(Path(recipe["training_arguments"]["output_dir"]), options.save_steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", nargs="+", default=["recipe=tiny_sft", "parallel=ddp"], help="bundle overrides")
    parser.add_argument("--steps", type=int, default=16, help="steps of each dry run (the save is at half)")
    parser.add_argument("--runs", type=int, default=1, help="pairs of dry runs; the median cost of each side")
    parser.add_argument("--volume-mbps", type=float, help="the shared volume's write bandwidth (a FUSE throttle)")
    options = parser.parse_args()
    volume = f"shared volume at {options.volume_mbps:g} MB/s" if options.volume_mbps else "shared volume on local disk"
    print(f"machine: {os.cpu_count()} CPU cores; python {sys.version.split()[0]}; bundle {' '.join(options.bundle)}")
    print(f"{volume}; node-local disk at local speed")
    sides: dict[str, list[dict[str, float]]] = {"sync": [], "hot tier": []}
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        for run in range(options.runs):  # the two sides alternate, so the machine's load drifts over both
            mbps = options.volume_mbps
            sides["sync"].append(one_run(options.bundle, options.steps, Path(tmp) / f"sync{run}", mbps))
            sides["hot tier"].append(one_run([*options.bundle, HOT], options.steps, Path(tmp) / f"hot{run}", mbps))
    figures = {side: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for side, runs in sides.items()}
    print(f"save at step {options.steps // 2} of {options.steps}, 1 pod (median of {options.runs} run(s) each):")
    print(f"  {'':28} {'sync':>10} {'hot tier':>10}")
    for key, label in (
        ("median_s", "step interval, no save"),
        ("with_save_s", "step interval with the save"),
        ("cost_s", "the save's cost to the step"),
        ("blocking_s", "blocking (runtime's gauge)"),
        ("total_s", "until signed on the volume"),
    ):
        print(f"  {label:28} {figures['sync'][key]:9.3f}s {figures['hot tier'][key]:9.3f}s")
    sync, hot = figures["sync"], figures["hot tier"]
    print(f"ratio of the step with the save, hot tier / sync: {hot['with_save_s'] / sync['with_save_s']:.2f}")
    print(f"ratio of the blocking seconds, hot tier / sync:   {hot['blocking_s'] / max(sync['blocking_s'], 1e-9):.2f}")


if __name__ == "__main__":
    main()
