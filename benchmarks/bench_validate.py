"""How fast `recipekit validate BUNDLE` (static checks) answers: for a new bundle, a cached one, and a new bundle whose
Trainer arguments equal a validated one's; against baselines measured side by side in this run.

Prints the median of N interleaved rounds (each round runs every case once, so drift in a shared machine's speed hits
baselines and recipekit alike) of cold processes:
  - baseline `python -c "import yaml, json"` (a Python process that reads YAML: the floor of any validate);
  - baseline `python -c "import torch"` (the floor of any check that runs the real Transformers/DeepSpeed code,
    which needs torch);
  - the first static validate of a new bundle (an empty cache: the library cross-checks start a child that imports
    transformers and DeepSpeed, concurrent with the other checks);
  - the same bundle again (the cross-checks' answer is cached);
  - a new bundle with equal Trainer arguments (another data path: another run id and output directory), after the
    first was validated: the cache is keyed by content, not by bundle, so it hits;
  - the child's own import time, as reported by the child, and what the same imports cost with peft visible
    (before the child hid it) — what dominates a first validate.
Goal: a new bundle's first static validate ≤ 5 s on this machine.
Run: .venv/bin/python benchmarks/bench_validate.py [--runs 3]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
GOAL_S = 5.0
CHILD_IMPORTS = (
    "import transformers.training_args, transformers.hf_argparser, transformers.integrations.deepspeed, "
    "deepspeed.runtime.config"
)


def timed(argv: list[str], env: dict[str, str] | None = None, expect: int = 0) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if result.returncode != expect:
        raise SystemExit(f"{argv} exited {result.returncode}, expected {expect}:\n{result.stderr[-2000:]}")
    return elapsed, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    import recipekit
    from recipekit.build import build

    compileall.compile_dir(Path(recipekit.__file__).parent, quiet=1)  # as an installed wheel is
    cli = [PY, "-m", "recipekit.cli", "validate"]
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPU cores, load average {load:.1f}; python {sys.version.split()[0]}")
    times: dict[str, list[float]] = {}
    imports_s: list[float] = []

    def record(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    with tempfile.TemporaryDirectory(prefix="bench-validate-") as tmp:
        root = Path(tmp)
        first = build(["recipe=llama3_8b_sft", "hw=ascend910b"], root / "first", force=True).path
        twin = build(
            ["recipe=llama3_8b_sft", "hw=ascend910b", "data.path=/mnt/shared/data/other.jsonl"],
            root / "twin",
            force=True,
        ).path
        run_ids = {json.loads((b / "launch.json").read_text())["run_id"] for b in (first, twin)}
        assert len(run_ids) == 2, "the two bundles should be different runs"
        for round_ in range(runs):
            env = {**os.environ, "XDG_CACHE_HOME": str(root / f"cache{round_}")}  # empty: nothing cached
            record('baseline: python -c "import yaml, json"', timed([PY, "-c", "import yaml, json"])[0])
            record('baseline: python -c "import torch"', timed([PY, "-c", "import torch"])[0])
            seconds, out = timed([*cli, str(first), "--json"], env)
            record("validate, new bundle (empty cache)", seconds)
            child = json.loads(out)
            checks = {c["id"]: c for c in child["checks"]}
            assert child["ok"], [c for c in child["checks"] if c["status"] == "fail"]
            imports_s.append(checks["library.transformers"]["details"].get("child_imports_s", float("nan")))
            record("validate, same bundle again (cached)", timed([*cli, str(first)], env)[0])
            seconds, out = timed([*cli, str(twin), "--json"], env)
            hit = all("cached result" in c["reason"] for c in json.loads(out)["checks"] if c["id"].startswith("lib"))
            record(f"validate, new bundle, equal arguments ({'cache hit' if hit else 'MISSED the cache'})", seconds)
            hidden = f"import sys; sys.modules['peft'] = None; {CHILD_IMPORTS}"
            quiet = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore"}
            record("child's imports, peft hidden (as validate runs them)", timed([PY, "-c", hidden], quiet)[0])
            record("child's imports, peft visible (before)", timed([PY, "-c", CHILD_IMPORTS], quiet)[0])

    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians['baseline: python -c "import yaml, json"']
    torch_s = medians['baseline: python -c "import torch"']
    print(f"median of {runs} interleaved rounds of cold processes, measured in this run")
    print(f"{'case':60} {'seconds':>8} {'× yaml':>8} {'× torch':>8}")
    for name, seconds in medians.items():
        print(f"{name:60} {seconds:8.2f} {seconds / base:7.1f}× {seconds / torch_s:7.2f}×")
    print(f"the child's imports as it reported them (new bundle): median {statistics.median(imports_s):.2f} s")
    new = medians["validate, new bundle (empty cache)"]
    print(
        f"goal: a new bundle's first static validate ≤ {GOAL_S:.0f} s -> "
        f"{'met' if new <= GOAL_S else 'NOT met'} ({new:.1f} s; import torch alone: {torch_s:.1f} s)"
    )


if __name__ == "__main__":
    main()
