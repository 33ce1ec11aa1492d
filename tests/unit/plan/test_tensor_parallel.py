"""Tensor parallelism in the bundle (DeepSpeed AutoTP): the arithmetic, the refusals, the documents, the static
checks and the dry run's work copy. The dry runs themselves are in tests/integration/test_dryrun_tp.py."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import build, resolve
from recipekit.runtime.boundary.common import RunError
from recipekit.runtime.session import arguments
from recipekit.runtime.session.callbacks import ThroughputCallback
from recipekit.validate.dryrun.options import DryRunOptions
from recipekit.validate.dryrun.workdir.substitutions import substitute
from recipekit.validate.shared.loader import load_bundle, rehash_manifest
from recipekit.validate.shared.results import Result, Status
from recipekit.validate.static.checks import run_static
from tests.conftest import documents_of

TP2 = ("recipe=llama3_8b_sft", "parallel=zero2", "parallel.tensor_parallel=2", "cluster.nodes=2")


def problems_of(*overrides: str) -> dict[str, str]:
    with pytest.raises(RecipeError) as info:
        resolve(list(overrides))
    return {p.key: f"{p.message} ({p.hint})" for p in info.value.problems}


# ---------------------------------------------------------------------------------------------- the arithmetic
def test_world_size_is_tp_times_dp_in_every_document() -> None:
    resolved = resolve(list(TP2))
    plan, docs = resolved.plan, documents_of(resolved)
    lay = plan.layout
    assert (lay.world_size, lay.tensor_parallel, lay.dp_size) == (16, 2, 8)
    assert lay.global_batch_size == 128 == lay.micro_batch_size * lay.gradient_accumulation_steps * lay.dp_size
    assert (lay.micro_batch_size, lay.gradient_accumulation_steps) == (2, 8)
    # the Job and the launcher: 2 pods × 8 processes; the Trainer: micro and accumulation per rank
    assert docs.job["spec"]["tasks"][0]["replicas"] == 2 and docs.launch["nproc_per_node"] == 8
    args = docs.engine.recipe_sections["training_arguments"]
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"]) == (2, 8)
    assert plan.summary()["tensor_parallel"] == 2 and plan.summary()["dp_size"] == 8


def test_ds_config_asks_for_autotp_and_gathered_weights_without_a_train_batch_size() -> None:
    ds = documents_of(resolve(list(TP2))).engine.files.get("ds_config.json")
    assert ds["tensor_parallel"] == {"autotp_size": 2}
    assert "train_batch_size" not in ds  # the Trainer would count every TP rank: see documents.deepspeed_config
    assert ds["train_micro_batch_size_per_gpu"] == 2 and ds["gradient_accumulation_steps"] == 8
    assert ds["zero_optimization"]["stage"] == 2
    assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    no_tp = documents_of(resolve(["recipe=llama3_8b_sft", "parallel=zero2", "cluster.nodes=2"])).engine.files.get(
        "ds_config.json"
    )
    assert "tensor_parallel" not in no_tp and no_tp["train_batch_size"] == 128


def test_tp_without_zero_runs_deepspeed_at_stage_0() -> None:
    resolved = resolve(["recipe=llama3_8b_sft", "parallel=ddp", "parallel.tensor_parallel=2"])
    plan, docs = resolved.plan, documents_of(resolved)
    assert plan.uses_deepspeed and plan.zero_stage == 0
    assert (
        docs.engine.files.get("ds_config.json")["zero_optimization"]["stage"] == 0
        and docs.engine.files.get("ds_config.json")["tensor_parallel"]["autotp_size"] == 2
    )
    assert docs.engine.recipe_sections["training_arguments"]["deepspeed"] == "ds_config.json"
    assert docs.env["DS_ACCELERATOR"] == "npu" and any(p.startswith("deepspeed==") for p in docs.pip_packages)
    assert not resolve(["recipe=llama3_8b_sft", "parallel=ddp"]).plan.uses_deepspeed


def test_a_tp_bundle_is_its_own_run() -> None:
    """TP is part of the run identity: a TP bundle never resumes a checkpoint of another layout."""
    tp = resolve(list(TP2)).plan
    plain = resolve(["recipe=llama3_8b_sft", "parallel=zero2", "cluster.nodes=2"]).plan
    assert tp.run_id != plain.run_id and tp.output_dir != plain.output_dir


# ------------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("mode", ["lora", "qlora"])
def test_lora_with_tp_is_refused_with_the_reason(mode: str) -> None:
    problem = problems_of("recipe=llama3_8b_lora", f"mode={mode}", "parallel.tensor_parallel=2", "hw=a100_80g")[
        "parallel.tensor_parallel"
    ]
    assert f"TP 2 with mode {mode}" in problem and "PEFT" in problem and "KeyError" in problem
    assert "mode=sft with TP 2" in problem


def test_zero3_with_tp_is_refused_with_the_reason() -> None:
    problem = problems_of("recipe=llama3_8b_sft", "parallel.tensor_parallel=2")["parallel.zero_stage"]
    assert "ZeRO-3 with TP 2" in problem and "deepspeed.zero.Init" in problem and "parallel=zero1 or zero2" in problem


def test_tp_must_divide_the_devices_of_a_pod() -> None:
    problem = problems_of(
        "recipe=llama3_8b_sft",
        "parallel=zero2",
        "cluster.nodes=2",
        "cluster.devices_per_pod=2",
        "parallel.tensor_parallel=4",
    )["parallel.tensor_parallel"]
    assert "TP 4 does not divide the 2 devices of one pod (a ascend910b node has 8)" in problem
    assert "HCCS" in problem and "RoCE" in problem and "(TP 2)" in problem


def test_tp_must_divide_the_heads_with_the_arithmetic() -> None:
    problem = problems_of("recipe=qwen2.5_7b_pretrain", "parallel.tensor_parallel=8")["parallel.tensor_parallel"]
    assert "28 attention heads / 8 = 3.5, 4 key/value heads / 8 = 0.5" in problem and "(TP 2 or 4)" in problem


def test_tp_must_divide_the_world() -> None:
    problem = problems_of("recipe=llama3_8b_sft", "parallel=zero2", "parallel.tensor_parallel=16")
    assert "world size 8 (nodes 1 × devices per pod 8) is not divisible by TP 16" in problem["parallel.tensor_parallel"]


def test_every_refusal_is_reported_at_once() -> None:
    with pytest.raises(RecipeError) as info:
        resolve(["recipe=llama3_8b_lora", "parallel=zero3", "parallel.tensor_parallel=8", "model=qwen2.5_7b"])
    found = [(p.key, p.message) for p in info.value.problems]
    assert [key for key, _ in found].count("parallel.tensor_parallel") == 2
    assert any(key == "parallel.zero_stage" for key, _ in found)
    assert any("PEFT" in message for _, message in found) and any("heads" in message for _, message in found)


def test_plan_analyses_what_build_refuses() -> None:
    plan = resolve(["recipe=llama3_8b_lora", "parallel.tensor_parallel=2"], analysis_only=True).plan
    assert plan.layout.dp_size == 4


# ------------------------------------------------------------------------------------------- the static checks
@pytest.fixture(scope="module")
def tp_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(list(TP2), tmp_path_factory.mktemp("tp") / "bundle", force=True).path


def _edited(bundle: Path, tmp_path: Path, name: str, change) -> Path:
    copy = shutil.copytree(bundle, tmp_path / "copy")
    path = copy / name
    data = json.loads(path.read_text()) if name.endswith(".json") else yaml.safe_load(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2) if name.endswith(".json") else yaml.safe_dump(data, sort_keys=False))
    rehash_manifest(copy)
    return copy


def test_a_tp_bundle_passes_every_static_check_and_the_libraries(tp_bundle: Path) -> None:
    libraries = all(importlib.util.find_spec(m) for m in ("transformers", "deepspeed"))
    results = {r.id: r for r in run_static(load_bundle(tp_bundle), libraries=libraries)}
    failed = [f"{r.id}: {[str(f) for f in r.findings]}" for r in results.values() if r.failed]
    assert not failed, failed
    assert results["consistency.tensor-parallel"].reason == "TP 2 × DP 8 = world size 16, AutoTP 2, ZeRO-2"
    if libraries:
        assert "world size 16 = TP 2 × DP 8" in results["library.transformers"].reason
        assert "AutoTP 2" in results["library.deepspeed"].reason


@pytest.mark.parametrize(
    "name, change, field, text",
    [
        (
            "ds_config.json",
            lambda d: d["tensor_parallel"].update(autotp_size=4),
            "tensor_parallel.autotp_size",
            "4, but recipe.yaml plan.tensor_parallel = 2",
        ),
        ("ds_config.json", lambda d: d.update(train_batch_size=128), "train_batch_size", "leave it out"),
        (
            "ds_config.json",
            lambda d: d["zero_optimization"].pop("stage3_gather_16bit_weights_on_model_save"),
            "zero_optimization.stage3_gather_16bit_weights_on_model_save",
            "gathers the TP-sliced weights",
        ),
        ("recipe.yaml", lambda d: d["plan"].update(dp_size=16), "plan.dp_size", "TP 2 × DP 16 = 32"),
        ("recipe.yaml", lambda d: d["plan"].update(devices_per_pod=3), "plan.tensor_parallel", "does not divide the 3"),
    ],
    ids=["autotp-size", "train-batch-size", "gather", "dp-size", "pod"],
)
def test_tp_static_check_catches_each_breakage(tp_bundle: Path, tmp_path: Path, name, change, field, text) -> None:
    copy = _edited(tp_bundle, tmp_path, name, change)
    results = {r.id: r for r in run_static(load_bundle(copy), libraries=False)}
    result = results["consistency.tensor-parallel"]
    assert result.status is Status.FAIL
    assert any(f.field == field and text in f.message + f.hint for f in result.findings), result.findings


def test_a_bundle_without_tp_passes_the_tp_check_with_its_reason(tmp_path: Path) -> None:
    bundle = build(["recipe=tiny_sft"], tmp_path / "tiny", force=True).path
    result = next(r for r in run_static(load_bundle(bundle), libraries=False) if r.id == "consistency.tensor-parallel")
    assert result.status is Status.PASS and result.reason.startswith("no tensor parallelism")


def test_the_library_check_counts_the_global_batch_as_the_trainer_does(tp_bundle: Path, tmp_path: Path) -> None:
    """A plan whose global batch counts the TP ranks as data-parallel is what the Trainer would not train."""
    if not all(importlib.util.find_spec(m) for m in ("transformers", "deepspeed")):
        pytest.skip("transformers and deepspeed not installed")
    copy = _edited(tp_bundle, tmp_path, "recipe.yaml", lambda d: d["plan"].update(global_batch_size=256))
    result = next(r for r in run_static(load_bundle(copy), libraries=True) if r.id == "library.transformers")
    assert result.status is Status.FAIL
    assert any(
        "the Trainer counts micro 2 × accumulation 8 × data-parallel 8 (world 16 // TP 2) = 128" in f.message
        for f in result.findings
    ), result.findings


# ------------------------------------------------------------------------------------------ the dry run's copy
def _substituted(tmp_path: Path, *overrides: str, pods: int, procs: int):
    recipe = resolve(list(overrides)).recipe
    options = DryRunOptions(pods=pods, procs_per_pod=procs, steps=8, device="cpu")
    return substitute(recipe, options, tmp_path)


def test_two_pods_of_one_process_carry_tp_across_them_and_say_so(tmp_path: Path) -> None:
    dry, subs = _substituted(tmp_path, *TP2, pods=2, procs=1)
    assert (dry.cluster.nodes, dry.cluster.devices_per_pod, dry.parallel.tensor_parallel) == (2, 1, 2)
    across = next(s for s in subs if s.field == "plan.tensor_parallel")
    assert across.new == "TP 2 across 2 simulated pods" and "every link is local" in across.why
    from recipekit.image.matrix import load_images
    from recipekit.plan.plan import make_plan

    plan = make_plan(dry, load_images(), tp_across_pods=True)
    assert (plan.layout.world_size, plan.layout.dp_size) == (2, 1)
    with pytest.raises(RecipeError, match="does not divide the 1 devices of one pod"):
        make_plan(dry, load_images())


def test_two_pods_of_two_run_tp_inside_each_pod(tmp_path: Path) -> None:
    dry, subs = _substituted(tmp_path, *TP2, pods=2, procs=2)
    assert (dry.cluster.devices_per_pod, dry.hw.devices_per_node) == (2, 2)
    assert not any(s.field == "plan.tensor_parallel" for s in subs)
    assert any(s.field == "recipe.hw.devices_per_node" for s in subs)


def test_the_dry_run_sees_the_same_data_at_the_same_data_parallel_size(tmp_path: Path) -> None:
    """TP 2 on 2 pods and no TP on 1 pod are both one data-parallel rank: same data, so their losses compare."""
    tp, _ = _substituted(tmp_path / "tp", *TP2, pods=2, procs=1)
    plain, _ = _substituted(tmp_path / "plain", "recipe=llama3_8b_sft", "parallel=zero2", pods=1, procs=1)
    assert tp.data.num_samples == plain.data.num_samples
    assert Path(tp.data.path).read_bytes() == Path(plain.data.path).read_bytes()


# ---------------------------------------------------------------------------------------------- the runtime side
def test_a_world_that_tp_does_not_divide_is_one_line() -> None:
    with pytest.raises(RunError, match="world size 3 is not divisible by the plan's tensor-parallel degree 2"):
        arguments.trainer_kwargs(
            {},
            device_kind="cpu",
            bundle_dir=Path("."),
            world_size=3,
            planned_world_size=4,
            launched=True,
            tensor_parallel=2,
        )


def test_throughput_counts_each_token_once_under_tp() -> None:
    """num_input_tokens_seen sums every process's batch; a TP group's ranks share theirs."""
    flops = SimpleNamespace(model_per_token=1e9, hardware_per_token=1e9, peak_tflops=100.0)
    logs: dict = {"loss": 1.0}
    callback = ThroughputCallback.from_plan(flops, world_size=4, replicas=2)
    callback._time -= 1.0  # one second ago
    callback.on_log(None, SimpleNamespace(num_input_tokens_seen=8000), None, logs=logs)
    # 8000 counted = 4000 tokens (each seen by both ranks of its TP group) in 1 s on 4 devices
    assert logs["tokens_per_second_per_device"] == pytest.approx(1000, rel=0.01)


def test_judge_checks_the_tp_degree_train_py_started_with(tmp_path: Path) -> None:
    from recipekit.runtime.boundary import metricslog
    from recipekit.validate.dryrun.cluster.attemptlog import Attempt
    from recipekit.validate.dryrun.judges import training

    attempt = Attempt(number=0, port=29500, started=0.0)
    attempt.records.append(metricslog.event(metricslog.EVENT_START, world_size=2, tensor_parallel=1))
    result = Result("dryrun.train", "t")
    training.judge_start(result, attempt, 2, 2)
    assert result.failed and "started with TP 1, but the work copy plans TP 2" in str(result.findings[0])


def test_the_twin_gets_heads_tp_can_split(tmp_path: Path) -> None:
    """Qwen2.5 72B at TP 8 (8 key/value heads): the Qwen2 twin's 4 and 2 heads become 8 and 8."""
    overrides = ("recipe=qwen2.5_72b_sft", "parallel=zero2", "parallel.tensor_parallel=8")
    dry, subs = _substituted(tmp_path, *overrides, pods=2, procs=4)
    model = dry.model
    assert (model.num_attention_heads, model.num_kv_heads, model.hidden_size) == (8, 8, 64)
    assert any(s.field == "recipe.model.num_kv_heads" and "whole heads" in s.why for s in subs)
    assert model.params is None and model.flops is None and model.activations is None  # measured on its own heads
    small, _ = _substituted(tmp_path / "tp2", *TP2, pods=2, procs=1)
    assert (small.model.num_attention_heads, small.model.num_kv_heads) == (4, 2)  # TP 2 divides the twin's own


def test_a_simulated_world_tp_does_not_divide_is_a_usage_error(tmp_path: Path) -> None:
    from recipekit.validate.dryrun.options import DryRunUsageError

    with pytest.raises(DryRunUsageError, match=r"--pods 2 × --procs-per-pod 1 = 2 processes \(e.g. --pods 2 --procs"):
        _substituted(
            tmp_path, "recipe=qwen2.5_72b_sft", "parallel=zero2", "parallel.tensor_parallel=8", pods=2, procs=1
        )
