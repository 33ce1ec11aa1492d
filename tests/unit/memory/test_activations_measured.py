"""Activation memory from the architecture's own layers (issue 29, item 3): the numbers `model import` stores
(model.activations, measured with torch's MemTracker under FakeTensorMode on one or two layers of each layer kind,
scaled by the count of each kind, at batch 1 and 2 and two sequence lengths) give, over the whole depth and at other
shapes (micro batch × sequence, checkpointing on and off), what the tracker measures there; and the memory
estimate uses them, saying so, where they describe the run (else its Llama-shaped formula, saying why).

Tolerance: the stored numbers are linear in the tokens and in the sequence length; the tracker's own figures at
other shapes differ from that line only by tensors one per sequence position that the micro batch shares (the rotary
tables), which the import's fit cannot place: the peak, what the estimate uses, is within :data:`TINY_TOLERANCE` on
the tiny twins (width 64, where those tables weigh most) and :data:`TOLERANCE` on the full-size models.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))

from recipekit.memory import GIB, estimate  # noqa: E402
from recipekit.plan.plan import make_plan  # noqa: E402
from recipekit.recipe.compose import compose  # noqa: E402
from recipekit.recipe.schema import validate  # noqa: E402
from recipekit.recipe.sections import ModelSpec, parse_recipe  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from recipekit.image.matrix import load_images  # noqa: E402
from recipekit.recipe import modelimport  # noqa: E402
from recipekit.recipe.measured import modelmemory  # noqa: E402
from recipekit.runtime.boundary import layerkinds  # noqa: E402

CONFIGS = ROOT / "tests" / "data" / "model_configs"
#: Relative difference allowed between the stored numbers' prediction and the tracker at a shape not measured.
TOLERANCE = 0.03
#: The same for the tiny twins (width 64, 2 layers), where tensors one per sequence position shared by the micro
#: batch (the rotary tables), neither per token nor constant, weigh a few percent of what a layer keeps.
TINY_TOLERANCE = 0.05
#: What is kept with checkpointing on (each layer's input, a few bytes per token in a tiny model): tensors one per
#: sequence position that the micro batch shares (the rotary tables) are neither per token nor constant.
KEPT_TOLERANCE = 0.12
#: (micro batch, sequence length): none of them the import's own (batch 1 at 512 and 1024).
SHAPES = ((1, 2048), (2, 768), (4, 256))

#: Llama 3.2 1B as published (meta-llama/Llama-3.2-1B config.json): tied head, GQA 32/8, llama3 rope scaling.
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}


def config_of(name: str, tmp_path_factory: pytest.TempPathFactory):
    if name == "llama3.2_1b":
        path = tmp_path_factory.mktemp("llama3.2_1b") / "config.json"
        path.write_text(__import__("json").dumps(LLAMA_3_2_1B))
        return modelimport.load_config(path)
    return modelimport.load_config(CONFIGS / name / "config.json")


def check_against_the_tracker(name: str, tmp_path_factory: pytest.TempPathFactory, tolerance: float) -> None:
    """The stored bytes per token, plus the per-step constant the import leaves out (a weight gradient alive for an op
    before the tracker files it as one: taken from the first shape), give the tracker's peak at the other shapes."""
    config = config_of(name, tmp_path_factory)
    stored = modelmemory.measure(config)
    with modelmemory.fake_model(config) as model:
        for checkpointing in (False, True):
            tracked = [modelmemory.sample(model, micro, seq, checkpointing=checkpointing) for micro, seq in SHAPES]
            constant = tracked[0].peak - tracked[0].tokens * stored.peak_at(
                tracked[0].seq_len, checkpointing=checkpointing
            )
            assert 0 <= constant < 0.1 * tracked[0].peak, checkpointing
            for one in tracked[1:]:
                shape = (one.micro_batch, one.seq_len, checkpointing)
                predicted = constant + one.tokens * stored.peak_at(one.seq_len, checkpointing=checkpointing)
                assert predicted == pytest.approx(one.peak, rel=tolerance), shape
                kept = one.tokens * stored.kept_at(one.seq_len, checkpointing=checkpointing)
                assert kept == pytest.approx(one.kept, rel=KEPT_TOLERANCE if checkpointing else tolerance), shape
    # checkpointing keeps far less: each layer's input instead of everything it made
    assert stored.checkpointed_kept < stored.kept / 4


#: One dense and one MoE twin (the Gemma- and DeepSeek-shaped models below and the catalog's byte-for-byte re-import
#: cover the other layer kinds; each case runs the tracker a dozen times).
@pytest.mark.parametrize("name", ["tiny_llama", "tiny_mixtral"])
def test_stored_activations_predict_the_tracker_at_other_shapes(name, tmp_path_factory):
    check_against_the_tracker(name, tmp_path_factory, TINY_TOLERANCE)


@pytest.mark.slow
def test_stored_activations_predict_the_tracker_over_the_whole_depth_full_size(tmp_path_factory):
    """The proof on a full-size model (16 layers, width 2048): the numbers measured on two layers give what the
    tracker measures running all sixteen, at shapes the import did not measure."""
    check_against_the_tracker("llama3.2_1b", tmp_path_factory, TOLERANCE)


#: Architectures with more than one layer kind, small enough to run their whole depth here: a Gemma-3-shaped model
#: (sliding and global attention alternating) and a DeepSeek-V3-shaped one (MLA, a dense first layer, then MoE
#: layers with a shared expert).
MIXED_DEPTHS = {
    "gemma3_text": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
        sliding_window=64,
        sliding_window_pattern=2,
    ),
    "deepseek_v3": dict(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=5,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        vocab_size=512,
    ),
}


@pytest.mark.parametrize("model_type", sorted(MIXED_DEPTHS))
def test_one_layer_of_each_kind_gives_what_the_whole_depth_keeps(model_type):
    """The import runs the fewest first layers that hold two of each kind; what the second of each kind keeps,
    scaled by the count of its kind, gives what the tracker measures over the whole depth: kept exactly, the peak
    within the tiny tolerance."""
    config = transformers.AutoConfig.for_model(model_type, **MIXED_DEPTHS[model_type])
    kinds = modelmemory.full_depth_kinds(config)
    assert len(set(kinds)) == 2 and len(kinds) > 4
    depth = modelmemory.CutDepth.depth(kinds)
    assert depth < len(kinds)  # fewer layers than the whole depth run
    with modelmemory.fake_model(layerkinds.cut_depth(config, depth)) as model:
        cut = modelmemory.CutDepth.of(model, kinds)
        scaled = [modelmemory.whole_depth(cut, 2, 128, checkpointing=on) for on in (False, True)]
    with modelmemory.fake_model(config) as model:
        whole = [modelmemory.sample(model, 2, 128, checkpointing=on) for on in (False, True)]
    for ours, tracked in zip(scaled, whole, strict=True):
        assert ours.kept == tracked.kept, ours.checkpointing
        assert ours.peak == pytest.approx(tracked.peak, rel=TINY_TOLERANCE), ours.checkpointing


#: Catalog options whose modules the tracker cannot follow under fake tensors, with the reason.
NO_TRACKER = {
    "ernie4.5_21b_a3b": "the tracker hooks a module output that does not require grad (its router's statistics)",
    "internlm3_8b": "its dynamic rotary scaling reads the sequence length off a tensor (Tensor.item())",
}


def test_the_catalog_s_activations_come_from_one_layer_of_each_kind():
    """Every catalog option's numbers are the per-kind measurement's (re-imported byte for byte by
    tests/unit/recipe/test_models.py)."""
    options = sorted((ROOT / "recipes" / "model").glob("*.yaml"))
    assert options
    for path in options:
        spec = validate(ModelSpec, yaml.safe_load(path.read_text()), root="model")
        if path.stem in NO_TRACKER:  # the estimate then takes its formula and says so
            assert spec.activations is None, path.name
            continue
        assert spec.activations is not None, path.name
        assert spec.activations.measured_by == "tracker_per_layer_kind", path.name


def test_moe_experts_are_measured_as_a_device_runs_them():
    """Grouped GEMMs (the default experts implementation), not the FLOP counter's batched_mm, which gathers each
    token's expert weights: an import that built the model for the counter first must not leave that choice behind."""
    config = modelimport.load_config(CONFIGS / "tiny_qwen3_moe" / "config.json")
    modelimport.meta_model(config)  # the counter's build: sets batched_mm on the config
    dense = modelmemory.measure(modelimport.load_config(CONFIGS / "tiny_qwen3" / "config.json"))
    moe = modelmemory.measure(config)
    # the two tiny models share widths; top-2 of 4 experts of width 32 keep about what a dense MLP of width 128 does
    assert moe.kept < 1.5 * dense.kept


# ------------------------------------------------------------------------------------------------ the estimate
IMAGES = load_images()


@functools.cache
def recipe_of(*overrides: str):
    return parse_recipe(compose(list(overrides)).raw)


def activations_item(*overrides: str):
    recipe = recipe_of(*overrides)
    est = estimate(recipe, make_plan(recipe, IMAGES, analysis_only=True))
    return recipe, est, next(item for item in est.memory if item.name == "activations")


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_estimate_uses_the_option_s_measured_activations(checkpointing):
    flag = "true" if checkpointing else "false"
    recipe, est, item = activations_item(
        "recipe=llama3_8b_sft", "parallel=zero3", f"parallel.gradient_checkpointing={flag}"
    )
    spec = recipe.model.activations
    assert spec is not None
    tokens = est.layout.micro_batch_size * recipe.data.max_len
    assert item.gib * GIB == pytest.approx(tokens * spec.peak_at(recipe.data.max_len, checkpointing=checkpointing))
    assert "measured by torch's memory tracker" in item.basis


def test_without_measured_numbers_the_formula_is_used_and_named():
    recipe, _, measured = activations_item("recipe=llama3_8b_sft", "parallel=zero3")
    bare = recipe.model.__class__(**{**recipe.model.__dict__, "activations": None})
    plain = recipe.__class__(**{**recipe.__dict__, "model": bare})
    est = estimate(plain, make_plan(plain, IMAGES, analysis_only=True))
    item = next(item for item in est.memory if item.name == "activations")
    assert "Llama-shaped formula (no model.activations" in item.basis
    assert item.gib != measured.gib


def test_lora_falls_back_to_the_formula_and_says_why():
    _, _, item = activations_item("recipe=llama3_8b_lora")
    assert "Llama-shaped formula (adapters" in item.basis
