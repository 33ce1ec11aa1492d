"""The bundle's runtime package, piece by piece, without running the Trainer (the real runs are tests/integration).

The modules are imported as ``recipekit.runtime.*``; a bundle runs the same files as ``runtime.*`` (torchrun
``-m runtime.train`` with the bundle directory on PYTHONPATH), which the subprocess tests here reproduce by copying
the package the way ``recipekit build`` does. The data path has its own file (test_runtime_data.py), the
contract's resume rules too (test_runtime_contract.py).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipekit.base.paths import RUNTIME_DIR
from recipekit.bundle.files import RUNTIME, runtime_files

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from recipekit.runtime.boundary import common, config, exitcodes, filenames, flopcount  # noqa: E402
from recipekit.runtime.boundary.recipeview import LoraView, ModeView, QuantView  # noqa: E402
from recipekit.runtime.boundary.resume import resumechoice  # noqa: E402
from recipekit.runtime.model import loader, twin  # noqa: E402
from recipekit.runtime.ops import device  # noqa: E402
from recipekit.runtime.session import arguments, callbacks, checkpoints  # noqa: E402
from recipekit.runtime.volume import trust  # noqa: E402
from recipekit.validate.shared.ports import free_port  # noqa: E402

GOLDEN = Path(__file__).parents[2] / "golden" / "bundles"
#: What a bundle's image provides; anything else (recipekit above all) would break the bundle.
IMAGE_PACKAGES = {
    "yaml",
    "torch",
    "transformers",
    "datasets",
    "tokenizers",
    "peft",
    "deepspeed",
    "bitsandbytes",
    "torch_npu",
    # datasets' own dependencies, so in every image that has datasets: the shards are numpy memory maps, and
    # Parquet and Arrow inputs are read with pyarrow
    "numpy",
    "pyarrow",
    "prometheus_client",  # the metrics endpoint, pinned in every image family (imported only when serving)
    "lm_eval",  # the benchmark harness: in the images of recipes that evaluate (eval.enabled), imported only then
}


def bundle_runtime(root: Path) -> Path:
    """The runtime package laid out as in a bundle: root/runtime/*.py; root goes on PYTHONPATH."""
    for name, source in runtime_files("trainer").items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, root / name)
    return root


def run_module(root: Path, *args: str, pythonpath: tuple[Path, ...] = (), **env: str) -> subprocess.CompletedProcess:
    """``python -m runtime.train ARGS`` as torchrun starts it in a pod, with only the bundle on PYTHONPATH."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
    environ["PYTHONPATH"] = os.pathsep.join(str(p) for p in (*pythonpath, root))
    return subprocess.run(
        [sys.executable, "-m", f"{RUNTIME}.train", *args],
        cwd=root,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


# ------------------------------------------------------------------------------------------------- packaging
#: What the Megatron engine's image adds for its room (runtime/megatron/): Megatron-Bridge and Megatron-core.
ENGINE_PACKAGES = {"megatron"}
RUNTIME_MODULES = sorted(p for p in RUNTIME_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def _module_parts(path: Path) -> list[str]:
    return list(path.relative_to(RUNTIME_DIR).with_suffix("").parts)


@pytest.mark.parametrize("path", RUNTIME_MODULES, ids=lambda p: p.relative_to(RUNTIME_DIR).as_posix())
def test_every_runtime_module_imports_only_what_the_image_has(path):
    """Each module imports the standard library, the image's packages and runtime modules (relatively, never out of
    the runtime package)."""
    known = {tuple(_module_parts(p)) for p in RUNTIME_MODULES}
    known |= {parts[:-1] for parts in known if parts[-1] == "__init__"}
    package = _module_parts(path)[:-1]
    imported, outside, missing = set(), [], []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level - 1 > len(package):
                outside.append(node.module)
                continue
            base = package[: len(package) - (node.level - 1)]
            targets = [[*base, *node.module.split(".")]] if node.module else [[*base, a.name] for a in node.names]
            missing += [".".join(t) for t in targets if tuple(t) not in known]
    engine = ENGINE_PACKAGES if _module_parts(path)[0] == "megatron" else set()  # the Megatron room's own image
    foreign = imported - IMAGE_PACKAGES - engine - set(sys.stdlib_module_names) - {"__future__"}
    assert not foreign, f"{path.name} imports {foreign}; a bundle's image has only {sorted(IMAGE_PACKAGES)}"
    assert not outside, f"{path.name}: import from outside the runtime package: {outside}"
    assert not missing, f"{path.name} imports {missing}, which are not runtime modules"


def test_the_bundle_entrypoint_imports_no_training_stack_before_the_device_check(tmp_path):
    """transformers probes torch_npu on import; the device check must come first (see runtime/ops/device.py)."""
    root = bundle_runtime(tmp_path)
    probe = f"import sys, {RUNTIME}.train; print(sorted({{'torch', 'transformers', 'datasets'}} & set(sys.modules)))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, env={**env, "PYTHONPATH": str(root)}, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# ----------------------------------------------------------------------------------------------- run config
def test_recipe_yaml_without_its_sections_or_keys_is_a_one_line_error(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("recipe: {}\n")
    with pytest.raises(common.RunError, match="lacks section.*plan, training_arguments, operations"):
        config.load_run_config(path)
    path.write_text("recipe: {name: x, hw: {}}\nplan: {run_id: abc}\ntraining_arguments: {}\noperations: {}\n")
    with pytest.raises(common.RunError, match=r"recipe.yaml: recipe.model is missing: rebuild the bundle"):
        config.load_run_config(path)
    with pytest.raises(common.RunError, match="cannot read recipe"):
        config.load_run_config(tmp_path / "missing.yaml")


def test_a_golden_recipe_yaml_loads_with_what_the_runtime_reads():
    run = config.load_run_config(GOLDEN / "tiny_sft" / "recipe.yaml")
    assert run.recipe.hw.torch_device == "cpu" and run.plan.run_id and run.plan.flops.peak_tflops == 1.0
    assert run.bundle_dir == (GOLDEN / "tiny_sft").resolve()


# ------------------------------------------------------------------------------------------------- device
ASCEND = GOLDEN / "llama3_8b_sft" / "recipe.yaml"
CUDA = GOLDEN / "llama3_8b_lora@a100_80g" / "recipe.yaml"


def test_a_broken_torch_npu_is_one_line_and_exit_2_without_a_traceback(tmp_path):
    root = bundle_runtime(tmp_path / "bundle")
    shutil.copyfile(ASCEND, root / "recipe.yaml")
    fake = tmp_path / "site"
    (fake / "torch_npu").mkdir(parents=True)
    (fake / "torch_npu" / "__init__.py").write_text(
        'raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")\n'
    )
    result = run_module(root, "--recipe", str(root / "recipe.yaml"), pythonpath=(fake,))
    assert result.returncode == exitcodes.EXIT_USER_ERROR, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("train.py: this bundle targets Ascend NPUs (ascend910b) but torch_npu does not load")
    assert "ImportError: libhccl.so: cannot open shared object file" in line
    assert "set_env.sh" in line and "/usr/local/Ascend/driver" in line and "ASCEND_RT_VISIBLE_DEVICES" in line


def test_npu_target_without_a_visible_npu_is_refused(monkeypatch):
    hw = config.load_run_config(ASCEND).recipe.hw
    monkeypatch.setitem(sys.modules, "torch_npu", SimpleNamespace())
    monkeypatch.setattr(
        torch, "npu", SimpleNamespace(is_available=lambda: False, device_count=lambda: 0), raising=False
    )
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "")
    with pytest.raises(device.DeviceError, match="torch_npu sees none: .*ASCEND_RT_VISIBLE_DEVICES=''"):
        device.detect(hw)
    monkeypatch.setattr(torch, "npu", SimpleNamespace(is_available=lambda: True, device_count=lambda: 2))
    assert device.detect(hw) == device.Device("npu", 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(device.DeviceError, match="local rank 3 needs a npu device 3, but 2 are visible"):
        device.detect(hw)


def test_cuda_target_without_cuda_is_refused_and_cpu_is_cpu(monkeypatch):
    hw = config.load_run_config(CUDA).recipe.hw
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(device.DeviceError, match=r"targets CUDA GPUs \(a100_80g\) but torch sees none"):
        device.detect(hw)
    assert device.detect(SimpleNamespace(torch_device="cpu")) == device.Device("cpu", 0)
    with pytest.raises(device.DeviceError, match="expected one of npu, cuda, cpu"):
        device.detect(SimpleNamespace(torch_device="tpu"))


# ---------------------------------------------------------------------------------------------- arguments
def _ds_config(tmp_path: Path) -> None:
    config = {"train_batch_size": 4, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    (tmp_path / "ds_config.json").write_text(json.dumps(config))


def test_the_plans_arguments_are_kept_for_the_target(tmp_path):
    planned = {"ddp_backend": "hccl", "optim": "adamw_torch_npu_fused", "bf16": True}
    kwargs, notes = arguments.trainer_kwargs(
        planned, device_kind="npu", bundle_dir=tmp_path, world_size=8, planned_world_size=8, launched=True
    )
    assert kwargs == planned and notes == []
    cpu, _ = arguments.trainer_kwargs(
        {"ddp_backend": "gloo"},
        device_kind="cpu",
        bundle_dir=tmp_path,
        world_size=2,
        planned_world_size=2,
        launched=True,
    )
    assert cpu == {"ddp_backend": "gloo", "use_cpu": True}


def test_deepspeed_config_is_resolved_next_to_the_recipe_and_follows_a_smaller_world(tmp_path):
    _ds_config(tmp_path)
    planned = {"deepspeed": "ds_config.json", "bf16": True, "ddp_backend": "gloo"}
    kwargs, notes = arguments.trainer_kwargs(
        planned, device_kind="cpu", bundle_dir=tmp_path, world_size=1, planned_world_size=2, launched=False
    )
    assert kwargs["deepspeed"]["train_batch_size"] == "auto" and kwargs["deepspeed"]["bf16"] == {"enabled": True}
    assert kwargs["ddp_backend"] == "gloo"  # DeepSpeed always has a process group
    assert notes == ["world size is 1, the plan's is 2: the global batch follows the world size"]
    same, none = arguments.trainer_kwargs(
        planned, device_kind="cpu", bundle_dir=tmp_path, world_size=2, planned_world_size=2, launched=True
    )
    assert same["deepspeed"]["train_batch_size"] == 4 and none == []
    with pytest.raises(common.RunError, match="DeepSpeed config"):
        arguments.trainer_kwargs(
            {"deepspeed": "nope.json"}, device_kind="cpu", bundle_dir=tmp_path, world_size=1, planned_world_size=1,
            launched=True,
        )  # fmt: skip


def test_a_start_without_torchrun_trains_one_process_and_says_so(tmp_path):
    kwargs, notes = arguments.trainer_kwargs(
        {"ddp_backend": "gloo"}, device_kind="cpu", bundle_dir=tmp_path, world_size=1, planned_world_size=1,
        launched=False,
    )  # fmt: skip
    assert "ddp_backend" not in kwargs and notes == [
        "not started by torchrun: training as one process, without a process group"
    ]


def test_deepspeed_without_torchrun_gets_a_single_process_rendezvous(monkeypatch):
    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DS_ACCELERATOR", "npu")
    from recipekit.runtime.session import distributed

    notes: list[str] = []
    distributed.prepare_environment(True, "cpu", notes)
    assert os.environ["DS_ACCELERATOR"] == "cpu" and os.environ["WORLD_SIZE"] == "1" and os.environ["MASTER_PORT"]
    assert notes == [
        "DS_ACCELERATOR=npu but this bundle targets cpu: using cpu",
        "not started by torchrun: running DeepSpeed as a single process",
    ]


def test_weights_are_half_precision_only_where_a_master_copy_exists():
    assert loader.weight_dtype("bf16", "sft", deepspeed=False) is torch.float32  # AMP keeps no master copy
    assert loader.weight_dtype("bf16", "sft", deepspeed=True) is torch.bfloat16
    assert loader.weight_dtype("fp16", "lora", deepspeed=False) is torch.float16  # frozen base
    assert loader.weight_dtype("fp32", "lora", deepspeed=True) is torch.float32


def test_qlora_falls_back_to_lora_where_4bit_cannot_load_and_says_so(caplog):
    lora = LoraView(r=8, alpha=16, dropout=0.0, target_modules="all-linear", merge_on_save=False)
    qlora = ModeView(kind="qlora", lora=lora, quant=QuantView(quant_type="nf4", double_quant=True))
    caplog.set_level("INFO", logger="train")
    assert loader.quantization_config(qlora, "cpu", torch.bfloat16) is None
    assert "training plain LoRA" in caplog.text
    assert loader.quantization_config(ModeView(kind="lora", lora=lora), "cuda", None) is None


# -------------------------------------------------------------------------------------------- checkpoints
def _checkpoint(root: Path, step: int, run_id: str | None = "abc123", *, weights: bool = True) -> Path:
    from safetensors.torch import save_file

    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if weights:
        save_file({"w": torch.ones(64, 64)}, str(path / "model.safetensors"))
    if run_id:
        _sign(path, step, run_id)
    return path


def _sign(path: Path, step: int, run_id: str = "abc123") -> None:
    record = resumechoice.run_record(run_id, world_size=1, zero_stage=0, step=step)
    record = trust.sign(record, RUN_KEY, trust.digests(path, frozenset({filenames.RUN_FILE})))
    resumechoice.write_run_record(path, record)


#: The run key (docs/trust.md): what the Job's Secret holds, here a file the tests point RECIPEKIT_RUN_KEY_FILE at.
RUN_KEY = b"unit-test-run-key-" + b"0" * 32


def test_resume_logs_what_it_skips_and_refuses_another_runs_checkpoint(tmp_path, caplog, monkeypatch):
    key = tmp_path.parent / f"{tmp_path.name}.key"
    key.write_bytes(RUN_KEY)
    monkeypatch.setenv(trust.KEY_ENV, str(key))
    _checkpoint(tmp_path, 2)
    truncated = _checkpoint(tmp_path, 4, run_id=None)
    os.truncate(truncated / "model.safetensors", 5000)
    _sign(truncated, 4)  # signed as it is (a save that wrote a short file): proven, then found incomplete
    _checkpoint(tmp_path, 6, weights=False)
    caplog.set_level("INFO", logger="train")
    choice = checkpoints.choose_resume(tmp_path, "auto", "abc123", resumechoice.WorldLayout(1, 0))
    assert choice.path == tmp_path / "checkpoint-2" and choice.step == 2
    assert "skipping checkpoint-6: no model weights" in caplog.text
    assert "skipping checkpoint-4: model.safetensors truncated" in caplog.text
    _checkpoint(tmp_path, 8, run_id="fff000")
    with pytest.raises(
        common.RunError, match="checkpoint-8 belongs to run 'fff000'.*not to this bundle's run 'abc123'"
    ):
        checkpoints.choose_resume(tmp_path, "auto", "abc123", resumechoice.WorldLayout(1, 0))
    os.truncate(tmp_path / "checkpoint-8" / "model.safetensors", 5000)  # changed after signing: refused, not skipped
    with pytest.raises(common.RunError, match="refusing to resume: checkpoint-8: model.safetensors was changed"):
        checkpoints.choose_resume(tmp_path, "auto", "abc123", resumechoice.WorldLayout(1, 0))


def test_every_saved_checkpoint_gets_the_signed_run_record(tmp_path):
    record = resumechoice.run_record("abc123", world_size=2, zero_stage=2, recipe="tiny_sft")
    callback = checkpoints.RunRecordCallback(record, RUN_KEY)
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text("{}")
    args = SimpleNamespace(output_dir=str(tmp_path))
    callback.on_save(args, SimpleNamespace(global_step=4, is_world_process_zero=False), None)
    assert resumechoice.read_run_record(tmp_path / "checkpoint-4") is None  # rank 0 writes it
    callback.on_save(args, SimpleNamespace(global_step=4, is_world_process_zero=True), None)
    written = resumechoice.read_run_record(tmp_path / "checkpoint-4")
    assert {k: written[k] for k in record} == record and written["step"] == 4
    assert list(written["files"]) == ["trainer_state.json"]
    trust.verify_directory(tmp_path / "checkpoint-4", written, RUN_KEY, frozenset({filenames.RUN_FILE}), "c")
    unsigned = checkpoints.RunRecordCallback(record, None)  # a run started by hand, without the Secret
    unsigned.on_save(args, SimpleNamespace(global_step=4, is_world_process_zero=True), None)
    assert "hmac" not in resumechoice.read_run_record(tmp_path / "checkpoint-4")


# -------------------------------------------------------------------------------------------- throughput
@pytest.fixture(scope="module")
def tiny_sft():
    from recipekit.bundle.build import resolve

    return resolve(["recipe=tiny_sft"])


def test_the_plans_parameter_count_is_the_live_twins(tiny_sft):
    tokenizer = twin.train_tokenizer(["the red fox jumps over 1 2 3"] * 20, 512, 512)
    live = twin.random_model(tiny_sft.recipe.model, tokenizer)
    trainable, total = loader.parameter_counts(live)
    assert total == trainable == tiny_sft.plan.flops.params_total == tiny_sft.plan.flops.params_trainable


def test_the_plans_lora_parameter_count_is_the_live_adapters():
    from peft import LoraConfig, get_peft_model

    from recipekit.bundle.build import resolve

    resolved = resolve(["recipe=tiny_sft", "mode=lora"])
    lora, flops = resolved.recipe.mode.lora, resolved.plan.flops
    tokenizer = twin.train_tokenizer(["the red fox jumps over 1 2 3"] * 20, 512, 512)
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=lora.target_modules, task_type="CAUSAL_LM")
    live = get_peft_model(twin.random_model(resolved.recipe.model, tokenizer), config)
    trainable, total = loader.parameter_counts(live)
    assert trainable == flops.params_trainable and total - trainable == flops.params_total  # adapters come on top


def test_throughput_reports_mfu_and_hfu_with_the_plans_flops(tiny_sft, monkeypatch):
    flops = tiny_sft.plan.flops
    clock = [100.0]
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    callback = callbacks.ThroughputCallback.from_plan(flops, world_size=2)
    state = SimpleNamespace(num_input_tokens_seen=1000)
    callback.on_train_begin(None, state, None)
    clock[0], state.num_input_tokens_seen = 102.0, 9000  # 8000 tokens in 2 s on 2 devices
    logs = {"loss": 1.0}
    callback.on_log(None, state, None, logs=logs)
    assert logs["tokens_per_second_per_device"] == 2000.0
    assert logs["tflops_per_device"] == pytest.approx(2000 * flops.model_per_token / 1e12, abs=1e-4)
    assert logs["mfu"] == pytest.approx(flopcount.utilisation(2000, flops.model_per_token, flops.peak_tflops), rel=1e-5)
    assert logs["hfu"] == pytest.approx(
        flopcount.utilisation(2000, flops.hardware_per_token, flops.peak_tflops), rel=1e-5
    )
    assert logs["hfu"] > logs["mfu"]  # tiny_sft checkpoints activations: the hardware recomputes the forward pass
    summary = {"train_runtime": 3.0}
    callback.on_log(None, state, None, logs=summary)
    assert summary == {"train_runtime": 3.0}


def test_sigterm_requests_a_checkpoint_and_a_stop():
    from transformers import TrainerControl

    callback = callbacks.PreemptionCallback()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        callback.install()
        control = TrainerControl()
        callback.on_step_end(SimpleNamespace(device="cpu"), SimpleNamespace(global_step=6), control)
        assert not control.should_save and not control.should_training_stop
        os.kill(os.getpid(), signal.SIGTERM)
        callback.on_step_end(SimpleNamespace(device="cpu"), SimpleNamespace(global_step=7), control)
        assert control.should_save and control.should_training_stop and callback.stopped_at == 7
    finally:
        signal.signal(signal.SIGTERM, previous)


_LEAVE_SCRIPT = f"""
import os, time
import torch.distributed as dist
from {RUNTIME}.session import distributed
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(1.5)  # the slow rank, still busy after rank 0 is done
start = time.monotonic()
distributed.leave_process_group()
print(f"rank {{os.environ['RANK']}} waited {{time.monotonic() - start:.2f}} initialized={{dist.is_initialized()}}")
"""


@pytest.mark.slow
def test_no_rank_leaves_the_process_group_before_the_others(tmp_path: Path) -> None:
    """A rank that finishes first waits for the slow one, then all tear the group down (no SIGABRT on the slow one)."""
    root = bundle_runtime(tmp_path)
    script = tmp_path / "leave.py"
    script.write_text(_LEAVE_SCRIPT)
    port = free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    env["PYTHONPATH"] = str(root)
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={**env, "RANK": str(rank), "LOCAL_RANK": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [process.communicate(timeout=120) for process in ranks]
    assert [process.returncode for process in ranks] == [0, 0], outputs
    waited = {line.split()[1]: line for out, _ in outputs for line in out.splitlines() if line.startswith("rank")}
    assert float(waited["0"].split()[3]) >= 1.0 and "initialized=False" in waited["0"], waited
    assert "initialized=False" in waited["1"], waited


def test_the_process_ends_with_its_code_and_everything_it_said(tmp_path: Path) -> None:
    """train.py ends without the interpreter's finalization (``exit_now``), yet a pipe still gets the buffered
    output and the log's last record, and the exit status is the run's code."""
    root = bundle_runtime(tmp_path)
    script = (
        "import logging, sys\n"
        "from runtime.train import exit_now\n"
        "logging.basicConfig(stream=sys.stderr, format='%(message)s')\n"
        "sys.stdout.write('buffered on stdout')\n"
        "logging.getLogger('runtime').warning('the last record')\n"
        "exit_now(17)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True
    )
    assert done.returncode == 17, done.stderr
    assert done.stdout == "buffered on stdout" and "the last record" in done.stderr


def test_lora_targets_the_model_lacks_are_a_user_error_not_a_retry():
    """Issue 41: Phi-4's attention is one fused qkv_proj; PEFT's ValueError for [q_proj, v_proj] exited 1, which the
    Job restarts up to maxRetry times. It is the recipe's mistake: a RunError (exit 2, TerminateJob) naming the
    modules the model has. Targets PEFT finds are adapted as before."""
    from peft import LoraConfig
    from transformers import Phi3Config, Phi3ForCausalLM

    small = Phi3Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    targets = ["q_proj", "v_proj"]
    with pytest.raises(common.RunError) as refused:
        loader.adapted(Phi3ForCausalLM(small), LoraConfig(r=2, target_modules=targets), targets)
    message = str(refused.value)
    assert "q_proj" in message and "qkv_proj" in message and "gate_up_proj" in message and "\n" not in message
    assert exitcodes.exit_code_policies()[0] == {"exitCode": exitcodes.EXIT_USER_ERROR, "action": "TerminateJob"}
    fused = loader.adapted(Phi3ForCausalLM(small), LoraConfig(r=2, target_modules=["qkv_proj"]), ["qkv_proj"])
    assert any("qkv_proj.lora_A" in name for name, _ in fused.named_parameters())


def test_an_elastic_world_keeps_the_global_batch_with_the_plans_accumulation(tmp_path):
    """plan.elastic lists world 1 with accumulation 2: the Trainer and the DeepSpeed config both get 2, and the
    config's global batch stays the plan's (the Trainer refuses a config whose accumulation differs from its own)."""
    config = {"train_batch_size": 4, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}
    (tmp_path / "ds_config.json").write_text(json.dumps(config))
    planned = {"deepspeed": "ds_config.json", "gradient_accumulation_steps": 1, "ddp_backend": "gloo"}
    kwargs, notes = arguments.trainer_kwargs(
        planned, device_kind="cpu", bundle_dir=tmp_path, world_size=1, planned_world_size=2, launched=True,
        elastic_steps=2,
    )  # fmt: skip
    assert kwargs["gradient_accumulation_steps"] == 2
    assert kwargs["deepspeed"]["train_batch_size"] == 4 and kwargs["deepspeed"]["gradient_accumulation_steps"] == 2
    assert notes == ["elastic: world size 1 of the plan's 2: accumulation 2 keeps the global batch"]


def test_the_elastic_table_is_read_typed() -> None:
    from recipekit.runtime.boundary.recipeview import RunPlan, elastic_accumulation

    def plan(elastic):
        flops = {"model_per_token": 1.0, "hardware_per_token": 1.0, "peak_tflops": 1.0}
        return RunPlan("j", "r", "/p", 2, 4, 1, 0, "gloo", flops, elastic)  # type: ignore[arg-type]

    table = {"accumulation": [{"world_size": 1, "gradient_accumulation_steps": 2}]}
    assert elastic_accumulation(plan(table), 1) == 2 and elastic_accumulation(plan(table), 3) is None
    assert elastic_accumulation(plan(None), 1) is None
    for bad in ({"accumulation": "x"}, {"accumulation": [{"world_size": 1, "gradient_accumulation_steps": True}]},
                {"accumulation": [{"world_size": 1, "gradient_accumulation_steps": 0}]}, [1]):  # fmt: skip
        assert elastic_accumulation(plan(bad), 1) is None
