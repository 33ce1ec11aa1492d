"""Real training runs of a built bundle's runtime on CPU: the tiny twin through the real Trainer.

Each test builds a bundle with ``bundle.build`` (so runtime/, recipe.yaml and ds_config.json are exactly what a
cluster would get), writes tiny data with ``validate.tinydata`` and runs ``python -m runtime.train`` with the bundle
directory on PYTHONPATH as a subprocess, the way the launcher does (under torchrun for the multi-process cases).
Slow: deselect with ``-m 'not slow'``.
DeepSpeed compiles a CPU communication op on first use (a few minutes, once); it is cached in
~/.cache/recipekit/torch_extensions.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from recipekit.bundle.build import build
from recipekit.bundle.files import TRAIN_MODULE
from recipekit.runtime.boundary import exitcodes, filenames, flopcount, metricslog
from recipekit.runtime.boundary.resume import resumechoice
from recipekit.runtime.volume import trust
from recipekit.validate.dryrun.workdir.extensions import extensions_dir
from recipekit.validate.dryrun.workdir.tinydata import write_tiny_dataset

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 300
#: DeepSpeed's first use compiles its shared-memory op; later runs find it in the dry run's cache. The venv's bin
#: comes first on PATH as in the dry run's pods: a different ninja would make torch rebuild the op every time.
#: The run key a Job mounts from its Secret (docs/trust.md): checkpoints are signed with it and resumed only then.
RUN_KEY = Path(tempfile.mkdtemp(prefix="recipekit-run-key-")) / "key"
RUN_KEY.write_text("test-run-key-" + "0" * 32)
ENV = {
    **os.environ,
    trust.KEY_ENV: str(RUN_KEY),
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TORCH_EXTENSIONS_DIR": str(extensions_dir()),
    "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
}


def make_bundle(root: Path, fmt: str, *overrides: str) -> Path:
    """Build the tiny_sft preset (with ``overrides``) into root/bundle, its data and output under root."""
    data = write_tiny_dataset(fmt, root / ("corpus" if fmt == "text" else "data.jsonl"))
    settings = [
        "recipe=tiny_sft",
        "cluster.nodes=1",
        "parallel=ddp",
        f"cluster.mount_path={root}",
        f"cluster.output_dir={root}/runs",
        f"data.path={data}",
        "train.report_to=[none]",
        *overrides,
    ]
    return build(settings, output=root / "bundle", force=True).path


def recipe_yaml(bundle: Path) -> dict:
    return yaml.safe_load((bundle / "recipe.yaml").read_text())


def output_dir(bundle: Path) -> Path:
    return Path(recipe_yaml(bundle)["training_arguments"]["output_dir"])


def train_command(bundle: Path, *args: str, processes: int = 0) -> list[str]:
    """The bundle's entrypoint: ``python -m runtime.train``, or torchrun ``-m runtime.train`` with ``processes``."""
    entry = ["-m", TRAIN_MODULE, "--recipe", str(bundle / "recipe.yaml"), *args]
    if not processes:
        return [sys.executable, *entry]
    # --standalone: torchrun's agent binds a free port itself (a port picked here and bound later by torchrun could be
    # taken in between by another test's process: EADDRINUSE, seen in a full run)
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc_per_node={processes}"]
    return [sys.executable, *torchrun, *entry]


def bundle_env(bundle: Path) -> dict[str, str]:
    """The environment run.sh gives the launcher: the bundle directory on PYTHONPATH (``runtime`` is a package)."""
    return {**ENV, "PYTHONPATH": str(bundle)}


def run_train(bundle: Path, *args: str, processes: int = 0) -> subprocess.CompletedProcess:
    return subprocess.run(
        train_command(bundle, *args, processes=processes),
        env=bundle_env(bundle),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def terminate_mid_run(bundle: Path, processes: int = 0) -> tuple[int, str]:
    """Start training, send SIGTERM (as the kubelet does) once 3 steps are logged; return exit code and stderr."""
    out = output_dir(bundle)
    process = subprocess.Popen(
        train_command(bundle, processes=processes),
        env=bundle_env(bundle),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not ((out / "metrics.jsonl").exists() and len(training_logs(out)) >= 3):
            assert process.poll() is None and time.monotonic() < deadline, "training never got going"
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        process.kill()
    return process.returncode, stderr


def succeeded(result: subprocess.CompletedProcess) -> bool:
    if result.returncode != 0:
        print(result.stderr[-6000:])
    return result.returncode == 0


def training_logs(out: Path) -> list[dict]:
    """metrics.jsonl's training entries (one per logging step)."""
    return [entry for entry in metricslog.read_records(out / filenames.METRICS_FILE) if "loss" in entry]


def records(out: Path, kind: str) -> list[dict]:
    """metrics.jsonl's structured records of one kind (metricslog.EVENT_*)."""
    return metricslog.events(metricslog.read_records(out / filenames.METRICS_FILE), kind)


def global_step(checkpoint: Path) -> int:
    return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]


# -------------------------------------------------------------------------------------------------- modes
def test_sft_learns_the_tiny_set_and_reports_throughput(tmp_path):
    bundle = make_bundle(
        tmp_path,
        "alpaca",
        "train.max_steps=60",
        "train.learning_rate=3e-3",
        "train.micro_batch_size=4",
        "train.save_steps=30",
        "train.report_to=[tensorboard]",
        "data.eval_fraction=0.125",
    )
    result = run_train(bundle)
    assert succeeded(result)
    out = output_dir(bundle)
    logs = training_logs(out)
    assert [e["step"] for e in logs] == list(range(1, 61))
    first, last = logs[0]["loss"], sum(e["loss"] for e in logs[-20:]) / 20  # 4 samples a step: average the noise
    assert last < 0.5 * first, f"loss {first:.2f} → {last:.2f}"
    assert all(e["tokens_per_second_per_device"] > 0 and 0 < e["mfu"] <= e["hfu"] < 1 for e in logs[1:])
    flops = recipe_yaml(bundle)["plan"]["flops"]
    for entry in logs[1:]:  # one MFU definition: the callback's figure is the contract's, from the plan's numbers
        tokens = entry["tokens_per_second_per_device"]
        expected = flopcount.utilisation(tokens, flops["model_per_token"], flops["peak_tflops"])
        assert entry["mfu"] == pytest.approx(expected, rel=1e-3)
    assert "world size 1 | device cpu | backend gloo | precision bf16 | ZeRO 0" in result.stderr
    (start,) = records(out, metricslog.EVENT_START)
    assert start["run_id"] == recipe_yaml(bundle)["plan"]["run_id"] and start["device"] == "cpu"
    assert start["parameters_total"] == flops["params_total"] == start["parameters_trainable"]
    assert (start["world_size"], start["precision"], start["zero_stage"]) == (1, "bf16", 0)
    assert start["resume_from"] is None and start["resume_step"] is None
    (done,) = records(out, metricslog.EVENT_DONE)
    assert done["step"] == 60 and done["output"] == str(out)
    assert resumechoice.read_run_record(out)["run_id"] == start["run_id"]
    checkpoint_record = resumechoice.read_run_record(out / "checkpoint-30")
    signature = {key: checkpoint_record.pop(key) for key in ("files", "hmac")}
    assert checkpoint_record == {**resumechoice.read_run_record(out), "step": 30}
    assert "model.safetensors" in signature["files"] and signature["hmac"]  # signed with the run key: resumable
    (data,) = records(out, metricslog.EVENT_DATA)  # prepared by this run, eval drawn per sample (about 1/8)
    assert data["train_rows"] + data["eval_rows"] == 64 and 4 <= data["eval_rows"] <= 14 and not data["reused"]
    assert f"{data['train_rows']} train samples, {data['eval_rows']} eval" in result.stderr
    evaluations = [e for e in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval_loss" in e]
    assert [e["step"] for e in evaluations] == [30, 60] and evaluations[-1]["eval_loss"] < first
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert model.config.num_hidden_layers == 2 and tokenizer.chat_template
    assert list(out.glob("runs/**/events.out.tfevents.*")), "TensorBoard wrote nothing"


def test_pretrain_on_a_text_directory(tmp_path):
    bundle = make_bundle(
        tmp_path,
        "text",
        "mode=pretrain",
        "data=text",
        "data.max_len=64",
        "train.max_steps=30",
        "train.learning_rate=3e-3",
        "train.save_steps=30",
    )
    result = run_train(bundle)
    assert succeeded(result)
    logs = training_logs(output_dir(bundle))
    assert len(logs) == 30 and logs[-1]["loss"] < 0.7 * logs[0]["loss"]
    assert "train blocks" in result.stderr and "max_len 64, packing documents concatenated" in result.stderr


def test_lora_with_packing_saves_an_adapter_that_reloads_and_merges(tmp_path):
    from peft import PeftModel

    bundle = make_bundle(
        tmp_path,
        "messages",
        "mode=lora",
        "data=chat",
        "data.max_len=128",
        "data.packing=true",
        "train.max_steps=12",
        "train.learning_rate=1e-2",
        "train.save_steps=12",
        "mode.lora.merge_on_save=true",
        "parallel.gradient_checkpointing=true",
    )
    result = run_train(bundle)
    assert succeeded(result)
    out = output_dir(bundle)
    assert "packed rows" in result.stderr and "trainable of" in result.stderr
    assert (out / "adapter_model.safetensors").exists() and not (out / "model.safetensors").exists()
    base = transformers.AutoModelForCausalLM.from_pretrained(out / "random-init")
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        before = base(input_ids=ids).logits
        adapted = PeftModel.from_pretrained(base, out).eval()
        tuned = adapted(input_ids=ids).logits
        merged = transformers.AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.float32)(
            input_ids=ids
        ).logits
    assert not torch.allclose(before, tuned, atol=1e-3), "the adapter changed nothing"
    assert torch.allclose(tuned, merged, atol=0.05), (tuned - merged).abs().max()  # merged copy is bf16


# ------------------------------------------------------------------------------------------ checkpoints
def test_resume_continues_from_the_contracts_choice_and_refuses_another_run(tmp_path):
    bundle = make_bundle(tmp_path, "alpaca", "train.max_steps=6", "train.save_steps=2")
    assert succeeded(run_train(bundle))
    out, run_id = output_dir(bundle), recipe_yaml(bundle)["plan"]["run_id"]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    cut = out / "checkpoint-6"  # as if the pod died while writing the weights: the Trainer writes its state after
    os.truncate(cut / "model.safetensors", (cut / "model.safetensors").stat().st_size // 2)  # them, the record last
    (cut / "trainer_state.json").unlink()
    (cut / filenames.RUN_FILE).unlink()
    sharded = out / "checkpoint-8"  # a .bin-sharded save cut after its index
    sharded.mkdir()
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"w": "pytorch_model-1.bin"}}))
    expected = resumechoice.resume_choice(out, run_id)
    assert expected.step == 4 and [name for name, _ in expected.skipped] == ["checkpoint-8", "checkpoint-6"]

    result = run_train(bundle, "--resume", "auto")
    assert succeeded(result)
    assert "skipping checkpoint-6: trainer_state.json missing (an interrupted save, never signed)" in result.stderr
    assert "skipping checkpoint-8: trainer_state.json missing (an interrupted save, never signed)" in result.stderr
    assert f"resume from {out / 'checkpoint-4'}" in result.stderr
    start = records(out, metricslog.EVENT_START)[-1]
    assert (start["resume_from"], start["resume_step"]) == (str(expected.path), 4)
    assert [s["checkpoint"] for s in start["skipped"]] == ["checkpoint-8", "checkpoint-6"]
    second_run = [e["step"] for e in training_logs(out)][6:]
    assert second_run == [5, 6] and global_step(out / "checkpoint-6") == 6  # the Trainer was given checkpoint-4

    # resumed from the checkpoint of the last step (as after a SIGTERM at that step): no step past max_steps
    again = run_train(bundle, "--resume", "auto")
    assert succeeded(again) and f"resume from {out / 'checkpoint-6'}" in again.stderr
    assert [e["step"] for e in training_logs(out)][8:] == []
    assert records(out, metricslog.EVENT_DONE)[-1]["step"] == 6 and global_step(out) == 6

    shutil.rmtree(sharded)
    resumechoice.write_run_record(out / "checkpoint-6", resumechoice.run_record("0a0a0a", world_size=1, zero_stage=0))
    refused = run_train(bundle, "--resume", "auto")
    assert refused.returncode == exitcodes.EXIT_USER_ERROR and "Traceback" not in refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    # another run's record carries no signature under this run's key: refused before its run id is even read
    assert last == "train.py: refusing to resume: checkpoint-6 has no signed record: it was not written by this run"


def test_sigterm_saves_a_loadable_checkpoint_and_exits_143(tmp_path):
    bundle = make_bundle(tmp_path, "alpaca", "train.max_steps=100000", "train.save_steps=100000")
    out = output_dir(bundle)
    returncode, stderr = terminate_mid_run(bundle)
    assert returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr
    (checkpoint,) = out.glob("checkpoint-*")
    assert global_step(checkpoint) >= 3 and f"SIGTERM: saved {checkpoint.name}" in stderr
    assert [r["step"] for r in records(out, metricslog.EVENT_PREEMPTED)] == [global_step(checkpoint)]
    assert resumechoice.read_run_record(checkpoint)["step"] == global_step(checkpoint)
    assert not records(out, metricslog.EVENT_DONE)
    assert transformers.AutoModelForCausalLM.from_pretrained(checkpoint).config.num_hidden_layers == 2
    assert not (out / "model.safetensors").exists()  # an interrupted run does not pose as a finished one


def test_bad_data_exits_2_with_one_line(tmp_path):
    bundle = make_bundle(tmp_path, "alpaca")
    data = tmp_path / "data.jsonl"
    lines = data.read_text().splitlines()
    data.write_text("\n".join([*lines[:2], '{"instruction": "x", "output": ', *lines[2:]]) + "\n")
    result = run_train(bundle)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"train.py: data error: {data}:3: not valid JSON")


# ------------------------------------------------------------------------------------------ distributed
def test_two_processes_with_gloo_under_torchrun(tmp_path):
    """Both ranks prepare a share of the data (2 KiB chunks) before the process group forms; a rerun reuses it.
    The cold tier (train.cold_checkpoints): rank 0 runs the command once a checkpoint is final; the copy of step 3
    fails (an alert, training goes on), and the last checkpoint's copy is awaited before the process ends."""
    cold = tmp_path / "cold"
    copy = f"mkdir -p {cold} && test {{step}} != 3 && cp -r {{checkpoint}} {cold}/{{name}}"
    bundle = make_bundle(
        tmp_path, "alpaca", "cluster.nodes=2", "train.max_steps=6", "train.save_steps=3", "data.shard_mib=0.002",
        f'train.cold_checkpoints.command=[sh,-c,"{copy}"]',
    )  # fmt: skip
    result = run_train(bundle, processes=2)
    assert succeeded(result)
    out = output_dir(bundle)
    copies = {r["step"]: r["code"] for r in records(out, metricslog.EVENT_CHECKPOINT_COLD)}
    assert copies == {3: 1, 6: 0}
    assert any(r["alert"] == "checkpoint_cold_failed" and r["step"] == 3 for r in records(out, metricslog.EVENT_ALERT))
    assert sorted(p.name for p in cold.iterdir()) == ["checkpoint-6"]
    # the cold copy is the final checkpoint, its run record included (a restart resumes it once copied back)
    run_file = f"checkpoint-6/{filenames.RUN_FILE}"
    assert (cold / run_file).read_bytes() == (out / run_file).read_bytes()
    assert "world size 2 | device cpu | backend gloo" in result.stderr
    assert "global batch 4 = micro 2 × accumulation 1 × data-parallel 2" in result.stderr
    assert [e["step"] for e in training_logs(out)] == list(range(1, 7))
    assert global_step(out / "checkpoint-6") == 6
    transformers.AutoModelForCausalLM.from_pretrained(out)
    (data,) = records(out, metricslog.EVENT_DATA)
    assert data["workers"] == 2 and data["chunks"] >= 3 and not data["reused"] and data["records"]["read"] == 64
    directory = Path(data["directory"])
    assert directory.parent == tmp_path / "runs" / "prepared" and (directory / "manifest.json").is_file()
    shares = [json.loads((directory / "progress" / f"{rank}.json").read_text())["chunks"] for rank in (0, 1)]
    assert shares == [(data["chunks"] + 1) // 2, data["chunks"] // 2]  # chunks r, r + 2, ... for rank r

    again = run_train(bundle, "--resume", "none", processes=2)
    assert succeeded(again)
    assert records(out, metricslog.EVENT_DATA)[-1]["reused"] is True


def test_sigterm_to_torchrun_stops_every_rank_at_the_same_step(tmp_path):
    bundle = make_bundle(tmp_path, "alpaca", "cluster.nodes=2", "train.max_steps=100000", "train.save_steps=100000")
    out = output_dir(bundle)
    returncode, stderr = terminate_mid_run(bundle, processes=2)
    assert returncode != 0  # torchrun reports the signal; Volcano then restarts the job
    (checkpoint,) = out.glob("checkpoint-*")
    assert f"SIGTERM: saved {checkpoint.name}" in stderr
    assert {p.name for p in checkpoint.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    assert [r["step"] for r in records(out, metricslog.EVENT_PREEMPTED)] == [global_step(checkpoint)]
    assert global_step(checkpoint) == int(checkpoint.name.split("-")[1])


def test_zero2_with_deepspeed_on_cpu(tmp_path):
    bundle = make_bundle(
        tmp_path, "alpaca", "cluster.nodes=2", "parallel=zero2", "train.max_steps=4", "train.save_steps=2"
    )
    assert (bundle / "ds_config.json").exists()
    result = run_train(bundle, processes=2)
    assert succeeded(result)
    out = output_dir(bundle)
    assert "world size 2 | device cpu | backend gloo | precision bf16 | ZeRO 2" in result.stderr
    assert (out / "checkpoint-4" / "global_step4").is_dir()  # DeepSpeed's partitioned optimizer states
    assert global_step(out / "checkpoint-4") == 4
    record = resumechoice.read_run_record(out / "checkpoint-4")
    assert (record["world_size"], record["zero_stage"], record["step"]) == (2, 2, 4)
    (start,) = records(out, metricslog.EVENT_START)  # rank 0 alone writes the records
    assert (start["world_size"], start["zero_stage"]) == (2, 2) and not records(out, metricslog.EVENT_ADAPTED)
    transformers.AutoModelForCausalLM.from_pretrained(out)
