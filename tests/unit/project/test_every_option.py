"""Every option of every group composes, validates, plans and renders — discovered from the filesystem.

A new YAML dropped into recipes/<group>/ is tested here without touching this file. Each option is combined with a
base that makes sense for it (LoRA data for modes, a node count the hardware can take, ...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING

import pytest
import yaml

from recipekit.base.paths import GROUPS
from recipekit.bundle.files import MANIFEST, PLAN_JSON, PLAN_MD, REQUIRED
from recipekit.recipe.compose import group_options
from recipekit.recipe.sections import ClusterSpec, DataSpec, HardwareSpec, ModelSpec, ParallelSpec
from tests.conftest import render_files

#: What must accompany an option of a group so the combination is meaningful.
_COMPANIONS = {
    "mode": {"pretrain": ["data=text"]},
    "data": {"text": ["mode=pretrain"]},
    # Megatron shards optimizer states with its distributed optimizer, not DeepSpeed's ZeRO (the default zero2)
    "engine": {"megatron": ["parallel=distopt"]},
    "parallel": {"distopt": ["engine=megatron"]},
}
_SECTION_MODELS = {
    "model": ModelSpec,
    "hw": HardwareSpec,
    "parallel": ParallelSpec,
    "data": DataSpec,
    "cluster": ClusterSpec,
}


def _all_options() -> list[tuple[str, str]]:
    return [(group, option) for group in GROUPS for option in group_options(group)]


@pytest.mark.parametrize(("group", "option"), _all_options(), ids=lambda v: str(v))
def test_option_builds(group: str, option: str) -> None:
    overrides = [f"{group}={option}", *_COMPANIONS.get(group, {}).get(option, [])]
    if group == "mode" and option == "qlora":
        # 4-bit loading needs bitsandbytes: the default hardware's family (Ascend) has none (tested in test_plan)
        overrides += ["parallel=zero2", "hw=h100"]
    # A lone option may not fit on the default cluster (llama3_70b on one node): presets must, options must build.
    files = render_files(overrides, allow_oom=group != "recipe")
    assert {*REQUIRED, MANIFEST, PLAN_JSON, PLAN_MD} <= set(files)


@pytest.mark.parametrize(
    ("group", "option"), [(g, o) for g, o in _all_options() if g in _SECTION_MODELS], ids=lambda v: str(v)
)
def test_option_states_defaults_once(group: str, option: str) -> None:
    """Defaults live in the typed records: an option spells every required key and only values that differ."""
    data = yaml.safe_load(group_options(group)[option].read_text())
    fields = {f.name: f for f in dataclasses.fields(_SECTION_MODELS[group])}
    assert set(data) <= set(fields), f"recipes/{group}/{option}.yaml: unknown keys {set(data) - set(fields)}"
    required = {name for name, f in fields.items() if f.default is MISSING and f.default_factory is MISSING}
    assert required <= set(data), f"recipes/{group}/{option}.yaml lacks {required - set(data)}"
    for key, value in data.items():
        f = fields[key]
        default = (
            f.default
            if f.default is not MISSING
            else f.default_factory()
            if f.default_factory is not MISSING
            else MISSING
        )
        assert key == "name" or value != default, f"recipes/{group}/{option}.yaml repeats the default {key}: {value!r}"
    assert data["name"] == option, "an option's name is its file name"


def test_every_record_key_can_be_overridden_without_a_plus() -> None:
    """`section.key=value` reaches keys no option file spells (compose sets them with Hydra's ++)."""
    files = render_files(["recipe=tiny_sft", "cluster.master_port=29511", "parallel.overlap_comm=false"])
    recipe = yaml.safe_load(files["recipe.yaml"])["recipe"]
    assert recipe["cluster"]["master_port"] == 29511 and recipe["parallel"]["overlap_comm"] is False
