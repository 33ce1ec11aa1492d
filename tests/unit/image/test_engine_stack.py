"""A Megatron bundle's image installs the engine's stack of its family (images/matrix.yaml engines), not the
Trainer's: the frozen set --no-deps, the family's changes, Transformer Engine on CUDA, MindSpeed at a commit on
Ascend, and a pip check that passes over exactly the requirements the matrix leaves out."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from recipekit.base.errors import RecipeError
from recipekit.base.paths import IMAGES_DIR
from recipekit.image.dockerfile import parse
from recipekit.image.enginestack import engine_pins, read_pins
from recipekit.image.matrix import load_images
from recipekit.validate.shared.results import Status
from tests.conftest import render_files

#: A small Megatron recipe per family (the presets are large; the stack depends on the family and engine only).
MEGATRON = ["model=qwen3_0.6b", "engine=megatron", "parallel=distopt", "cluster.nodes=1"]


def _dockerfile(*overrides: str) -> str:
    return render_files([*MEGATRON, *overrides], allow_oom=True)["Dockerfile"].decode()


def test_cuda_megatron_image_installs_bridge_core_and_transformer_engine() -> None:
    text = _dockerfile("hw=h100")
    pins = parse(text).pins
    frozen = read_pins(IMAGES_DIR / "engines" / "megatron-bridge.txt")
    assert pins["megatron-bridge"] == frozen["megatron-bridge"] == "0.3.1"
    assert pins["megatron-core"] == frozen["megatron-core"] == "0.16.1"
    assert pins["transformers"] == "4.57.6", "Bridge 0.3.1 needs transformers < 5, not the Trainer's 5.24"
    # Bridge 0.3.1: transformer-engine[core_cu13,pytorch]>=2.10,<2.13; torch 2.13.0's CUDA build pins triton 3.7.1
    assert pins["transformer-engine"] == pins["transformer-engine-cu13"] == "2.12.0"
    assert pins["triton"] == "3.7.1" and "deepspeed" not in pins and "peft" not in pins
    assert "pip install --no-deps --no-build-isolation \\\n      transformer-engine-torch==2.12.0" in text
    assert "python3 -m pip install --no-deps \\\n" in text and "git" not in parse(text).apt_packages


def test_ascend_megatron_image_installs_mindspeed_at_a_commit_and_keeps_canns_protobuf() -> None:
    text = _dockerfile()
    df = parse(text)
    assert "git" in df.apt_packages and "torch_npu==2.12.0" in text
    source = re.search(r'"mindspeed @ git\+(https://\S+\.git)@([0-9a-f]+)"', text)
    assert source and len(source.group(2)) == 40, "a full commit, not a branch that moves"
    assert df.pins["protobuf"] == "3.20.0" and df.pins["tensorboard"] == "2.20.0"
    assert not any(name.startswith("transformer-engine") for name in df.pins), "CUDA only; MindSpeed stands in"
    assert "torch" not in df.pins and df.torch_builds == {"amd64|x86_64": "2.12.0+cpu", "arm64|aarch64": "2.12.0"}


def test_the_engine_stack_moves_the_image_tag_and_no_trainer_image() -> None:
    trainer = render_files(["model=qwen3_0.6b", "cluster.nodes=1"])["Dockerfile"].decode()
    assert "--no-deps \\\n      absl-py" not in trainer and "transformers==5.24.0" in trainer
    assert "python3 -m pip check\n" in trainer, "the Trainer's images keep the plain pip check"


def _pip_check_filter(text: str) -> tuple[str, list[str]]:
    """The Dockerfile's pip-check filter script and the names it passes over."""
    script = re.search(r"python3 -c '(import re, sys; norm.*?)' \\\n\s+/tmp/pip-check.txt ([^\\\n]*)", text)
    assert script, "the engine image's pip check passes its output through the filter"
    return script.group(1), script.group(2).split()


@pytest.mark.parametrize("hw", ["hw=h100", "hw=ascend910b"])
def test_pip_check_passes_only_what_the_matrix_leaves_out(hw: str, tmp_path: Path) -> None:
    script, names = _pip_check_filter(_dockerfile(hw))
    family = load_images().families["cuda" if "h100" in hw else "ascend-910b"]
    assert sorted(names) == sorted(family.engines["megatron"].left_out)

    def run(*lines: str) -> subprocess.CompletedProcess[str]:
        report = tmp_path / "pip-check.txt"
        report.write_text("".join(line + "\n" for line in lines))
        return subprocess.run([sys.executable, "-c", script, str(report), *names], capture_output=True, text=True)

    assert run("No broken requirements found.").returncode == 0
    assert run("megatron-bridge 0.3.1 requires mamba-ssm, which is not installed.").returncode == 0
    broken = run(
        "megatron-bridge 0.3.1 requires mamba_ssm, which is not installed.",
        "megatron-bridge 0.3.1 has requirement transformers<5.0.0, but you have transformers 5.24.0.",
    )
    assert broken.returncode == 1 and "transformers<5.0.0" in broken.stderr and "mamba" not in broken.stderr
    assert run("megatron-core 0.16.1 requires einops, which is not installed.").returncode == 1


def test_a_git_source_without_a_full_commit_is_a_matrix_error(tmp_path: Path) -> None:
    shutil.copytree(IMAGES_DIR, tmp_path / "images")
    matrix = tmp_path / "images" / "matrix.yaml"
    matrix.write_text(re.sub(r"(MindSpeed\.git)@[0-9a-f]{40}", r"\1@core_r0.16.0", matrix.read_text()))
    with pytest.raises(RecipeError) as info:
        load_images(tmp_path / "images")
    assert any(p.key.endswith("engines.megatron.git") and "40-digit commit" in p.message for p in info.value.problems)


def test_a_family_without_the_engines_stack_is_a_build_error(tmp_path: Path) -> None:
    from recipekit.bundle.build import resolve
    from recipekit.image.matrix import engine_problems

    recipe = resolve(MEGATRON).recipe
    family = load_images().families["cuda"]
    bare = replace(family, engines={})
    problems = engine_problems("cuda", bare, recipe)
    assert problems and problems[0].key == "engine" and "has no megatron stack" in problems[0].message


def test_engine_pins_drop_replace_and_keep_the_bases_pins() -> None:
    stack = load_images().families["ascend-910b"].engines["megatron"]
    pins = dict(p.split("==") for p in engine_pins(stack, kept={"protobuf": "3.20.0"}))
    assert "torch" not in pins and pins["protobuf"] == "3.20.0" and pins["tensorboard"] == "2.20.0"
    assert pins["megatron-core"] == "0.16.1" and len(pins) == len(set(pins))


def test_validate_names_what_it_cannot_prove_of_the_engine_stack(tmp_path: Path) -> None:
    from recipekit.bundle.build import build
    from recipekit.validate.shared.loader import load_bundle
    from recipekit.validate.static.image.stack import check_engine

    bundle = build(MEGATRON, tmp_path / "b", force=True, allow_oom=True).path
    result = check_engine(load_bundle(bundle))
    assert result.status is Status.PASS, result.findings
    assert "Not resolved here: mindspeed at " in result.reason and "MindSpeed-Bridge" in result.reason
    assert "Declared but not installed:" in result.reason and "numpy" in result.details["left_out"]
    dockerfile = bundle / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("megatron-core==0.16.1", "megatron-core==0.17.0"))
    edited = check_engine(load_bundle(bundle))
    assert edited.status is Status.FAIL and "megatron-core==0.16.1" in str(edited.findings[0])
    trainer = build(["model=qwen3_0.6b", "cluster.nodes=1"], tmp_path / "t", force=True).path
    plain = check_engine(load_bundle(trainer))
    assert plain.status is Status.PASS and plain.reason.startswith("no engine stack")
