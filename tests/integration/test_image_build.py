"""`recipekit image build` on a real builder: an Ascend and a CUDA bundle's own Dockerfiles, through the docker SDK
and a `podman system service` this test starts, pushed to a local registry, the digest pinned in the bundle.

No container registry outside is reachable, so the bases are stand-ins made here and cached between runs:
`debootstrap --variant=minbase` of Debian bookworm. The CANN stand-in lays Python out as the CANN image does
(its own prefix /usr/local/python3.11.x with python3/pip, on PATH, and CANN's set_env.sh paths); the CUDA stand-in
has no Python at all, as nvcr.io/nvidia/cuda has none, so the Dockerfile's apt step really installs one (given
the bookworm package names through the PYTHON_PACKAGES / PYTHON build args). The package index is a local one of
stub wheels with the pinned names and versions (download.pytorch.org is not reachable either), and the real pip
the install step upgrades to (downloaded once from PyPI). Every RUN step of
both Dockerfiles runs: apt, venv, the per-architecture torch choice, both pip installs and `pip check`.

Needs root, buildah, podman, runc, debootstrap and docker-registry (Debian packages; .ci/run installs them) and the
docker SDK; skipped with the reason otherwise.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from recipekit.base.paths import cache_dir
from recipekit.bundle.build import build
from recipekit.image.dockerfile import normalize, parse
from recipekit.validate.dryrun.workdir.locks import FileLock
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.ports import free_port
from recipekit.validate.static.checks import run_static

pytestmark = pytest.mark.slow

TOOLS = ("buildah", "podman", "runc", "debootstrap", "docker-registry")
STANDIN_VERSION = "v1"
CANN_PYTHON = "/usr/local/python3.11.2"
CANN_SET_ENV = (
    "/usr/local/Ascend/ascend-toolkit/set_env.sh",
    "/usr/local/Ascend/cann/set_env.sh",
    "/usr/local/Ascend/nnal/atb/set_env.sh",
)


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (debootstrap, podman's storage)"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install {' '.join(absent)})"
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the docker SDK is not installed (pip install 'recipekit[image]')"
    return None


@pytest.fixture(scope="module")
def tools() -> None:
    reason = _missing()
    if reason:
        pytest.skip(reason)


def _wait(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not come up within {timeout:.0f} s")


# --------------------------------------------------------------------------------------------- stand-in bases
def _chroot(root: Path, script: str) -> None:
    subprocess.run(["mount", "--bind", "/proc", str(root / "proc")], check=True)
    try:
        subprocess.run(["chroot", str(root), "/bin/sh", "-ec", script], check=True, capture_output=True, text=True)
    finally:
        subprocess.run(["umount", str(root / "proc")], check=False)


def _tar(root: Path, target: Path) -> None:
    tmp = target.with_suffix(".partial")
    subprocess.run(["tar", "-C", str(root), "-cf", str(tmp), "."], check=True)
    os.replace(tmp, target)


@pytest.fixture(scope="module")
def standins(tools: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Root filesystem tarballs of the two stand-in bases, made once and kept in the user cache."""
    cache = cache_dir("image-standins", STANDIN_VERSION)
    tars = {"cuda": cache / "bookworm-minbase.tar", "cann": cache / "bookworm-cann-layout.tar"}
    with cache_lock(cache):
        if not all(t.is_file() for t in tars.values()):
            _make_standins(tars, tmp_path_factory)
    return tars


@contextlib.contextmanager
def cache_lock(folder: Path) -> Iterator[None]:
    """One process at a time fills ``folder`` of the per-user cache: the image files may run on two xdist workers
    at once. An flock, so a killed holder never leaves it held."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock.open(folder / ".lock")
    try:
        lock.lock()
        yield
    finally:
        lock.close()


def _make_standins(tars: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("rootfs") / "bookworm"
    mirror = os.environ.get("RECIPEKIT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(root), mirror], check=True, capture_output=True)
    _chroot(root, "apt-get clean && rm -rf /var/lib/apt/lists/*")
    _tar(root, tars["cuda"])
    set_env = " ".join(CANN_SET_ENV)
    _chroot(
        root,
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "python3.11 python3.11-venv >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/* "
        f"&& python3.11 -m venv {CANN_PYTHON} "
        f"&& for f in {set_env}; do mkdir -p $(dirname $f) && printf 'export ASCEND_STANDIN=1\\n' > $f; done",
    )
    _tar(root, tars["cann"])
    shutil.rmtree(root, ignore_errors=True)


# -------------------------------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def engine(tools: None, standins: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A podman service (vfs storage, runc) speaking the Docker API, with both bases imported, and a registry."""
    root = tmp_path_factory.mktemp("engine")
    registry_port = free_port()
    registry = f"127.0.0.1:{registry_port}"
    # crun cannot run in a hybrid-cgroup sandbox; runc with cgroups off can. The registry is plain HTTP.
    (root / "containers.conf").write_text(
        '[containers]\ncgroups = "disabled"\n[engine]\ncgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\nruntime = "runc"\n'
    )
    (root / "registries.conf").write_text(
        f'unqualified-search-registries = []\n[[registry]]\nlocation = "{registry}"\ninsecure = true\n'
    )
    (root / "registry.yml").write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root}/registry\n"
        f"http:\n  addr: {registry}\nlog:\n  level: error\n"
    )
    env = {
        **os.environ,
        "CONTAINERS_STORAGE_CONF": str(root / "storage.conf"),
        "CONTAINERS_CONF": str(root / "containers.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(root / "registries.conf"),
    }
    bases = {}
    # overlay where the kernel lets podman mount it (minutes faster: vfs copies the whole root per step), else vfs
    for driver in ("overlay", "vfs"):
        (root / "storage.conf").write_text(
            f'[storage]\ndriver = "{driver}"\nrunroot = "{root}/run-{driver}"\ngraphroot = "{root}/graph-{driver}"\n'
        )
        for name, tar in standins.items():
            ref = f"localhost/recipekit-standin-{name}:{STANDIN_VERSION}"
            path = f"ENV PATH={CANN_PYTHON}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            change = ["--change", path] if name == "cann" else []
            proc = subprocess.run(["podman", "import", *change, str(tar), ref], env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                break
            bases[name] = ref
        if len(bases) == len(standins):
            break
        assert driver != "vfs", f"podman import failed: {proc.stderr[-2000:]}"
    socket_path = root / "podman.sock"
    log = (root / "service.log").open("w")
    service = subprocess.Popen(
        ["podman", "system", "service", "--time", "0", f"unix://{socket_path}"], env=env, stdout=log, stderr=log
    )
    registry_log = (root / "registry.log").open("w")
    registry_proc = subprocess.Popen(
        ["docker-registry", "serve", str(root / "registry.yml")], stdout=registry_log, stderr=registry_log
    )
    try:
        _wait(socket_path.exists, "podman system service")
        _wait(lambda: urllib.request.urlopen(f"http://{registry}/v2/", timeout=2).status == 200, "docker-registry")
        # env: what the podman CLI needs to see the same storage (tests that mount an image's root filesystem)
        yield {"url": f"unix://{socket_path}", "registry": registry, "bases": bases, "env": env}
    finally:
        for proc in (service, registry_proc):  # a throw-away service: a few seconds to stop, then killed
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        registry_log.close()
        # overlay storage mounts its layer directory on itself: unmount it so pytest's own clean-up of old temporary
        # directories can remove it (removing gigabytes of layers here cost the suite most of a minute a module)
        for graph in root.glob("graph-*"):
            subprocess.run(["umount", "-l", str(graph / "overlay")], check=False, capture_output=True)


# ------------------------------------------------------------------------------------------- stub package index
def _stub_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel with ``name``'s pinned version, an importable module and no requirements (so `pip check` holds)."""
    dist = normalize(name).replace("-", "_")
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": f'__version__ = "{version}"\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: stub\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: recipekit-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for member, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    recipes = {
        # This machine is x86_64: the 910B bundle targets its x86 hosts (hw.arch=amd64, the +cpu torch build).
        "ascend": ["recipe=llama3_8b_sft", "hw.arch=amd64"],
        "cuda": ["recipe=llama3_8b_sft", "hw=h100"],
    }
    return {name: build(overrides, root / name, force=True).path for name, overrides in recipes.items()}


def real_wheel(name: str, version: str) -> Path:
    """The real ``name==version`` wheel from PyPI, downloaded once into the user cache (pip itself: the Dockerfile
    upgrades pip first, and a stub would leave the image without one)."""
    folder = cache_dir("image-test-wheels", f"{name}-{version}")
    with cache_lock(folder):
        return _download_wheel(folder, name, version)


def _download_wheel(folder: Path, name: str, version: str) -> Path:
    found = sorted(folder.glob("*.whl"))
    if not found:
        command = [
            sys.executable, "-m", "pip", "download", "--isolated", "--quiet", "--no-deps", "--only-binary", ":all:",
            "--index-url", os.environ.get("RECIPEKIT_PYPI", "https://pypi.org/simple"), "--dest", str(folder),
            f"{name}=={version}",
        ]  # fmt: skip
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
        found = sorted(folder.glob("*.whl"))
        if proc.returncode != 0 or not found:
            pytest.skip(f"cannot download {name}=={version} from PyPI: {proc.stderr.strip()[-300:]}")
    return found[0]


@pytest.fixture(scope="module")
def index(bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PEP 503 index on 127.0.0.1 with a stub of every pin the bundles' Dockerfiles install."""
    root = tmp_path_factory.mktemp("index")
    wheels: dict[str, list[Path]] = {}
    for bundle in bundles.values():
        parsed = parse((bundle / "Dockerfile").read_text())
        pins = {**parsed.pins, **{f"torch {v}": v for v in parsed.torch_builds.values()}}
        for key, version in pins.items():
            name = key.split()[0]
            folder = root / "files"
            folder.mkdir(exist_ok=True)
            if name == "pip":  # the real one: the install step upgrades pip first and then runs it
                wheel = Path(shutil.copy(real_wheel(name, version), folder))
            else:
                wheel = _stub_wheel(folder, name, version)
            wheels.setdefault(normalize(name), []).append(wheel)
    for project, files in wheels.items():
        page = root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        links = "".join(f'<a href="../../files/{w.name}">{w.name}</a>\n' for w in sorted(set(files)))
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


# -------------------------------------------------------------------------------------------------------- tests
def _image_build(bundle: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "recipekit.cli", "image", "build", str(bundle), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=1500)


def _build_args(engine: dict, index: str, family: str) -> list[str]:
    args = {"BASE_IMAGE": engine["bases"][family], "PIP_INDEX_URL": index}
    if family == "cann":
        args["TORCH_INDEX_URL"] = index
    else:  # the stand-in is Debian bookworm: its Python packages stand in for Ubuntu 24.04's python3.12
        args.update(PYTHON_PACKAGES="python3.11 python3.11-venv", PYTHON="python3.11")
    return [word for key, value in args.items() for word in ("--build-arg", f"{key}={value}")]


def _registry_digest(registry: str, repository: str, tag: str) -> str:
    accept = ", ".join(
        (
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.docker.distribution.manifest.v2+json",
        )
    )
    url = f"http://{registry}/v2/{repository}/manifests/{tag}"
    request = urllib.request.Request(url, method="HEAD", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers["Docker-Content-Digest"]


@pytest.mark.parametrize(("name", "family"), [("ascend", "cann"), ("cuda", "cuda")])
def test_bundle_image_builds_pushes_and_is_pinned_by_digest(
    engine: dict, index: str, bundles: dict[str, Path], name: str, family: str
) -> None:
    bundle = bundles[name]
    repository, tag = f"recipekit/{name}", "test"
    reference = f"{engine['registry']}/{repository}:{tag}"
    proc = _image_build(
        bundle, "--engine", engine["url"], "--tag", reference, "--push", *_build_args(engine, index, family)
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    # every RUN step ran, in order, and the last one is pip check
    assert "STEP" in output and "No broken requirements found." in output, output[-4000:]
    if family == "cann":  # the x86_64 torch_npu image: torch's +cpu build from TORCH_INDEX_URL, then the stack
        assert "Successfully installed torch-2.12.0+cpu" in output and "torch_npu-2.12.0" in output, output[-4000:]
    else:
        assert "Setting up python3.11" in output, "the apt step installed the Python the base lacks"
        assert "torch-2.13.0" in output and "Successfully installed" in output, output[-4000:]

    digest = _registry_digest(engine["registry"], repository, tag)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["image"]["digest"] == digest
    assert manifest["image"]["pinned"] == f"{engine['registry']}/{repository}@{digest}"
    assert manifest["image"]["platform"] == "linux/amd64"
    job = yaml.safe_load((bundle / "volcano-job.yaml").read_text())
    assert job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["image"] == manifest["image"]["pinned"]
    # the rewritten bundle is still one validate accepts: every hash matches, every file parses
    results = {r.id: r for r in run_static(load_bundle(bundle), libraries=False)}
    for check in ("files.manifest", "files.parse", "volcano.schema", "image.arch"):
        assert results[check].status.value == "pass", (check, [str(f) for f in results[check].findings])

    # what the image is: its platform and how it starts
    import docker

    attrs = docker.DockerClient(base_url=engine["url"]).api.inspect_image(reference)
    assert (attrs["Os"], attrs["Architecture"]) == ("linux", "amd64")
    config = attrs["Config"]
    # the image starts its own launcher on the run files the Job mounts from the bundle's ConfigMap (it holds none of
    # them itself, and runs none of them before checking them against the Job's digest)
    assert config["Cmd"] == ["python3", "-m", "runtime.launch", "/workspace/run/launch.json"]
    assert config["WorkingDir"] == "/workspace"
    if family == "cuda":
        assert any(e.startswith("PATH=/opt/venv/bin:") for e in config["Env"]), config["Env"]


def test_a_failing_step_is_reported_with_its_last_lines(
    engine: dict, index: str, bundles: dict[str, Path], tmp_path: Path
) -> None:
    """A step that fails (here: TORCH_INDEX_URL given as an index without torch) is named with its last lines."""
    bundle = Path(shutil.copytree(bundles["ascend"], tmp_path / "broken"))
    args = _build_args(engine, index, "cann")
    args[args.index(f"TORCH_INDEX_URL={index}")] = f"TORCH_INDEX_URL={index.removesuffix('/simple')}/empty/simple"
    before = (bundle / "manifest.json").read_text()
    proc = _image_build(bundle, "--engine", engine["url"], "--tag", "localhost/recipekit/broken:test", *args)
    output = proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "failing step: STEP" in output and "torch==" in output.split("failing step:")[1]
    assert "its last lines:" in output and "No matching distribution found" in output.split("its last lines:")[1]
    assert (bundle / "manifest.json").read_text() == before, "a failed build leaves the bundle as it was"


@pytest.mark.parametrize("edited", ["Dockerfile", "runtime/train.py"])
def test_a_tampered_bundle_is_never_built_under_its_stacks_tag(
    engine: dict, index: str, tmp_path: Path, edited: str
) -> None:
    """Issue 38: a Dockerfile that gained a RUN step, or a runtime that gained a line, is refused (exit 2, one
    problem naming the file) through the real engine path, before any step runs; manifest.json is left alone, so
    validate still reports the edit; the same bundle untouched would build (the tests above)."""
    registry = f"cluster.image_registry={engine['registry']}/recipekit"
    bundle = build(["recipe=llama3_8b_sft", "hw.arch=amd64", registry], tmp_path / "tampered", force=True).path
    path = bundle / edited
    text = path.read_text()
    if edited == "Dockerfile":
        path.write_text(text.replace("WORKDIR /workspace", "RUN touch /planted\nWORKDIR /workspace"))
    else:
        path.write_text(text + "\nimport os; os.system('touch /planted')\n")
    before = (bundle / "manifest.json").read_text()
    proc = _image_build(bundle, "--engine", engine["url"], "--push", *_build_args(engine, index, "cann"))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    problems = [line for line in proc.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and f"{path}: was edited after the build" in problems[0], proc.stderr
    assert "STEP" not in output and "pushing" not in output, "nothing built, nothing pushed"
    assert (bundle / "manifest.json").read_text() == before
    results = {r.id: r for r in run_static(load_bundle(bundle), libraries=False)}
    assert results["files.manifest"].status.value == "fail"


def test_a_second_bundle_of_the_same_stack_builds_nothing(engine: dict, index: str, tmp_path: Path) -> None:
    """Two bundles that differ only in learning rate name one image; `image build --push` of the second finds it in
    the registry (the real one, through the real engine), builds nothing and pins the same digest."""
    registry = f"cluster.image_registry={engine['registry']}/recipekit"
    base = ["recipe=llama3_8b_sft", "hw.arch=amd64", registry]
    first = build(base, tmp_path / "first", force=True)
    second = build([*base, "train.learning_rate=1e-4"], tmp_path / "second", force=True)
    assert first.resolved.plan.image == second.resolved.plan.image
    args = ["--engine", engine["url"], "--push", *_build_args(engine, index, "cann")]
    proc = _image_build(first.path, *args)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    proc = _image_build(second.path, *args)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "STEP" not in output and "already holds this software stack's image" in output, output[-4000:]
    pinned = [json.loads((b.path / "manifest.json").read_text())["image"]["pinned"] for b in (first, second)]
    assert pinned[0] and pinned[0] == pinned[1]
