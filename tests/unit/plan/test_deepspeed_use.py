"""One answer to "does this bundle run DeepSpeed?": tensor parallelism at ZeRO-0 does (AutoTP), so its image pins,
preflight's version check and its checkpoint sizes follow DeepSpeed, not plain DDP."""

from __future__ import annotations

from recipekit.bundle.build import resolve
from recipekit.memory.operations import checkpoint_sizes, expected_versions
from tests.conftest import documents_of

TP_ZERO0 = ["recipe=llama3_8b_sft", "hw=h100", "parallel=ddp", "parallel.tensor_parallel=2"]
GB = 10**9


def test_tensor_parallel_at_zero0_runs_deepspeed_everywhere() -> None:
    resolved = resolve(TP_ZERO0)
    plan = resolved.plan
    assert plan.zero_stage == 0 and plan.layout.tensor_parallel == 2 and plan.uses_deepspeed
    assert documents_of(resolved).engine.files.get("ds_config.json") is not None
    assert "deepspeed" in expected_versions(resolved.recipe, plan)


def test_tensor_parallel_at_zero0_checkpoints_at_deepspeed_widths() -> None:
    # Llama 3 8B (8.03e9 parameters) under DeepSpeed's bf16 optimizer: 2-byte weights + 4-byte master + 8 bytes of
    # Adam moments = 14 bytes a parameter (112 GB), not DDP's fp32 weights + moments = 12 (96 GB).
    resolved = resolve(TP_ZERO0)
    checkpoint, final = checkpoint_sizes(resolved.recipe, resolved.plan)
    params = resolved.plan.flops.params_total
    assert checkpoint == 14 * params and round(checkpoint / GB) == 112
    assert final == 2 * params


def test_plain_ddp_keeps_ddp_widths_and_no_deepspeed_pin() -> None:
    resolved = resolve(["recipe=llama3_8b_sft", "hw=h100", "parallel=ddp"])
    assert not resolved.plan.uses_deepspeed and documents_of(resolved).engine.files.get("ds_config.json") is None
    assert "deepspeed" not in expected_versions(resolved.recipe, resolved.plan)
    checkpoint, _ = checkpoint_sizes(resolved.recipe, resolved.plan)
    assert checkpoint == 12 * resolved.plan.flops.params_total


def test_the_adapter_modes_are_one_list() -> None:
    """The runtime's ADAPTER_MODES and the recipe's adapter-training mode sections name the same modes."""
    from typing import get_args

    from recipekit.recipe.schema import field_types, sections_in
    from recipekit.recipe.sections import ModeSpec, adapter_of
    from recipekit.runtime.boundary import recipeview

    modes = sections_in(ModeSpec)
    with_adapter = {get_args(field_types(mode)["kind"])[0] for mode in modes if "lora" in field_types(mode)}
    assert with_adapter == set(recipeview.ADAPTER_MODES)
    assert adapter_of(resolve(["recipe=tiny_sft"]).recipe.mode) is None
    assert adapter_of(resolve(["recipe=tiny_sft", "mode=lora"]).recipe.mode) is not None
