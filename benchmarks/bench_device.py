"""The device check (issue 29, item 7): a 1-8 B model's bundle trained by its own runtime on one CUDA device.

Builds the bundle of a full-size model option with random weights (``model.init=random``: the runtime's twin builds
the model from its architecture numbers, no hub, no download) for one device of ``--hw``, runs the bundle's train.py
for about ``--minutes`` (the step count comes from the plan's own step time) on generated alpaca data packed to
``--seq-len`` tokens, and prints what the run measured next to what the plan said:

  * tokens/s per device and MFU, as the runtime's throughput callback logs them to metrics.jsonl (MFU: the model's
    FLOPs per token from the counter, ``plan.compute.flops_per_token``, over the device's peak); the first logged
    intervals are warm-up and left out, the rest summarised by their median;
  * peak device memory (``peak_device_memory_gib``: torch's ``max_memory_allocated``, the largest over the run)
    against the plan's memory per device (``plan.memory_gib.total``) and the device's capacity.

With ``--engine megatron`` it runs the Megatron engine's path instead (issue 39, item 6): the bundle of
``engine=megatron`` at ``--tp`` × ``--pp`` on one node of ``--devices`` devices, started as a pod starts its workers
(torchrun, ``-m runtime.megatron.train``: Megatron-Bridge's own ``pretrain()`` / ``finetune()``), the same figures read
from the room's metrics.jsonl (its MFU is the same definition: runtime/boundary/flopcount.py). It needs Megatron-Bridge
and Transformer Engine installed where it runs (the image's stack, images/matrix.yaml ``engines.megatron``); without
them it prints ``skipped: ...`` and exits 0.

Where no CUDA device is present it prints ``skipped: no CUDA device`` and exits 0 (so it can sit in a benchmark
sweep). Run from the repository root on the machine with the device:

    .venv/bin/python benchmarks/bench_device.py [--model qwen3_8b] [--mode lora] [--minutes 3] [--set KEY=VALUE]
    .venv/bin/python benchmarks/bench_device.py --engine megatron --mode sft --tp 2 --pp 2 --devices 8

Budget about 2 minutes on top of ``--minutes``: the random twin's weights are created and written once per run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

#: Logged intervals left out of the summary: the first ones include compilation, allocator growth and data start.
WARMUP_LOGS = 2
#: The fewest and most optimizer steps run, whatever the plan's step time says.
MIN_STEPS, MAX_STEPS = 20, 20_000
#: Seconds allowed past ``--minutes`` for start-up (imports, the twin's weights) before the run is stopped.
START_UP_S = 600


@dataclass(frozen=True)
class Summary:
    """What one run measured, next to the plan's figures."""

    model: str
    steps: int
    tokens_per_s: float
    mfu: float
    planned_mfu: float
    peak_gib: float
    planned_gib: float
    device_gib: float


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen3_8b", help="a model option of 1-8 B parameters (recipes/model/)")
    parser.add_argument("--mode", default="lora", help="a mode option: lora fits an 8 B model on one device")
    parser.add_argument("--hw", default="h200", help="the hardware option the device is (recipes/hw/)")
    parser.add_argument("--minutes", type=float, default=3.0, help="training time to aim for (0.5 to 9)")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per packed sequence")
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE", help="more overrides")
    parser.add_argument("--engine", choices=("trainer", "megatron"), default="trainer", help="the training engine")
    parser.add_argument("--tp", type=int, default=2, help="--engine megatron: tensor-parallel size")
    parser.add_argument("--pp", type=int, default=2, help="--engine megatron: pipeline-parallel size")
    parser.add_argument("--devices", type=int, default=8, help="--engine megatron: devices of the one node")
    options = parser.parse_args(argv)
    if not 0.5 <= options.minutes <= 9:
        parser.error("--minutes must be from 0.5 to 9 (a device check is one short command)")
    if options.seq_len < 16 or options.micro_batch < 1:
        parser.error("--seq-len must be at least 16 and --micro-batch at least 1")
    if options.engine == "megatron" and (
        min(options.tp, options.pp) < 1 or options.devices % (options.tp * options.pp)
    ):
        parser.error("--tp × --pp must divide --devices (the rest is data parallel)")
    bad = [item for item in options.extra if "=" not in item or item.startswith("=")]
    if bad:
        parser.error(f"--set takes KEY=VALUE, not {bad[0]!r}")
    return options


def engine_overrides(options: argparse.Namespace) -> list[str]:
    """The engine's part of the overrides: one device for the Trainer; for Megatron, one node of ``--devices`` at
    ``--tp`` × ``--pp`` with its distributed optimizer."""
    if options.engine == "trainer":
        return ["parallel=ddp", "hw.devices_per_node=1"]
    return [
        "engine=megatron",
        "parallel=distopt",
        f"parallel.tensor_parallel={options.tp}",
        f"parallel.pipeline_parallel={options.pp}",
        f"hw.devices_per_node={options.devices}",
    ]


def overrides(options: argparse.Namespace, root: Path, data: Path, steps: int) -> list[str]:
    """The recipe overrides of the device check's bundle: one pod, random weights, no checkpoint."""
    return [
        f"model={options.model}",
        f"mode={options.mode}",
        f"hw={options.hw}",
        *engine_overrides(options),
        "cluster=local",
        "cluster.nodes=1",
        "model.init=random",
        "data=alpaca",
        f"data.path={data}",
        f"data.max_len={options.seq_len}",
        "data.packing=true",
        f"train.max_steps={steps}",
        f"train.micro_batch_size={options.micro_batch}",
        "train.gradient_accumulation_steps=1",
        "train.logging_steps=5",
        f"train.save_steps={MAX_STEPS * 10}",
        "train.report_to=[none]",
        f"cluster.mount_path={root}",
        f"cluster.output_dir={root}/runs",
        *options.extra,
    ]


def steps_for(plan: dict[str, Any], minutes: float) -> int:
    """Optimizer steps that take about ``minutes`` at the plan's step time (bounded either way)."""
    step_s = float(plan.get("time", {}).get("step_s") or 1.0)
    return max(MIN_STEPS, min(MAX_STEPS, int(minutes * 60 / max(step_s, 1e-3))))


def summarise(model: str, records: list[dict[str, Any]], plan: dict[str, Any]) -> Summary:
    """The run's logged intervals (metrics.jsonl lines with a loss) reduced to one row; a SystemExit when none."""
    logs = [r for r in records if "loss" in r and "tokens_per_second_per_device" in r]
    if not logs:
        raise SystemExit("the run logged no training step with a throughput: see its output above")
    steady = logs[WARMUP_LOGS:] or logs[-1:]
    peaks = [float(r["peak_device_memory_gib"]) for r in logs if r.get("peak_device_memory_gib") is not None]
    memory, compute = plan.get("memory_gib", {}), plan.get("compute", {})
    return Summary(
        model=model,
        steps=int(max(r.get("step", 0) for r in logs)),
        tokens_per_s=statistics.median(float(r["tokens_per_second_per_device"]) for r in steady),
        mfu=statistics.median(float(r.get("mfu", 0.0)) for r in steady),
        planned_mfu=float(compute.get("assumed_mfu", 0.0)),
        peak_gib=max(peaks, default=0.0),
        planned_gib=float(memory.get("total", 0.0)),
        device_gib=float(memory.get("device", 0.0)),
    )


def report(summary: Summary) -> str:
    """The figures, one per line, each beside the plan's."""
    ratio = summary.peak_gib / summary.planned_gib if summary.planned_gib else 0.0
    rows = [
        ("model, steps", f"{summary.model}, {summary.steps}"),
        ("tokens/s per device (median after warm-up)", f"{summary.tokens_per_s:,.0f}"),
        ("MFU (counter's FLOPs / peak)", f"{summary.mfu:.1%}   plan assumes {summary.planned_mfu:.0%}"),
        (
            "peak device memory, GiB",
            f"{summary.peak_gib:.1f}   plan {summary.planned_gib:.1f} ({ratio:.2f}×), device {summary.device_gib:.0f}",
        ),
    ]
    return "\n".join(f"{name:44} {value}" for name, value in rows)


def read_records(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if path.exists() else []:
        try:
            value = json.loads(line)
        except ValueError:
            continue  # a last line cut by the stop
        if isinstance(value, dict):
            records.append(value)
    return records


def run(options: argparse.Namespace, root: Path) -> Summary:
    import yaml

    from recipekit.bundle.build import build
    from recipekit.validate.dryrun.workdir.tinydata import write_tiny_dataset

    data = write_tiny_dataset("alpaca", root / "data.jsonl", n=20_000)
    probe = build(overrides(options, root, data, MIN_STEPS), output=root / "probe", force=True).path
    steps = steps_for(json.loads((probe / "plan.json").read_text()), options.minutes)
    bundle = build(overrides(options, root, data, steps), output=root / "bundle", force=True).path
    plan = json.loads((bundle / "plan.json").read_text())
    out, command = start_command(options, bundle, yaml.safe_load((bundle / "recipe.yaml").read_text()))
    env = {**os.environ, "PYTHONPATH": str(bundle), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    where = (
        "one device" if options.engine == "trainer" else f"{options.devices} devices, TP {options.tp} × PP {options.pp}"
    )
    print(f"{steps} steps of {options.model} ({options.mode}, {options.engine}) on {options.hw}: {where}", flush=True)
    try:
        done = subprocess.run(command, env=env, timeout=options.minutes * 60 * 2 + START_UP_S, check=False)
        if done.returncode:
            print(f"train.py exited {done.returncode}: the figures below are from what it logged", flush=True)
    except subprocess.TimeoutExpired:
        print("train.py ran past its time and was stopped: the figures below are from what it logged", flush=True)
    return summarise(options.model, read_records(out / "metrics.jsonl"), plan)


def start_command(options: argparse.Namespace, bundle: Path, recipe: dict[str, Any]) -> tuple[Path, list[str]]:
    """The run's output directory and the command a pod's launcher would run: train.py in one process for the
    Trainer; torchrun over the node's devices with the Megatron room's entry for Megatron."""
    from recipekit.bundle.files import TRAIN_MODULE

    if options.engine == "trainer":
        out = Path(recipe["training_arguments"]["output_dir"])
        return out, [sys.executable, "-m", TRAIN_MODULE, "--recipe", str(bundle / "recipe.yaml"), "--resume", "none"]
    out = Path(recipe["megatron"]["recipekit"]["output_dir"])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={options.devices}"]
    return out, [*torchrun, "-m", "runtime.megatron.train", "--recipe", str(bundle / "recipe.yaml"), "--resume", "none"]


def _engine_missing(engine: str) -> str | None:
    """Why the engine cannot run here (its packages are not installed), or None."""
    if engine == "trainer":
        return None
    import importlib.util

    missing = [name for name in ("megatron.bridge", "transformer_engine") if importlib.util.find_spec(name) is None]
    return f"skipped: {', '.join(missing)} not installed (the image's Megatron stack)" if missing else None


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    if not _cuda_available():
        print("skipped: no CUDA device")
        return 0
    missing = _engine_missing(options.engine)
    if missing:
        print(missing)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        print(report(run(options, Path(tmp))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
