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
from recipekit.compose import group_options
from recipekit.modelsize import count_params
from recipekit.recipe import ModelSpec
from recipekit.schema import validate

ROOT = Path(__file__).resolve().parents[2]
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
    "deepseek_r1_distill_qwen_7b": (7.62e9, None),
    "glm4_9b": (9.4e9, None),
    "mixtral_8x7b": (46.7e9, 12.9e9),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_counts_match_the_model_cards(name: str) -> None:
    total, active = PUBLISHED[name]
    counts = count_params(option(name))
    assert counts.total == pytest.approx(total, rel=0.02)
    assert counts.active == pytest.approx(active or total, rel=0.02)


@pytest.mark.parametrize("name", sorted(catalog()))
def test_catalog_options_are_what_model_import_writes(name: str, tmp_path: Path) -> None:
    result = run(*import_args(name, catalog()[name], tmp_path / f"{name}.yaml"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / f"{name}.yaml").read_text() == group_options("model")[name].read_text()


def test_every_model_option_is_in_the_catalog() -> None:
    assert set(group_options("model")) == set(catalog())


def test_import_counts_equal_transformers_count_per_part(tmp_path: Path) -> None:
    """Five architectures; the counts are transformers' own, tied embeddings once, MoE experts apart."""
    from recipekit.modelimport import import_config

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
        ({"model_type": "gpt2"}, "no planner formulas"),
        ({"hidden_size": 8}, "no model_type"),
        (
            {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 3, "head_dim": None, "vocab_size": 0},
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
    assert data["architecture"] == "Qwen3MoeForCausalLM" and data["name_or_path"] == "/mnt/shared/models/Qwen3-30B-A3B"
    assert run("model", "import", str(model_dir)).exit_code == 2  # no silent overwrite
    shown = run("show", "model=qwen3_30b_a3b", "--json")
    assert shown.exit_code == 0, shown.output


def test_outside_a_team_repo_the_destination_is_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run("model", "import", str(CONFIGS / "qwen3_8b"))
    assert result.exit_code == 2 and "-o PATH" in result.output
