"""The planner against training runs whose layout, batch and throughput are published.

Each test builds the published setup as a recipe, gives the planner the published MFU (or the MFU that reproduces a
published throughput) and checks the step, the device-hours and the memory against the publication. MFU here is the
field's: model FLOPs (torch's FLOP counter, no recomputation) over the whole step, bubbles and exposed
communication included (docs/planning.md), so a published MFU must give the published step.
"""

from __future__ import annotations

import functools

import pytest

from recipekit.image.matrix import load_images
from recipekit.memory import advise, estimate
from recipekit.plan.plan import make_plan
from recipekit.recipe.compose import compose
from recipekit.recipe.paralleloptions import load_parallel_options
from recipekit.recipe.sections import parse_recipe
from recipekit.runtime.boundary import flopcount

IMAGES = load_images()
OPTIONS = load_parallel_options()


@functools.cache
def recipe_of(*overrides: str):
    return parse_recipe(compose(list(overrides)).raw)


def estimate_of(*overrides: str):
    recipe = recipe_of(*overrides)
    return estimate(recipe, make_plan(recipe, IMAGES, analysis_only=True))


# ------------------------------------------------------------------------------------------------ Llama 3 405B
#: Llama 3 405B pre-training at 8K (Llama Team, "The Llama 3 Herd of Models", arXiv 2407.21783, §3.3.2 and Table 4):
#: TP 8, CP 1, PP 16, 8,192-token sequences, 16M tokens a batch, BF16. Table 4's two 8K rows: 8,192 GPUs at DP 64
#: (32 sequences per DP rank), 430 TFLOPs/GPU, 43% BF16 MFU; 16,384 GPUs at DP 128 (16 per DP rank), 400 TFLOPs/GPU,
#: 41%. §3.3.2: one layer fewer on the first and the last stage (126 layers: 7, 8 × 14, 7), no activation
#: checkpointing at 8K, FSDP sharding gradients and optimizer states over DP (ZeRO-2's memory), Megatron-style TP
#: (with sequence parallelism).
LLAMA3_405B = (
    "model=llama3.1_405b",
    "mode=pretrain",
    "data=text",
    "hw=h100",
    "data.max_len=8192",
    "train.micro_batch_size=1",
    "train.global_batch_size=2048",  # 2,048 × 8,192 = 16.8M tokens
    "parallel=zero2",
    "parallel.gradient_checkpointing=false",
    "parallel.tensor_parallel=8",
    "parallel.sequence_parallel=true",
    "parallel.pipeline_parallel=16",
    "parallel.first_stage_layers=7",
    "parallel.last_stage_layers=7",
)
#: Table 4's 8K rows: GPUs, DP, TFLOPs/GPU, BF16 MFU.
TABLE_4 = {"8,192 GPUs": (8192, 64, 430, 0.43), "16,384 GPUs": (16384, 128, 400, 0.41)}


@pytest.mark.parametrize("row", sorted(TABLE_4))
def test_llama3_405b_step_at_the_published_mfu_is_the_published_step(row: str) -> None:
    """At Table 4's MFU the step is within 15% of the step its TFLOPs/GPU imply. The paper does not say how it
    counts FLOPs, so the published step is bounded by the two counts in use: 6 × parameters + causal attention
    (6·L·s·h per token, half the dense S×S: NeMo's), and recipekit's (the FLOP counter's dense S×S)."""
    gpus, dp, tflops, mfu = TABLE_4[row]
    est = estimate_of(*LLAMA3_405B, f"cluster.nodes={gpus // 8}", f"hw.assumed_mfu={mfu}")
    assert (est.layout.world_size, est.layout.dp_size) == (gpus, dp)
    assert est.layout.gradient_accumulation_steps == 2048 // dp  # Table 4's batch size per DP rank
    tokens = est.compute.tokens_per_step
    model = est.recipe.model
    six_n = 6 * est.compute.params_total
    causal = six_n + 6 * model.num_layers * 8192 * model.hidden_size
    for flops_per_token in (causal, est.compute.flops_per_token):
        published = tokens * flops_per_token / (gpus * tflops * 1e12)
        assert est.step_time_s == pytest.approx(published, rel=0.15), (flops_per_token, published)
    assert est.compute.mfu == pytest.approx(mfu) and est.compute.attainable
    # the breakdown explains the step, not a second charge: 1F1B's bubble and TP's traffic lie inside it
    assert est.seconds("pipeline bubble") > 0 and est.seconds("TP traffic") > 0
    assert sum(item.seconds for item in est.time) == pytest.approx(est.step_time_s)


@pytest.mark.parametrize("row", sorted(TABLE_4))
def test_llama3_405b_at_tp8_pp16_without_recomputation_fits_80_gib(row: str) -> None:
    """§3.3.2: "we could pre-train Llama 3 on 8K sequences without activation checkpointing". The heaviest stage
    is the second (8 layers, 15 micro-batches in flight under 1F1B), its activations split by TP + SP."""
    gpus = TABLE_4[row][0]
    est = estimate_of(*LLAMA3_405B, f"cluster.nodes={gpus // 8}")
    assert est.fits and est.total_gib <= 80, [(i.name, round(i.gib, 1)) for i in est.memory]
    assert est.parallel3d is not None and est.parallel3d.stage_layers == (7, *[8] * 14, 7)
    assert "15 micro-batches in flight" in next(i.basis for i in est.memory if i.name == "activations")


def test_llama3_405b_without_sequence_parallelism_does_not_fit() -> None:
    """Without SP the norms' and the residuals' activations are whole on every TP rank (Korthikanti et al. 2022,
    s·b·h·(10 + 24/t)): the published layout needs it."""
    assert not estimate_of(*LLAMA3_405B, "cluster.nodes=1024", "parallel.sequence_parallel=false").fits


# ------------------------------------------------------------------------------------------------ DeepSeek-V3
#: DeepSeek-V3 pre-training (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437): 2,048 H800 GPUs, PP 16
#: with the DualPipe schedule (its all-to-all behind the other direction's compute, two copies of the parameters,
#: PP + 1 micro-batches in flight: §3.2.1, Table 2), EP 64 across 8 nodes with node-limited routing (at most 4 nodes
#: a token, §2.1.2, §3.2.2), ZeRO-1 data parallelism, no TP (§3.2); FP8 mixed precision (§3.3); 4K sequences, a batch
#: of 15,360 sequences after the ramp (§4.2); 14.8T tokens, 2.664M H800 GPU-hours of pre-training, 180K GPU-hours
#: per trillion tokens (Table 1, §1). 61 layers: PP 16 with one layer on the first stage (1 + 4 × 15). The report
#: recomputes RMSNorm and the MLA up-projections and keeps activations in FP8 (§3.2.3); recipekit models full
#: recomputation, the nearest it has.
DEEPSEEK_V3 = (
    "model=deepseek_v3",
    "mode=pretrain",
    "data=text",
    "hw=h800",
    "cluster.nodes=256",
    "train.precision=fp8",
    "data.max_len=4096",
    "train.micro_batch_size=1",
    "train.global_batch_size=15360",
    "parallel=distopt",
    "parallel.gradient_checkpointing=true",
    "parallel.pipeline_parallel=16",
    "parallel.first_stage_layers=1",
    "parallel.expert_parallel=64",
    "parallel.pipeline_schedule=dualpipe",
)
DEEPSEEK_TOKENS, DEEPSEEK_GPU_HOURS, DEEPSEEK_HOURS_PER_TRILLION = 14.8e12, 2.664e6, 180e3


def test_deepseek_v3_device_hours_at_the_mfu_of_its_published_throughput() -> None:
    """At the MFU that reproduces the report's throughput (180K H800 GPU-hours per trillion tokens, one step of
    15,360 × 4,096 tokens), 14.8T tokens take the report's 2.664M GPU-hours within 15%."""
    first = estimate_of(*DEEPSEEK_V3, "train.max_steps=1")
    tokens = first.compute.tokens_per_step
    step = tokens * DEEPSEEK_HOURS_PER_TRILLION * 3600 / (1e12 * 2048)  # the published step, ≈ 19.9 s
    mfu = first.compute.flops_per_token * tokens / (step * 2048 * first.compute.peak_tflops * 1e12)
    steps = round(DEEPSEEK_TOKENS / tokens)
    est = estimate_of(*DEEPSEEK_V3, f"train.max_steps={steps}", f"hw.assumed_mfu={mfu:.6f}")
    assert est.compute.peak_tflops == 1979  # FP8 on the H800: NVIDIA's datasheet, dense
    assert est.step_time_s == pytest.approx(step, rel=1e-3) and est.compute.attainable
    assert est.device_hours == pytest.approx(DEEPSEEK_GPU_HOURS, rel=0.15)
    # EP 64 spans 8 nodes: the all-to-all crosses InfiniBand, and DualPipe hides it behind compute
    assert est.experts is not None and est.experts.link == "InfiniBand" and est.experts.alltoall_time_s > 0
    assert est.seconds("EP all-to-all") == 0


def test_deepseek_v3_at_pp16_ep64_fits_an_h800() -> None:
    """Each rank holds 4 of the 256 experts of each of its layers (EP 64) and its stage's dense weights, twice under
    DualPipe; memory counts them where they live, not every expert on every rank."""
    est = estimate_of(*DEEPSEEK_V3)
    assert est.fits, [(i.name, round(i.gib, 1)) for i in est.memory]
    counts = est.recipe.model.params
    assert counts is not None
    per_rank_experts = 2 * counts.experts / 61 * 4 / 64  # a stage of 4 layers, two copies
    assert "of experts: EP 64" in est.memory[0].basis and f"{per_rank_experts / 1e9:.2f} B" in est.memory[0].basis
    assert est.layout.expert_dp_size == 2048 // (64 * 16)


# --------------------------------------------------------------------------------------- NeMo Automodel (MoE)
#: NeMo Automodel's performance summary (docs.nvidia.com/nemo/automodel, "Performance Summary", pre-training, DGX-H100,
#: BF16): Qwen3 MoE 30B on 8 GPUs, GBS 512, MBS 4, GA 16, 4,096 tokens, EP 8, FSDP 8: 21.773 s a global step,
#: 277 model TFLOPs/sec/GPU, 12,040 tokens/sec/GPU. 277 / 12,040 = 23.0 GFLOP a token: NeMo's count takes causal
#: attention as half the dense S×S, recipekit's counter counts it whole (27.9 GFLOP at 4,096).
AUTOMODEL_QWEN3 = (
    "model=qwen3_30b_a3b",
    "mode=pretrain",
    "data=text",
    "hw=h100",
    "cluster.nodes=1",
    "data.max_len=4096",
    "train.micro_batch_size=4",
    "train.global_batch_size=512",
    "parallel=zero3",
    "parallel.expert_parallel=8",
    f"hw.assumed_mfu={277 / 989:.6f}",
)


def test_nemo_automodel_qwen3_moe_step_with_its_mfu_in_its_own_count() -> None:
    """Its MFU (277 / 989 TFLOP/s), stated as NeMo counts (hw.assumed_mfu_attention=causal), gives its step within
    25%; the same number read in recipekit's count would not be the same run's MFU."""
    est = estimate_of(*AUTOMODEL_QWEN3, "hw.assumed_mfu_attention=causal")
    assert est.layout.gradient_accumulation_steps == 16
    assert est.step_time_s == pytest.approx(21.773, rel=0.25)
    flops = est.plan.flops
    causal = flops.model_per_token * flopcount.causal_share(flops.attention_per_token, flops.model_per_token)
    assert causal == pytest.approx(277e12 / 12040, rel=0.01)  # NeMo's FLOPs per token
    assert est.compute.mfu == pytest.approx(277 / 989 * flops.model_per_token / causal, rel=1e-3)
    dense = estimate_of(*AUTOMODEL_QWEN3)  # the causal MFU pasted as if dense: a slower step
    assert dense.step_time_s / est.step_time_s == pytest.approx(flops.model_per_token / causal, rel=1e-3)


# ---------------------------------------------------------------------------------------------------- advise
def test_advise_on_a_1024_card_cluster_proposes_tp_pp_dp_for_a_405b_model() -> None:
    """The seeds' example: 1,024 H100s (128 nodes), a dense 405B model at 8K. Searching Megatron-core's layouts, the
    first advice splits the model over TP inside a node and PP across nodes, data-parallel over the rest; it fits,
    its bubble and its exposed TP traffic are stated, and the Megatron engine builds it."""
    recipe = recipe_of(
        "model=llama3.1_405b",
        "mode=pretrain",
        "data=text",
        "hw=h100",
        "cluster.nodes=128",
        "data.max_len=8192",
        "train.micro_batch_size=1",
        "train.global_batch_size=1024",
    )
    advices = advise(recipe, IMAGES, parallel_options=OPTIONS, search_pp=True)
    best = advices[0].estimate
    lay = best.layout
    assert lay.tensor_parallel > 1 and lay.pipeline_parallel > 1 and lay.dp_size > 1
    assert best.fits and best.parallel3d is not None and best.parallel3d.tp_inside_node
    assert best.parallel3d.bubble_fraction > 0 and best.seconds("pipeline bubble") > 0
    assert best.seconds("TP traffic") > 0
    # the Megatron engine builds it, edge stages of their own length included (126 layers: one on each end)
    assert advices[0].buildable and "engine=megatron" in advices[0].overrides


def test_advise_for_deepseek_v3_on_64_nodes_of_910b_uses_expert_parallelism() -> None:
    """DeepSeek-V3 on 64 × 8 Ascend 910B (64 GB): no layout without EP fits in the first places; the advice splits
    the experts over EP ranks."""
    recipe = recipe_of(
        "model=deepseek_v3",
        "mode=pretrain",
        "data=text",
        "hw=ascend910b",
        "cluster.nodes=64",
        "data.max_len=4096",
        "train.micro_batch_size=1",
        "train.global_batch_size=1024",
    )
    advices = advise(recipe, IMAGES, parallel_options=OPTIONS, search_pp=True)
    assert advices and advices[0].estimate.layout.expert_parallel > 1
    for advice in advices:
        assert advice.estimate.fits and advice.estimate.total_gib <= 64
