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
  - what dominates a first validate: the child's imports as validate runs them, and the same imports as the child
    ran them before it was trimmed (peft visible; TrainingArguments' Kubeflow probe importing the modelling stack).
Wall and CPU seconds are both shown (CPU: the process and its children, the library check's child included); CPU
seconds move less when the machine is shared.
Goal: a new bundle's first static validate ≤ 5 s on this machine.
Run: .venv/bin/python benchmarks/bench_validate.py [--runs 3]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

PY = sys.executable
GOAL_S = 5.0
CHILD_IMPORTS = (
    "import transformers.training_args, transformers.hf_argparser, transformers.integrations.deepspeed, "
    "deepspeed.runtime.config"
)
#: What the child imported before it was trimmed: the same, peft, and the modelling stack TrainingArguments pulls in.
BEFORE_CHILD = CHILD_IMPORTS + "; import transformers.integrations.integration_utils"


def timed(argv: list[str], env: dict[str, str] | None = None, expect: int = 0) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (the process and every descendant it waited for: the library check's child too)
    and stdout of one cold process. CPU seconds move less than wall time when the machine is shared."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if result.returncode != expect:
        raise SystemExit(f"{argv} exited {result.returncode}, expected {expect}:\n{result.stderr[-2000:]}")
    return elapsed, cpu, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    import recipekit
    from recipekit.bundle.build import build

    compileall.compile_dir(Path(recipekit.__file__).parent, quiet=1)  # as an installed wheel is
    cli = [PY, "-m", "recipekit.cli", "validate"]
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPU cores, load average {load:.1f}; python {sys.version.split()[0]}")
    times: dict[str, list[tuple[float, float]]] = {}
    imports_s: list[float] = []

    def record(name: str, argv: list[str], env: dict[str, str] | None = None) -> str:
        wall, cpu, out = timed(argv, env)
        times.setdefault(name, []).append((wall, cpu))
        return out

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
            record('baseline: python -c "import yaml, json"', [PY, "-c", "import yaml, json"])
            record('baseline: python -c "import torch"', [PY, "-c", "import torch"])
            out = record("validate, new bundle (empty cache)", [*cli, str(first), "--json"], env)
            checks = {c["id"]: c for c in json.loads(out)["checks"]}
            assert all(c["status"] != "fail" for c in checks.values()), [c for c in checks.values() if c["findings"]]
            imports_s.append(checks["library.transformers"]["details"].get("child_imports_s") or float("nan"))
            record("validate, same bundle again (cached)", [*cli, str(first)], env)
            out = record("validate, new bundle, equal arguments", [*cli, str(twin), "--json"], env)
            library = [c for c in json.loads(out)["checks"] if c["id"].startswith("library.")]
            assert all(c["reason"].endswith("(cached result)") for c in library), "equal arguments missed the cache"
            quiet = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore"}
            trimmed = "from recipekit.validate.static.librarychild import import_libraries; import_libraries()"
            record("the child's imports, as validate runs them", [PY, "-c", trimmed], quiet)
            record("the same imports with peft visible (before)", [PY, "-c", CHILD_IMPORTS], quiet)
            record("... and TrainingArguments' modelling import (before)", [PY, "-c", BEFORE_CHILD], quiet)

    medians = {name: (median(v[0] for v in values), median(v[1] for v in values)) for name, values in times.items()}
    base = medians['baseline: python -c "import yaml, json"'][0]
    torch_wall, torch_cpu = medians['baseline: python -c "import torch"']
    print(f"median of {runs} interleaved rounds of cold processes, measured in this run")
    print(f"{'case':56} {'wall s':>7} {'× yaml':>7} {'× torch':>8} {'CPU s':>7} {'× torch':>8}")
    for name, (wall, cpu) in medians.items():
        print(f"{name:56} {wall:7.2f} {wall / base:6.0f}× {wall / torch_wall:7.2f}× {cpu:7.2f} {cpu / torch_cpu:7.2f}×")
    print(f"the child's imports, as it reported them (new bundle): median {median(imports_s):.2f} s")
    new, new_cpu = medians["validate, new bundle (empty cache)"]
    print(
        f"goal: a new bundle's first static validate ≤ {GOAL_S:.0f} s -> {'met' if new <= GOAL_S else 'NOT met'} "
        f"({new:.1f} s wall; import torch alone: {torch_wall:.1f} s, load average now {os.getloadavg()[0]:.1f})"
    )
    print(
        f"  its CPU cost, {new_cpu:.1f} s ({new_cpu / torch_cpu:.1f}× import torch), is about its wall time on an idle "
        "machine: the checks run one process at a time, the child and the other checks side by side"
    )


if __name__ == "__main__":
    main()
