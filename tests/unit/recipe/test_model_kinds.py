"""`recipekit model import` refuses what is not a decoder-only text model, one line each with the reason (exit 2),
takes a multimodal model's text model where transformers has one, and imports a config whose ``auto_map`` names an
architecture transformers ships with transformers' own class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from recipekit.cli import main

ROOT = Path(__file__).resolve().parents[3]
TINY_LLAMA = json.loads((ROOT / "tests" / "data" / "model_configs" / "tiny_llama" / "config.json").read_text())

pytest.importorskip("torch")


def _import(tmp_path: Path, raw: dict):
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw))
    out = tmp_path / "o.yaml"
    return CliRunner().invoke(main, ["model", "import", str(path), "-o", str(out)]), out


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"model_type": "t5", "d_model": 64, "num_layers": 2, "num_heads": 4}, "'t5' is an encoder-decoder model"),
        ({"model_type": "bart", "d_model": 64}, "'bart' is an encoder-decoder model"),
        ({"model_type": "bert", "hidden_size": 64, "num_attention_heads": 4}, "'bert' is an encoder-only model"),
        (
            {"model_type": "qwen2_vl", "text_config": {"hidden_size": 64, "num_attention_heads": 4}},
            "'qwen2_vl' is a multimodal model and transformers has no causal language model class for its text model",
        ),
        (
            {"model_type": "my_arch", "auto_map": {"AutoModelForCausalLM": "modeling_my.MyForCausalLM"}},
            "remote code: the config's auto_map names model code shipped with the checkpoint (AutoModelForCausalLM)",
        ),
    ],
)
def test_what_is_not_a_decoder_only_text_model_is_refused_in_one_line(tmp_path: Path, raw: dict, words: str) -> None:
    result, out = _import(tmp_path, raw)
    assert result.exit_code == 2, result.output
    assert words in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not out.exists()


def test_auto_map_for_a_native_architecture_imports_with_the_native_class(tmp_path: Path) -> None:
    """DeepSeek-V3 and Phi-3.5-MoE publish configs with auto_map for architectures transformers ships."""
    raw = {**TINY_LLAMA, "auto_map": {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.X"}}
    result, out = _import(tmp_path, raw)
    assert result.exit_code == 0, result.output
    assert "transformers has 'llama' natively" in result.output and "no remote code runs" in result.output
    option = yaml.safe_load(out.read_text())
    assert option["architecture"] == "LlamaForCausalLM" and not option.get("trust_remote_code")


def test_a_multimodal_model_s_text_model_is_imported_saying_so(tmp_path: Path) -> None:
    """LLaVA's text model is a Llama: the option describes it (counts and FLOPs of the text model alone)."""
    text = {k: v for k, v in TINY_LLAMA.items() if k != "architectures"}
    raw = {"model_type": "llava", "text_config": text, "vision_config": {"model_type": "clip_vision_model"}}
    result, out = _import(tmp_path, raw)
    assert result.exit_code == 0, result.output
    assert "'llava' is a multimodal model: the option describes its text model (llama, LlamaForCausalLM)" in (
        result.output
    )
    option = yaml.safe_load(out.read_text())
    alone, _ = _import(tmp_path / "alone", TINY_LLAMA)
    assert alone.exit_code == 0, alone.output
    llama = yaml.safe_load((tmp_path / "alone" / "o.yaml").read_text())
    assert option["family"] == "llama" and option["params"] == llama["params"] and option["flops"] == llama["flops"]
