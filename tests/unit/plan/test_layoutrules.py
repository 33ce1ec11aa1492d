"""The layout model: Megatron-core's rules (each refusal with its arithmetic), how the groups lie on the hardware,
the schedules' bubbles and micro-batches in flight, and what only Megatron-core builds."""

from __future__ import annotations

import functools

import pytest

from recipekit.base.errors import RecipeError
from recipekit.image.matrix import load_images
from recipekit.memory import estimate
from recipekit.memory.activations import tp_activation_share
from recipekit.memory.pipeline import bubble_fraction, layers_in_flight
from recipekit.plan.layout import Layout
from recipekit.plan.layoutrules import megatron_features, stage_layers
from recipekit.plan.nesting import groups
from recipekit.plan.parallelism import buildable
from recipekit.plan.plan import make_plan
from recipekit.recipe.compose import compose
from recipekit.recipe.sections import parse_recipe

IMAGES = load_images()


@functools.cache
def recipe_of(*overrides: str):
    return parse_recipe(compose(list(overrides)).raw)


def problems_of(*overrides: str, analysis_only: bool = True) -> list[str]:
    try:
        make_plan(recipe_of(*overrides), IMAGES, analysis_only=analysis_only)
    except RecipeError as exc:
        return [str(p) for p in exc.problems]
    return []


# --------------------------------------------------------------------------------------------------- the rules
def test_layers_split_evenly_or_with_uneven_first_and_last_stages():
    """Megatron-core's num_layers_in_first/last_pipeline_stage: the rest split evenly over the middle stages."""
    assert stage_layers(80, Layout(1, 1, pipeline_parallel=4)) == (20, 20, 20, 20)
    assert stage_layers(126, Layout(1, 1, pipeline_parallel=16)) is None
    assert stage_layers(126, Layout(1, 1, pipeline_parallel=16, first_stage_layers=7, last_stage_layers=7)) == (
        7,
        *[8] * 14,
        7,
    )
    assert stage_layers(61, Layout(1, 1, pipeline_parallel=16, first_stage_layers=1)) == (1, *[4] * 15)
    (problem,) = problems_of("model=llama3.1_405b", "cluster.nodes=16", "parallel.pipeline_parallel=16")
    assert "126 layers do not split over PP 16: 126 layers over 16 stages = 7.88" in problem
    assert "parallel.first_stage_layers=7 parallel.last_stage_layers=7" in problem  # the Llama 3 paper's split


def test_virtual_stages_split_every_stage_and_interleaving_runs_micro_batches_in_groups_of_pp():
    base = ("recipe=llama3_70b_sft", "parallel=zero1", "parallel.tensor_parallel=8", "parallel.pipeline_parallel=4")
    (problem,) = problems_of(*base, "parallel.virtual_pipeline_stages=3")
    assert "stages of 20 layers do not split into 3 virtual stages (20 / 3 = 6.67)" in problem
    assert problems_of(*base, "parallel.virtual_pipeline_stages=4") == []  # 64 micro-batches, PP 4
    (problem,) = problems_of(*base, "parallel.virtual_pipeline_stages=4", "train.global_batch_size=6")
    assert "3 micro-batches per step under interleaved 1F1B with PP 4" in problem and "multiple of 4" in problem


def test_heads_sequence_parallelism_and_moe_under_tp():
    (heads,) = problems_of("recipe=qwen2.5_14b_sft", "parallel.tensor_parallel=16", "cluster.nodes=2")
    assert "40 attention heads / 16 = 2.5, 8 key/value heads / 16 = 0.5" in heads
    (sp,) = problems_of("recipe=llama3_8b_sft", "parallel.sequence_parallel=true")
    assert sp.startswith("parallel.sequence_parallel: sequence parallelism with TP 1")
    moe = problems_of("model=qwen3_30b_a3b", "parallel=zero1", "parallel.tensor_parallel=2")
    assert any("Megatron-core refuses MoE layers under tensor parallelism without it" in p for p in moe)


def test_context_parallelism_splits_a_sequence_into_2_cp_chunks():
    (problem,) = problems_of("recipe=llama3_8b_sft", "data.max_len=2004", "parallel.context_parallel=8")
    assert "2004 tokens do not split into 2 × CP 8 = 16 chunks (125.25)" in problem
    assert problems_of("recipe=llama3_8b_sft", "data.max_len=2048", "parallel.context_parallel=8") == []


def test_experts_split_over_ep_and_tile_the_world():
    base = ("model=qwen3_30b_a3b", "parallel=zero1")
    problem, _ = problems_of(*base, "parallel.expert_parallel=3")
    assert "EP 3 does not divide qwen3_30b_a3b's 128 experts (128 / 3 = 42.6667)" in problem
    (problem,) = problems_of(*base, "cluster.nodes=1", "parallel.expert_parallel=16")
    assert "world size 8 is not divisible by expert-TP 1 × EP 16 × PP 1 = 16" in problem
    (dense,) = problems_of("recipe=llama3_8b_sft", "parallel.expert_parallel=2")
    assert "a dense model: it has no experts" in dense


def test_the_parallel_section_refuses_contradictions():
    bad = [
        ("parallel=zero2", "parallel.distributed_optimizer=true"),
        ("parallel.virtual_pipeline_stages=2", "parallel.pipeline_schedule=1f1b"),
        ("parallel.pipeline_schedule=interleaved_1f1b",),
        ("parallel.recompute_granularity=selective", "parallel.gradient_checkpointing=false"),
    ]
    for overrides in bad:
        with pytest.raises(RecipeError):
            recipe_of("recipe=llama3_8b_sft", *overrides)


def test_fp8_needs_hardware_with_fp8():
    """NVIDIA's datasheets give Hopper 1,979 dense FP8 TFLOP/s; the 910B has no FP8."""
    (problem,) = problems_of("recipe=llama3_8b_sft", "train.precision=fp8")
    assert "fp8 requested, but ascend910b has no FP8" in problem
    plan = make_plan(recipe_of("recipe=llama3_8b_sft", "hw=h100", "train.precision=fp8"), IMAGES, analysis_only=True)
    assert plan.flops.peak_tflops == 1979


def test_build_refuses_what_only_megatron_core_runs_and_plan_analyses_it():
    """The bundle's Trainer + DeepSpeed engine does not build SP, CP, virtual stages, the distributed optimizer, FP8
    or selective recomputation (plan.parallelism); plan analyses them."""
    cases = [
        ("parallel.tensor_parallel=2", "parallel.sequence_parallel=true"),
        ("parallel.context_parallel=2",),
        ("parallel=distopt",),
        ("hw=h100", "train.precision=fp8"),
        ("parallel.gradient_checkpointing=true", "parallel.recompute_granularity=selective"),
    ]
    for overrides in cases:
        recipe = recipe_of("recipe=llama3_8b_sft", *overrides)
        plan = make_plan(recipe, IMAGES, analysis_only=True)
        assert megatron_features(recipe, plan.layout) and not buildable(recipe, plan.layout), overrides
        assert any("analysis only" in p for p in problems_of("recipe=llama3_8b_sft", *overrides, analysis_only=False))


# ------------------------------------------------------------------------------------------------ the topology
def test_groups_nest_tp_cp_dp_pp_as_megatron_core_orders_ranks():
    """TP innermost (inside a node), then CP, DP, PP outermost: on 16 × 8 GPUs with TP 8, CP 2, PP 4 the TP group is
    one node, CP pairs two nodes, DP and PP cross the network; a DP ring with one member per node gets its NIC's
    share of the node's network."""
    hw = recipe_of("recipe=llama3_8b_sft", "hw=h100").hw
    lay = Layout(16, 8, tensor_parallel=8, pipeline_parallel=4, context_parallel=2)
    found = groups(lay, hw)
    assert (found["TP"].inside, found["TP"].gbps) == ("node", hw.intra_node_gbps)
    assert found["CP"].span == 16 and found["CP"].crosses_nodes
    assert found["DP"].size == 2 and found["DP"].gbps == hw.inter_node_gbps / 8
    assert found["PP"].span == 128 and found["DP×CP"].size == 4
    ep = groups(Layout(8, 8, expert_parallel=16), hw)
    assert ep["EP"].span == 16 and ep["EP"].alltoall_gbps == hw.inter_node_gbps / 8
    superpod = recipe_of("recipe=llama3_8b_sft", "hw=ascend910_a3_superpod").hw
    assert groups(Layout(8, 16, tensor_parallel=16), superpod)["DP"].inside == "SuperPoD"


# ------------------------------------------------------------------------------------------------ the schedule
def test_bubbles_of_each_schedule():
    """1F1B: (p − 1)/(m + p − 1); interleaved: (p − 1)/(v·m + p − 1) (Narayanan et al. 2021); DualPipe: (p/2 − 1) ×
    2F against 3F a micro-batch (DeepSeek-V3 report, Table 2)."""
    assert bubble_fraction(16, 32) == pytest.approx(15 / 47)
    assert bubble_fraction(16, 32, 4) == pytest.approx(15 / (128 + 15))
    assert bubble_fraction(16, 120, schedule="dualpipe") == pytest.approx(14 / (360 + 14))


def test_micro_batches_in_flight_under_each_schedule():
    """1F1B keeps p − stage micro-batches on a stage (the first: p, the last: 1); interleaved keeps
    L·(1 + (p − 1)/(p·v)) layers' worth on the first (Korthikanti et al. 2022, §4.2.3); DualPipe p + 1."""
    assert layers_in_flight(0, 8, stages=16, micro_batches=32) == 16 * 8
    assert layers_in_flight(15, 8, stages=16, micro_batches=32) == 8
    assert layers_in_flight(0, 20, stages=4, micro_batches=64) == 80
    v = 4
    assert layers_in_flight(0, 20, stages=4, micro_batches=64, virtual_stages=v) == pytest.approx(80 * (1 + 3 / 16))
    assert layers_in_flight(0, 4, stages=16, micro_batches=120, schedule="dualpipe") == 17 * 4
    assert layers_in_flight(0, 8, stages=16, micro_batches=4) == 4 * 8  # never more than the micro-batches


def test_sequence_parallelism_splits_all_of_a_layers_activations():
    """Korthikanti et al. 2022: s·b·h·(10 + 24/t) of 34 without SP, 34/t with it."""
    assert tp_activation_share(8, True) == pytest.approx(1 / 8)
    assert tp_activation_share(8, False) == pytest.approx((10 + 3) / 34)
    base = (
        "recipe=llama3_70b_sft",
        "parallel=zero1",
        "parallel.tensor_parallel=8",
        "parallel.gradient_checkpointing=false",
    )
    recipe = recipe_of(*base)
    without = estimate(recipe, make_plan(recipe, IMAGES, analysis_only=True)).item("activations")
    recipe = recipe_of(*base, "parallel.sequence_parallel=true")
    with_sp = estimate(recipe, make_plan(recipe, IMAGES, analysis_only=True)).item("activations")
    assert with_sp < without * 13 / 34 * 1.05
