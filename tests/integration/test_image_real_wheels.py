"""Bundle images built from the real wheels, the way a cluster builds them: what the stub-wheel build hides.

The bases are test_image_build's stand-ins (Debian bookworm, Python 3.11), the builder its podman service. The
package index is a local mirror of PyPI: torch alone is served from here (the CPU build; PyPI's own torch is the
CUDA build, several GB with its nvidia-* wheels, which no test downloads), every other project comes from PyPI
through it (its files cached on disk between runs), so transformers, peft, accelerate, datasets, the DeepSpeed
sdist... are the real releases.

* The CUDA bundle on amd64: its stack imports and `pip check` passes inside the image.
* The x86_64 910B bundle on a CANN stand-in with the base's old pip (23.0.1), the real CPU torch, and a stand-in
  torch_npu that, like the real one without CANN, fails when torch auto-loads it: the install step passes, and
  the control shows why it must (DeepSpeed built the way an old pip builds it fails the same way issue 21 did).
  The image loads CANN for every shell, and only for shells.
* The arm64 910B bundle under qemu-user-static (binfmt_misc), on an arm64 stand-in: every step runs emulated.

The images are inspected by chroot into their mounted root filesystem (`podman run` needs cgroups this sandbox
does not give). Needs what test_image_build needs, PyPI, and a torch 2.13.0+cpu wheel for CPython 3.11 x86_64
(pip's own configuration finds it, or RECIPEKIT_TORCH_CPU_WHEEL names it); the arm64 build also needs
qemu-user-static and binfmt-support. Each is skipped with the missing piece named.

Each build takes minutes (the amd64 ones 3-8, the arm64 one far more under emulation), so they run where
RECIPEKIT_REAL_WHEELS=1 (and RECIPEKIT_IMAGE_ARM64=1 for the arm64 one). .ci/run sets the first; the arm64 build
is opt-in there too: its stand-in base alone takes about 20 minutes on 2 cores, past the suite's 30-minute budget."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from recipekit.base.paths import cache_dir
from recipekit.bundle.build import build
from recipekit.handover.buildcontext import checked_context
from recipekit.image.dockerfile import normalize, split_image
from recipekit.validate.shared.loader import rehash_manifest
from tests.integration import test_image_build
from tests.integration.test_image_build import (
    CANN_PYTHON,
    CANN_SET_ENV,
    STANDIN_VERSION,
    _chroot,
    _image_build,
    _QuietHandler,
    _tar,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.longest,
    pytest.mark.skipif(
        os.environ.get("RECIPEKIT_REAL_WHEELS") != "1",
        reason="real-wheel image builds run with RECIPEKIT_REAL_WHEELS=1",
    ),
]
# test_image_build's builder and stand-in bases, as fixtures of this module
tools, standins, engine = test_image_build.tools, test_image_build.standins, test_image_build.engine

PYPI = os.environ.get("RECIPEKIT_PYPI", "https://pypi.org/simple")
#: The CPU torch the real-wheel builds install (this project's own torch; the stand-ins run CPython 3.11).
TORCH_CPU = "2.13.0+cpu"
STACK = "torch, transformers, peft, deepspeed, accelerate, datasets"  # what a LoRA bundle installs
AUTOLOAD_ERROR = "Failed to load the backend extension: torch_npu"
LIBHCCL_DIR = "/usr/local/Ascend/ascend-toolkit/latest/lib64"


# ------------------------------------------------------------------------------------------------ wheels
def _wheel(
    folder: Path, name: str, version: str, files: dict[str, str], entry_points: str = "", requires: tuple[str, ...] = ()
) -> Path:
    """A pure-Python wheel with ``files``, ``requires`` (Requires-Dist) and, optionally, an entry_points.txt."""
    dist = normalize(name).replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: stand-in\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: recipekit-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        **({f"{info}/entry_points.txt": entry_points} if entry_points else {}),
    }
    record = []
    for member, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


#: torch_npu without CANN: its import needs libhccl.so, which only a sourced set_env.sh puts on LD_LIBRARY_PATH
#: (read by the dynamic linker when the process starts, so a later os.environ change cannot help either).
TORCH_NPU = '''import os

if not any(os.path.isfile(os.path.join(d, "libhccl.so")) for d in os.environ.get("LD_LIBRARY_PATH", "").split(":")):
    raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")


def _autoload():
    """torch's entry point (group torch.backends), as the real torch_npu registers it."""
'''
#: torch's CPU build for aarch64 is on the PyTorch CPU index only (not reachable here): a stand-in that loads
#: device backends on import as torch does (torch/__init__.py, _import_device_backends).
TORCH = """import os
from importlib.metadata import entry_points

if os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1":
    for extension in entry_points(group="torch.backends"):
        try:
            extension.load()()
        except Exception as err:
            raise RuntimeError(
                f"Failed to load the backend extension: {extension.name}. "
                "You can disable extension auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0."
            ) from err
"""


def _torch_npu(folder: Path, version: str) -> Path:
    entry = "[torch.backends]\ntorch_npu = torch_npu:_autoload\n"
    return _wheel(folder, "torch_npu", version, {"torch_npu/__init__.py": TORCH_NPU}, entry)


@pytest.fixture(scope="module")
def torch_cpu_wheel() -> Path:
    """The real torch 2.13.0+cpu wheel for CPython 3.11 on x86_64 (never PyPI's CUDA build: +cpu is asked for)."""
    named = os.environ.get("RECIPEKIT_TORCH_CPU_WHEEL")
    if named:
        return Path(named)
    folder = cache_dir("image-test-wheels", f"torch-{TORCH_CPU}")
    found = sorted(folder.glob("*.whl"))
    if not found:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
            "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "--dest", str(folder),
            f"torch=={TORCH_CPU}",
        ]  # fmt: skip
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
        found = sorted(folder.glob("*.whl"))
        if proc.returncode != 0 or not found:
            pytest.skip(
                f"no torch=={TORCH_CPU} wheel for CPython 3.11 x86_64 at hand (pip download: "
                f"{proc.stderr.strip()[-200:]}); set RECIPEKIT_TORCH_CPU_WHEEL"
            )
    return found[0]


class _Mirror(_QuietHandler):
    """A PyPI mirror: projects with a folder here are served from it, every other one from PyPI through this
    server (the build's pip trusts only its own CA bundle, and a proxy between here and PyPI may re-sign TLS),
    its files cached on disk: they never change, and pip checks each one's sha256 from the page."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) >= 2 and parts[0] == "simple" and not Path(self.directory, *parts[:2]).is_dir():
            return self._page(parts[1])
        if parts[0] == "remote" and len(parts) > 2:
            return self._file("/".join(parts[1:]))
        return super().do_GET()

    def _page(self, project: str) -> None:
        request = urllib.request.Request(f"{PYPI}/{project}/", headers={"Accept": "text/html"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                page = response.read().decode("utf-8")
        except urllib.error.HTTPError as exc:
            return self.send_error(exc.code)
        self._send(re.sub(r'href="https://', 'href="/remote/', page).encode("utf-8"), "text/html")

    def _file(self, where: str) -> None:
        cached = cache_dir("image-test-pypi", *where.split("/"))
        if not cached.is_file():
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_name(f"{cached.name}.{threading.get_ident()}.partial")
            try:
                with urllib.request.urlopen(f"https://{where}", timeout=300) as response, partial.open("wb") as out:
                    shutil.copyfileobj(response, out)
            except urllib.error.HTTPError as exc:
                partial.unlink(missing_ok=True)
                return self.send_error(exc.code)
            os.replace(partial, cached)
        self._send(cached.read_bytes(), "application/octet-stream")

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def mirror_of(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """mirror_of({project: [wheel, ...]}) -> the URL of a PyPI mirror serving those projects itself."""
    servers = []

    def start(local: dict[str, list[Path]]) -> str:
        root = tmp_path_factory.mktemp("mirror")
        (root / "files").mkdir()
        for project, wheels in local.items():
            page = root / "simple" / normalize(project)
            page.mkdir(parents=True)
            links = "".join(f'<a href="../../files/{w.name}">{w.name}</a>\n' for w in wheels)
            for wheel in wheels:
                (root / "files" / wheel.name).symlink_to(wheel.resolve())
            (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Mirror, directory=str(root)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/simple"

    yield start
    for server in servers:
        server.shutdown()


@pytest.fixture(scope="module")
def pypi() -> None:
    from recipekit.validate.static.image.pypi import reachable

    why = reachable(PYPI)
    if why:
        pytest.skip(f"PyPI is not reachable ({why}): the real-wheel builds need it")


# ---------------------------------------------------------------------------------------------- in the image
def _in_image(
    engine: dict, reference: str, script: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``sh -c script`` in the image's root filesystem with exactly the image's environment (as a container
    process gets it, before any shell reads a profile), plus ``env``."""
    import docker

    config = docker.DockerClient(base_url=engine["url"]).api.inspect_image(reference)["Config"]
    variables = [*(config.get("Env") or []), "HOME=/root", *(f"{k}={v}" for k, v in (env or {}).items())]
    # buildah's working container: a writable root filesystem on the engine's storage (podman create needs cgroups)
    buildah = functools.partial(subprocess.run, env=engine["env"], capture_output=True, text=True, check=True)
    container = buildah(["buildah", "from", "--pull-never", reference]).stdout.strip()
    try:
        root = buildah(["buildah", "mount", container]).stdout.strip()
        mounts = 'mount --rbind /dev "$0/dev" && mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
        command = [
            "unshare",
            "--mount",
            "--fork",
            "sh",
            "-c",
            mounts,
            root,
            "env",
            "-i",
            *variables,
            "sh",
            "-c",
            script,
        ]
        return subprocess.run(command, capture_output=True, text=True, timeout=900, cwd="/")
    finally:
        subprocess.run(["buildah", "umount", container], env=engine["env"], capture_output=True)
        subprocess.run(["buildah", "rm", container], env=engine["env"], capture_output=True)


def _build(bundle: Path, engine: dict, tag: str, **args: str) -> tuple[subprocess.CompletedProcess, float]:
    build_args = [word for key, value in args.items() for word in ("--build-arg", f"{key}={value}")]
    start = time.monotonic()
    proc = _image_build(bundle, "--engine", engine["url"], "--tag", tag, *build_args)
    return proc, time.monotonic() - start


def _bundle(tmp_path: Path, *overrides: str) -> Path:
    return build(["recipe=llama3_8b_sft", *overrides], tmp_path / "bundle", force=True).path


def _edit_dockerfile(bundle: Path, old: str, new: str) -> None:
    """A test's stand-in edit to the bundle's Dockerfile, with what `recipekit build` would have written for it:
    manifest.json's hashes and plan.image's stack tag, the one `image build`'s own context check computes."""
    dockerfile, recipe = bundle / "Dockerfile", bundle / "recipe.yaml"
    before = split_image(yaml.safe_load(recipe.read_text())["plan"]["image"])[1]
    dockerfile.write_text(dockerfile.read_text().replace(old, new))
    rehash_manifest(bundle)
    after = checked_context(bundle, json.loads((bundle / "manifest.json").read_text()), None, None).stack
    for path in bundle.rglob("*"):
        if path.is_file() and not path.is_symlink() and before in (text := path.read_text(errors="replace")):
            path.write_text(text.replace(before, after))
    rehash_manifest(bundle)


def _podman_build(engine: dict, tag: str, dockerfile: str, folder: Path, platform: str = "linux/amd64") -> None:
    (folder / "Dockerfile").write_text(dockerfile)
    proc = subprocess.run(
        ["podman", "build", "--platform", platform, "-t", tag, str(folder)],
        env=engine["env"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


#: The stand-in CANN's toolkit: a libhccl.so that its set_env.sh (and only it) puts on LD_LIBRARY_PATH.
CANN_TOOLKIT = f"""RUN mkdir -p {LIBHCCL_DIR} && touch {LIBHCCL_DIR}/libhccl.so \\
 && printf 'export LD_LIBRARY_PATH={LIBHCCL_DIR}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\\n' > {CANN_SET_ENV[0]}
"""


# -------------------------------------------------------------------------------------------------------- tests
def test_cuda_bundle_builds_from_real_wheels_and_its_stack_imports(
    engine: dict, pypi: None, torch_cpu_wheel: Path, mirror_of, tmp_path: Path
) -> None:
    # the LoRA bundle: peft is installed only where the recipe trains adapters
    bundle = build(["recipe=llama3_8b_lora", "hw=h100"], tmp_path / "bundle", force=True).path
    mirror = mirror_of({"torch": [torch_cpu_wheel]})
    reference = "localhost/recipekit/real-cuda:test"
    proc, seconds = _build(
        bundle,
        engine,
        reference,
        BASE_IMAGE=engine["bases"]["cuda"],
        PIP_INDEX_URL=mirror,
        # the stand-in is Debian bookworm: its Python packages stand in for Ubuntu 24.04's python3.12
        PYTHON_PACKAGES="python3.11 python3.11-venv",
        PYTHON="python3.11",
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    print(f"CUDA bundle, real wheels, amd64: built in {seconds:.0f} s")
    assert f"torch-{TORCH_CPU}" in output and "deepspeed" in output, output[-3000:]
    assert "No broken requirements found." in output
    check = _in_image(
        engine,
        reference,
        f'python3 -c "import {STACK}; print(torch.__version__, deepspeed.__version__, transformers.__version__)" '
        "&& python3 -m pip check",
        {"DS_ACCELERATOR": "cpu"},
    )
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    assert f"{TORCH_CPU} 0.19.8 5.24.0" in check.stdout and "No broken requirements found." in check.stdout


@pytest.fixture(scope="module")
def cann_with_toolkit(engine: dict, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The CANN stand-in (pip 23.0.1, as bookworm's venv gives it) with a toolkit library and its set_env.sh."""
    tag = f"localhost/recipekit-standin-cann-toolkit:{STANDIN_VERSION}"
    dockerfile = f"FROM {engine['bases']['cann']}\n{CANN_TOOLKIT}"
    _podman_build(engine, tag, dockerfile, tmp_path_factory.mktemp("cann-toolkit"))
    return tag


def test_ascend_install_steps_pass_with_an_old_pip_and_torch_npu_before_deepspeed(
    engine: dict, pypi: None, torch_cpu_wheel: Path, mirror_of, cann_with_toolkit: str, tmp_path: Path
) -> None:
    bundle = _bundle(tmp_path, "hw.arch=amd64")
    # torch_npu 2.12.0's torch, 2.12.0+cpu, is on the PyTorch CPU index only: the CPU build at hand stands in for it
    _edit_dockerfile(bundle, "torch==2.12.0+cpu", f"torch=={TORCH_CPU}")
    stand_in = tmp_path / "stand-in"
    stand_in.mkdir()
    mirror = mirror_of({"torch": [torch_cpu_wheel], "torch_npu": [_torch_npu(stand_in, "2.12.0")]})
    reference = "localhost/recipekit/real-ascend:test"
    proc, seconds = _build(bundle, engine, reference, BASE_IMAGE=cann_with_toolkit, PIP_INDEX_URL=mirror,
                           TORCH_INDEX_URL=mirror)  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    print(f"910B bundle (x86_64), real wheels but torch_npu, old pip: built in {seconds:.0f} s")
    assert "Successfully uninstalled pip-23.0.1" in output, "the base's own pip was the old one"
    assert "torch_npu-2.12.0" in output and "deepspeed-0.19.8" in output, output[-3000:]
    assert "No broken requirements found." in output

    # CANN for every shell: non-interactive (BASH_ENV), login (/etc/profile.d), interactive (/etc/bash.bashrc)
    # (the stand-in's Python by its path: Debian's /etc/profile resets PATH in a login shell)
    imports = f"{CANN_PYTHON}/bin/python3 -c 'import torch, torch_npu; print(torch.__version__)'"
    for shell in ("bash -c", "bash -lc", "bash -ic"):
        run = _in_image(engine, reference, f'{shell} "{imports}"')
        assert run.returncode == 0 and TORCH_CPU in run.stdout, (shell, run.stdout[-2000:], run.stderr[-2000:])
    # ...and only for shells: a process the runtime starts directly (`kubectl exec POD -- python3`) has no CANN
    direct = _in_image(engine, reference, f"exec {imports}")
    assert direct.returncode != 0 and AUTOLOAD_ERROR in direct.stderr, direct.stderr[-2000:]

    # The control: DeepSpeed's sdist built without isolation (what pip 23 does) where torch_npu is installed fails
    # as issue 21 found. The install step above, which exports TORCH_DEVICE_BACKEND_AUTOLOAD=0, installed it
    # ("deepspeed-0.19.8" in its output).
    wheel = (
        f"python3 -m pip wheel --no-deps --no-build-isolation --no-binary deepspeed --index-url {mirror} "
        "--wheel-dir /tmp/wheels deepspeed==0.19.8"
    )
    failing = _in_image(engine, reference, wheel)
    assert failing.returncode != 0 and AUTOLOAD_ERROR in failing.stdout + failing.stderr, failing.stderr[-3000:]


def test_a_torch_index_without_the_cpu_build_stops_the_build_before_any_download(
    engine: dict, pypi: None, mirror_of, tmp_path: Path
) -> None:
    """TORCH_INDEX_URL set to a PyPI mirror: no +cpu build on x86_64 (PyPI's torch is the CUDA one), or a torch that
    requires nvidia-* wheels: the install step stops with the reason, before torch is downloaded."""
    bundle = _bundle(tmp_path, "hw.arch=amd64")
    stand_in = tmp_path / "stand-in"
    stand_in.mkdir()
    cuda = _wheel(stand_in, "torch", "2.12.0+cpu", {"torch/__init__.py": ""}, requires=("nvidia-cublas==13.1.1.3",))
    for local, expected in (
        ({}, "has no torch==2.12.0+cpu for amd64"),
        ({"torch": [cuda]}, "gives torch 2.12.0+cpu, a CUDA build (nvidia-cublas==13.1.1.3)"),
    ):
        mirror = mirror_of(local)
        base = engine["bases"]["cann"]
        tag = "localhost/recipekit/wrong-torch:test"
        proc, seconds = _build(bundle, engine, tag, BASE_IMAGE=base, PIP_INDEX_URL=mirror, TORCH_INDEX_URL=mirror)
        output = proc.stdout + proc.stderr
        assert proc.returncode != 0 and expected in output, output[-3000:]
        assert "not a PyPI mirror" in output and "Successfully installed torch" not in output
        print(f"wrong TORCH_INDEX_URL ({expected}): stopped after {seconds:.0f} s")


# ------------------------------------------------------------------------------------------------------ arm64
ARM64_TOOLS = ("qemu-aarch64-static", "update-binfmts")
BINFMT = Path("/proc/sys/fs/binfmt_misc")


def _arm64_missing() -> str | None:
    """None when this machine can run arm64 binaries (qemu-user-static through binfmt_misc), else what is missing."""
    absent = [tool for tool in ARM64_TOOLS if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install qemu-user-static binfmt-support)"
    if not (BINFMT / "status").exists():
        proc = subprocess.run(
            ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            return f"binfmt_misc is not mounted and cannot be ({proc.stderr.strip()})"
    if not (BINFMT / "qemu-aarch64").exists():
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], capture_output=True, text=True)
    entry = BINFMT / "qemu-aarch64"
    if not entry.exists() or "enabled" not in entry.read_text():
        return "qemu-aarch64 is not registered with binfmt_misc (update-binfmts --enable qemu-aarch64 failed)"
    flags = next((line for line in entry.read_text().splitlines() if line.startswith("flags:")), "")
    if "F" not in flags:
        return f"qemu-aarch64's binfmt_misc entry lacks the F flag ({flags}): it cannot run inside a build's chroot"
    return None


@pytest.fixture(scope="module")
def arm64_cann(engine: dict, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An arm64 CANN stand-in, laid out as the amd64 one, imported as linux/arm64 (made once, cached)."""
    if os.environ.get("RECIPEKIT_IMAGE_ARM64") != "1":
        pytest.skip(
            "the arm64 build under qemu runs with RECIPEKIT_IMAGE_ARM64=1 (about 30 min on 2 cores, stand-in included)"
        )
    reason = _arm64_missing()
    if reason:
        pytest.skip(f"arm64 build: {reason}")
    tar = cache_dir("image-standins", STANDIN_VERSION) / "bookworm-arm64-cann-layout.tar"
    if not tar.is_file():
        tar.parent.mkdir(parents=True, exist_ok=True)
        root = tmp_path_factory.mktemp("rootfs-arm64") / "bookworm"
        mirror = os.environ.get("RECIPEKIT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
        first = ["debootstrap", "--foreign", "--arch=arm64", "--variant=minbase", "bookworm", str(root), mirror]
        subprocess.run(first, check=True, capture_output=True)
        second = ["chroot", str(root), "/debootstrap/debootstrap", "--second-stage"]
        subprocess.run(second, check=True, capture_output=True)
        set_env = " ".join(CANN_SET_ENV)
        # apt, not debootstrap --include, resolves python3.11-venv's dependencies (python3.11-distutils, ...)
        _chroot(
            root,
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
            "python3.11 python3.11-venv >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/* "
            f"&& python3.11 -m venv {CANN_PYTHON} "
            f"&& for f in {set_env}; do mkdir -p $(dirname $f) && printf 'export ASCEND_STANDIN=1\\n' > $f; done",
        )
        _tar(root, tar)
        shutil.rmtree(root, ignore_errors=True)
    base = f"localhost/recipekit-standin-cann-arm64:{STANDIN_VERSION}"
    path = f"ENV PATH={CANN_PYTHON}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    subprocess.run(["podman", "import", "--arch", "arm64", "--change", path, str(tar), base],
                   env=engine["env"], check=True, capture_output=True)  # fmt: skip
    tag = f"localhost/recipekit-standin-cann-arm64-toolkit:{STANDIN_VERSION}"
    _podman_build(engine, tag, f"FROM {base}\n{CANN_TOOLKIT}", tmp_path_factory.mktemp("arm64"), "linux/arm64")
    return tag


def test_arm64_ascend_bundle_builds_under_qemu(
    engine: dict, pypi: None, arm64_cann: str, mirror_of, tmp_path: Path
) -> None:
    bundle = _bundle(tmp_path)  # the 910B preset: hw.arch=arm64
    stand_in = tmp_path / "stand-in"
    stand_in.mkdir()
    torch = _wheel(stand_in, "torch", "2.12.0", {"torch/__init__.py": TORCH})
    mirror = mirror_of({"torch": [torch], "torch_npu": [_torch_npu(stand_in, "2.12.0")]})
    reference = "localhost/recipekit/real-ascend-arm64:test"
    proc, seconds = _build(
        bundle, engine, reference, BASE_IMAGE=arm64_cann, PIP_INDEX_URL=mirror, TORCH_INDEX_URL=mirror
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    print(f"910B bundle (arm64 under qemu), real wheels but torch and torch_npu: built in {seconds:.0f} s")
    assert "deepspeed-0.19.8" in output and "No broken requirements found." in output, output[-3000:]
    # the real wheels import on aarch64 (peft and deepspeed need the real torch, which the stand-in is not)
    imports = "python3 -c 'import torch, torch_npu, transformers, tokenizers, datasets' && python3 -m pip check"
    run = _in_image(engine, reference, f'uname -m && bash -c "{imports}"')
    assert run.returncode == 0 and run.stdout.startswith("aarch64"), run.stdout[-2000:] + run.stderr[-2000:]
