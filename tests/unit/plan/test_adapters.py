"""Issue 41: LoRA targets the model lacks are refused at build, from the module tree `model import` recorded.

Phi-4's attention is one fused ``qkv_proj`` and its MLP one ``gate_up_proj`` (transformers' Phi3 modules; the
option is imported from microsoft/phi-4's published config.json): ``[q_proj, v_proj]`` built and passed static
validation, and failed only on the cluster, where PEFT's ValueError is exit 1 and the Job restarts. The MoE
families whose experts transformers 5 fused keep their transformers-4 expert names in PEFT (huggingface/peft#3711).
"""

from __future__ import annotations

import pytest

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import resolve
from recipekit.plan import adapters


def problems(*overrides: str) -> list[str]:
    with pytest.raises(RecipeError) as refused:
        resolve(list(overrides))
    return [str(p) for p in refused.value.problems if p.key == adapters.KEY]


def test_phi4_q_and_v_proj_are_refused_naming_the_fused_qkv_proj() -> None:
    found = problems("model=phi4", "mode=lora", "mode.lora.target_modules=[q_proj,v_proj]", "cluster.nodes=2")
    assert len(found) == 1, found
    assert "phi4 has no module named q_proj or v_proj" in found[0]
    assert "self_attn.qkv_proj" in found[0] and "mlp.gate_up_proj" in found[0]  # what it has
    assert "q_proj is fused into qkv_proj" in found[0]
    assert "mode.lora.target_modules=[qkv_proj]" in found[0]  # the list that was meant, ready to paste


def test_phi4_fused_names_and_all_linear_build() -> None:
    for targets in ("[qkv_proj,o_proj,gate_up_proj,down_proj]", "[self_attn.qkv_proj]", "all-linear"):
        resolve(["model=phi4", "mode=lora", f"mode.lora.target_modules={targets}", "cluster.nodes=2"])


def test_a_misspelled_target_gets_the_closest_name() -> None:
    found = problems("recipe=llama3_8b_lora", "mode.lora.target_modules=[q_proj,v_porj]")
    assert "no module named v_porj" in found[0] and "did you mean: mode.lora.target_modules=[q_proj,v_proj]" in found[0]


def test_moe_experts_are_accepted_by_the_names_peft_rewrites() -> None:
    """Qwen3-MoE's experts are fused 3-D weights: PEFT rewrites gate_proj/up_proj/down_proj to them; gate_proj
    without up_proj is refused (PEFT: "Cannot convert PEFT target(s) gate_proj without also targeting up_proj")."""
    base = ["recipe=qwen3_30b_a3b_lora", "mode.lora.dropout=0"]
    resolve([*base, "mode.lora.target_modules=[q_proj,gate_proj,up_proj,down_proj]"], analysis_only=True)
    found = problems(*base, "mode.lora.target_modules=[q_proj,gate_proj]")
    assert len(found) == 1 and "gate_proj without up_proj" in found[0] and "gate_up_proj" in found[0], found


def test_mixtral_expert_names_are_its_own() -> None:
    resolve(["model=mixtral_8x7b", "mode=lora", "mode.lora.dropout=0", "mode.lora.target_modules=[w1,w2,w3]"])
    found = problems("model=mixtral_8x7b", "mode=lora", "mode.lora.target_modules=[gate_proj,up_proj]")
    assert "mixtral_8x7b has no module named gate_proj or up_proj" in found[0], found


@pytest.mark.parametrize(
    ("part", "whole", "fused"),
    [
        ("q_proj", "qkv_proj", True),
        ("v_proj", "qkv_proj", True),
        ("o_proj", "qkv_proj", False),
        ("up_proj", "gate_up_proj", True),
        ("down_proj", "gate_up_proj", False),
        ("gate_up_proj", "gate_up_proj", False),
    ],
)
def test_fused_names(part: str, whole: str, fused: bool) -> None:
    assert adapters._fused_into(part, whole) is fused


def test_every_catalog_option_records_its_module_tree() -> None:
    """The check runs for every built-in model: each option records what LoRA can adapt, and its own all-linear
    projections match (the twin's and the plan's counts are checked in tests/unit/recipe/test_models.py)."""
    from recipekit.recipe.compose import group_options
    from tests.unit.recipe.test_models import option

    for name in group_options("model"):
        tree = option(name).modules
        assert tree is not None and tree.layers, name
        assert all(adapters.matches(tree, path) for path in adapters.adaptable(tree)), name


def test_a_sequence_longer_than_the_model_s_context_needs_rope_scaling() -> None:
    """The model's positions bound the sequence unless its config scales RoPE; then factor × the original length."""
    with pytest.raises(RecipeError) as refused:
        resolve(["recipe=qwen3_8b_sft", "data.max_len=65536"])
    problem = next(str(p) for p in refused.value.problems if p.key == "data.max_len")
    assert "40960" in problem and "rope scaling" in problem, problem
    yarn = "model.config.rope_scaling={rope_type:yarn,factor:4.0,original_max_position_embeddings:32768}"
    resolved = resolve(["recipe=qwen3_8b_sft", "data.max_len=65536", yarn])
    assert resolved.recipe.data.max_len == 65536
    with pytest.raises(RecipeError) as beyond:
        resolve(["recipe=qwen3_8b_sft", "data.max_len=262144", yarn])
    assert "131072" in str(beyond.value), beyond.value


@pytest.mark.parametrize("targets", ["all-linear", ["qkv_proj"], ["qkv_proj", "o_proj", "gate_up_proj"]])
def test_the_plan_counts_fused_projections_as_peft_adapts_them(targets: object) -> None:
    """A fused qkv_proj is one adapted module, r × (h + q + 2 kv), not three (Phi-4's tree, at a small size)."""
    from dataclasses import replace

    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import Phi3Config, Phi3ForCausalLM

    from recipekit.plan.modelsize import lora_params
    from recipekit.recipe.sections import LoraSpec
    from recipekit.runtime.model.loader import lora_targets
    from tests.unit.recipe.test_models import option

    small = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "vocab_size": 128}
    spec = replace(option("phi4"), **small, num_layers=2, num_kv_heads=2, params=None, flops=None, config=None)
    torch.manual_seed(0)
    model = Phi3ForCausalLM(Phi3Config(**small, num_hidden_layers=2, num_key_value_heads=2, pad_token_id=0))
    lora = LoraSpec(r=8, target_modules=targets)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=8, task_type="CAUSAL_LM", **lora_targets(model, lora)))
    assert lora_params(spec, lora) == sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
