"""The memory and time model under tensor parallelism, against what DeepSpeed AutoTP really builds.

The shapes and the activations come from two real ranks (tests/unit/memory/autotp_probe.py: a gloo group of 2 processes,
``deepspeed.initialize`` with ``tensor_parallel.autotp_size = 2``); the rest is the planner's arithmetic under TP.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from recipekit.image.matrix import load_images
from recipekit.memory import advise, estimate
from recipekit.memory.activations import activation_bytes
from recipekit.memory.formulas import model_states, regime
from recipekit.memory.traffic import tp_allreduce_bytes_per_layer, tp_allreduce_count, tp_head_bytes
from recipekit.plan.modelsize import count_params, tensor_parallel_share
from recipekit.plan.plan import make_plan
from recipekit.recipe.compose import compose
from recipekit.recipe.paralleloptions import load_parallel_options
from recipekit.recipe.sections import ModelSpec, parse_recipe
from recipekit.validate.shared.ports import free_port

PROBE = Path(__file__).with_name("autotp_probe.py")
IMAGES = load_images()
OPTIONS = load_parallel_options()
#: the probe's models (autotp_probe.SHAPE, VOCAB, SEQ, BATCH)
H, INTER, LAYERS, HEADS, KV, VOCAB, SEQ, BATCH = 256, 704, 4, 8, 2, 1000, 96, 2


def spec(family: str, tied: bool) -> ModelSpec:
    return ModelSpec(
        name=f"probe-{family}",
        family=family,
        name_or_path="t",
        num_layers=LAYERS,
        hidden_size=H,
        num_attention_heads=HEADS,
        num_kv_heads=KV,
        intermediate_size=INTER,
        vocab_size=VOCAB,
        max_position_embeddings=1024,
        tie_word_embeddings=tied,
        attention_bias=family == "qwen2",  # Qwen2's q/k/v carry a bias
    )


CASES = {"llama": spec("llama", tied=False), "qwen2-tied": spec("qwen2", tied=True)}


@functools.cache
def recipe_of(*overrides: str):
    return parse_recipe(compose(list(overrides)).raw)


def estimate_of(*overrides: str):
    recipe = recipe_of(*overrides)
    return estimate(recipe, make_plan(recipe, IMAGES, analysis_only=True))


@pytest.fixture(scope="module")
def probe() -> dict:
    """Rank 0's account of AutoTP on two processes (about 30 s of CPU: two imports of deepspeed)."""
    missing = [m for m in ("torch", "transformers", "deepspeed") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")
    port = free_port()
    base = {
        **os.environ,
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    # Each rank writes to a file, not a pipe: reading two pipes one after the other deadlocks once the other rank
    # fills its pipe (DeepSpeed's first build of its CPU ops prints that much) while both wait in a collective.
    with tempfile.TemporaryDirectory() as logs:
        files = [open(Path(logs) / f"rank{rank}.log", "w+", encoding="utf-8") for rank in (0, 1)]  # noqa: SIM115
        procs: list[subprocess.Popen[str]] = []
        try:
            procs += [
                subprocess.Popen(
                    [sys.executable, str(PROBE)],
                    env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    stdout=files[rank],
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for rank in (0, 1)
            ]
            for proc in procs:
                proc.wait(timeout=600)
            outputs = []
            for file in files:
                file.seek(0)
                outputs.append(file.read())
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            for file in files:
                file.close()
    assert all(proc.returncode == 0 for proc in procs), outputs[0][-3000:] + outputs[1][-3000:]
    line = next(line for line in outputs[0].splitlines() if line.startswith("PROBE "))
    return json.loads(line.removeprefix("PROBE "))


# ------------------------------------------------------------------------------------- against AutoTP's shapes
@pytest.mark.parametrize("case", sorted(CASES))
def test_tensor_parallel_share_equals_autotp_parameters(probe, case):
    """Every parameter one rank holds after AutoTP, counted from the architecture numbers alone."""
    assert tensor_parallel_share(CASES[case], 2).total == probe[case]["params"]


def test_autotp_shards_what_the_model_says(probe):
    """Column-parallel q/k/v, gate/up; row-parallel o/down; whole norms; an untied head split over the vocabulary
    next to a whole embedding; a tied pair vocabulary-parallel together."""
    llama, qwen = probe["llama"]["modules"], probe["qwen2-tied"]["modules"]
    assert llama["model.layers.0.self_attn.q_proj"] == ["LinearLayer", [H // 2, H]]
    assert llama["model.layers.0.self_attn.o_proj"] == ["LinearAllreduce", [H, H // 2]]
    assert llama["model.layers.0.mlp.down_proj"] == ["LinearAllreduce", [H, INTER // 2]]
    assert llama["model.layers.0.input_layernorm"][1] == [H]
    assert llama["model.embed_tokens"] == ["Embedding", [VOCAB, H]]
    assert llama["lm_head"] == ["LinearLayer", [VOCAB // 2, H]]
    assert qwen["model.embed_tokens"] == ["VocabParallelEmbedding", [VOCAB // 2, H]]
    assert qwen["lm_head"] == ["VocabParallelLinear", [VOCAB // 2, H]]


@pytest.mark.parametrize("case", sorted(CASES))
def test_activations_under_tp_match_what_autograd_keeps(probe, case):
    """The bytes autograd keeps on one TP rank in DeepSpeed's bf16 model: norms and the column-parallel inputs whole,
    the rest halved; the logits whole for an untied head (gathered), halved for a tied one (vocabulary-parallel)."""
    assert probe[case]["dtype"] == "torch.bfloat16"
    predicted = activation_bytes(
        CASES[case],
        regime("bf16", 1, deepspeed=True),
        micro_batch=BATCH,
        seq_len=SEQ,
        full_training=True,
        checkpointing=False,
        tp=2,
    ).saved
    assert predicted == pytest.approx(probe[case]["saved_bytes"], rel=0.03)


# -------------------------------------------------------------------------------------------- the arithmetic
def test_tp_divides_the_layers_not_the_norms_or_an_untied_embedding():
    llama = recipe_of("recipe=llama3_8b_sft").model
    whole, share = count_params(llama), tensor_parallel_share(llama, 8)
    assert share.per_layer == whole.linear_per_layer // 8 + 2 * llama.hidden_size
    assert share.embedding == whole.embedding and share.head == whole.head // 8
    whole_on_every_rank = whole.embedding + whole.layers * 2 * 4096 + whole.final_norm  # embedding and norms
    assert share.total == whole.total / 8 + whole_on_every_rank * 7 / 8


def test_model_states_under_tp_are_the_share_partitioned_over_dp():
    """ZeRO-2 with TP 2 on 2 × 8 devices: DeepSpeed's counts for the rank's share over the 8 data-parallel ranks."""
    est = estimate_of("recipe=llama3_8b_sft", "parallel=zero2", "parallel.tensor_parallel=2", "cluster.nodes=2")
    share = tensor_parallel_share(recipe_of("recipe=llama3_8b_sft").model, 2).total
    states = model_states(share, regime("bf16", 2, deepspeed=True), dp=8)
    assert est.layout.dp_size == 8 and est.layout.world_size == 16
    assert est.item("weights") * 2**30 == pytest.approx(states.weights)
    assert est.item("gradients") * 2**30 == pytest.approx(states.gradients)
    assert est.item("optimizer states") * 2**30 == pytest.approx(states.optimizer)


def test_tp_at_zero_stage_0_is_deepspeed_not_ddp():
    """parallel=ddp with TP runs DeepSpeed at stage 0 (AutoTP needs it): 16-bit weights, fp32 master, no DDP
    buckets."""
    est = estimate_of("recipe=llama3_8b_sft", "parallel=ddp", "parallel.tensor_parallel=2")
    share = tensor_parallel_share(recipe_of("recipe=llama3_8b_sft").model, 2).total
    assert est.item("weights") * 2**30 == pytest.approx(2 * share)
    assert est.item("gradients") * 2**30 == pytest.approx((2 + 4) * share)
    assert "DDP bucket" not in next(i.basis for i in est.memory if i.name == "gradients")
    assert est.plan.uses_deepspeed and est.plan.zero_stage == 0


def test_autotp_collectives_per_layer():
    """Forward: o_proj and down_proj all-reduce; backward: each of q, k, v, gate, up all-reduces its input gradient;
    recomputation runs the forward's two again."""
    assert tp_allreduce_count(False) == 7 and tp_allreduce_count(True) == 9
    reg = regime("bf16", 1, deepspeed=True)
    one = 2 * (2 - 1) / 2 * 1 * 2048 * 4096 * 2
    assert tp_allreduce_bytes_per_layer(
        reg, tensor_parallel=2, micro_batch=1, seq_len=2048, hidden=4096, checkpointing=False
    ) == pytest.approx(7 * one)
    tied, untied = CASES["qwen2-tied"], CASES["llama"]
    assert tp_head_bytes(reg, tied, tensor_parallel=2, micro_batch=1, seq_len=SEQ) == pytest.approx(
        2 * 2 * (1 / 2) * SEQ * H * 2
    )
    # the untied head gathers its logits: half of them arrive from the other rank
    assert tp_head_bytes(reg, untied, tensor_parallel=2, micro_batch=1, seq_len=SEQ) == pytest.approx(
        (1 / 2) * SEQ * VOCAB * 2 + 2 * (1 / 2) * SEQ * H * 2
    )


def test_three_d_says_whether_the_bundle_runs_it():
    tp = estimate_of("recipe=llama3_8b_sft", "parallel=zero2", "parallel.tensor_parallel=8")
    assert tp.parallel3d.buildable and "DeepSpeed AutoTP" in tp.parallel3d.note
    assert tp.parallel3d.tp_allreduces_per_layer == 9  # the preset checkpoints
    assert tp.parallel3d.tp_time_s > 0 and tp.seconds("TP traffic") == tp.parallel3d.tp_time_s
    pp = estimate_of(
        "recipe=llama3_70b_sft", "parallel=zero1", "parallel.tensor_parallel=8", "parallel.pipeline_parallel=2"
    )
    assert not pp.parallel3d.buildable and pp.parallel3d.note.startswith("analysis only: pipeline parallelism")
    lora = estimate_of("recipe=llama3_8b_lora", "parallel.tensor_parallel=2")
    assert not lora.parallel3d.buildable and "PEFT" in lora.parallel3d.note


# ----------------------------------------------------------------------------------------------------- advise
def test_advise_ranks_layouts_by_what_their_traffic_costs():
    """Qwen2.5 72B on 8 × 8 910B over a 50 GB/s network, 1024-token sequences: the preset's ZeRO-3 cannot hide its
    gathers at its MFU. The fastest layout moves fewer bytes a step, and each is planned at the MFU it reaches with
    the kernels at the preset's utilisation: its pasted overrides give its step. A TP layout's data-parallel rings
    share each node's network (8 / TP members of each ring per node), so TP does not make them faster."""
    recipe = recipe_of("recipe=qwen2.5_72b_sft", "data.max_len=1024", "hw.inter_node_gbps=50")
    advices = advise(recipe, IMAGES, parallel_options=OPTIONS, top=5)
    best = advices[0]
    preset = estimate(recipe, make_plan(recipe, IMAGES, analysis_only=True))
    assert not preset.compute.attainable and best.step_time_s < preset.step_time_s
    assert best.estimate.communication.volume_gb < preset.communication.volume_gb
    assert any(a.estimate.layout.tensor_parallel > 1 for a in advices)
    tp = next(a for a in advices if a.estimate.layout.tensor_parallel > 1)
    ring = tp.estimate.communication
    assert ring.crosses_nodes and ring.bandwidth_gbps == pytest.approx(50 / tp.estimate.layout.tensor_parallel)
    # on the preset's own 200 GB/s network ZeRO-3 hides its gathers and comes first
    fast = advise(recipe_of("recipe=qwen2.5_72b_sft", "data.max_len=1024"), IMAGES, parallel_options=OPTIONS, top=5)
    assert fast[0].estimate.parallel.zero_stage == 3 and fast[0].estimate.layout.tensor_parallel == 1
    assert fast[0].estimate.exposed_s == 0


def test_advise_only_keeps_buildable_layouts_unless_pp_is_searched():
    lora = advise(recipe_of("recipe=llama3_8b_lora"), IMAGES, parallel_options=OPTIONS, top=50)
    assert lora and all(a.buildable and a.estimate.layout.tensor_parallel == 1 for a in lora)
    with_pp = advise(recipe_of("recipe=llama3_70b_sft"), IMAGES, parallel_options=OPTIONS, top=50, search_pp=True)
    # Megatron-core's layouts come with the engine that builds them: each is buildable with it
    megatron = [a for a in with_pp if "engine=megatron" in a.overrides]
    assert megatron and all(a.buildable for a in megatron) and any(a.buildable for a in with_pp)
    for advice in with_pp:
        d = advice.estimate.parallel3d
        if d is not None and d.tensor_parallel > 1:
            assert advice.estimate.parallel.zero_stage <= 2
