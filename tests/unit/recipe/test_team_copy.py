"""``recipekit cp`` copies a built-in option or preset into a team repo with its origin noted, and a team layer
drops a built-in key durably by setting it to null (recipe/scaffold.py, recipe/schema.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from recipekit.base.errors import RecipeError
from recipekit.base.paths import RECIPES_DIR
from recipekit.bundle.build import resolve
from recipekit.cli import main
from recipekit.recipe.scaffold import copy_option, init
from recipekit.recipe.schema import Section, spec, validate


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    init(tmp_path / "team-nlp-recipes")
    monkeypatch.chdir(tmp_path / "team-nlp-recipes")
    return tmp_path / "team-nlp-recipes"


def test_cp_copies_a_built_in_option_with_its_origin_and_it_shadows_the_built_in(repo: Path) -> None:
    result = CliRunner().invoke(main, ["cp", "hw/ascend910b"])
    assert result.exit_code == 0, result.output
    assert "copied built-in hw/ascend910b to recipes/hw/ascend910b.yaml" in result.output
    assert all(len(line) <= 80 for line in result.output.splitlines())
    copy = (repo / "recipes" / "hw" / "ascend910b.yaml").read_text()
    built_in = (RECIPES_DIR / "hw" / "ascend910b.yaml").read_bytes()
    assert copy.startswith("# Copied from recipekit ") and hashlib.sha256(built_in).hexdigest()[:16] in copy
    assert copy.endswith(built_in.decode()) and yaml.safe_load(copy) == yaml.safe_load(built_in)
    listed = CliRunner().invoke(main, ["list", "hw"]).output
    row = [line for line in listed.splitlines() if "ascend910b *" in line]  # the table wraps the cell at 80 columns
    assert row and "team-nlp-recipes (shadows" in row[0], listed


def test_cp_under_a_new_name_renames_the_option_and_keeps_the_package_line_first(repo: Path) -> None:
    copied = copy_option("recipe/llama3_8b_sft", "our_llama_sft")
    text = copied.target.read_text()
    assert not copied.shadows and text.startswith("# @package _global_\n# Copied from recipekit")
    assert yaml.safe_load(text)["name"] == "our_llama_sft"
    recipe = resolve(["recipe=our_llama_sft"], (repo / "recipes",)).recipe
    assert recipe.name == "our_llama_sft" and recipe.hw.name == "ascend910b"


def test_cp_refuses_an_unknown_option_an_existing_file_and_no_team_repo(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RecipeError, match="did you mean hw/ascend910b"):
        copy_option("hw/ascend910")
    with pytest.raises(RecipeError, match="unknown group 'gpu'"):
        copy_option("gpu/h100")
    copy_option("hw/h100")
    with pytest.raises(RecipeError, match="exists: not overwritten"):
        copy_option("hw/h100")
    copy_option("hw/h100", force=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (repo / "recipes" / "hw" / "h200.yaml").symlink_to(elsewhere / "x.yaml")
    with pytest.raises(RecipeError, match="is a link"):
        copy_option("hw/h200", force=True)
    monkeypatch.chdir(elsewhere)
    result = CliRunner().invoke(main, ["cp", "hw/h100"])
    assert result.exit_code == 2 and "not inside a team recipe repo" in result.output
    assert "Traceback" not in result.output
    assert copy_option("hw/h100", to=elsewhere / "recipes").target == elsewhere / "recipes" / "hw" / "h100.yaml"


def test_a_team_layer_drops_built_in_keys_with_null(repo: Path) -> None:
    (repo / "recipes" / "hw").mkdir()
    (repo / "recipes" / "hw" / "our910b.yaml").write_text(
        "defaults:\n  - ascend910b\n  - _self_\n"
        "name: our910b\n"
        "node_selector:\n  accelerator-type: null\n"  # one key dropped
        "env:\n  HCCL_BUFFSIZE: null\n"
        "pod_labels: null\n"  # the whole map cleared
    )
    built_in = resolve(["recipe=llama3_8b_sft"]).recipe.hw
    assert built_in.node_selector == {"accelerator-type": "module-910b-8"} and "HCCL_BUFFSIZE" in built_in.env
    ours = resolve(["recipe=llama3_8b_sft", "hw=our910b"], (repo / "recipes",)).recipe.hw
    assert ours.node_selector == {} and ours.pod_labels == {}
    assert "HCCL_BUFFSIZE" not in ours.env and ours.env["TASK_QUEUE_ENABLE"] == "1"
    # the same on the command line, where `~` also works
    line = resolve(["recipe=llama3_8b_sft", "hw.node_selector.accelerator-type=null"]).recipe.hw
    assert line.node_selector == {}


class Holder(Section):
    plain: dict[str, str] = spec(default_factory=dict, description="text values")
    maybe: dict[str, int | None] = spec(default_factory=dict, description="values or null")
    anything: dict[str, Any] = spec(default_factory=dict, description="anything")


def test_null_in_a_mapping_whose_values_may_be_null_is_kept() -> None:
    held = validate(Holder, {"plain": {"a": None, "b": "x"}, "maybe": {"a": None}, "anything": {"a": None}})
    assert held.plain == {"b": "x"} and held.maybe == {"a": None} and held.anything == {"a": None}
    assert validate(Holder, {"plain": None}).plain == {}
