"""The plan: every derived number, and every impossible combination reported with its arithmetic."""

from __future__ import annotations

import pytest

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import resolve
from recipekit.recipe.k8snames import k8s_name, task_env_name
from tests.conftest import documents_of


def plan_of(*overrides: str):
    return resolve(list(overrides)).plan


def docs_of(*overrides: str):
    return documents_of(resolve(list(overrides)))


def problems_of(*overrides: str) -> dict[str, str]:
    with pytest.raises(RecipeError) as info:
        resolve(list(overrides))
    return {p.key: f"{p.message} ({p.hint})" for p in info.value.problems}


def test_case_study_two_nodes_of_910b() -> None:
    plan = plan_of("recipe=qwen2.5_14b_sft")
    assert (plan.layout.nodes, plan.layout.devices_per_pod, plan.layout.world_size, plan.layout.dp_size) == (
        2,
        8,
        16,
        16,
    )
    assert (plan.layout.micro_batch_size, plan.layout.gradient_accumulation_steps, plan.layout.global_batch_size) == (
        1,
        4,
        64,
    )
    assert plan.precision == "bf16" and plan.comm_backend == "hccl" and plan.zero_stage == 3


def test_batch_numbers_agree_between_deepspeed_and_trainer() -> None:
    plan = plan_of("recipe=llama3_8b_sft", "cluster.nodes=4")
    docs = docs_of("recipe=llama3_8b_sft", "cluster.nodes=4")
    ds, args = docs.engine.files.get("ds_config.json"), docs.engine.recipe_sections["training_arguments"]
    assert ds["train_micro_batch_size_per_gpu"] == args["per_device_train_batch_size"] == plan.layout.micro_batch_size
    assert ds["gradient_accumulation_steps"] == args["gradient_accumulation_steps"]
    assert (
        ds["train_batch_size"]
        == plan.layout.micro_batch_size * plan.layout.gradient_accumulation_steps * plan.layout.world_size
    )
    assert ds["gradient_clipping"] == args["max_grad_norm"]
    assert ds["bf16"] == {"enabled": True} and args["bf16"] is True and args["fp16"] is False


def test_global_batch_not_divisible_shows_the_arithmetic() -> None:
    found = problems_of("recipe=qwen2.5_14b_sft", "train.global_batch_size=100", "train.micro_batch_size=2")
    message = found["train.global_batch_size"]
    assert "100 is not divisible by micro_batch_size (2) × data-parallel size (16) = 32" in message
    assert "96 or 128" in message


def test_explicit_accumulation_must_agree_with_global_batch() -> None:
    found = problems_of("recipe=qwen2.5_14b_sft", "train.gradient_accumulation_steps=3")
    assert "= 48" in found["train.global_batch_size"]


def test_precision_auto_follows_hardware() -> None:
    assert plan_of("hw=ascend910b").precision == "bf16"
    assert plan_of("hw=h100", "hw.supports_bf16=false").precision == "fp16"
    fp16 = docs_of("hw=h100", "hw.supports_bf16=false", "parallel=zero2").engine.files.get("ds_config.json")["fp16"]
    assert fp16["enabled"] is True and fp16["loss_scale"] == 0  # dynamic loss scaling


def test_unsupported_precision_is_an_error() -> None:
    assert "has no bf16" in problems_of("hw.supports_bf16=false", "train.precision=bf16")["train.precision"]
    assert "cpu has no fp16" in problems_of("hw=cpu", "train.precision=fp16")["train.precision"]


def test_pod_cannot_ask_for_more_devices_than_a_node_has() -> None:
    message = problems_of("cluster.devices_per_pod=16")["cluster.devices_per_pod"]
    assert "16 devices per pod" in message and "has 8" in message


def test_nvme_offload_needs_a_path_and_param_offload_needs_zero3() -> None:
    found = problems_of("parallel=zero3_nvme", "parallel.nvme_path=null", "parallel.zero_stage=2")
    assert "nvme offload without a path" in found["parallel.nvme_path"]
    assert "needs zero_stage 3" in found["parallel.offload_param"]


def test_all_cross_section_problems_reported_together() -> None:
    found = problems_of(
        "mode=pretrain", "data.max_len=100000", "cluster.output_dir=/tmp/out", "train.precision=fp16", "hw=cpu"
    )
    assert {"data.format", "data.max_len", "cluster.output_dir", "train.precision"} <= set(found)


def test_zero3_saves_whole_weights_and_offload_uses_deepspeed_adam() -> None:
    zero = docs_of("recipe=llama3_8b_sft", "parallel=zero3_offload").engine.files.get("ds_config.json")
    assert zero["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert zero["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["optimizer"]["params"]["lr"] == "auto"


def test_ddp_has_no_deepspeed_config() -> None:
    docs = docs_of("parallel=ddp")
    assert (
        docs.engine.files.get("ds_config.json") is None
        and "deepspeed" not in docs.engine.recipe_sections["training_arguments"]
    )


def test_schedule_from_dataset_size() -> None:
    plan = plan_of("recipe=llama3_8b_sft")  # 52002 samples, global 128, 3 epochs, warmup 3%
    assert plan.steps_per_epoch == 407 and plan.total_steps == 1221 and plan.warmup_steps == 37


def test_pipeline_parallel_is_analysed_but_not_built() -> None:
    """(Tensor parallelism builds: tests/unit/plan/test_tensor_parallel.py.)"""
    problem = problems_of("parallel.pipeline_parallel=2")["parallel.pipeline_parallel"]
    assert "analysis only" in problem and "PipelineModule" in problem
    analysed = resolve(["recipe=llama3_70b_sft", "parallel.pipeline_parallel=2"], analysis_only=True).plan
    assert analysed.layout.dp_size == 32 and analysed.layout.world_size == 64


def test_job_names_are_dns_labels_even_for_long_recipe_names() -> None:
    plan = plan_of("name=" + "a" * 80, "cluster.nodes=12")
    longest = f"{plan.job_name}-{plan.task_name}-11"
    assert len(longest) == 63 and k8s_name(longest) == longest


def test_names_for_volcano() -> None:
    assert k8s_name("Qwen2.5_14B SFT") == "qwen2-5-14b-sft"
    assert task_env_name("train-workers") == "TRAIN_WORKERS"


def test_qlora_is_refused_where_the_family_has_no_bitsandbytes_and_pinned_where_it_has() -> None:
    """Decided by the matrix's data (bitsandbytes: null), not by the vendor's name."""
    with pytest.raises(RecipeError) as info:
        plan_of("mode=qlora", "parallel=zero2")
    (problem,) = info.value.problems
    assert problem.key == "mode" and "0.46.1" in problem.message and "bitsandbytes-npu-beta" in problem.message
    assert "bitsandbytes==0.50.2" in docs_of("mode=qlora", "hw=h100", "parallel=zero2").pip_packages


def test_the_image_is_named_after_the_software_stack_not_the_run() -> None:
    """Learning rate, batch, node count and data are run files: one image. A pin the image installs, a system
    package it needs, another family or architecture is another stack: another image."""
    base = plan_of("recipe=llama3_8b_sft").image
    assert base.rsplit("/", 1)[-1].startswith("recipekit-ascend-910b:")
    for same in (
        "train.learning_rate=2e-5",
        "cluster.nodes=4",
        "train.micro_batch_size=2",
        "data.path=/mnt/shared/other.jsonl",
    ):
        assert plan_of("recipe=llama3_8b_sft", same).image == base, same
    assert plan_of("recipe=llama3_8b_lora").image != base  # peft is pinned only for adapters
    assert plan_of("recipe=llama3_8b_sft", "hw=h100").image != base
    assert plan_of("recipe=llama3_8b_sft", "hw.arch=amd64").image != base


def test_checkpoint_on_sigterm_fits_in_the_grace_period() -> None:
    docs = docs_of("recipe=llama3_8b_sft")
    grace = docs.job["spec"]["tasks"][0]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert 0 < int(docs.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) < grace


def test_a_recipe_name_must_start_with_a_letter() -> None:
    """The svc plugin names a Service after the Job, and a Service name is a DNS-1035 label."""
    assert "must match [a-z]" in problems_of("recipe=tiny_sft", "name=1-sft")["name"]
