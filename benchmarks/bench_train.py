"""What the bundle's train.py costs, and what packing buys, on the tiny twin on this machine's CPU.

Prints, measured side by side in this run (best of N runs each, every run a fresh process):
  1. tokens/s of a bundle's train.py against a minimal hand-written HF Trainer script training the same model
     (the entrypoint's random twin), on the same data, with the same Trainer arguments (goal: ≥ 0.95×);
  2. effective (non-pad) tokens/s of one SFT epoch with packing against padding (micro batch 8, max_len 256), on
     a long-tailed variable-length chat set: 85% tinydata exchanges (20-90 tokens), 15% long ones (170-250)
     (goal: ≥ 2×). About 39% of a padded batch is real tokens on this set, 99% of a packed one, and packed rows
     also need fewer optimizer steps per epoch. The machine's load moves single figures a lot: compare ratios.
Tokens/s is the Trainer's own count (num_input_tokens_seen) over its train_runtime.
Run: .venv/bin/python benchmarks/bench_train.py [--runs 2] [--steps 300] [--only overhead|packing]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import yaml

from recipekit.bundle.build import build
from recipekit.bundle.files import TRAIN_MODULE
from recipekit.validate.dryrun.workdir.tinydata import write_tiny_dataset

LONG_SHARE = 0.15
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}

#: The hand-written baseline: what one would write without recipekit. It takes the entrypoint's Trainer
#: arguments (made CPU-ready the same way) so that both sides do the same work, and prints the Trainer's metrics.
BASELINE = textwrap.dedent("""
    import json, sys
    import yaml
    from datasets import load_dataset
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                              TrainingArguments)

    recipe_yaml, model_dir, data_path, output_dir = sys.argv[1:5]
    settings = yaml.safe_load(open(recipe_yaml))
    args = {**settings["training_arguments"], "output_dir": output_dir, "use_cpu": True, "ddp_backend": None,
            "save_strategy": "no", "report_to": "none"}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    max_len = settings["recipe"]["data"]["max_len"]

    def tokenize(record):
        prompt = record["instruction"] + ("\\n\\n" + record["input"] if record["input"] else "")
        chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": record["output"]}]
        text = tokenizer.apply_chat_template(chat, tokenize=False)
        return tokenizer(text, add_special_tokens=False, truncation=True, max_length=max_len)

    data = load_dataset("json", data_files=data_path, split="train")
    data = data.map(tokenize, remove_columns=data.column_names)
    trainer = Trainer(model=model, args=TrainingArguments(**args), train_dataset=data,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    print(json.dumps(trainer.train().metrics))
""")


def tiny_bundle(root: Path, data: Path, *overrides: str, training_arguments: dict | None = None) -> Path:
    """A built tiny_sft bundle (one CPU process, no DeepSpeed) writing under ``root``."""
    settings = [
        "recipe=tiny_sft",
        "cluster.nodes=1",
        "parallel=ddp",
        f"cluster.mount_path={root}",
        f"cluster.output_dir={root}/runs",
        f"data.path={data}",
        "train.report_to=[none]",
        "train.logging_steps=10",
        *overrides,
    ]
    bundle = build(settings, output=root / "bundle", force=True).path
    if training_arguments:
        recipe_yaml = bundle / "recipe.yaml"
        document = yaml.safe_load(recipe_yaml.read_text())
        document["training_arguments"].update(training_arguments)
        recipe_yaml.write_text(yaml.safe_dump(document))
    return bundle


def output_of(bundle: Path) -> Path:
    return Path(yaml.safe_load((bundle / "recipe.yaml").read_text())["training_arguments"]["output_dir"])


def run_entrypoint(bundle: Path) -> dict:
    """Train from scratch (keeping the random twin) and return the Trainer's final metrics."""
    out = output_of(bundle)
    for checkpoint in out.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", TRAIN_MODULE, "--recipe", str(bundle / "recipe.yaml"), "--resume", "none"],
        env={**ENV, "PYTHONPATH": str(bundle)},  # as run.sh: the bundle's runtime package on the path
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode:
        raise SystemExit(f"train.py failed:\n{result.stderr[-4000:]}")
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(entry for entry in reversed(lines) if "train_runtime" in entry and "loss" not in entry)


def run_baseline(bundle: Path, data: Path, scratch: Path) -> dict:
    script = scratch / "baseline.py"
    script.write_text(BASELINE)
    model_dir = output_of(bundle) / "random-init"
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            str(bundle / "recipe.yaml"),
            str(model_dir),
            str(data),
            str(scratch / "baseline-out"),
        ],
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode:
        raise SystemExit(f"baseline failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def tokens_per_second(metrics: dict) -> float:
    return metrics["num_input_tokens_seen"] / metrics["train_runtime"]


def long_tailed_chat(path: Path, n: int, seed: int = 0) -> Path:
    """Chat samples of which about one in seven is three to five times longer than the rest.

    Real SFT sets are long-tailed like this (most exchanges short, some long); it is where padding to the
    longest sample of a batch wastes the most, and what packing is for.
    """
    short = write_tiny_dataset("messages", path.with_suffix(".short.jsonl"), n=n, seed=seed).read_text().splitlines()
    rng = random.Random(seed)
    lines = []
    for line in short:
        record = json.loads(line)
        if rng.random() < LONG_SHARE:
            words = " ".join(rng.choice(["red", "blue", "green", "cat", "dog"]) for _ in range(rng.randint(80, 120)))
            record["messages"] = [
                {"role": "user", "content": "Repeat these words.\n" + words},
                {"role": "assistant", "content": words},
            ]
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


def compare_overhead(root: Path, runs: int, steps: int) -> None:
    data = write_tiny_dataset("alpaca", root / "data.jsonl", n=256)
    # No checkpoint inside the timed window: the baseline saves none either.
    bundle = tiny_bundle(root, data, f"train.max_steps={steps}", "train.micro_batch_size=4", "train.save_steps=100000")
    entry = baseline = 0.0
    for _ in range(runs):  # interleaved, so drift in machine load hits both sides
        entry = max(entry, tokens_per_second(run_entrypoint(bundle)))
        baseline = max(baseline, tokens_per_second(run_baseline(bundle, data, root)))
    print(f"{'hand-written Trainer script, tokens/s':52} {baseline:10.0f}")
    print(
        f"{'bundle train.py, tokens/s':52} {entry:10.0f}   {entry / baseline:.2f}× (goal ≥ 0.95×: "
        f"{'met' if entry >= 0.95 * baseline else 'NOT met'})"
    )


def compare_packing(root: Path, runs: int) -> None:
    chat = long_tailed_chat(root / "chat.jsonl", n=512)
    rates = {}
    for packing in (False, True):
        bundle = tiny_bundle(
            root / f"packing-{packing}",
            chat,
            "mode=sft",
            "data=chat",
            "data.max_len=256",
            f"data.packing={str(packing).lower()}",
            "train.max_steps=null",
            "train.epochs=1",
            "train.micro_batch_size=8",
            "train.save_steps=100000",
            training_arguments={"include_num_input_tokens_seen": "non_padding"},
        )
        rates[packing] = max(tokens_per_second(run_entrypoint(bundle)) for _ in range(runs))
    ratio = rates[True] / rates[False]
    print(f"{'padding, effective (non-pad) tokens/s':52} {rates[False]:10.0f}")
    print(
        f"{'packing, effective (non-pad) tokens/s':52} {rates[True]:10.0f}   {ratio:.2f}× (goal ≥ 2×: "
        f"{'met' if ratio >= 2 else 'NOT met'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="runs of each case; the best is kept")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps of the overhead comparison")
    parser.add_argument("--only", choices=("overhead", "packing"), help="run one of the two comparisons")
    options = parser.parse_args()
    print(f"best of {options.runs} runs each, OMP_NUM_THREADS={ENV['OMP_NUM_THREADS']}, measured in this run")
    with tempfile.TemporaryDirectory() as tmp:
        if options.only != "packing":
            compare_overhead(Path(tmp) / "overhead", options.runs, options.steps)
        if options.only != "overhead":
            compare_packing(Path(tmp) / "packing", options.runs)


if __name__ == "__main__":
    main()
