"""Prepared data against the in-process path, measured side by side in one run on this machine's CPU.

Prints:
  1. prepare throughput, tokens/s, on an alpaca (SFT: chat template, prompt masking) and a text (pretraining
     blocks) corpus: the bundle's prepare step on 1 and on 2 worker processes, against datasets.map running the same
     tokenising function (the in-process path's load_dataset + map, fresh cache) with the same fast tokenizer:
     plain (one process) and with num_proc=2. Goals: 2 workers ≥ 1.6× one worker, and ≥ plain datasets.map.
     Every side runs one tokenizer thread per process (TOKENIZERS_PARALLELISM=false), so the ratios are about
     processes, not about the tokenizer's thread pool.
  2. time to the first training step of a bundle's train.py (one process, tiny twin) on a 1× and a 10× alpaca
     corpus: on shards prepared ahead (``python -m runtime.dataprep``, as ``recipekit data prepare`` runs it), and
     with the in-process path of the runtime before prepared data (``--baseline``, a git revision; its runtime/
     replaces the bundle's), which tokenises on the main process before step 1. Goal: prepared 10× ≤ 1.2 × 1×.
     Both sides get the random twin made ahead, so the figures are about the data alone.
The machine's load moves single figures a lot (2 cores shared here): compare the ratios, measured in one run, and
the 2-worker ratio with the machine's own 2-process speed-up on pure Python work, printed before and after.
Run: .venv/bin/python benchmarks/bench_data.py [--records 10000] [--throughput-records 40000] [--runs 3] [--only ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from recipekit.bundle.build import build
from recipekit.bundle.files import TRAIN_MODULE
from recipekit.runtime.boundary import filenames, metricslog
from recipekit.validate.dryrun.workdir.tinydata import tiny_records, write_tiny_dataset

os.environ["TOKENIZERS_PARALLELISM"] = "false"
ROOT = Path(__file__).resolve().parents[1]
#: The last revision whose train.py tokenised in-process (datasets.map under main_process_first).
BASELINE = "7fa5574"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


# ------------------------------------------------------------------------------------------------- throughput
def throughput(root: Path, fmt: str, records: int) -> None:
    from recipekit.runtime import dataprep
    from recipekit.runtime.data import samples
    from recipekit.runtime.data.fingerprint import Settings
    from recipekit.runtime.data.sources import find_files
    from recipekit.runtime.model import twin
    from recipekit.runtime.session import rundata

    data = write_tiny_dataset(fmt, root / f"{fmt}.jsonl", n=records, seed=1)
    texts = (
        [r["text"] for r in tiny_records("text", 5000)]
        if fmt == "text"
        else [r["instruction"] + " " + r["output"] for r in tiny_records("alpaca", 5000)]
    )
    tokenizer = twin.train_tokenizer(texts, vocab_size=2048, max_length=2048)
    size = data.stat().st_size
    settings = Settings(fmt, 128 if fmt == "text" else 256, False, 0.0, 0, max(1 << 16, size // 16), 0, "stat")
    figures = {}
    for workers in (1, 2):
        job = rundata.describe_job(settings, find_files(str(data), fmt), tokenizer, root / f"prepared-{fmt}-{workers}")
        started = time.monotonic()
        found = dataprep._with_local_workers(job, tokenizer, workers, started, lambda event: None)
        seconds = time.monotonic() - started
        figures[workers] = (found["splits"]["train"]["tokens"], seconds)
    import datasets

    datasets.disable_progress_bars()
    if fmt == "text":
        function, kwargs = samples.tokenize_into_blocks, {"tokenizer": tokenizer, "block_len": settings.max_len}
    else:
        function = samples.tokenize_conversations
        kwargs = {"tokenizer": tokenizer, "fmt": fmt, "max_len": settings.max_len}
    mapped = {}
    for procs in (1, 2):
        started = time.monotonic()
        cache = str(root / f"cache-{fmt}-{procs}")
        raw = datasets.load_dataset("json", data_files=[str(data)], split="train", cache_dir=cache)
        rows = raw.map(
            function,
            batched=True,
            batch_size=samples.WINDOW,
            remove_columns=raw.column_names,
            fn_kwargs=kwargs,
            num_proc=procs if procs > 1 else None,
            new_fingerprint=f"bench-{fmt}-{procs}",
        )
        seconds = time.monotonic() - started
        mapped[procs] = (sum(len(ids) for ids in rows["input_ids"]), seconds)
    one, two = (tokens / seconds for tokens, seconds in (figures[1], figures[2]))
    plain, plain2 = (tokens / seconds for tokens, seconds in (mapped[1], mapped[2]))
    print(f"\n{fmt}: {records:,} records, {size / 2**20:.1f} MiB, {figures[1][0]:,} tokens")
    print(f"  prepare, 1 worker     {one:12,.0f} tokens/s  ({figures[1][1]:.1f} s)")
    print(f"  prepare, 2 workers    {two:12,.0f} tokens/s  ({figures[2][1]:.1f} s)")
    print(f"  datasets.map          {plain:12,.0f} tokens/s  ({mapped[1][1]:.1f} s, load_dataset + map, plain)")
    print(f"  datasets.map, 2 procs {plain2:12,.0f} tokens/s  ({mapped[2][1]:.1f} s, num_proc=2)")
    print(f"  2 workers / 1 worker          {two / one:.2f}×   (goal ≥ 1.6)")
    print(f"  2 workers / datasets.map      {two / plain:.2f}×   (goal ≥ 1.0)")
    print(f"  2 workers / map, num_proc=2   {two / plain2:.2f}×   (the same processes on both sides)")


# ----------------------------------------------------------------------------------------- time to first step
def bundle_for(root: Path, data: Path, name: str) -> Path:
    settings = [
        "recipe=tiny_sft",
        "cluster.nodes=1",
        "parallel=ddp",
        f"cluster.mount_path={root}",
        f"cluster.output_dir={root}/{name}-runs",
        f"data.path={data}",
        "train.report_to=[none]",
        "train.max_steps=2",
        "train.save_steps=100",
    ]
    return build(settings, output=root / name, force=True).path


def output_dir(bundle: Path) -> Path:
    return Path(yaml.safe_load((bundle / "recipe.yaml").read_text())["training_arguments"]["output_dir"])


def first_step_s(bundle: Path) -> float:
    """Seconds from starting ``python -m runtime.train`` to its first training log in metrics.jsonl, as on a first
    start: the output directory is emptied first (but for the random twin made ahead, and the shards, which live
    beside it), so the in-process path tokenises again instead of finding its Arrow cache."""
    out = output_dir(bundle)
    for entry in out.iterdir():
        if entry.name != filenames.RANDOM_INIT_DIR:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    metrics = out / filenames.METRICS_FILE
    command = [sys.executable, "-m", TRAIN_MODULE, "--recipe", str(bundle / "recipe.yaml"), "--resume", "none"]
    started = time.monotonic()
    process = subprocess.Popen(
        command, env={**ENV, "PYTHONPATH": str(bundle)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    while not any("loss" in r for r in metricslog.read_records(metrics)):
        if process.poll() is not None:
            raise SystemExit(f"train.py exited {process.returncode}: {process.stderr.read()[-3000:]}")
        time.sleep(0.05)
    seconds = time.monotonic() - started
    process.communicate(timeout=600)
    return seconds


def baseline_runtime(revision: str, bundle: Path) -> bool:
    """Replace the bundle's runtime/ by ``revision``'s; False when git cannot give it."""
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{revision}:src/recipekit/runtime"], cwd=ROOT, capture_output=True, text=True
    )
    if listing.returncode != 0:
        print(f"  (baseline {revision} not available: {listing.stderr.strip()})")
        return False
    shutil.rmtree(bundle / "runtime")
    (bundle / "runtime").mkdir()
    for name in listing.stdout.split():
        if name.endswith(".py"):
            source = subprocess.run(
                ["git", "show", f"{revision}:src/recipekit/runtime/{name}"], cwd=ROOT, capture_output=True, check=True
            )
            (bundle / "runtime" / name).write_bytes(source.stdout)
    return True


def first_steps(root: Path, records: int, revision: str | None, runs: int) -> None:
    bundles: dict[tuple[int, str], Path] = {}
    ahead = {}
    for scale in (1, 10):
        data = write_tiny_dataset("alpaca", root / f"alpaca-{scale}x.jsonl", n=records * scale, seed=2)
        prepared = bundle_for(root, data, f"prepared-{scale}x")
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "runtime.dataprep", "--recipe", str(prepared / "recipe.yaml"), "--workers", "2"],
            env={**ENV, "PYTHONPATH": str(prepared)},
            check=True,
            capture_output=True,
        )
        ahead[scale] = time.monotonic() - started
        bundles[scale, "prepared"] = prepared
        if revision:
            today = bundle_for(root, data, f"inprocess-{scale}x")
            twin = output_dir(prepared) / filenames.RANDOM_INIT_DIR
            shutil.copytree(twin, output_dir(today) / filenames.RANDOM_INIT_DIR)
            if baseline_runtime(revision, today):
                bundles[scale, "in-process"] = today
    best: dict[tuple[int, str], float] = {}
    for _ in range(runs):  # interleaved, so that the machine's load falls on every case alike; best of the runs
        for key, bundle in bundles.items():
            best[key] = min(best.get(key, float("inf")), first_step_s(bundle))
    print(f"\ntime to the first training step (alpaca, train.py, 1 process; 1× = {records:,} records; best of {runs})")
    print(f"  {'':30}{'1×':>10}{'10×':>10}{'10× / 1×':>10}")
    for kind, label in (("prepared", "on prepared shards"), ("in-process", f"in-process ({revision})")):
        if (1, kind) in best:
            one, ten = best[1, kind], best[10, kind]
            goal = "   (goal ≤ 1.2)" if kind == "prepared" else ""
            print(f"  {label:30}{one:9.1f}s{ten:9.1f}s{ten / one:9.2f}×{goal}")
    print(f"  {'prepare ahead, 2 workers':30}{ahead[1]:9.1f}s{ahead[10]:9.1f}s{ahead[10] / ahead[1]:9.2f}×  (once)")


def _burn(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def machine_scaling(n: int = 4_000_000) -> float:
    """This machine's own speed-up from a second process on pure Python work, now: what 2 workers can hope for
    (1.9-2.0 on two idle cores; far less when other work holds them)."""
    import multiprocessing

    started = time.monotonic()
    _burn(n), _burn(n)
    serial = time.monotonic() - started
    started = time.monotonic()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_burn, [n, n])
    return serial / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=10_000, help="records of the 1× corpus (time to first step)")
    parser.add_argument("--throughput-records", type=int, default=40_000, help="records of the throughput corpora")
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the in-process runtime ('' to skip)")
    parser.add_argument("--only", choices=("throughput", "first-step"), default=None)
    parser.add_argument("--runs", type=int, default=3, help="train.py starts per case (the best is shown)")
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-data-"))
    try:
        if options.only in (None, "throughput"):
            print("prepare throughput (tokens/s, one tokenizer thread per process)")
            print(f"this machine's 2-process speed-up on pure Python work, before: {machine_scaling():.2f}×")
            for fmt in ("alpaca", "text"):
                throughput(root, fmt, options.throughput_records)
            print(f"this machine's 2-process speed-up on pure Python work, after: {machine_scaling():.2f}×")
        if options.only in (None, "first-step"):
            first_steps(root, options.records, options.baseline or None, options.runs)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
