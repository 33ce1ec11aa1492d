"""Wall time of `recipekit validate --dry-run` with one kill and resume: 2 pods, ZeRO-2, the tiny_sft preset.

Prints, measured in this run:
  - the one-time build of DeepSpeed's C++ op (deepspeed_shm_comm, g++), separately: 0 when already cached;
  - the static checks (with the Transformers/DeepSpeed cross-checks, cached after the first run);
  - the dry run: time to the first step, steps/s, the kill at step 6, teardown, restart, MTTR, total wall time;
  - the goal: the whole dry run (prepare → two attempts → report) ≤ 120 s on a 2-core machine once the op is built.
Run: .venv/bin/python benchmarks/bench_dryrun.py [--bundle recipe=tiny_sft] [--runs 1] [--cold-ops]
  --cold-ops deletes the cached op first, to measure its build.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", nargs="+", default=["recipe=tiny_sft"], help="overrides of the bundle to build")
    parser.add_argument("--runs", type=int, default=1, help="dry runs to take the median of")
    parser.add_argument("--cold-ops", action="store_true", help="delete the cached DeepSpeed op to time its build")
    options = parser.parse_args()

    from recipekit.bundle.build import build
    from recipekit.validate.dryrun.options import DryRunOptions
    from recipekit.validate.dryrun.run import run_dry_run
    from recipekit.validate.dryrun.workdir.extensions import extensions_dir
    from recipekit.validate.shared.loader import load_bundle
    from recipekit.validate.static.checks import run_static

    if options.cold_ops and extensions_dir().exists():
        shutil.rmtree(extensions_dir())
    print(f"machine: {os.cpu_count()} CPU cores; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="bench-dryrun-") as tmp:
        bundle = build(options.bundle, Path(tmp) / "bundle", force=True).path
        start = time.perf_counter()
        static = run_static(load_bundle(bundle))
        static_s = time.perf_counter() - start
        failed = [r.id for r in static if r.failed]
        failures = f", FAILED: {', '.join(failed)}" if failed else ""
        print(f"static checks: {static_s:6.1f} s ({len(static)} checks{failures})")

        walls, figures = [], []
        op_build = None
        for run in range(options.runs):
            start = time.perf_counter()
            results = {
                r.id: r
                for r in run_dry_run(
                    load_bundle(bundle),
                    DryRunOptions(pods=2, kill_pod=1, at_step=6, workdir=Path(tmp) / f"work{run}", timeout=900),
                )
            }
            wall = time.perf_counter() - start
            ops = results["dryrun.ops"]
            built = [o for o in ops.details.get("ops", []) if o.get("status") == "built"]
            if built and op_build is None:
                op_build = ops.seconds
            bad = [f"{r.id}: {[str(f) for f in r.findings]}" for r in results.values() if r.failed]
            if bad:
                raise SystemExit("dry run failed:\n" + "\n".join(bad))
            walls.append(wall - (ops.seconds if built else 0.0))
            figures.append((results["dryrun.train"].details, results["dryrun.resume"].details))

    train, resume = figures[-1]
    median = statistics.median(walls)
    print(f"DeepSpeed op build (one-time): {f'{op_build:6.1f} s' if op_build is not None else '   0.0 s (cached)'}")
    print(f"dry run, 2 pods, ZeRO-2, kill pod 1 at step 6 (median of {len(walls)}, op build excluded):")
    print(f"  time to first step          {train['time_to_first_step_s']:8.1f} s")
    print(f"  steps/s (first attempt)     {train['steps_per_s']:8.2f}")
    print(f"  loss first → final          {train['first_loss']:8.4f} → {train['final_loss']:.4f}")
    print(f"  killed at step              {resume['killed_at_step']:8d} ({resume['killed_processes']} processes)")
    print(f"  teardown (RestartJob)       {resume['teardown_s']:8.1f} s")
    print(
        f"  resumed from step           {resume['resumed_step']:8d} (last complete checkpoint "
        f"{resume['complete_checkpoints_at_restart'][-1] if resume['complete_checkpoints_at_restart'] else None})"
    )
    print(f"  restart → first step        {resume['restart_to_first_step_s']:8.1f} s")
    print(f"  MTTR (kill → training)      {resume['mttr_s']:8.1f} s")
    print(f"  total wall time             {median:8.1f} s")
    print(f"goal: ≤ {GOAL_S:.0f} s once the op is built -> {'met' if median <= GOAL_S else 'NOT met'} ({median:.1f} s)")


if __name__ == "__main__":
    main()
