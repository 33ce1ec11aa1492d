"""`recipekit model import` has no family switch: architectures it never named import with transformers' exact
count, the routed experts and their top-k found in the module tree; what cannot be known is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from recipekit.cli import main

torch = pytest.importorskip("torch")

TINY_DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "vocab_size": 256,
}


def imported(tmp_path: Path, raw: dict) -> tuple[int, dict, str]:
    folder = tmp_path / raw["model_type"]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    out = folder / "option.yaml"
    result = CliRunner().invoke(main, ["model", "import", str(folder), "-o", str(out), "--name", "generic"])
    return result.exit_code, yaml.safe_load(out.read_text()) if out.exists() else {}, result.output


def meta_model(raw: dict):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_an_architecture_never_named_imports_with_transformers_exact_count(tmp_path: Path) -> None:
    raw = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 256}
    code, option, output = imported(tmp_path, raw)
    assert code == 0, output
    exact = sum(p.numel() for p in meta_model(raw).parameters())
    assert option["family"] == "gpt2" and option["params"]["total"] == exact == option["params"]["active"]
    assert option["num_attention_heads"] == 4 and option["intermediate_size"] == 256  # GPT-2's 4 × width MLP
    assert option["flops"]["counted_by"] == "counter"


def test_mla_moe_experts_and_top_k_come_from_the_module_tree(tmp_path: Path) -> None:
    code, option, output = imported(tmp_path, TINY_DEEPSEEK_V3)
    assert code == 0, output
    model = meta_model(TINY_DEEPSEEK_V3)
    routed = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    params = option["params"]
    assert params["total"] == sum(p.numel() for p in model.parameters())
    assert params["experts"] == routed and params["router"] == 2 * 8 * 64  # two MoE layers' routers, not dense
    assert params["active"] == params["total"] - routed * (8 - 2) // 8  # a token skips 6 of 8 routed experts
    assert (option["num_experts"], option["experts_per_token"], option["moe_intermediate_size"]) == (8, 2, 32)
    assert option["head_dim_override"] == 24  # MLA: the query-key head is nope + rope wide


def test_experts_without_a_top_k_are_refused_in_one_line(tmp_path: Path) -> None:
    raw = {**TINY_DEEPSEEK_V3, "model_type": "deepseek_v2", "num_experts_per_tok": None}
    code, _, output = imported(tmp_path, raw)
    assert code == 2 and "top-k" in output and len(output.strip().splitlines()) == 1, output


def test_experts_without_weights_are_refused_for_want_of_a_fixed_active_count() -> None:
    """Fused expert tensors that disagree on the expert count (LongCat-Flash's zero-computation experts) make a
    token's active parameters depend on its routing: named, so the import can refuse."""
    from recipekit.recipe import modelfacts

    class Experts(torch.nn.Module):
        def __init__(self, gate_up: int, down: int) -> None:
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.empty(gate_up, 4, 8))
            self.down_proj = torch.nn.Parameter(torch.empty(down, 8, 4))

    model = torch.nn.ModuleDict({"even": torch.nn.ModuleDict({"experts": Experts(6, 6)}), "zero": Experts(6, 4)})
    assert modelfacts.uneven_experts(model) == ["zero (gate_up_proj 6, down_proj 4)"]
