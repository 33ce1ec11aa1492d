"""`recipekit model import` and the model catalog: exact counts from transformers, refusals, the team repo, and
every model option's tiny twin training one step.

The catalog's configs (tests/data/model_configs/, numbers as published) are re-imported and compared with the
options byte for byte, so an option cannot drift from what `model import` writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from recipekit.cli import main
from recipekit.plan.modelsize import count_params
from recipekit.recipe.compose import group_options
from recipekit.recipe.schema import validate
from recipekit.recipe.sections import ModelSpec

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "tests" / "data" / "model_configs"
sys.path.insert(0, str(CONFIGS))
from regenerate import catalog, import_args  # noqa: E402

torch = pytest.importorskip("torch")


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def option(name: str) -> ModelSpec:
    return validate(ModelSpec, yaml.safe_load(group_options("model")[name].read_text()), root="model")


# ---------------------------------------------------------------------------------------------------- the catalog
#: Sizes the model cards state (total, active), in parameters.
PUBLISHED = {
    "qwen3_0.6b": (0.6e9, None),
    "qwen3_8b": (8.2e9, None),
    "qwen3_32b": (32.8e9, None),
    "qwen3_30b_a3b": (30.5e9, 3.3e9),
    "qwen3_235b_a22b": (235e9, 22e9),
    "llama3.1_8b": (8.03e9, None),
    "llama3.3_70b": (70.6e9, None),
    "llama3.1_405b": (405e9, None),  # the Llama 3.1 model card: 405B
    "deepseek_r1_distill_qwen_7b": (7.62e9, None),
    "glm4_9b": (9.4e9, None),
    "mixtral_8x7b": (46.7e9, 12.9e9),
    "deepseek_v3": (671e9, 37e9),
    "gemma3_27b": (27e9, None),
    "mistral_small_24b": (24e9, None),
    "hunyuan_a13b": (80e9, 13e9),
    "minicpm3_4b": (4e9, None),
    "internlm3_8b": (8.8e9, None),
    "qwen3.5_27b": (27e9, None),
}
#: Cards whose only active figure is the name's rounded one ("35B in total and 3B activated" for A3B): the total is
#: checked; the active count is the option's own (Qwen3.5-35B-A3B: 3.45 B with the embedding and head, 2.95 B without).
PUBLISHED_TOTAL_ONLY = {
    "qwen3.5_35b_a3b": 35e9,
}
#: Cards that state the active count without the embedding tables (total as above, or the card's exact total):
#: card's active, the parts it leaves out. gpt-oss counts the unembedding but not the embedding (its card's table
#: gives 20.91 B / 3.61 B and 116.83 B / 5.13 B); GLM-4.5 leaves out both (355 B / 32 B, Air 106 B / 12 B).
PUBLISHED_ACTIVE_WITHOUT = {
    "gpt_oss_20b": (20.91e9, 3.61e9, ("embedding",)),
    "gpt_oss_120b": (116.83e9, 5.13e9, ("embedding",)),
    "glm4.5": (355e9, 32e9, ("embedding", "head")),
    "glm4.5_air": (106e9, 12e9, ("embedding", "head")),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_counts_match_the_model_cards(name: str) -> None:
    total, active = PUBLISHED[name]
    counts = count_params(option(name))
    assert counts.total == pytest.approx(total, rel=0.02)
    assert counts.active == pytest.approx(active or total, rel=0.02)


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL_ONLY))
def test_catalog_totals_match_cards_that_state_no_exact_active_count(name: str) -> None:
    counts = count_params(option(name))
    assert counts.total == pytest.approx(PUBLISHED_TOTAL_ONLY[name], rel=0.02)
    assert counts.active < counts.total


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE_WITHOUT))
def test_catalog_counts_match_cards_that_leave_the_embeddings_out(name: str) -> None:
    total, active, left_out = PUBLISHED_ACTIVE_WITHOUT[name]
    counts = option(name).params
    assert counts is not None
    assert counts.total == pytest.approx(total, rel=0.02)
    assert counts.active - sum(getattr(counts, part) for part in left_out) == pytest.approx(active, rel=0.02)


@pytest.mark.parametrize("name", sorted(catalog()))
def test_catalog_options_are_what_model_import_writes(name: str, tmp_path: Path) -> None:
    result = run(*import_args(name, catalog()[name], tmp_path / f"{name}.yaml"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / f"{name}.yaml").read_text() == group_options("model")[name].read_text()


def test_every_model_option_is_in_the_catalog() -> None:
    assert set(group_options("model")) == set(catalog())


def test_import_counts_equal_transformers_count_per_part(tmp_path: Path) -> None:
    """Five architectures; the counts are transformers' own, tied embeddings once, MoE experts apart."""
    from recipekit.recipe.modelimport import import_config

    for name in (
        "qwen3_0.6b",
        "qwen3_30b_a3b",
        "llama3.1_8b",
        "glm4_9b",
        "mixtral_8x7b",
        "deepseek_r1_distill_qwen_7b",
    ):
        counts = import_config(CONFIGS / name).option["params"]
        config = json.loads((CONFIGS / name / "config.json").read_text())
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):
            built = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
        unique = {id(p): p.numel() for p in built.parameters()}
        assert counts.total == sum(unique.values()), name
        if config.get("tie_word_embeddings"):
            assert counts.head == 0 and counts.embedding == config["vocab_size"] * config["hidden_size"]
        experts = config.get("num_experts") or config.get("num_local_experts") or 0
        if experts:
            assert counts.experts > 0 and counts.router == config["num_hidden_layers"] * experts * config["hidden_size"]
            per_token = config["num_experts_per_tok"]
            assert counts.active == counts.total - counts.experts + counts.experts * per_token // experts
        else:
            assert counts.experts == counts.router == 0 and counts.active == counts.total


# ---------------------------------------------------------------------------------------------------- refusals
def _config(tmp_path: Path, **raw: object) -> Path:
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw))
    return path


def test_remote_code_is_refused_with_the_reason(tmp_path: Path) -> None:
    path = _config(tmp_path, model_type="deepseek", auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    result = run("model", "import", str(path), "-o", str(tmp_path / "o.yaml"))
    assert result.exit_code == 2 and "auto_map" in result.output and "remote code" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "o.yaml").exists()


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"model_type": "no_such_arch"}, "does not know model_type 'no_such_arch'"),
        ({"model_type": "bert"}, "encoder-only"),
        ({"hidden_size": 8}, "no model_type"),
        (
            {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 3, "head_dim": None, "vocab_size": 0},
            "vocab_size is 0: expected a whole number from 1 to",
        ),
        (
            {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 3, "head_dim": None},
            "transformers cannot",
        ),
    ],
)
def test_unusable_configs_are_one_line_errors(tmp_path: Path, raw: dict, words: str) -> None:
    result = run("model", "import", str(_config(tmp_path, **raw)), "-o", str(tmp_path / "o.yaml"))
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output and len(result.output.splitlines()) == 1


def test_import_writes_into_the_team_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run("init", str(tmp_path / "team")).exit_code == 0
    monkeypatch.chdir(tmp_path / "team")
    model_dir = tmp_path / "Qwen3-30B-A3B"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((CONFIGS / "qwen3_30b_a3b" / "config.json").read_text())
    result = run("model", "import", str(model_dir))
    assert result.exit_code == 0, result.output
    written = tmp_path / "team" / "recipes" / "model" / "qwen3_30b_a3b.yaml"
    data = yaml.safe_load(written.read_text())
    assert data["architecture"] == "Qwen3MoeForCausalLM"
    assert data["name_or_path"] == "${cluster.mount_path}/models/Qwen3-30B-A3B"  # on the volume the pods mount
    assert run("model", "import", str(model_dir)).exit_code == 2  # no silent overwrite
    shown = run("show", "model=qwen3_30b_a3b", "--json")
    assert shown.exit_code == 0, shown.output


def test_outside_a_team_repo_the_destination_is_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run("model", "import", str(CONFIGS / "qwen3_8b"))
    assert result.exit_code == 2 and "-o PATH" in result.output


# ------------------------------------------------------------------------------------------ MoE in plan and bundle
def _plan(*overrides: str):
    from recipekit.bundle.build import resolve

    resolved = resolve(list(overrides))
    return resolved.recipe, resolved.plan


def test_moe_flops_count_active_parameters_and_memory_counts_all(tmp_path: Path) -> None:
    from recipekit import memory

    recipe, plan = _plan("model=qwen3_30b_a3b", "parallel=zero3", "hw=h100", "cluster.nodes=2")
    counts = count_params(recipe.model)
    assert plan.flops.params_total == counts.total > 9 * plan.flops.params_active == 9 * counts.active
    flops = recipe.model.flops
    assert flops is not None and plan.flops.model_per_token == flops.train_at(recipe.data.max_len)
    # the counter counted the top-k experts a token routes through: ~6 FLOPs per active parameter, not per parameter
    assert 6 * counts.active < plan.flops.model_per_token < 2 * 6 * counts.active
    est = memory.estimate(recipe, plan)
    assert est.compute.params_total == counts.total and est.compute.params_active == counts.active
    assert est.experts is not None and est.experts.expert_params == counts.experts
    # the weights item is counted from all 30.5 B parameters, not the 3.3 B active ones
    assert est.item("weights") * 2**30 > counts.total * 2 / plan.layout.dp_size


def test_the_bundle_s_mfu_uses_the_plan_s_active_flops(tmp_path: Path) -> None:
    result = run(
        "build", "model=qwen3_30b_a3b", "parallel=zero3", "hw=h100", "cluster.nodes=2", "-o", str(tmp_path / "b")
    )
    assert result.exit_code == 0, result.output
    saved = yaml.safe_load((tmp_path / "b" / "recipe.yaml").read_text())
    flops = saved["plan"]["flops"]
    assert flops["params_active"] < flops["params_total"]
    from types import SimpleNamespace

    from recipekit.runtime.session.callbacks import ThroughputCallback

    callback = ThroughputCallback.from_plan(SimpleNamespace(**flops), world_size=16)
    assert callback.model_flops == flops["model_per_token"]
    text = (tmp_path / "b" / "plan.md").read_text()
    assert "active per token" in text and "over the whole step" in text and "mixture of experts" in text


def test_expert_parallelism_is_analysed_and_refused_by_build(tmp_path: Path) -> None:
    from recipekit import memory
    from recipekit.bundle.build import resolve

    resolved = resolve(
        ["model=qwen3_30b_a3b", "parallel=zero2", "hw=h100", "cluster.nodes=2", "parallel.expert_parallel=8"],
        analysis_only=True,
    )
    recipe, plan = resolved.recipe, resolved.plan
    est = memory.estimate(recipe, plan)
    assert est.experts is not None and est.experts.expert_parallel == 8 and not est.experts.buildable
    assert est.experts.saved_gib > 40 and est.experts.dp_gb_with_ep < est.experts.dp_gb
    assert "all-to-all" in est.experts.note
    out = tmp_path / "b"
    built = run(
        "build", "model=qwen3_30b_a3b", "hw=h100", "cluster.nodes=2", "parallel.expert_parallel=8", "-o", str(out)
    )
    assert built.exit_code == 2 and "parallel.expert_parallel" in built.output and "analysis only" in built.output
    dense = run("build", "model=tiny_llama", "parallel.expert_parallel=2", "-o", str(out))
    assert dense.exit_code == 2 and "a dense model" in dense.output
    tp = run("build", "model=qwen3_30b_a3b", "hw=h100", "parallel=zero2", "parallel.tensor_parallel=2", "-o", str(out))
    assert tp.exit_code == 2 and "fused 3-D" in tp.output


def test_build_says_when_the_image_s_transformers_is_too_old(tmp_path: Path) -> None:
    result = run("build", "model=qwen3_8b", "model.min_transformers=9.1.0", "-o", str(tmp_path / "b"))
    assert result.exit_code == 2
    assert "needs transformers >= 9.1.0" in result.output and "pins transformers 5.24.0" in result.output
    refusal = next(line for line in result.output.splitlines() if "model.min_transformers" in line)
    assert "raise the pin in images/matrix.yaml" in refusal  # one line: both versions and what to do


#: The transformers release that first shipped each architecture (the release after the day its model_doc page says
#: it was added), as the catalog options record it; Mistral Small 3's own head_dim was first read in 4.43.0.
FIRST_SHIPPED = {
    "deepseek_v3": "4.51.0",
    "gemma3_27b": "4.50.0",
    "glm4.5": "4.54.0",
    "glm4.5_air": "4.54.0",
    "ernie4.5_21b_a3b": "4.54.0",
    "gpt_oss_20b": "4.55.0",
    "gpt_oss_120b": "4.55.0",
    "hunyuan_a13b": "4.56.0",
    "qwen3_next_80b_a3b": "4.57.0",
    "qwen3.5_27b": "5.2.0",
    "qwen3.5_35b_a3b": "5.2.0",
    "minicpm3_4b": "5.8.0",
    "mistral_small_24b": "4.43.0",
    "phi4": "4.40.0",  # Phi3ForCausalLM, added in transformers 4.40.0
}


@pytest.mark.parametrize("name", sorted(FIRST_SHIPPED))
def test_an_image_older_than_the_architecture_is_refused_naming_both(name: str) -> None:
    """Each new option records the release that first shipped its architecture; an image family pinning the release
    before it is refused, naming both versions; one pinning that release is not."""
    import dataclasses

    from recipekit.bundle.build import resolve
    from recipekit.image.matrix import load_images, transformers_problems

    needed = FIRST_SHIPPED[name]
    assert option(name).min_transformers == needed
    recipe = resolve([f"model={name}"], analysis_only=True).recipe
    family = load_images().families["ascend-910b"]
    major, minor, _ = needed.split(".")
    older = f"{major}.{int(minor) - 1}.0" if int(minor) else "4.57.6"
    pinned_older = dataclasses.replace(family, packages={**family.packages, "transformers": older})
    (problem,) = transformers_problems("ascend-910b", pinned_older, recipe)
    assert f"needs transformers >= {needed}" in problem.message and f"pins transformers {older}" in problem.message
    pinned_same = dataclasses.replace(family, packages={**family.packages, "transformers": needed})
    assert transformers_problems("ascend-910b", pinned_same, recipe) == []


# ------------------------------------------------------------------------------------------------ runtime and twins
def test_router_settings_pass_through_to_the_model_config() -> None:
    from recipekit.runtime.model.loader import router_settings

    assert router_settings(option("qwen3_8b")) == {}
    moe = option("mixtral_8x7b")
    assert router_settings(moe) == {"output_router_logits": True, "router_aux_loss_coef": 0.02}


def _twin(name: str):
    """The option's tiny twin (same family, random init), built with its own architecture class."""
    from recipekit.runtime.model.twin import architecture_config, causal_lm_class
    from recipekit.validate.dryrun.workdir.twinmodel import find_twin

    spec = option(name)
    twin = find_twin(spec.family)
    assert twin is not None, f"no tiny twin for family {spec.family}"
    torch.manual_seed(0)
    return spec, twin, causal_lm_class(twin.family)(architecture_config(twin))


def _has_tiny_twin(name: str) -> bool:
    from recipekit.validate.dryrun.workdir.twinmodel import find_twin

    return find_twin(option(name).family) is not None


#: Options of a family that has a tiny_<family> option (the others' twins are shrunk from their own config by
#: recipekit.runtime.model.shrink, tested there; their counts are the catalog's re-import above).
@pytest.mark.parametrize("name", sorted(n for n in group_options("model") if _has_tiny_twin(n)))
def test_every_model_option_s_twin_trains_a_step_and_its_counts_match(name: str) -> None:
    from recipekit.runtime.model.twin import architecture_config, causal_lm_class

    spec, twin, model = _twin(name)
    assert type(model).__name__ == (spec.architecture or type(model).__name__)
    ids = torch.randint(0, twin.vocab_size, (2, 16))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(p.grad is not None for n, p in model.named_parameters() if "experts" not in n)
    if twin.moe:  # the load-balancing loss is part of the loss the twin trains on
        assert out.aux_loss is not None and torch.isfinite(out.aux_loss)
    with torch.device("meta"):
        full = causal_lm_class(spec.family)(architecture_config(spec))
    assert count_params(spec).total == sum(p.numel() for p in full.parameters())


def test_zero3_marks_the_moe_blocks_as_leaves() -> None:
    from deepspeed.utils import get_z3_leaf_modules

    from recipekit.runtime.model.loader import mark_moe_leaves

    blocks = {"tiny_qwen3_moe": "Qwen3MoeSparseMoeBlock", "tiny_mixtral": "MixtralSparseMoeBlock"}
    for name, block in blocks.items():
        _, _, model = _twin(name)
        assert mark_moe_leaves(model, zero_stage=2) == []
        marked = mark_moe_leaves(model, zero_stage=3)
        assert marked == [block]  # found from the module tree: the module holding the experts and their router
        assert {type(m).__name__ for m in get_z3_leaf_modules(model)} == set(marked)
    _, _, dense = _twin("tiny_qwen3")
    assert mark_moe_leaves(dense, zero_stage=3) == []


@pytest.mark.parametrize("name", ["qwen3_8b", "qwen3_30b_a3b", "mixtral_8x7b"])
@pytest.mark.parametrize("stage", [2, 3])
def test_plan_memory_of_dense_and_moe_models_matches_deepspeed_s_estimator(name: str, stage: int) -> None:
    """The plan's model states per device (from the option's stored total and largest module) within 2% of
    DeepSpeed's own estimators, called with the same counts transformers gives."""
    from recipekit import memory

    recipe, plan = _plan(f"model={name}", "mode=sft", f"parallel=zero{stage}", "hw=h100", "cluster.nodes=4")
    est = memory.estimate(recipe, plan)
    ours = sum(est.item(item) for item in ("weights", "gradients", "optimizer states")) * 2**30
    counts = recipe.model.params
    assert counts is not None
    gpus, nodes = plan.layout.devices_per_pod, plan.layout.nodes
    if stage == 2:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        _, theirs = estimate_zero2_model_states_mem_needs(counts.total, gpus, nodes, cpu_offload=False)
    else:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        _, theirs, _ = estimate_zero3_model_states_mem_needs(
            counts.total, counts.largest_module, gpus, nodes, cpu_offload=False, cpu_offload_params=False
        )
    assert ours == pytest.approx(theirs, rel=0.02)


@pytest.mark.parametrize("name", sorted(n for n in group_options("model") if n.startswith("tiny_")))
def test_lora_parameter_count_is_peft_s_live_adapters(name: str) -> None:
    """The runtime's default (all-linear) adapters on each family's twin, fused MLPs and MoE experts included, routers
    left alone: the plan counts what PEFT makes live."""
    from peft import LoraConfig, get_peft_model

    from recipekit.plan.modelsize import lora_params
    from recipekit.recipe.sections import LoraSpec
    from recipekit.runtime.model.loader import lora_targets
    from recipekit.runtime.model.twin import architecture_config, causal_lm_class

    spec = option(name)
    model = causal_lm_class(spec.family)(architecture_config(spec))
    targets = lora_targets(model, LoraSpec(r=8))
    wrapped = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM", **targets))
    live = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert lora_params(spec, LoraSpec(r=8)) == live
    adapted = {n.split(".lora_")[0] for n, p in wrapped.named_parameters() if p.requires_grad}
    assert not any(n.endswith((".gate", ".router")) for n in adapted)  # no router is adapted


def test_moe_lora_with_dropout_is_refused_with_the_fix(tmp_path: Path) -> None:
    """PEFT's adapter for fused experts refuses dropout: found by the preset's dry run, refused at build."""
    refused = run("build", "model=qwen3_30b_a3b", "mode=lora", "parallel=zero3", "-o", str(tmp_path / "a"))
    assert refused.exit_code == 2 and "mode.lora.dropout" in refused.output and "ParamWrapper" in refused.output
    fixed = ["model=qwen3_30b_a3b", "mode=lora", "parallel=zero3", "mode.lora.dropout=0", "-o", str(tmp_path / "b")]
    assert run("build", *fixed).exit_code == 0
    named = ["model=qwen3_30b_a3b", "mode=lora", "parallel=zero3", "mode.lora.target_modules=[q_proj,v_proj]"]
    assert run("build", *named, "-o", str(tmp_path / "c")).exit_code == 0


def test_import_states_flops_at_the_lengths_users_choose(tmp_path: Path) -> None:
    """Issue 41: not "at 4096 tokens" alone, but at the common training lengths within the model's context and at
    the context itself (Phi-4: 16,384)."""
    result = run(*import_args("phi4", catalog()["phi4"], tmp_path / "phi4.yaml"))
    assert result.exit_code == 0, result.output
    assert "at 4096 tokens" not in result.output
    figures = next(line for line in result.output.splitlines() if "2,048:" in line)
    assert "4,096:" in figures and "8,192:" in figures and "16,384:" in figures and "(context)" in figures
    assert "32,768" not in figures  # beyond its context
