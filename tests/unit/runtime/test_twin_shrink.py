"""The generic tiny twin: any decoder-only text architecture's own config, shrunk (widths, heads, experts, vocabulary;
depth keeping every layer kind), builds, trains one step, saves and reloads on CPU; LoRA targets and ZeRO-3 leaf
modules come from the module tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from recipekit.runtime.boundary.layerkinds import cut_depth, depth_keeping_every_kind, layer_kinds  # noqa: E402
from recipekit.runtime.model.shrink import (  # noqa: E402
    ShrinkProblem,
    lora_target_modules,
    lora_target_parameters,
    moe_leaf_classes,
    train_one_step,
    twin_config,
    whole_heads,
    write_twin,
)

VOCAB = 256


def train_save_reload(config: Any, folder: Path) -> float:
    """Build the twin on CPU, train one step, save, reload: the loss of the step (finite) and the reload's check."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.train()
    ids = torch.randint(0, VOCAB, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1e-3).step()
    model.save_pretrained(folder)
    again = AutoModelForCausalLM.from_pretrained(folder)
    first = next(iter(model.state_dict().items()))
    assert torch.equal(again.state_dict()[first[0]], first[1])
    return float(loss.detach())


def test_depth_keeps_every_layer_kind_and_the_pattern() -> None:
    assert depth_keeping_every_kind([("dense",), ("dense",), ("moe",), ("moe",)]) == 3
    assert depth_keeping_every_kind([("sliding",)] * 5 + [("full",)] + [("sliding",)] * 5) == 6
    assert depth_keeping_every_kind([("only",)] * 4) == 1


def test_depth_keeping_every_kind_twice_for_the_activation_measurement() -> None:
    """The import's activation measurement runs a second layer of each kind (a kind the depth has once, once)."""
    assert depth_keeping_every_kind([("dense",)] + [("moe",)] * 60, times=2) == 3
    assert depth_keeping_every_kind([("sliding",)] * 5 + [("full",)] + [("sliding",)] * 5 + [("full",)], times=2) == 12
    assert depth_keeping_every_kind([("only",)] * 4, times=2) == 2
    assert depth_keeping_every_kind([("only",)], times=2) == 1


def test_a_deepseek_v3_twin_keeps_dense_and_moe_layers_and_mla() -> None:
    from transformers import AutoConfig

    config = AutoConfig.for_model("deepseek_v3")
    twin = twin_config(config, VOCAB)
    assert twin.num_hidden_layers == config.first_k_dense_replace + 1  # the dense layers, then one MoE layer
    assert twin.hidden_size == 64 and twin.n_routed_experts == 4 and twin.num_experts_per_tok == 2
    assert twin.qk_head_dim == twin.qk_nope_head_dim + twin.qk_rope_head_dim  # MLA's widths still add up
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(twin)
    assert "DeepseekV3MoE" in moe_leaf_classes(model)
    targets = lora_target_modules(model)
    assert {"q_a_proj", "kv_a_proj_with_mqa", "o_proj", "gate_proj", "down_proj"} <= set(targets)
    assert "gate" not in targets  # routers are not adapted
    assert lora_target_parameters(model) == ["experts.down_proj", "experts.gate_up_proj"]  # the fused experts


def test_a_deepseek_v3_twin_trains_a_step_saves_and_reloads(tmp_path: Path) -> None:
    from transformers import AutoConfig

    assert train_save_reload(twin_config(AutoConfig.for_model("deepseek_v3"), VOCAB), tmp_path / "twin") > 0


def test_a_gemma3_twin_keeps_sliding_and_global_layers(tmp_path: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.for_model("gemma3_text")
    twin = twin_config(config, VOCAB)
    assert set(twin.layer_types) == set(config.layer_types) and len(twin.layer_types) == twin.num_hidden_layers
    assert train_save_reload(twin, tmp_path / "twin") > 0


def test_per_layer_lists_are_cut_with_the_depth() -> None:
    from transformers import AutoConfig

    config = AutoConfig.for_model("qwen3_moe", num_hidden_layers=4, mlp_only_layers=[0, 3])
    cut = cut_depth(config, 2)
    assert cut.num_hidden_layers == 2 and cut.mlp_only_layers == [0]


def test_per_layer_overrides_are_cut_with_the_depth() -> None:
    """transformers' per_layer_config (Gemma 4's wider global layers) keeps the overrides of the layers kept."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("gemma4_text")
    cut = cut_depth(config, 6)
    assert cut.num_hidden_layers == 6 and [int(i) for i in cut.to_dict()["per_layer_config"]] == [5]
    with torch.device("meta"):
        assert len(AutoModelForCausalLM.from_config(cut).model.layers) == 6


def test_a_module_holding_two_of_the_configs_layers_is_cut_in_modules() -> None:
    """LongCat-Flash builds one module per two of num_hidden_layers: one module kept is two layers, not zero."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("longcat_flash")
    with torch.device("meta"):
        modules = len(AutoModelForCausalLM.from_config(config).model.layers)
    assert config.num_hidden_layers == 2 * modules
    cut = cut_depth(config, 1, modules=modules)
    with torch.device("meta"):
        assert len(AutoModelForCausalLM.from_config(cut).model.layers) == 1


def test_a_state_space_twin_splits_its_inner_width_into_its_heads(tmp_path: Path) -> None:
    """Mamba-2 splits expand × width into heads × head width: the twin's heads are as many as that holds."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("mamba2")
    twin = twin_config(config, VOCAB)
    assert twin.num_heads * twin.head_dim == twin.expand * twin.hidden_size
    assert train_save_reload(twin, tmp_path / "twin") > 0
    falcon = twin_config(AutoConfig.for_model("falcon_h1"), VOCAB)  # an inner width the config names
    assert falcon.mamba_d_ssm == falcon.mamba_n_heads * falcon.mamba_d_head


def test_a_wider_layer_s_override_stays_wider_in_the_twin(tmp_path: Path) -> None:
    """Gemma 4's global layers have heads twice as wide (per_layer_config): so do the twin's, and the override is
    written out (the config class sets its own where none is given: a reload would build other shapes)."""
    from transformers import AutoConfig

    twin = twin_config(AutoConfig.for_model("gemma4_text"), VOCAB)
    overrides = twin.to_dict()["per_layer_config"]
    assert [value["head_dim"] for value in overrides.values()] == [2 * global_head_dim(twin)]
    assert train_save_reload(twin, tmp_path / "twin") > 0


def global_head_dim(config: Any) -> int:
    """The head width of a heterogeneous config's layers without an override (read with the overrides set aside)."""
    import copy

    flat = copy.deepcopy(config)
    flat.per_layer_config = None
    return flat.head_dim


def test_layer_counts_follow_the_cut_depth() -> None:
    """Sections that add up to the depth still do (Dory's input, recurrent and output layers); the last layers that
    share another's key-value cache are a share of the twin's depth (Gemma 3n), and a twin has two layers at least
    (RWKV's per-layer schedule divides by the depth less one)."""
    from transformers import AutoConfig

    dory = twin_config(AutoConfig.for_model("dory"), VOCAB)
    assert dory.n_input_layers + dory.n_recurrent_layers + dory.n_output_layers == dory.num_hidden_layers
    assert min(dory.n_input_layers, dory.n_recurrent_layers, dory.n_output_layers) >= 1
    gemma3n = twin_config(AutoConfig.for_model("gemma3n_text"), VOCAB)
    assert 0 < gemma3n.num_kv_shared_layers < gemma3n.num_hidden_layers
    assert twin_config(AutoConfig.for_model("rwkv"), VOCAB).num_hidden_layers == 2


def test_layers_that_reuse_another_s_cache_are_a_kind_and_the_cut_keeps_where_they_begin() -> None:
    """Gemma 3n's last 15 of 35 layers reuse earlier layers' key-value caches (their ``is_kv_shared_layer`` flag):
    a kind of their own, so the cut reaches the first of them, and there the shared count starts as at full depth."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("gemma3n_text")
    with torch.device("meta"):
        kinds = layer_kinds(AutoModelForCausalLM.from_config(config))
    depth = depth_keeping_every_kind(kinds)
    first_shared = config.num_hidden_layers - config.num_kv_shared_layers
    assert depth > first_shared
    cut = cut_depth(config, depth)
    assert cut.num_hidden_layers - cut.num_kv_shared_layers == first_shared


def test_a_twin_keeps_every_kind_twice_where_once_does_not_build() -> None:
    """Zamba ties the shared attention block of its first hybrid layer to the others': its twin has two."""
    from transformers import AutoConfig

    twin = twin_config(AutoConfig.for_model("zamba"), VOCAB)
    assert twin.layers_block_type.count("hybrid") == 2


def distinct_modeling_modules() -> dict[str, str]:
    """One decoder-only text architecture per modeling module of the pinned transformers (model_type by module)."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    encoders = set(MODEL_FOR_MASKED_LM_MAPPING_NAMES) | set(MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
    chosen: dict[str, str] = {}
    for model_type in sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) - encoders):
        try:
            config = AutoConfig.for_model(model_type)
            module = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]).__module__
        except Exception:
            continue
        if getattr(config, "is_encoder_decoder", False) or getattr(config, "sub_configs", None):
            continue
        chosen.setdefault(module, model_type)
    return chosen


def builds_on_meta(model_type: str) -> bool:
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type))
    except Exception:  # noqa: BLE001 - the sweep leaves such an architecture out the same way
        return False
    return True


@pytest.mark.slow
def test_one_twin_per_modeling_module_trains_a_step_on_cpu(tmp_path: Path) -> None:
    from transformers import AutoConfig

    trained, failed = [], {}
    for _module, model_type in sorted(distinct_modeling_modules().items()):
        try:
            twin = twin_config(AutoConfig.for_model(model_type), VOCAB)
            loss = train_save_reload(twin, tmp_path / model_type)
            assert loss == loss, "the loss is NaN"
            trained.append(model_type)
        except (ShrinkProblem, Exception) as exc:  # noqa: BLE001 - each architecture's reason is reported
            if builds_on_meta(model_type):  # else outside the sweep: its default config does not build at all
                failed[model_type] = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
    rate = len(trained) / (len(trained) + len(failed))
    print(f"\ntiny twins: {len(trained)} of {len(trained) + len(failed)} modeling modules train a step ({rate:.0%})")
    for model_type, why in sorted(failed.items()):
        print(f"no twin {model_type}: {why}")
    assert rate >= 0.95, sorted(failed)


def test_moe_blocks_are_found_after_zero3_partitioned_their_experts() -> None:
    """Under ZeRO-3's zero.Init each parameter is a 1-D partition by the time the loader marks leaves; the fused
    experts' 3-D shape survives only as ``ds_shape``."""

    class Experts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.empty(0))
            self.gate_up_proj.ds_shape = torch.Size([4, 8, 16])  # type: ignore[attr-defined]

    class SparseBlock(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = torch.nn.Linear(8, 4)
            self.experts = Experts()

    assert moe_leaf_classes(torch.nn.Sequential(SparseBlock())) == ["SparseBlock"]


def test_the_runtime_builds_an_option_s_config_with_the_tokenizer_s_vocabulary() -> None:
    """A model option's ``config`` mapping (what `model import` stores) is what the random model is built from, any
    architecture: recipe.yaml's values stay typed, the embedding fits the tokenizer trained on the run's data."""
    from recipekit.runtime.boundary.recipeview import ModelView, read_section
    from recipekit.runtime.model.twin import architecture_config, train_tokenizer

    mapping = {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4}
    mapping.update(num_key_value_heads=1, head_dim=16, intermediate_size=128, sliding_window=32, vocab_size=300)
    numbers = {"num_layers": 6, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 1, "head_dim_override": 16}
    numbers.update(intermediate_size=128, vocab_size=300, max_position_embeddings=128, tie_word_embeddings=True)
    numbers.update(rope_theta=1e6, rms_norm_eps=1e-6, attention_bias=False, num_experts=0, experts_per_token=0)
    numbers.update(moe_intermediate_size=0, router_aux_loss_coef=0.001, router_aux_loss=True)
    raw = {"name": "g", "name_or_path": "x", "init": "random", "trust_remote_code": False, "family": "gemma3_text"}
    spec = read_section(ModelView, {**raw, **numbers, "config": mapping}, "recipe.model")
    assert spec.config == mapping and isinstance(spec.config["sliding_window"], int)
    tokenizer = train_tokenizer(["a few words of the run's own data"] * 50, 400, 128)
    config = architecture_config(spec, tokenizer)
    assert type(config).__name__ == "Gemma3TextConfig" and config.sliding_window == 32
    assert config.vocab_size == max(300, len(tokenizer)) and config.pad_token_id == tokenizer.pad_token_id


def test_a_twin_that_cannot_train_on_a_cpu_says_why_in_one_line() -> None:
    from transformers import AutoConfig

    config = twin_config(AutoConfig.for_model("llama"), VOCAB)
    config._attn_implementation = "no_such_kernel"  # what a CUDA-only attention kernel does on a CPU
    with pytest.raises(ShrinkProblem, match="does not train on a CPU") as caught:
        train_one_step(config)
    assert "\n" not in str(caught.value)


def test_whole_heads_under_tp_and_the_written_twin(tmp_path: Path) -> None:
    from transformers import AutoConfig

    config = whole_heads(twin_config(AutoConfig.for_model("qwen3", num_key_value_heads=2), VOCAB), 4)
    assert config.num_attention_heads % 4 == 0 and config.num_key_value_heads % 4 == 0
    full = tmp_path / "config.json"
    full.write_text(AutoConfig.for_model("gemma3_text").to_json_string(), encoding="utf-8")
    written = write_twin(full, tmp_path / "twin", VOCAB, 1)
    twin = AutoConfig.from_pretrained(written.parent)
    assert twin.hidden_size == 64 and set(twin.layer_types) == {"sliding_attention", "full_attention"}
    full.write_text('{"model_type": "no_such_architecture"}', encoding="utf-8")
    with pytest.raises(ShrinkProblem, match="does not know the architecture"):
        write_twin(full, tmp_path / "none", VOCAB, 1)


def test_an_infinite_limit_is_stored_as_json_and_built_as_a_float() -> None:
    """Mamba-2's time_step_limit (0, inf): `model import` stores it as transformers' tagged object (the bundle's JSON
    stays JSON) and the runtime untags it before it builds the config (transformers' from_dict keeps the object)."""
    import math

    from transformers import CONFIG_MAPPING

    from recipekit.recipe.modelimport import architecture_config
    from recipekit.runtime.boundary.configfloats import untag_floats

    stored = architecture_config({"model_type": "mamba2", "time_step_limit": [0.0, math.inf]})
    assert stored["time_step_limit"] == [0.0, {"__float__": "Infinity"}]
    assert json.loads(json.dumps(stored, allow_nan=False)) == stored
    assert untag_floats({"a": [{"__float__": "-Infinity"}, {"__float__": "x"}]}) == {
        "a": [-math.inf, {"__float__": "x"}]
    }
    built = CONFIG_MAPPING["mamba2"].from_dict({k: v for k, v in untag_floats(stored).items() if k != "model_type"})
    assert tuple(built.time_step_limit) == (0.0, math.inf)


def test_lora_defaults_adapt_every_projection_of_a_deepseek_v3_twin_but_no_router() -> None:
    """all-linear: the runtime's targets from the module tree (MLA's projections, the fused routed experts through
    PEFT's target_parameters), never the router; named targets override them. (PEFT reads this MoE family's MLP
    names as the fused experts: see runtime/model/loader.lora_targets.)"""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from recipekit.recipe.sections import LoraSpec
    from recipekit.runtime.model.loader import lora_targets

    model = AutoModelForCausalLM.from_config(twin_config(AutoConfig.for_model("deepseek_v3"), VOCAB))
    targets = lora_targets(model, LoraSpec(r=4))
    assert targets["target_parameters"] == ["experts.down_proj", "experts.gate_up_proj"]
    wrapped = get_peft_model(model, LoraConfig(r=4, task_type="CAUSAL_LM", **targets))
    adapted = {n.split(".lora_")[0] for n, p in wrapped.named_parameters() if p.requires_grad}
    assert any(n.endswith("self_attn.q_a_proj") for n in adapted) and any(".experts" in n for n in adapted)
    assert not any(n.endswith(".gate") for n in adapted)  # the router
    assert lora_targets(model, LoraSpec(target_modules=["q_a_proj"])) == {"target_modules": ["q_a_proj"]}
