"""The image matrix only pins combinations from torch_npu's compatibility table."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from recipekit.base.errors import RecipeError
from recipekit.base.paths import IMAGES_DIR
from recipekit.image.matrix import compatibility_problems, load_images


def test_shipped_matrix_is_compatible() -> None:
    images = load_images()
    for name, family in images.families.items():
        assert compatibility_problems(name, family, images.torch_npu_table) == [], name


def test_wrong_torch_or_cann_is_reported() -> None:
    images = load_images()
    family = images.families["ascend-910b"]
    bad_torch = compatibility_problems("x", replace(family, torch="2.8.0"), images.torch_npu_table)
    assert "needs torch 2.12.0" in bad_torch[0].message
    bad_cann = compatibility_problems("x", replace(family, cann="8.5.0", base_tag="8.5.0-910b"), images.torch_npu_table)
    assert "needs CANN 9.1.0" in bad_cann[0].message
    unknown = compatibility_problems("x", replace(family, torch_npu="9.9.9"), images.torch_npu_table)
    assert "not in torch_npu's compatibility table" in unknown[0].message


def test_malformed_matrix_is_a_recipe_error_naming_the_key(tmp_path) -> None:
    shutil.copytree(IMAGES_DIR, tmp_path / "images")
    matrix = tmp_path / "images" / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace("base_tag:", "base_tg:", 1))
    with pytest.raises(RecipeError) as info:
        load_images(tmp_path / "images")
    keys = {problem.key for problem in info.value.problems}
    assert any(key.endswith(".base_tg") for key in keys) and any(key.endswith(".base_tag") for key in keys), keys


# ------------------------------------------------------------------------------------------- arch and build args
def _dockerfile_and_job(*overrides: str) -> tuple[str, dict]:
    import yaml

    from tests.conftest import render_files

    files = render_files(["recipe=llama3_8b_sft", *overrides], allow_oom=True)
    return files["Dockerfile"].decode(), yaml.safe_load(files["volcano-job.yaml"])


def _selector(job: dict) -> dict:
    return job["spec"]["tasks"][0]["template"]["spec"]["nodeSelector"]


def test_arch_default_is_explicit_and_overridable() -> None:
    dockerfile, job = _dockerfile_and_job()
    assert _selector(job) == {
        "accelerator-type": "module-910b-8",
        "kubernetes.io/arch": "arm64",
        "host-arch": "huawei-arm",
    }
    assert "build with --platform linux/arm64" in dockerfile
    _, job = _dockerfile_and_job("hw.arch=amd64")
    assert (_selector(job)["kubernetes.io/arch"], _selector(job)["host-arch"]) == ("amd64", "huawei-x86")
    _, job = _dockerfile_and_job("hw=h100")
    assert _selector(job) == {"kubernetes.io/arch": "amd64"}


def test_an_arch_the_hardware_or_the_family_lacks_is_refused() -> None:
    from recipekit.bundle.build import resolve

    with pytest.raises(RecipeError) as info:
        resolve(["recipe=llama3_8b_sft", "hw=h100", "hw.arch=arm64"])
    assert "arch 'arm64' is not one of h100's architectures (archs: amd64)" in str(info.value)
    with pytest.raises(RecipeError) as info:
        resolve(["recipe=llama3_8b_sft", "hw.archs=[arm64,amd64]", "hw.arch=riscv64"])
    assert "hw.arch" in str(info.value)


def test_torch_build_is_chosen_per_target_architecture() -> None:
    dockerfile, _ = _dockerfile_and_job()
    assert 'amd64|x86_64) torch="torch==2.12.0+cpu"' in dockerfile
    assert 'arm64|aarch64) torch="torch==2.12.0"' in dockerfile
    assert "ARG TARGETARCH" in dockerfile and '--no-deps --index-url "${TORCH_INDEX_URL}" "${torch}"' in dockerfile
    cuda, _ = _dockerfile_and_job("hw=h100")
    assert "TORCH_INDEX_URL" not in cuda and 'torch="torch==2.13.0"' in cuda


def test_build_args_default_to_the_recipes_mirrors() -> None:
    dockerfile, _ = _dockerfile_and_job()
    assert "# syntax" not in dockerfile and "--index-url https" not in dockerfile
    assert "ARG BASE_IMAGE=quay.io/ascend/cann:9.1.0-910b-ubuntu22.04-py3.12\nFROM ${BASE_IMAGE}" in dockerfile
    assert "ARG PIP_INDEX_URL=https://pypi.org/simple\nARG PIP_EXTRA_INDEX_URL=\n" in dockerfile
    mirrored, _ = _dockerfile_and_job(
        "cluster.base_image_registry=harbor.internal/quay",
        "cluster.pip_index_url=https://pypi.internal/simple",
        "cluster.pip_extra_index_url=https://extra.internal/simple",
        "cluster.torch_index_url=https://torch.internal/whl/cpu",
    )
    assert "ARG BASE_IMAGE=harbor.internal/quay/ascend/cann:9.1.0-910b-ubuntu22.04-py3.12" in mirrored
    assert "ARG PIP_INDEX_URL=https://pypi.internal/simple" in mirrored
    assert "ARG PIP_EXTRA_INDEX_URL=https://extra.internal/simple" in mirrored
    assert "ARG TORCH_INDEX_URL=https://torch.internal/whl/cpu" in mirrored


def test_cuda_image_installs_python_and_nvme_adds_libaio() -> None:
    cuda, _ = _dockerfile_and_job("hw=h100")
    assert 'ARG PYTHON_PACKAGES="python3.12 python3.12-venv python3.12-dev g++"' in cuda
    assert 'RUN "${PYTHON}" -m venv /opt/venv' in cuda and "libaio" not in cuda
    nvme, _ = _dockerfile_and_job("hw=h100", "parallel=zero3_nvme")
    assert "--no-install-recommends ${PYTHON_PACKAGES} libaio-dev" in nvme
    ascend_nvme, _ = _dockerfile_and_job("parallel=zero3_nvme")
    assert "--no-install-recommends libaio-dev" in ascend_nvme and "PYTHON_PACKAGES" not in ascend_nvme
