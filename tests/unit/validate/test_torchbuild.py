"""image.torch-build: an image whose torch comes from TORCH_INDEX_URL gets the CPU build on every architecture.

PyPI itself plays the "plain PyPI mirror" configured as cluster.torch_index_url (its aarch64 torch is the CUDA
build, it has no x86_64 ``+cpu`` build); small local indexes of stub wheels play a CPU index and a CUDA index whose
builds carry a ``+cu`` version. uv resolves against them as it does against the real ones.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from recipekit.bundle.build import build
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from recipekit.validate.static.image.pypi import uv_binary
from recipekit.validate.static.image.torchbuild import check_torch_build
from tests.integration.test_image_build import _QuietHandler, _stub_wheel
from tests.unit.validate.test_imagestack import needs_index


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """http://127.0.0.1:PORT with /cpu/simple (torch 2.12.0+cpu) and /cuda/simple (torch 2.12.0+cu130)."""
    if uv_binary() is None:
        pytest.skip("uv is not installed (the image extra)")
    root = tmp_path_factory.mktemp("indexes")
    for name, version in (("cpu", "2.12.0+cpu"), ("cuda", "2.12.0+cu130")):
        files, page = root / name / "files", root / name / "simple" / "torch"
        files.mkdir(parents=True)
        page.mkdir(parents=True)
        wheel = _stub_wheel(files, "torch", version)
        (page / "index.html").write_text(f'<a href="../../files/{wheel.name}">{wheel.name}</a>\n')
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _check(tmp_path: Path, *overrides: str):
    bundle = build(["recipe=llama3_8b_sft", *overrides], tmp_path / "bundle", force=True).path
    return check_torch_build(load_bundle(bundle))


def test_a_pypi_mirror_as_torch_index_fails_on_both_architectures(tmp_path: Path) -> None:
    needs_index()
    result = _check(tmp_path, "cluster.torch_index_url=https://pypi.org/simple")
    assert result.status is Status.FAIL
    messages = {f.message.split(" for ")[1].split(" ")[0]: f.message for f in result.findings}
    assert set(messages) == {"linux/amd64", "linux/arm64"}, messages
    assert "has no torch==2.12.0+cpu" in messages["linux/amd64"]
    assert "CUDA build" in messages["linux/arm64"] and "nvidia-" in messages["linux/arm64"]
    assert all("PyTorch CPU index" in f.hint for f in result.findings)


def test_a_cuda_index_is_flagged_by_its_local_version(tmp_path: Path, indexes: str) -> None:
    result = _check(tmp_path, f"cluster.torch_index_url={indexes}/cuda/simple")
    arm64 = [f.message for f in result.findings if "linux/arm64" in f.message]
    assert result.status is Status.FAIL and arm64 and "torch==2.12.0+cu130" in arm64[0], arm64
    # x86_64 asks for +cpu exactly, which this index does not have
    assert any("has no torch==2.12.0+cpu for linux/amd64" in f.message for f in result.findings)


def test_a_cpu_index_mirror_passes(tmp_path: Path, indexes: str) -> None:
    result = _check(tmp_path, f"cluster.torch_index_url={indexes}/cpu/simple")
    assert result.status is Status.PASS, [str(f) for f in result.findings]
    assert "linux/amd64 torch 2.12.0+cpu" in result.reason and "linux/arm64 torch 2.12.0+cpu" in result.reason
    assert result.details["arm64"] == {"torch": "2.12.0+cpu"}


def test_an_unreachable_torch_index_is_a_skip_with_the_reason(tmp_path: Path) -> None:
    if uv_binary() is None:
        pytest.skip("uv is not installed (the image extra)")
    result = _check(tmp_path, "cluster.torch_index_url=http://127.0.0.1:9/simple")
    assert result.status is Status.SKIP and "127.0.0.1:9 not reachable" in result.reason


def test_the_cuda_family_takes_torch_from_the_package_index(tmp_path: Path) -> None:
    result = _check(tmp_path, "hw=h100")
    assert result.status is Status.SKIP and "package index" in result.reason
