"""Every option of every group composes, validates, plans and renders — discovered from the filesystem.

A new YAML dropped into recipes/<group>/ is tested here without touching this file. Each option is combined with a
base that makes sense for it (LoRA data for modes, a node count the hardware can take, ...).
"""

from __future__ import annotations

import pytest
import yaml

from recipekit.compose import group_options
from recipekit.recipe import ClusterSpec, DataSpec, HardwareSpec, ModelSpec, ParallelSpec
from recipekit.schema import field_names
from tests.conftest import render_files

#: What must accompany an option of a group so the combination is meaningful.
_COMPANIONS = {
    "mode": {"pretrain": ["data=text"]},
    "data": {"text": ["mode=pretrain"]},
}
_SECTION_MODELS = {
    "model": ModelSpec,
    "hw": HardwareSpec,
    "parallel": ParallelSpec,
    "data": DataSpec,
    "cluster": ClusterSpec,
}


def _all_options() -> list[tuple[str, str]]:
    groups = ("model", "mode", "hw", "parallel", "data", "cluster", "recipe")
    return [(group, option) for group in groups for option in group_options(group)]


@pytest.mark.parametrize(("group", "option"), _all_options(), ids=lambda v: str(v))
def test_option_builds(group: str, option: str) -> None:
    overrides = [f"{group}={option}", *_COMPANIONS.get(group, {}).get(option, [])]
    if group == "mode" and option == "qlora":
        # 4-bit loading needs bitsandbytes: the default hardware's family (Ascend) has none (tested in test_plan)
        overrides += ["parallel=zero2", "hw=h100"]
    # A lone option may not fit on the default cluster (llama3_70b on one node): presets must, options must build.
    files = render_files(overrides, allow_oom=group != "recipe")
    assert {
        "Dockerfile",
        "run.sh",
        "train.py",
        "recipe.yaml",
        "volcano-job.yaml",
        "README.md",
        "manifest.json",
        "plan.json",
        "plan.md",
    } <= set(files)


@pytest.mark.parametrize(
    ("group", "option"), [(g, o) for g, o in _all_options() if g in _SECTION_MODELS], ids=lambda v: str(v)
)
def test_option_lists_every_key(group: str, option: str) -> None:
    """Options spell out every key of their section, so `group.key=value` never needs a leading `+`."""
    data = yaml.safe_load(group_options(group)[option].read_text())
    assert set(data) == set(field_names(_SECTION_MODELS[group])), f"recipes/{group}/{option}.yaml"
    assert data["name"] == option, "an option's name is its file name"
