"""Issue 38: `recipekit model import` bounds every config it builds from, and measures in bounded memory.

Before, only the top level of a config.json was bounded: a multimodal config's text model with 10⁹ layers was built
on the meta device (2.4 GB and still running at 90 s), a vocabulary of 10¹³, a low-rank KV width of 2⁴⁰ or 65,536
experts of width 2²⁴ ended in a RecipeError traceback (exit 1), 4 query heads over 3 key-value heads imported and
recorded 4, an ``architectures`` of ``[null]`` or a mapping was a traceback, and the published Phi-3.5-MoE config
was killed by the kernel at 23 GB in the CPU fallback of the FLOP counter. Each is a child process here (a
refusal: exit 2, one line naming the key, within seconds and the hostile-input memory bound), except the budget's
own checks, which run in this process on tiny configs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.project.test_hostile_input import MAX_RSS_MIB, run_measured

pytest.importorskip("transformers")

BASE = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
}
DEEPSEEK = {
    **BASE,
    "model_type": "deepseek_v3",
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
}
QWEN3_MOE = {**BASE, "model_type": "qwen3_moe", "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
             "moe_intermediate_size": 32}  # fmt: skip
PHI_MOE = Path(__file__).parents[2] / "data" / "phi3.5_moe" / "config.json"


def multimodal(text: dict[str, Any]) -> dict[str, Any]:
    """A LLaVA config around ``text``: the import takes its text model."""
    return {"model_type": "llava", "text_config": text, "vision_config": {"model_type": "clip_vision_model"}}


def import_in_child(tmp_path: Path, config: dict[str, Any], *extra: str) -> tuple[Any, str]:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    target = tmp_path / "option.yaml"
    result = run_measured(["model", "import", str(tmp_path / "model"), "-o", str(target), *extra], tmp_path)
    return result, result.stdout + result.stderr


HOSTILE = {
    "text model of 10**9 layers": (multimodal({**BASE, "num_hidden_layers": 10**9}), "num_hidden_layers is"),
    "text model of a 10**13 vocabulary": (multimodal({**BASE, "vocab_size": 10**13}), "vocab_size is"),
    "text model of a 2**40 KV rank": (multimodal({**DEEPSEEK, "kv_lora_rank": 2**40}), "kv_lora_rank is"),
    "text model of 65,536 experts of width 2**24": (
        multimodal({**QWEN3_MOE, "num_experts": 65_536, "moe_intermediate_size": 2**24}),
        "over the 1e+12 an option holds",
    ),
    "4 query heads over 3 key-value heads": (
        {**BASE, "num_key_value_heads": 3},
        "num_attention_heads (4) is not a whole multiple of num_key_value_heads (3)",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_every_hostile_count_is_refused_in_one_line_before_anything_is_built(tmp_path: Path, case: str) -> None:
    config, expected = HOSTILE[case]
    result, output = import_in_child(tmp_path, config)
    lines = [line for line in output.splitlines() if line.strip() and "Warning" not in line]
    where = f"{case}: exit {result.code}, {result.wall_s:.0f} s, {result.rss_mib:.0f} MiB\n{output[-2000:]}"
    assert result.code == 2 and "Traceback" not in output, where
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], where
    assert result.wall_s < 60 and result.rss_mib < MAX_RSS_MIB, where
    assert not (tmp_path / "option.yaml").exists()


@pytest.mark.parametrize("architectures", [[None], {"LlamaForCausalLM": 1}, [["x"]], 7])
def test_an_architectures_entry_that_names_no_class_gives_transformers_own(tmp_path: Path, architectures: Any) -> None:
    result, output = import_in_child(tmp_path, {**BASE, "architectures": architectures})
    assert result.code == 0 and "Traceback" not in output, output[-2000:]
    assert yaml.safe_load((tmp_path / "option.yaml").read_text())["architecture"] == "LlamaForCausalLM"


def test_every_recipe_error_of_an_import_is_an_import_problem(tmp_path: Path, monkeypatch) -> None:
    """A schema bound the measured counts break (here: forced) is one line, exit 2, not a traceback."""
    from recipekit.base.errors import Problem, RecipeError
    from recipekit.recipe import modelimport

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RecipeError([Problem("model.params.total", "must be less than or equal to 1000000000000")])

    monkeypatch.setattr(modelimport, "count_parts", broken)
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    with pytest.raises(modelimport.ImportProblem, match="model.params.total: must be less than"):
        modelimport.import_config(tmp_path / "config.json")


# --------------------------------------------------------------------------------- the CPU count and its budget
#: A tiny Phi-MoE with LongRoPE: its rotary embedding picks its factors by the largest position (``Tensor.item()``).
TINY_PHI_MOE = {
    **BASE,
    "model_type": "phimoe",
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 512,
    "rope_scaling": {
        "type": "longrope",
        "short_factor": [1.0] * 8,
        "long_factor": [2.0] * 8,
        "short_mscale": 1.2,
        "long_mscale": 1.2,
        "original_max_position_embeddings": 512,
    },
}
#: A tiny JetMoE: a module of it cannot run on the meta device at all, so it is counted on the CPU.
TINY_JETMOE = {"model_type": "jetmoe", "hidden_size": 64, "num_hidden_layers": 2, "num_key_value_heads": 2,
               "kv_channels": 16, "intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2,
               "vocab_size": 256, "max_position_embeddings": 512}  # fmt: skip
FLOPS_FIELDS = ("train", "train_per_position", "frozen", "frozen_per_position", "recompute", "recompute_per_position")


def _import(tmp_path: Path, config: dict[str, Any]) -> Any:
    from recipekit.recipe import modelimport

    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return modelimport.import_config(path)


def _numbers(flops: Any) -> list[int]:
    return [getattr(flops, field) for field in FLOPS_FIELDS]


def test_a_rotary_embedding_reading_positions_is_answered_on_meta_as_the_cpu_counts_it(tmp_path: Path) -> None:
    """LongRoPE read the positions' values, which sent the count to the CPU (Phi-3.5-MoE: killed at 23 GB). The
    positions the counter feeds are known: the rotary computes on the CPU from them, the model stays on meta, and
    the count is the whole model's on the CPU, and the meta count of the same model without LongRoPE."""
    from recipekit.recipe import modelimport, modelkind
    from recipekit.recipe.measured import modelflops

    on_meta = _import(tmp_path / "phi", TINY_PHI_MOE).option["flops"]
    assert on_meta.counted_by == "counter"
    path = tmp_path / "phi" / "config.json"
    config = modelkind.decoder_text_model(path, modelimport.load_config(path), TINY_PHI_MOE).config
    model = modelimport.meta_model(config)
    lengths = modelflops.sequences(model.config)
    on_cpu = modelflops._solved(
        modelflops._samples_on_cpu(model, modelflops.DepthCut.of(model), lengths), "counter_cpu"
    )
    plain = {k: v for k, v in TINY_PHI_MOE.items() if k != "rope_scaling"}
    assert _numbers(on_meta) == _numbers(on_cpu) == _numbers(_import(tmp_path / "plain", plain).option["flops"])


def test_on_the_cpu_experts_run_eagerly_and_count_what_batched_mm_counts_on_meta(tmp_path: Path) -> None:
    from recipekit.recipe import modelimport, modelkind
    from recipekit.recipe.measured import modelflops

    assert _import(tmp_path / "jetmoe", TINY_JETMOE).option["flops"].counted_by == "counter_cpu"
    path = Path(__file__).parents[2] / "data" / "model_configs" / "tiny_mixtral" / "config.json"
    raw = modelimport.read_raw(path)
    model = modelimport.meta_model(modelkind.decoder_text_model(path, modelimport.load_config(path), raw).config)
    lengths = modelflops.sequences(model.config)
    on_cpu = modelflops._solved(
        modelflops._samples_on_cpu(model, modelflops.DepthCut.of(model), lengths), "counter_cpu"
    )
    assert _numbers(on_cpu) == _numbers(modelflops.measure(model))


def test_over_the_budget_the_count_is_analytic_and_the_import_says_why(tmp_path: Path, monkeypatch) -> None:
    import transformers

    from recipekit.recipe.measured import modelflops

    monkeypatch.setattr(modelflops, "CPU_BUDGET_BYTES", 1 << 20)
    built: list[Any] = []
    original = transformers.AutoModelForCausalLM.from_config

    def watched(config: Any, **kwargs: Any) -> Any:
        if kwargs.get("experts_implementation") == "eager":
            built.append(config)
        return original(config, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", watched)
    imported = _import(tmp_path, TINY_JETMOE)
    assert not built, "the budget is checked before the CPU model is built"
    assert imported.option["flops"].counted_by == "analytic"
    (note,) = [n for n in imported.notes if "FLOPs counted analytically" in n]
    assert "would need" in note and "over the budget of" in note


def test_the_budget_is_stated_in_the_help_and_the_docs() -> None:
    from click.testing import CliRunner

    from recipekit.cli import main
    from recipekit.recipe.measured import modelflops

    gib = f"{modelflops.CPU_BUDGET_BYTES / 2**30:g} GiB"
    help_text = " ".join(CliRunner().invoke(main, ["model", "import", "--help"]).output.split())
    assert f"within a budget of {gib}" in help_text
    docs = " ".join((Path(__file__).parents[3] / "docs" / "models.md").read_text().split())
    assert f"budget of {gib}" in docs


@pytest.mark.slow
def test_the_published_phi_3_5_moe_imports_within_the_budget_with_the_exact_count(tmp_path: Path) -> None:
    """The config the docs name as supported (killed at 23 GB before): its LongRoPE answered from the known
    positions, the count runs on the meta device, far within the budget, and equals the count of the same config
    without LongRoPE."""
    from recipekit.recipe.measured import modelflops

    config = json.loads(PHI_MOE.read_text())
    result, output = import_in_child(tmp_path, config, "--name", "phi3.5_moe")
    where = f"exit {result.code}, {result.wall_s:.0f} s, {result.rss_mib:.0f} MiB\n{output[-2000:]}"
    assert result.code == 0, where
    assert result.rss_mib < modelflops.CPU_BUDGET_BYTES / 2**20, where
    option = yaml.safe_load((tmp_path / "option.yaml").read_text())
    assert option["params"]["total"] == 41_873_153_344 and option["params"]["active"] == 6_640_999_744
    assert option["flops"]["counted_by"] == "counter", where
    plain = {k: v for k, v in config.items() if k != "rope_scaling"}
    (tmp_path / "plain").mkdir()
    meta_result, meta_output = import_in_child(tmp_path / "plain", plain, "--name", "phi3.5_moe")
    assert meta_result.code == 0, meta_output[-2000:]
    on_meta = yaml.safe_load((tmp_path / "plain" / "option.yaml").read_text())["flops"]
    assert on_meta["counted_by"] == "counter"
    assert {k: v for k, v in option["flops"].items() if k != "counted_by"} == {
        k: v for k, v in on_meta.items() if k != "counted_by"
    }


def test_a_heterogeneous_config_is_refused_in_one_line_naming_its_per_layer_fields(tmp_path: Path) -> None:
    """transformers' heterogeneous configs (dots3's text model: 128 heads on some layers, 64 on others) refuse a
    global read of a per-layer field; the import names the fields instead of planning one shape for all layers."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.for_model("dots3_note_text").to_dict()
    except (KeyError, ValueError):
        pytest.skip("the pinned transformers has no dots3_note_text")
    result, output = import_in_child(tmp_path, json.loads(json.dumps(config, default=str)))
    lines = [line for line in output.splitlines() if line.strip() and "Warning" not in line]
    assert result.code == 2 and "Traceback" not in output and len(lines) == 1, output[-2000:]
    assert "sets kv_lora_rank, num_attention_heads, num_key_value_heads, qk_nope_head_dim per layer" in lines[0]
