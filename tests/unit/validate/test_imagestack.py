"""The image.* checks: every shipped combination passes, and each defect issue 10 measured fails its rule again.

Each defect is reintroduced into a freshly built bundle the way it looked before the fix (the manifest is rehashed,
so only the rule under test objects). The rules that need the package index (resolution, transformers' source) run
against PyPI and are skipped, with the reason, where it is not reachable.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from recipekit.bundle.build import build
from recipekit.recipe.compose import group_options
from recipekit.validate.shared.loader import load_bundle, rehash_manifest
from recipekit.validate.shared.results import Result, Status
from recipekit.validate.static.image import stack
from recipekit.validate.static.image.pypi import reachable, uv_binary

BUNDLES = {
    "ascend": ["recipe=llama3_8b_sft"],
    "ascend_amd64": ["recipe=llama3_8b_sft", "hw.arch=amd64"],
    "ascend_lora": ["recipe=llama3_8b_lora"],
    "ascend_nvme": ["recipe=llama3_8b_sft", "parallel=zero3_nvme"],
    "cuda": ["recipe=llama3_8b_sft", "hw=h100"],
    "cuda_nvme": ["recipe=llama3_8b_sft", "hw=h100", "parallel=zero3_nvme"],
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    return {name: build(o, root / name, force=True, allow_oom=True).path for name, o in BUNDLES.items()}


def needs_index() -> None:
    if uv_binary() is None:
        pytest.skip("uv is not installed (the image extra)")
    why = reachable("https://pypi.org/simple")
    if why is not None:
        pytest.skip(f"PyPI not reachable: {why}")


def run(check: Callable, bundle: Path) -> Result:
    return check(load_bundle(bundle))


def text_edit(name: str, old: str, new: str, count: int = 1) -> Callable[[Path], None]:
    def apply(bundle: Path) -> None:
        path = bundle / name
        text = path.read_text()
        assert old in text, f"{old!r} not in {name}"
        path.write_text(text.replace(old, new, count))

    return apply


def regex_edit(name: str, pattern: str, new: str) -> Callable[[Path], None]:
    def apply(bundle: Path) -> None:
        path = bundle / name
        text, count = re.subn(pattern, new, path.read_text(), flags=re.DOTALL)
        assert count, f"{pattern!r} not in {name}"
        path.write_text(text)

    return apply


def yaml_edit(name: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(bundle: Path) -> None:
        path = bundle / name
        data = yaml.safe_load(path.read_text())
        change(data)
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    return apply


def _drop_arch(job: dict) -> None:
    del job["spec"]["tasks"][0]["template"]["spec"]["nodeSelector"]["kubernetes.io/arch"]


def _qlora(doc: dict) -> None:
    doc["recipe"]["mode"]["kind"] = "qlora"


# (id, bundle, mutation, check, substrings of one finding, needs the package index)
DEFECTS = [
    (
        "cuda-base-without-python",
        "cuda",
        regex_edit("Dockerfile", r"# nvcr\.io/nvidia/cuda ships no Python.*?PATH=/opt/venv/bin:\$PATH\n", ""),
        stack.check_dockerfile,
        ("pip: not found", "exit 127"),
        False,
    ),
    (
        "cuda-python-3.10-below-transformers-requires-python",
        "cuda",
        text_edit("Dockerfile", "ARG PYTHON=python3.12", "ARG PYTHON=python3.10"),
        stack.check_resolve,
        ("Python 3.10", "transformers"),
        True,
    ),
    (
        "ascend-qlora-bitsandbytes-below-transformers-minimum",
        "ascend_lora",
        text_edit(
            "Dockerfile",
            "      transformers==5.24.0 \\",
            "      transformers==5.24.0 \\\n      bitsandbytes-npu-beta==0.45.3 \\",
        ),
        stack.check_minimums,
        ("bitsandbytes-npu-beta 0.45.3", "bitsandbytes >= 0.46.1", "BITSANDBYTES_MIN_VERSION"),
        True,
    ),
    (
        "qlora-without-bitsandbytes",
        "ascend_lora",
        yaml_edit("recipe.yaml", _qlora),
        stack.check_minimums,
        ("qlora", "no bitsandbytes is pinned"),
        False,
    ),
    (
        "nvme-offload-without-libaio-ascend",
        "ascend_nvme",
        regex_edit("Dockerfile", r"# libaio-dev: .*?rm -rf /var/lib/apt/lists/\*\n", ""),
        stack.check_system,
        ("libaio-dev is not installed", "async_io"),
        False,
    ),
    (
        "nvme-offload-without-libaio-cuda",
        "cuda_nvme",
        text_edit("Dockerfile", "${PYTHON_PACKAGES} libaio-dev", "${PYTHON_PACKAGES}"),
        stack.check_system,
        ("libaio-dev is not installed",),
        False,
    ),
    (
        "torch-2.9-ignores-elastic-shutdown-timeout",
        "ascend",
        text_edit("Dockerfile", "torch==2.12.0", "torch==2.9.0", count=2),
        stack.check_torch_features,
        ("torch 2.9.0", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "SIGKILLs the workers 30 s after SIGTERM"),
        False,
    ),
    (
        "job-without-arch-selector",
        "ascend",
        yaml_edit("volcano-job.yaml", _drop_arch),
        stack.check_arch,
        ("nodeSelector", "exec format error"),
        False,
    ),
    (
        "readme-builds-without-platform",
        "ascend",
        text_edit("README.md", "docker build --platform linux/arm64 ", "docker build "),
        stack.check_arch,
        ("README.md", "--platform linux/arm64"),
        False,
    ),
    (
        "torch-not-chosen-per-architecture",
        "ascend",
        regex_edit("Dockerfile", r"ARG TARGETARCH\n", ""),
        stack.check_arch,
        ("ARG TARGETARCH",),
        False,
    ),
    (
        "syntax-directive-pulls-from-docker-hub",
        "ascend",
        regex_edit("Dockerfile", r"\A", "# syntax=docker/dockerfile:1\n"),
        stack.check_dockerfile,
        ("Docker Hub",),
        False,
    ),
    (
        "hard-coded-from",
        "ascend",
        text_edit("Dockerfile", "FROM ${BASE_IMAGE}", "FROM quay.io/ascend/cann:9.1.0-910b-ubuntu22.04-py3.12"),
        stack.check_dockerfile,
        ("FROM", "hard-coded"),
        False,
    ),
    (
        "hard-coded-index-url-ignores-the-mirror",
        "ascend",
        text_edit("Dockerfile", '--index-url "${TORCH_INDEX_URL}"', "--index-url https://download.pytorch.org/whl/cpu"),
        stack.check_dockerfile,
        ("https://download.pytorch.org/whl/cpu is hard-coded", "PIP_INDEX_URL"),
        False,
    ),
    (
        "cann-protobuf-not-kept",
        "ascend",
        text_edit("Dockerfile", "      protobuf==3.20.0 \\\n", ""),
        stack.check_dockerfile,
        ("protobuf is not pinned to the base image's 3.20.0",),
        False,
    ),
    (
        "tensorboard-2.21-needs-newer-protobuf-than-cann",
        "ascend",
        text_edit("Dockerfile", "tensorboard==2.20.0", "tensorboard==2.21.0"),
        stack.check_resolve,
        ("protobuf", "tensorboard"),
        True,
    ),
]


@pytest.mark.parametrize("case", DEFECTS, ids=[d[0] for d in DEFECTS])
def test_each_defect_fails_its_rule(built: dict[str, Path], tmp_path: Path, case: tuple) -> None:
    _, source, mutate, check, expected, online = case
    if online:
        needs_index()
    bundle = Path(shutil.copytree(built[source], tmp_path / source))
    assert run(check, bundle).status is not Status.FAIL, "passes before the defect is reintroduced"
    mutate(bundle)
    rehash_manifest(bundle)
    result = run(check, bundle)
    assert result.status is Status.FAIL, f"{result.id} did not fail: {result.reason}"
    messages = [str(f) for f in result.findings]
    assert any(all(text in m for text in expected) for m in messages), messages


def test_x86_64_torch_npu_cpu_build_is_understood(built: dict[str, Path]) -> None:
    """torch 2.12.0+cpu exists only on the PyTorch index: resolved as its public version, said so, not a failure."""
    needs_index()
    result = run(stack.check_resolve, built["ascend_amd64"])
    assert result.status is Status.PASS, [str(f) for f in result.findings]
    assert "torch 2.12.0+cpu" in result.reason and "public version 2.12.0" in result.reason
    assert "x86_64-manylinux_2_35" in result.reason and "torch-npu" in result.details["resolved"]


def test_resolve_skips_with_a_reason_without_network(built: dict[str, Path], tmp_path: Path) -> None:
    bundle = Path(shutil.copytree(built["cuda"], tmp_path / "b"))
    text_edit("Dockerfile", "ARG PIP_INDEX_URL=https://pypi.org/simple", "ARG PIP_INDEX_URL=http://127.0.0.1:9/simple")(
        bundle
    )
    rehash_manifest(bundle)
    result = run(stack.check_resolve, bundle)
    assert result.status is Status.SKIP and "not reachable" in result.reason and "127.0.0.1:9" in result.reason


def test_skew_names_what_the_dry_run_did_not_prove(built: dict[str, Path]) -> None:
    pytest.importorskip("torch")
    result = run(stack.check_skew, built["ascend"])
    assert result.status is Status.PASS
    skewed = {s["package"]: s for s in result.details["skew"]}
    assert skewed["torch"]["image"] == "2.12.0" and "SIGTERM" in skewed["torch"]["not_proven"]
    assert skewed["tensorboard"]["image"] == "2.20.0"
    assert "torch_npu, CANN and HCCL" in result.reason


def _combinations() -> list[list[str]]:
    """Every preset, every parallel option the bundle builds (Megatron-core's distributed optimizer is analysed by
    plan only), on one hardware option of every image family (and both 910B CPUs)."""
    hardware = ["hw=ascend910b", "hw=ascend910b hw.arch=amd64", "hw=ascend910_a3", "hw=h100", "hw=cpu"]
    # The Megatron presets' layouts (TP 8 inside a pod) need 8 devices a pod: on every family but the CPU's, whose
    # Megatron stack a small Megatron recipe covers.
    megatron = {preset for preset in group_options("recipe") if _engine_of(preset) == "megatron"}
    found = [
        f"recipe={preset} {hw}"
        for preset in group_options("recipe")
        for hw in hardware
        if preset not in megatron or hw != "hw=cpu"
    ]
    options = [p for p in group_options("parallel") if p != "distopt"]
    found += [f"recipe=llama3_8b_sft parallel={p} {hw}" for p in options for hw in hardware]
    found += [f"model=qwen3_0.6b engine=megatron parallel=distopt cluster.nodes=1 {hw}" for hw in hardware]
    return [c.split() for c in found]


def _engine_of(preset: str) -> str:
    from recipekit.bundle.build import resolve

    return resolve([f"recipe={preset}"]).recipe.engine.kind


def test_every_preset_family_and_parallel_option_passes(tmp_path: Path) -> None:
    needs_index()
    failures = []
    for index, overrides in enumerate(_combinations()):
        bundle = build(overrides, tmp_path / str(index), force=True, allow_oom=True).path
        loaded = load_bundle(bundle)
        for check in stack.CHECKS:
            result = check(loaded)
            if result.status is not Status.PASS:
                failures.append(f"{' '.join(overrides)}: {result.id} {result.status.value} {result.reason} "
                                f"{[str(f) for f in result.findings]}")  # fmt: skip
        shutil.rmtree(bundle)
    assert not failures, "\n".join(failures)
