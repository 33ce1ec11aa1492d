"""The training-engine seam: each engine is a room of its own (its plan rules, its documents, its runtime files),
and the Megatron engine's document is the one its room reads (runtime/boundary/megatronview.py)."""

from __future__ import annotations

import pytest
import yaml

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import resolve
from recipekit.bundle.engines import ENGINES as BUNDLE_ENGINES
from recipekit.bundle.files import LAUNCH, RECIPE
from recipekit.plan.engines import ENGINES as PLAN_ENGINES
from recipekit.recipe.compose import group_options
from recipekit.runtime.boundary.megatronview import check_world, read_megatron
from tests.conftest import render_files

MEGATRON = ("engine=megatron", "parallel=distopt")


def test_every_engine_option_has_a_room_in_each_stage() -> None:
    """An engine is an option file, one class in plan/engines and one in bundle/engines: discovered from disk."""
    options = set(group_options("engine"))
    assert options == set(PLAN_ENGINES) == set(BUNDLE_ENGINES)


def _megatron_document(*overrides: str) -> tuple[dict, dict]:
    files = render_files([*MEGATRON, *overrides], allow_oom=True)
    recipe = yaml.safe_load(files[RECIPE])
    return recipe["megatron"], recipe["plan"]


def test_trainer_bundles_ship_no_megatron_room_and_megatron_bundles_start_it() -> None:
    trainer = render_files(["recipe=tiny_sft"])
    assert not any(n.startswith("runtime/megatron/") or n.endswith("megatronview.py") for n in trainer)
    megatron = render_files(["recipe=tiny_sft", *MEGATRON])
    assert "runtime/megatron/train.py" in megatron and "runtime/boundary/megatronview.py" in megatron
    assert b"runtime.megatron.train" in megatron[LAUNCH] and "ds_config.json" not in megatron
    assert "training_arguments" not in yaml.safe_load(megatron[RECIPE])


@pytest.mark.parametrize(
    "overrides",
    [
        ("recipe=llama3_8b_sft", "parallel.tensor_parallel=4", "parallel.pipeline_parallel=2"),
        (
            "recipe=llama3_70b_sft",
            "cluster.nodes=4",
            "parallel.tensor_parallel=4",
            "parallel.sequence_parallel=true",
            "parallel.pipeline_parallel=8",
            "parallel.virtual_pipeline_stages=2",
            "train.micro_batch_size=1",
        ),
        ("recipe=qwen3_30b_a3b_lora", "parallel.expert_parallel=4", "mode.lora.dropout=0"),
        ("model=llama3_8b", "mode=pretrain", "data=text", "parallel.context_parallel=2", "data.max_len=8192"),
    ],
    ids=["tp-pp", "tp-sp-pp-vpp", "moe-ep-lora", "cp"],
)
def test_the_document_is_what_the_room_reads(overrides: tuple[str, ...]) -> None:
    """Every layout's document passes the room's own reader and its world check at the plan's world size."""
    raw, plan = _megatron_document(*overrides)
    doc = read_megatron(raw)
    assert check_world(doc, plan["world_size"]) == []
    model = doc.sections["model"]
    assert model["tensor_model_parallel_size"] == plan["tensor_parallel"]
    assert model["pipeline_model_parallel_size"] == plan["pipeline_parallel"]
    assert doc.get("train", "global_batch_size") == plan["global_batch_size"]
    assert doc.get("optimizer", "use_distributed_optimizer") is True


def test_lora_targets_become_megatrons_fused_projections() -> None:
    raw, _ = _megatron_document("recipe=llama3_8b_lora", "mode.lora.target_modules=[q_proj,k_proj,v_proj,o_proj]")
    assert raw["peft"]["target_modules"] == ["linear_qkv", "linear_proj"]
    with pytest.raises(RecipeError, match="one fused linear_qkv"):
        resolve(["recipe=llama3_8b_lora", *MEGATRON, "mode.lora.target_modules=[q_proj,v_proj]"])


def test_deepspeeds_zero_is_refused_with_the_distributed_optimizer_named() -> None:
    with pytest.raises(RecipeError) as info:
        resolve(["recipe=llama3_8b_sft", "engine=megatron"])
    assert "parallel=distopt" in str(info.value) and "parallel.zero_stage" in str(info.value)
