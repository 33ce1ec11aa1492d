"""recipekit.memory and bundle.report: the estimators against published sizes, DeepSpeed's own estimators and the
tensors PyTorch actually keeps; fit/no-fit on known cases; fixes that, applied, fit; stable JSON."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))

from recipekit import memory  # noqa: E402
from recipekit.bundle.planview import estimate_dict, estimate_markdown, render_advice, render_estimate  # noqa: E402
from recipekit.image.matrix import load_images  # noqa: E402
from recipekit.memory import (  # noqa: E402
    GIB,
    activation_bytes,
    activations,
    bubble_fraction,
    estimate,
    fit_problem,
    fixes,
    formulas,
    model_states,
    regime,
    tp_inside_node,
)
from recipekit.plan.modelsize import count_params, lora_params, tensor_parallel_share  # noqa: E402
from recipekit.plan.plan import make_plan  # noqa: E402
from recipekit.recipe.compose import compose  # noqa: E402
from recipekit.recipe.paralleloptions import load_parallel_options  # noqa: E402
from recipekit.recipe.schema import validate  # noqa: E402
from recipekit.recipe.sections import LoraSpec, ModelSpec, parse_recipe  # noqa: E402

IMAGES = load_images()
OPTIONS = load_parallel_options()


def model(name: str) -> ModelSpec:
    return validate(ModelSpec, yaml.safe_load((ROOT / "recipes" / "model" / f"{name}.yaml").read_text()))


@functools.cache
def recipe_of(*overrides: str):
    """Hydra composition costs about half a second; tests reuse the same handful of recipes."""
    return parse_recipe(compose(list(overrides)).raw)


def estimate_of(*overrides: str, **kw):
    recipe = recipe_of(*overrides)
    return estimate(recipe, make_plan(recipe, IMAGES, analysis_only=True), **kw)


# ------------------------------------------------------------------------------------------------ parameter counts
@pytest.mark.parametrize(
    "name, published",
    [
        ("llama3_8b", 8.03e9),
        ("llama3_70b", 70.6e9),
        ("qwen2.5_7b", 7.62e9),
        ("qwen2.5_14b", 14.8e9),
        ("qwen2.5_72b", 72.7e9),
    ],
)
def test_param_counts_match_published_sizes(name, published):
    assert count_params(model(name)).total == pytest.approx(published, rel=0.01)


def test_param_counts_equal_transformers_exactly():
    """Stored counts and, for the families the formulas know, the count from the numbers alone (glm4's extra
    post-attention and post-MLP norms are only in its stored counts). The count from the numbers serves a hand-made
    twin reshaped for TP; a generic twin is measured again (validate.dryrun.workdir.twinmeasure), so an architecture
    without a hand-made twin (MLA, dense first layers, sliding windows) is known by its stored counts alone."""
    torch = pytest.importorskip("torch")
    from recipekit.runtime.model.twin import architecture_config, causal_lm_class
    from recipekit.validate.dryrun.workdir.twinmodel import find_twin

    for path in sorted((ROOT / "recipes" / "model").glob("*.yaml")):
        spec = model(path.stem)
        with torch.device("meta"):
            built = causal_lm_class(spec.family)(architecture_config(spec))
        exact = sum(p.numel() for p in built.parameters())
        assert count_params(spec).total == exact, spec.name
        if spec.family != "glm4" and find_twin(spec.family) is not None:
            assert count_params(dataclasses.replace(spec, params=None)).total == exact, spec.name


def test_lora_params_all_linear():
    spec = model("llama3_8b")
    # r × (in + out) over q, k, v, o, gate, up, down of 32 layers: PEFT reports 41,943,040 for r=16.
    assert lora_params(spec, LoraSpec(r=16)) == 41_943_040
    assert lora_params(spec, LoraSpec(r=16, target_modules=["q_proj", "v_proj"])) == 32 * 16 * (8192 + 5120)


# ----------------------------------------------------------------------------------- DeepSpeed's own estimators
ZERO_CASES = [  # (params, gpus per node, nodes)
    (8.03e9, 8, 1),
    (14.77e9, 8, 2),
    (70.55e9, 8, 8),
    (1.3e9, 1, 1),
    (72.7e9, 16, 4),
]


@pytest.mark.parametrize("params, gpus, nodes", ZERO_CASES)
@pytest.mark.parametrize("offload", [False, True])
def test_zero2_model_states_equal_deepspeed(params, gpus, nodes, offload):
    ds = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    _, ds_gpu = ds.estimate_zero2_model_states_mem_needs(int(params), gpus, nodes, cpu_offload=offload)
    ours = model_states(
        params, regime("bf16", 2, deepspeed=True), dp=gpus * nodes, offload_optimizer="cpu" if offload else "none"
    )
    assert ours.device == pytest.approx(ds_gpu, rel=0.02)


@pytest.mark.parametrize("params, gpus, nodes", ZERO_CASES)
@pytest.mark.parametrize("offload_optimizer, offload_param", [(False, False), (True, False), (True, True)])
def test_zero3_model_states_equal_deepspeed(params, gpus, nodes, offload_optimizer, offload_param):
    ds = pytest.importorskip("deepspeed.runtime.zero.stage3")
    largest = 128256 * 4096  # an embedding-sized layer
    _, ds_gpu, _ = ds.estimate_zero3_model_states_mem_needs(
        int(params),
        largest,
        gpus,
        nodes,
        cpu_offload=offload_optimizer,
        cpu_offload_params=offload_param,
        zero_init=True,
    )
    ours = model_states(
        params,
        regime("bf16", 3, deepspeed=True),
        dp=gpus * nodes,
        largest_layer=largest,
        offload_optimizer="cpu" if offload_optimizer else "none",
        offload_param="cpu" if offload_param else "none",
    )
    assert ours.device == pytest.approx(ds_gpu, rel=0.02)


def test_zero3_host_memory_equals_deepspeed_zero_init():
    ds = pytest.importorskip("deepspeed.runtime.zero.stage3")
    params, gpus, nodes = 70.55e9, 8, 2
    ds_cpu, _, _ = ds.estimate_zero3_model_states_mem_needs(
        int(params), 10**9, gpus, nodes, cpu_offload=True, cpu_offload_params=True, zero_init=True
    )
    ours = model_states(
        params, regime("bf16", 3, deepspeed=True), dp=gpus * nodes, offload_optimizer="cpu", offload_param="cpu"
    )
    assert ours.host * gpus * formulas.HOST_BUFFER_FACTOR == pytest.approx(ds_cpu, rel=0.02)


def test_ddp_is_torch_amp_not_deepspeed():
    # Stage 0 is the bundle's plain DDP under AMP: fp32 weights + 16-bit autocast copy, fp32 gradients and DDP's
    # bucket copy, Adam moments: 22 bytes per parameter; one rank has no bucket copy: 18.
    assert model_states(1e9, regime("bf16", 0, deepspeed=False), dp=8).device == pytest.approx(22e9)
    assert model_states(1e9, regime("bf16", 0, deepspeed=False), dp=1).device == pytest.approx(18e9)


# --------------------------------------------------------------------------------------------------- activations
H, INTER, LAYERS, HEADS, KV_HEADS, VOCAB, SEQ, BATCH = 256, 704, 4, 8, 2, 1000, 96, 2


def _saved_bytes(torch, transformers, *, autocast: bool, lora: LoraSpec | None, checkpointing: bool) -> int:
    """Bytes of the tensors autograd keeps during one forward of a small Llama, weights and their casts excluded."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=H,
        intermediate_size=INTER,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=1024,
    )
    net = transformers.LlamaForCausalLM(config)
    if lora is not None or not autocast:  # DeepSpeed's 16-bit model, or the 16-bit LoRA base
        net = net.to(torch.bfloat16)
    if lora is not None:
        peft = pytest.importorskip("peft")
        net = peft.get_peft_model(
            net,
            peft.LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules
            ),
        )
        if not autocast:  # DeepSpeed casts the adapters too; under AMP PEFT keeps them fp32
            net = net.to(torch.bfloat16)
    if checkpointing:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora is not None:
            net.enable_input_require_grads()
    net.train()
    # autocast's weight casts are model states (AUTOCAST_WEIGHT_COPY_BYTES), not activations; mm may keep them
    # transposed. No activation here has a weight's shape: every 2-D activation has SEQ × BATCH = 192 rows.
    weight_shapes = {s for p in net.parameters() if p.dim() == 2 for s in (tuple(p.shape), tuple(p.shape)[::-1])}
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and not (t.dtype == torch.bfloat16 and tuple(t.shape) in weight_shapes):
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
        net(input_ids=ids, labels=ids)
    return sum(kept.values())


@pytest.mark.parametrize(
    "autocast, kind, checkpointing",
    [
        (False, "full", False),
        (False, "full", True),
        (True, "full", False),
        (True, "full", True),
        (False, "lora", False),
        (True, "lora", False),
        (False, "lora-nodropout", False),
        (True, "lora-nodropout", True),
    ],
    ids=[
        "ds-full",
        "ds-full-ckpt",
        "amp-full",
        "amp-full-ckpt",
        "ds-lora",
        "amp-lora",
        "ds-lora-nodropout",
        "amp-lora-nodropout-ckpt",
    ],
)
def test_activations_match_what_autograd_keeps(monkeypatch, autocast, kind, checkpointing):
    """DeepSpeed's 16-bit model (ds) and the Trainer's AMP under DDP (amp), against the tensors autograd keeps."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    lora = None if kind == "full" else LoraSpec(r=16, dropout=0.0 if kind == "lora-nodropout" else 0.05)
    # On CPU dropout keeps its mask in the input's dtype (fp32 for PEFT's fp32 adapters under AMP); CUDA and NPU
    # keep a bool mask, which is what the estimator assumes.
    monkeypatch.setattr(activations, "DROPOUT_MASK_BYTES", 4 if autocast else 2)
    measured = _saved_bytes(torch, transformers, autocast=autocast, lora=lora, checkpointing=checkpointing)
    spec = ModelSpec(
        name="t",
        family="llama",
        name_or_path="t",
        num_layers=LAYERS,
        hidden_size=H,
        num_attention_heads=HEADS,
        num_kv_heads=KV_HEADS,
        intermediate_size=INTER,
        vocab_size=VOCAB,
        max_position_embeddings=1024,
    )
    # AMP is the regime of stage 0 (DDP); any ZeRO stage is DeepSpeed's 16-bit model.
    predicted = activation_bytes(
        spec,
        regime("bf16", 0 if autocast else 2, deepspeed=not autocast),
        micro_batch=BATCH,
        seq_len=SEQ,
        full_training=lora is None,
        checkpointing=checkpointing,
        lora=lora,
    ).saved
    # LoRA is slightly over: the first layer's input comes from a frozen embedding, so autograd keeps less for it.
    assert predicted == pytest.approx(measured, rel=0.06)


def test_checkpointing_keeps_layer_inputs_plus_one_layer():
    spec = model("llama3_8b")
    ds = regime("bf16", 3, deepspeed=True)
    full = activation_bytes(spec, ds, micro_batch=1, seq_len=2048, full_training=True, checkpointing=False)
    ckpt = activation_bytes(spec, ds, micro_batch=1, seq_len=2048, full_training=True, checkpointing=True)
    assert ckpt.layers == 32 * 2 * 2048 * 4096  # 2·s·b·h bytes per layer
    assert ckpt.recomputed == pytest.approx(full.layers / 32)
    assert ckpt.logits_saved == full.logits_saved == 2048 * 128256 * 4


# ------------------------------------------------------------------------------------------- 3D parallel analysis
def test_bubble_formula():
    assert bubble_fraction(1, 8) == 0
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert bubble_fraction(8, 1) == pytest.approx(7 / 8)
    est = estimate_of(
        "recipe=llama3_70b_sft", "parallel=zero1", "parallel.tensor_parallel=8", "parallel.pipeline_parallel=4"
    )
    assert est.parallel3d is not None
    assert est.parallel3d.micro_batches == est.layout.gradient_accumulation_steps == 64
    assert est.parallel3d.bubble_fraction == pytest.approx(3 / (64 + 3))
    assert est.parallel3d.note.startswith("analysis only: pipeline parallelism") and not est.parallel3d.buildable


def test_tp_inside_node_detection():
    assert tp_inside_node(8, 8) and tp_inside_node(2, 8)
    assert not tp_inside_node(16, 8)
    inside = estimate_of("recipe=llama3_70b_sft", "parallel=ddp", "parallel.tensor_parallel=8")
    across = estimate_of(
        "recipe=llama3_70b_sft", "parallel=ddp", "parallel.tensor_parallel=8", "cluster.devices_per_pod=4"
    )
    assert inside.parallel3d.tp_inside_node and inside.parallel3d.tp_link == "HCCS"
    assert not across.parallel3d.tp_inside_node and across.parallel3d.tp_link == "RoCE"
    assert across.parallel3d.tp_time_s > inside.parallel3d.tp_time_s


def test_tensor_parallel_shards_model_states():
    """AutoTP's share of each rank (the layers split, the norms and an untied embedding whole): tests/unit/
    test_memory_tp.py checks it against DeepSpeed's own shapes."""
    dp_only = estimate_of("recipe=llama3_70b_sft", "parallel=zero1")
    tp8 = estimate_of("recipe=llama3_70b_sft", "parallel=zero1", "parallel.tensor_parallel=8")
    whole, share = count_params(model("llama3_70b")), tensor_parallel_share(model("llama3_70b"), 8)
    assert share.total == pytest.approx((whole.total - whole.embedding) / 8 + whole.embedding, rel=2e-4)
    assert tp8.item("weights") == pytest.approx(dp_only.item("weights") * share.total / whole.total)
    assert dp_only.parallel3d is None


# ------------------------------------------------------------------------------------------------ fit and no fit
def test_llama3_70b_sft_on_one_910b_node_with_ddp_does_not_fit():
    est = estimate_of("recipe=llama3_70b_sft", "cluster.nodes=1", "parallel=ddp")
    assert not est.fits and est.total_gib > est.device_gib == 64
    assert est.largest_item.name in ("gradients", "optimizer states")


@pytest.mark.parametrize(
    "preset",
    [
        "qwen2.5_14b_sft",
        "llama3_70b_sft",
        "qwen2.5_72b_sft",
        "llama3_8b_sft",
        "llama3_8b_lora",
        "qwen2.5_7b_pretrain",
        "tiny_sft",
    ],
)
def test_shipped_presets_fit(preset):
    est = estimate_of(f"recipe={preset}")
    assert est.fits, (preset, est.total_gib)
    assert fit_problem(est, parallel_options=OPTIONS) is None


def test_qwen2_5_14b_sft_on_2x8_910b_fits():
    est = estimate_of("recipe=qwen2.5_14b_sft")
    assert (est.layout.nodes, est.layout.devices_per_pod, est.hw_name) == (2, 8, "ascend910b")
    assert est.fits and 0 < est.headroom_gib < 64


def test_qlora_base_is_about_a_quarter_of_lora():
    lora = estimate_of("recipe=llama3_8b_lora", "hw=h100")
    qlora = estimate_of("recipe=llama3_8b_lora", "mode=qlora", "hw=h100")
    # NF4 linears (≈ 0.52 B/param) with the 16-bit embedding and head (1.05 B params) kept.
    assert qlora.item("weights") < 0.4 * lora.item("weights")
    assert qlora.compute.params_trainable == lora.compute.params_trainable == 41_943_040


def test_host_memory_counts_for_offload():
    est = estimate_of("recipe=llama3_70b_sft", "cluster.nodes=1", "parallel=zero3_offload")
    assert est.fits_device and not est.offload.host_fits and not est.fits
    problem = fit_problem(est, parallel_options=OPTIONS)
    assert problem is not None and "host memory" in problem.message


# ---------------------------------------------------------------------------------------------------- fit_problem
def _overrides_in(hint: str) -> list[str]:
    match = re.match(r"cheapest change that fits: (.+?) \(≈", hint)
    assert match, hint
    return match.group(1).split()


@pytest.mark.parametrize(
    "base",
    [
        ["recipe=llama3_70b_sft", "cluster.nodes=1", "parallel=ddp"],
        ["recipe=llama3_8b_sft", "parallel=ddp"],
        ["recipe=qwen2.5_14b_sft", "parallel.gradient_checkpointing=false", "train.micro_batch_size=4"],
        ["recipe=qwen2.5_72b_sft", "cluster.nodes=2"],
    ],
)
def test_fit_problem_names_largest_item_and_a_fix_that_fits(base):
    est = estimate_of(*base)
    assert not est.fits
    problem = fit_problem(est, parallel_options=OPTIONS)
    assert problem is not None and est.largest_item.name in problem.message
    overrides = _overrides_in(problem.hint)
    assert tuple(overrides) == fixes(est, parallel_options=OPTIONS)[0].overrides
    fixed = estimate_of(*base, *overrides)
    assert fixed.fits, (overrides, fixed.total_gib)


def test_fit_problem_prefers_checkpointing_when_it_is_enough():
    """Checkpointing is the fix; it recomputes a forward, so at the recipe's kernels' utilisation the layout reaches a
    lower MFU, which the fix carries (the step it is shown with is the step its paste plans)."""
    est = estimate_of("recipe=qwen2.5_14b_sft", "parallel.gradient_checkpointing=false", "train.micro_batch_size=4")
    fix = fixes(est, parallel_options=OPTIONS)[0]
    mfu = math.floor(0.4 / fix.estimate.compute.recompute_factor * 1000) / 1000  # rounded down, 3 digits
    assert fix.overrides == ("parallel.gradient_checkpointing=true", f"hw.assumed_mfu={mfu:g}")
    assert fix.estimate.step_time_s == pytest.approx(est.step_time_s * fix.estimate.compute.recompute_factor, rel=5e-3)


def test_offload_fix_comes_with_a_node_alternative():
    est = estimate_of("recipe=llama3_70b_sft", "cluster.nodes=1", "parallel=ddp")
    found = fixes(est, parallel_options=OPTIONS)
    assert found[0].estimate.offload.time_s > 0
    assert len(found) == 2 and any(o.startswith("cluster.nodes=") for o in found[1].overrides)
    assert found[1].estimate.offload.time_s == 0
    assert estimate_of("recipe=llama3_70b_sft", "cluster.nodes=1", "parallel=ddp", *found[1].overrides).fits


# ----------------------------------------------------------------------------------------------- compute and time
def test_flops_time_and_cost():
    est = estimate_of("recipe=llama3_8b_sft", "hw.price_per_device_hour=2.0")
    spec, c = model("llama3_8b"), est.compute
    assert spec.flops is not None  # torch's FLOP counter, measured by `model import` (test_model_flops.py)
    assert c.flops_per_token == spec.flops.train_at(2048)
    assert c.tokens_per_step == 128 * 2048
    # MFU is the model FLOPs (no recomputation) over the whole step: the step at 40% of the 910B's 354 TFLOP/s
    step = c.flops_per_token * c.tokens_per_step / (8 * 354e12 * 0.4)
    assert est.step_time_s == pytest.approx(step) and c.mfu == pytest.approx(0.4)
    # nothing exposed on one node: the step is compute, at the utilisation that leaves the recomputation its time
    assert c.time_s == pytest.approx(step) and c.efficiency == pytest.approx(0.4 * c.recompute_factor)
    assert c.hfu == pytest.approx(c.efficiency)
    assert est.total_time_s == pytest.approx(est.step_time_s * est.total_steps)
    assert est.device_hours == pytest.approx(est.total_time_s / 3600 * 8)
    assert est.cost == pytest.approx(est.device_hours * 2.0)
    assert estimate_of("recipe=llama3_8b_sft").cost is None
    assert estimate_of("recipe=llama3_8b_sft", price_per_device_hour=3.0).cost == pytest.approx(est.cost * 1.5)


def test_lora_costs_about_two_thirds_of_full_training():
    full = estimate_of("recipe=llama3_8b_lora", "mode=sft").compute
    lora = estimate_of("recipe=llama3_8b_lora").compute
    assert lora.flops_per_token / full.flops_per_token == pytest.approx(4 / 6, abs=0.03)


def test_communication_link_and_volume():
    one = estimate_of("recipe=llama3_8b_sft", "parallel=ddp")
    two = estimate_of("recipe=qwen2.5_14b_sft")
    assert (one.communication.link, one.communication.crosses_nodes) == ("HCCS", False)
    assert (two.communication.link, two.communication.crosses_nodes) == ("RoCE", True)
    # DDP under AMP all-reduces fp32 gradients once per step: 2 (n − 1)/n × 4 bytes × params.
    assert one.communication.volume_gb == pytest.approx(2 * 7 / 8 * 4 * count_params(model("llama3_8b")).total / 1e9)
    zero2 = estimate_of("recipe=llama3_8b_sft", "parallel=zero2")
    zero3 = estimate_of("recipe=llama3_8b_sft", "parallel=zero3")
    assert zero3.communication.volume_gb > zero2.communication.volume_gb


# --------------------------------------------------------------------------------------------------------- report
def test_estimate_dict_is_stable_json():
    first = json.dumps(estimate_dict(estimate_of("recipe=qwen2.5_14b_sft")))
    second = json.dumps(estimate_dict(estimate_of("recipe=qwen2.5_14b_sft")))
    assert first == second
    data = json.loads(first)
    assert list(data) == [
        "recipe",
        "model",
        "hw",
        "layout",
        "memory_gib",
        "offload",
        "compute",
        "communication",
        "parallel3d",
        "experts",
        "data",
        "time",
        "notes",
    ]
    assert [item["name"] for item in data["memory_gib"]["items"]] == [
        "weights",
        "gradients",
        "optimizer states",
        "activations",
        "logits (loss)",
        "ZeRO buffers",
        "framework overhead",
    ]
    assert data["memory_gib"]["fits"] is True
    assert all(len(f"{item['gib']:.10g}".replace(".", "").lstrip("0")) <= 4 for item in data["memory_gib"]["items"])


def test_markdown_and_rich_render():
    from rich.console import Console

    est = estimate_of(
        "recipe=llama3_70b_sft", "parallel=zero1", "parallel.tensor_parallel=8", "parallel.pipeline_parallel=4"
    )
    text = estimate_markdown(est)
    assert "| optimizer states |" in text and "pipeline bubble" in text and text.endswith("\n")
    console = Console(width=160, record=True, color_system=None)
    console.print(render_estimate(est))
    console.print(render_advice([]))
    shown = console.export_text()
    assert "Memory per device" in shown and "TP inside a node" in shown and "no layout" in shown


def test_estimate_is_fast():
    import time

    recipe = recipe_of("recipe=qwen2.5_72b_sft")
    plan = make_plan(recipe, IMAGES, analysis_only=True)
    start = time.perf_counter()
    for _ in range(100):
        estimate(recipe, plan)
    assert (time.perf_counter() - start) / 100 < 0.01
    assert memory.GIB == GIB == 2**30


# ------------------------------------------------------------------------------------------------------ regime
@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_regime_words_name_the_bytes_it_counts(precision, zero):
    reg = regime(precision, zero, deepspeed=zero > 0)
    assert reg.weight_words("sft").startswith({2: "16-bit", 4: "fp32"}[reg.weight])
    assert reg.gradient_words.startswith({2: "16-bit", 4: "fp32"}[reg.gradient])
    assert ("fp32 copy" in reg.gradient_words) == bool(reg.fp32_gradient)
    assert ("master +" in reg.optimizer_words) == bool(reg.master_weight)
    if precision == "fp32":
        assert "16-bit" not in reg.weight_words("lora") + reg.gradient_words + reg.optimizer_words


def test_fp32_under_zero_says_fp32_and_counts_4_bytes():
    """The review's case: fp32 with ZeRO ≥ 1 counted 4 bytes per parameter and called them 16-bit."""
    est = estimate_of("recipe=llama3_8b_sft", "train.precision=fp32")  # ZeRO-3 over 8 ranks
    counts = count_params(model("llama3_8b"))
    items = {item.name: item for item in est.memory}
    weights, gradients, optimizer = items["weights"], items["gradients"], items["optimizer states"]
    assert "16-bit" not in weights.basis + gradients.basis + optimizer.basis
    assert "fp32" in weights.basis and "fp32" in gradients.basis
    # weights: 4 bytes over 8 ranks + the largest layer gathered in fp32
    assert weights.gib * GIB == pytest.approx(counts.total * 4 / 8 + counts.largest_module * 4)
    # optimizer: Adam's two fp32 moments only; the fp32 weights are their own master
    assert optimizer.gib * GIB == pytest.approx(counts.total * 8 / 8)


def test_estimate_layout_is_the_plans():
    est = estimate_of("recipe=qwen2.5_14b_sft")
    assert est.layout is est.plan.layout
    assert est.parallel is est.recipe.parallel and est.precision == est.plan.precision
    assert list(estimate_dict(est)["layout"]) == [
        "parallel",
        "zero_stage",
        "offload_optimizer",
        "offload_param",
        "gradient_checkpointing",
        "recompute_granularity",
        "distributed_optimizer",
        "sequence_parallel",
        "pipeline_schedule",
        "nodes",
        "devices_per_pod",
        "world_size",
        "dp_size",
        "tensor_parallel",
        "pipeline_parallel",
        "context_parallel",
        "expert_parallel",
        "virtual_pipeline_stages",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "global_batch_size",
        "seq_len",
        "precision",
    ]


def test_memory_reads_nothing_from_disk():
    """The estimators and the search take their inputs: importing them pulls in neither Hydra nor the recipe trees."""
    import os
    import subprocess

    readers = ("recipekit.recipe.compose", "recipekit.recipe.paralleloptions", "hydra", "omegaconf")
    code = f"import sys, recipekit.memory; print(sorted(m for m in sys.modules if m.startswith({readers})))"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == "[]"
