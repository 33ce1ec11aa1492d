"""`recipekit image build` without an engine: the request's checks, the equivalent docker command, the streamed
build and push read from an engine's events, and the digest pinned into the bundle (the real builder runs in
tests/integration/test_image_build.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import build
from recipekit.cli import main
from recipekit.handover import imagebuild
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from recipekit.validate.static.checks import run_static

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(["recipe=llama3_8b_sft"], tmp_path_factory.mktemp("b") / "llama", force=True).path


@pytest.fixture()
def copy(bundle: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(bundle, tmp_path / "bundle"))


def test_defaults_are_the_bundles_own(bundle: Path) -> None:
    req = imagebuild.request(bundle)
    doc = yaml.safe_load((bundle / "recipe.yaml").read_text())
    assert req.tag == doc["plan"]["image"] and req.platform == "linux/arm64" and req.build_args == {}


def test_build_args_must_be_declared_and_platform_must_be_the_nodes(bundle: Path) -> None:
    ok = imagebuild.request(bundle, build_args=["PIP_INDEX_URL=https://mirror/simple", "HTTPS_PROXY=http://p:3128"])
    assert ok.build_args == {"PIP_INDEX_URL": "https://mirror/simple", "HTTPS_PROXY": "http://p:3128"}
    with pytest.raises(RecipeError) as info:
        imagebuild.request(bundle, platform="linux/amd64", build_args=["PIP_INDEX=x", "TARGETARCH=amd64", "oops"])
    messages = [str(p) for p in info.value.problems]
    assert any("--platform: linux/amd64" in m and "exec format error" in m and "hw.arch=amd64" in m for m in messages)
    assert any("--build-arg PIP_INDEX:" in m and "declared: BASE_IMAGE, PIP_INDEX_URL" in m for m in messages)
    assert any("--build-arg TARGETARCH" in m for m in messages) and any(
        "'oops' is not KEY=VALUE" in m for m in messages
    )


def test_equivalent_docker_command(bundle: Path) -> None:
    req = imagebuild.request(bundle, tag="reg.example/a:1", build_args=["PIP_INDEX_URL=https://m/simple"], push=True)
    assert req.docker_command() == (
        f"docker build --platform linux/arm64 --build-arg PIP_INDEX_URL=https://m/simple -t reg.example/a:1 "
        f"{req.bundle} && docker push reg.example/a:1"
    )


def test_no_engine_exits_2_with_the_docker_command(bundle: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["image", "build", str(bundle), "--engine", f"unix://{tmp_path}/none.sock"])
    assert result.exit_code == 2, result.output
    assert "no Docker-API engine reachable" in result.output and "docker build --platform linux/arm64" in result.output
    assert "Traceback" not in result.output


def test_not_a_bundle_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["image", "build", str(tmp_path)])
    assert result.exit_code == 2 and "not a recipekit bundle" in result.output


class FakeAPI:
    """The docker SDK's low-level API as an engine answers it: recorded event streams."""

    def __init__(self, build_events: list[dict], push_events: list[dict] | None = None, arch: str = "arm64") -> None:
        self.build_events, self.push_events, self.arch = build_events, push_events or [], arch
        self.calls: list[tuple[str, dict]] = []

    def build(self, **kwargs: Any):
        self.calls.append(("build", kwargs))
        return iter(self.build_events)

    def inspect_image(self, ref: str) -> dict:
        return {"Id": "sha256:" + "cd" * 32, "Os": "linux", "Architecture": self.arch}

    def push(self, repository: str, **kwargs: Any):
        self.calls.append(("push", {"repository": repository, **kwargs}))
        return iter(self.push_events)


class FakeClient:
    def __init__(self, api: FakeAPI) -> None:
        self.api = api


GOOD_BUILD = [
    {"stream": "STEP 1/3: FROM quay.io/ascend/cann:9.1.0-910b-ubuntu22.04-py3.12\n"},
    {"stream": "STEP 2/3: RUN python3 -m pip install torch==2.12.0\n"},
    {"stream": "Successfully installed torch-2.12.0\n"},
    {"stream": "STEP 3/3: COPY run.sh ./\n"},
    {"aux": {"ID": "sha256:" + "cd" * 32}},
    {"stream": "Successfully built cdcdcdcdcdcd\n"},
]


def test_build_streams_steps_and_passes_platform_and_args(bundle: Path) -> None:
    api = FakeAPI(GOOD_BUILD)
    lines: list[str] = []
    req = imagebuild.request(bundle, build_args=["PIP_INDEX_URL=https://m/simple"])
    built = imagebuild.build(FakeClient(api), req, lines.append)
    assert built.image_id == "sha256:" + "cd" * 32 and built.digest is None
    kwargs = api.calls[0][1]
    assert kwargs["platform"] == "linux/arm64" and kwargs["buildargs"] == {"PIP_INDEX_URL": "https://m/simple"}
    assert "STEP 2/3: RUN python3 -m pip install torch==2.12.0" in lines


def test_failing_step_is_named_with_its_last_lines(bundle: Path) -> None:
    events = [
        *GOOD_BUILD[:1],
        {"stream": "STEP 2/3: RUN python3 -m pip install no-such==1.0\n"},
        {"stream": "ERROR: Could not find a version that satisfies the requirement no-such==1.0\n"},
        {"stream": "ERROR: No matching distribution found for no-such==1.0\n"},
        {"errorDetail": {"message": "building at STEP 2: exit status 1"}, "error": "building at STEP 2: exit status 1"},
    ]
    with pytest.raises(imagebuild.BuildFailed) as info:
        imagebuild.build(FakeClient(FakeAPI(events)), imagebuild.request(bundle), lambda line: None)
    failed = info.value
    assert failed.step == "STEP 2/3: RUN python3 -m pip install no-such==1.0"
    assert failed.tail[-1] == "ERROR: No matching distribution found for no-such==1.0"
    assert "exit status 1" in failed.message


def test_an_image_for_another_cpu_is_refused(bundle: Path) -> None:
    with pytest.raises(imagebuild.BuildFailed, match="built linux/amd64, not linux/arm64"):
        imagebuild.build(FakeClient(FakeAPI(GOOD_BUILD, arch="amd64")), imagebuild.request(bundle), lambda _: None)


@pytest.mark.parametrize(
    "events",
    [
        [{"status": "Pushing"}, {"status": "1: digest: " + DIGEST + " size: 898"}],  # Podman
        [{"status": "1: digest: " + DIGEST + " size: 898"}, {"aux": {"Tag": "1", "Digest": DIGEST, "Size": 898}}],
    ],
    ids=["podman", "docker"],
)
def test_push_reads_the_registry_digest(bundle: Path, events: list[dict]) -> None:
    req = imagebuild.request(bundle, tag="reg.example:5000/team/a:1", push=True)
    api = FakeAPI(GOOD_BUILD, events)
    built = imagebuild.push(FakeClient(api), req, imagebuild.Built(req.tag, "sha256:x", req.platform), print)
    assert built.digest == DIGEST and built.pinned == f"reg.example:5000/team/a@{DIGEST}"
    assert api.calls[-1][1]["repository"] == "reg.example:5000/team/a" and api.calls[-1][1]["tag"] == "1"


def test_push_error_is_a_failure(bundle: Path) -> None:
    req = imagebuild.request(bundle, tag="reg.example/a:1", push=True)
    api = FakeAPI(GOOD_BUILD, [{"status": "Pushing"}, {"error": "denied: requested access to the resource"}])
    with pytest.raises(imagebuild.BuildFailed, match="denied"):
        imagebuild.push(FakeClient(api), req, imagebuild.Built(req.tag, "sha256:x", req.platform), print)


def test_digest_is_pinned_in_the_job_and_manifest_and_the_bundle_still_validates(copy: Path) -> None:
    job_before = (copy / "volcano-job.yaml").read_text()
    built = imagebuild.Built("reg.example/team/llama:abc", "sha256:" + "cd" * 32, "linux/arm64", DIGEST)
    imagebuild.record(copy, built)
    job_after = (copy / "volcano-job.yaml").read_text()
    container = yaml.safe_load(job_after)["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    assert container["image"] == f"reg.example/team/llama@{DIGEST}"
    changed = [(a, b) for a, b in zip(job_before.splitlines(), job_after.splitlines()) if a != b]
    assert len(changed) == 1 and len(job_before.splitlines()) == len(job_after.splitlines()), changed
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["image"] == {
        "reference": "reg.example/team/llama:abc",
        "platform": "linux/arm64",
        "id": "sha256:" + "cd" * 32,
        "digest": DIGEST,
        "pinned": f"reg.example/team/llama@{DIGEST}",
    }
    results = {r.id: r for r in run_static(load_bundle(copy), libraries=False)}
    assert results["files.manifest"].status is Status.PASS, [str(f) for f in results["files.manifest"].findings]
    assert results["volcano.schema"].status is Status.PASS and results["image.arch"].status is Status.PASS
    assert (copy / "run.sh").stat().st_mode & 0o111, "run.sh stays executable"


def test_a_build_without_push_records_the_image_and_keeps_the_tag(copy: Path) -> None:
    job_before = (copy / "volcano-job.yaml").read_bytes()
    imagebuild.record(copy, imagebuild.Built("reg.example/team/llama:abc", "sha256:" + "cd" * 32, "linux/arm64"))
    assert (copy / "volcano-job.yaml").read_bytes() == job_before
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["image"]["digest"] is None and manifest["image"]["id"] == "sha256:" + "cd" * 32


class RegistryAPI(FakeAPI):
    """An engine whose registry (``inspect_distribution``) and local store answer as configured."""

    def __init__(self, registry: dict | None, local: bool, arch: str = "arm64") -> None:
        super().__init__(GOOD_BUILD, arch=arch)
        self.registry, self.local = registry, local

    def inspect_distribution(self, ref: str) -> dict:
        if self.registry is None:
            raise RuntimeError("manifest unknown")
        return self.registry

    def inspect_image(self, ref: str) -> dict:
        if not self.local:
            raise RuntimeError("no such image")
        return super().inspect_image(ref)


def test_a_stack_already_in_the_registry_or_engine_is_not_built_again(bundle: Path) -> None:
    pushed = imagebuild.request(bundle, push=True)
    registry = {"Descriptor": {"digest": DIGEST}, "Platforms": [{"os": "linux", "architecture": "arm64"}]}
    found = imagebuild.already_built(FakeClient(RegistryAPI(registry, local=False)), pushed)
    assert found is not None and found.digest == DIGEST and found.reference == pushed.tag
    # in the registry for another CPU only: built
    other = {**registry, "Platforms": [{"os": "linux", "architecture": "amd64"}]}
    assert imagebuild.already_built(FakeClient(RegistryAPI(other, local=False)), pushed) is None
    # only the engine has it: not built again, but pushed (no digest yet)
    local = imagebuild.already_built(FakeClient(RegistryAPI(None, local=True)), pushed)
    assert local is not None and local.digest is None
    assert imagebuild.already_built(FakeClient(RegistryAPI(None, local=False)), pushed) is None
    assert imagebuild.already_built(FakeClient(RegistryAPI(None, local=True, arch="amd64")), pushed) is None


def test_the_cli_builds_nothing_for_a_stack_the_registry_holds(bundle: Path, tmp_path: Path, monkeypatch) -> None:
    import shutil

    copy = Path(shutil.copytree(bundle, tmp_path / "second"))
    registry = {"Descriptor": {"digest": DIGEST}, "Platforms": [{"os": "linux", "architecture": "arm64"}]}
    api = RegistryAPI(registry, local=False)
    monkeypatch.setattr(imagebuild, "connect", lambda req: FakeClient(api))
    result = CliRunner().invoke(main, ["image", "build", str(copy), "--push"])
    assert result.exit_code == 0, result.output
    assert not api.calls, "neither a build nor a push"
    assert "already holds this software stack's image; nothing to build" in result.output
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["image"]["digest"] == DIGEST


def test_a_rescaled_bundle_keeps_its_sources_pinned_image(copy: Path, tmp_path: Path) -> None:
    from recipekit.bundle.rescale import rescale

    reference = yaml.safe_load((copy / "recipe.yaml").read_text())["plan"]["image"]
    imagebuild.record(copy, imagebuild.Built(reference, "sha256:" + "cd" * 32, "linux/arm64", DIGEST))
    nodes = yaml.safe_load((copy / "recipe.yaml").read_text())["plan"]["nodes"]
    done = rescale(copy, nodes * 2, tmp_path / "rescaled")
    assert done.same_image and done.built.resolved.plan.image == reference
    pinned = imagebuild.carry_pin(copy, done.built.path)
    assert pinned and pinned.endswith("@" + DIGEST)
    job = yaml.safe_load((done.built.path / "volcano-job.yaml").read_text())
    assert job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["image"] == pinned
    results = {r.id: r for r in run_static(load_bundle(done.built.path), libraries=False)}
    assert results["files.manifest"].status is Status.PASS and results["runfiles.configmap"].status is Status.PASS


# ------------------------------------------------------------------------- issue 38: images cannot be laundered
def refused_by_the_cli(bundle: Path, *args: str) -> str:
    """`image build` exits 2 with one problem (naming the file), before any engine is asked, and leaves the
    bundle."""
    before = (bundle / "manifest.json").read_bytes()
    result = CliRunner().invoke(main, ["image", "build", str(bundle), "--engine", "unix:///nowhere.sock", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[0].endswith("error: 1 problem:") and len(lines) == 2, result.output
    assert "Traceback" not in result.output and "no Docker-API engine" not in result.output, "refused before the engine"
    assert (bundle / "manifest.json").read_bytes() == before, "manifest.json is never re-hashed"
    return lines[1]


def test_a_dockerfile_that_gained_a_step_is_refused_naming_it(copy: Path) -> None:
    dockerfile = copy / "Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text().replace("WORKDIR /workspace", "RUN touch /planted\nWORKDIR /workspace")
    )
    line = refused_by_the_cli(copy)
    assert f"{dockerfile}:" in line and "edited after the build" in line


def test_a_runtime_that_gained_a_line_is_refused_naming_it(copy: Path) -> None:
    train = copy / "runtime" / "train.py"
    train.write_text(train.read_text() + "\nimport os; os.system('touch /planted')\n")
    line = refused_by_the_cli(copy)
    assert f"{train}:" in line and "edited after the build" in line


def test_an_edit_with_manifest_json_rehashed_is_refused_by_the_tag(copy: Path) -> None:
    """The manifest re-hashed to hide the edit: the files no longer hash to the stack plan.image names."""
    from recipekit.validate.shared.loader import rehash_manifest

    train = copy / "runtime" / "train.py"
    train.write_text(train.read_text() + "\n# planted\n")
    rehash_manifest(copy)
    line = refused_by_the_cli(copy)
    assert "hash to stack" in line and "recipe.yaml: plan.image names stack" in line
    results = {r.id: r for r in run_static(load_bundle(copy), libraries=False)}
    assert results["image.context"].status is Status.FAIL, "validate reports it too"


@pytest.mark.parametrize("kind", ["pycache", "link", "fifo", "unlisted"])
def test_anything_else_the_image_would_copy_is_refused(copy: Path, tmp_path: Path, kind: str) -> None:
    import os

    runtime = copy / "runtime"
    if kind == "pycache":  # a bytecode file Python would run in place of its source
        (runtime / "__pycache__").mkdir(exist_ok=True)
        planted = runtime / "__pycache__" / "train.cpython-312.pyc"
        planted.write_bytes(b"\x00" * 16)
    elif kind == "link":
        planted = runtime / "extra.py"
        (tmp_path / "secret").write_text("x")
        planted.symlink_to(tmp_path / "secret")
    elif kind == "fifo":
        planted = runtime / "pipe.py"
        os.mkfifo(planted)
    else:
        planted = runtime / "sitecustomize.py"
        planted.write_text("import os\n")
    line = refused_by_the_cli(copy)
    assert str(planted) in line, line


def test_a_tag_claiming_another_stack_is_refused_and_an_own_tag_is_always_built(bundle: Path) -> None:
    with pytest.raises(RecipeError) as info:
        imagebuild.request(bundle, tag="reg.example/recipekit-ascend:0123456789ab")
    assert "--tag names stack 0123456789ab" in str(info.value.problems[0])
    own = imagebuild.request(bundle, tag="reg.example/team/llama:v1", push=True)
    registry = {"Descriptor": {"digest": DIGEST}, "Platforms": [{"os": "linux", "architecture": "arm64"}]}
    # a registry digest is trusted only for the stack digest recomputed from the bundle: v1 may hold anything
    assert imagebuild.already_built(FakeClient(RegistryAPI(registry, local=True)), own) is None
    stack = imagebuild.request(bundle, push=True)
    assert stack.tag.endswith(":" + stack.context.stack)
    assert imagebuild.already_built(FakeClient(RegistryAPI(registry, local=False)), stack) is not None


def test_the_engine_gets_exactly_the_checked_bytes(bundle: Path) -> None:
    import io
    import tarfile

    api = FakeAPI(GOOD_BUILD)
    req = imagebuild.request(bundle)
    imagebuild.build(FakeClient(api), req, lambda line: None)
    kwargs = api.calls[0][1]
    assert kwargs["custom_context"] is True and "path" not in kwargs
    with tarfile.open(fileobj=io.BytesIO(kwargs["fileobj"].getvalue())) as archive:
        names = {m.name for m in archive.getmembers() if m.isfile()}
        assert archive.extractfile("Dockerfile").read() == (bundle / "Dockerfile").read_bytes()
    listed = json.loads((bundle / "manifest.json").read_text())["files"]
    assert names == {"Dockerfile", *(n for n in listed if n.startswith("runtime/"))}


def test_recording_refuses_a_bundle_edited_during_the_build(copy: Path) -> None:
    """record() writes the Job and manifest.json's image only; a file that changed since it was checked is
    reported, nothing is written, and validate still sees the edit."""
    (copy / "Dockerfile").write_text((copy / "Dockerfile").read_text() + "RUN true\n")
    before = (copy / "manifest.json").read_bytes()
    with pytest.raises(RecipeError) as info:
        imagebuild.record(copy, imagebuild.Built("reg.example/a:b", "sha256:" + "cd" * 32, "linux/arm64", DIGEST))
    assert str(copy / "Dockerfile") in str(info.value.problems[0])
    assert (copy / "manifest.json").read_bytes() == before
    results = {r.id: r for r in run_static(load_bundle(copy), libraries=False)}
    assert results["files.manifest"].status is Status.FAIL
