"""``recipekit submit`` through the real kubernetes client against recorded answers: the server-side dry run comes first
and nothing is created while anything refuses (Volcano's webhook, a missing run key, a missing service account);
otherwise the ConfigMap is server-side applied and the Job created, exactly as the bundle holds them."""

from __future__ import annotations

import base64
import copy
from pathlib import Path

import pytest
import yaml

from recipekit.bundle.build import build
from recipekit.bundle.documents import run_key_command
from tests.unit.cluster.apiserver import RecordedAPIServer, Request, load, not_found, status
from tests.unit.cluster.conftest import command, fits

pytest.importorskip("kubernetes", reason="the cluster commands need the kubernetes client (the test extra)")

NS = "team-a"
CORE = f"/api/v1/namespaces/{NS}"
JOBS = f"/apis/batch.volcano.sh/v1alpha1/namespaces/{NS}/jobs"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    overrides = ["recipe=tiny_sft", f"cluster.namespace={NS}", "cluster.queue=llm"]
    return build(overrides, tmp_path_factory.mktemp("submit") / "tiny", force=True).path


@pytest.fixture(scope="module")
def identity_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    overrides = [
        "recipe=tiny_sft",
        f"cluster.namespace={NS}",
        "cluster.image_pull_secrets=[regcred]",
        "cluster.service_account=trainer",
        "cluster.priority_class=training-high",
    ]
    return build(overrides, tmp_path_factory.mktemp("submit") / "identity", force=True).path


def job_of(bundle: Path) -> dict:
    return yaml.safe_load((bundle / "volcano-job.yaml").read_text())


def configmap_of(bundle: Path) -> dict:
    return yaml.safe_load((bundle / "run-files.yaml").read_text())


def run_key(length: int = 64) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "recipekit-run-key", "namespace": NS, "uid": "5e1f0000-0000-4000-8000-000000000001"},
        "type": "Opaque",
        "data": {"key": base64.b64encode(b"f" * length).decode()},
    }


def claim(name: str = "recipekit-scratch", phase: str = "Bound") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Ti"}}},
        "status": {"phase": phase},
    }


def accepting(server: RecordedAPIServer, bundle: Path) -> None:
    """An API server that admits both objects (returning them as stored) and has what the pods need."""
    cm, job = configmap_of(bundle), job_of(bundle)

    def apply(request: Request) -> tuple[int, dict]:
        stored = copy.deepcopy(request.body)
        stored["metadata"].update(uid="c0000000-0000-4000-8000-000000000001", resourceVersion="1")
        return 200, stored

    def create(request: Request) -> tuple[int, dict]:
        stored = copy.deepcopy(request.body)
        stored["metadata"].update(uid="6f1c2b7e-0000-4000-8000-000000000002", resourceVersion="2")
        return 201, stored

    server.handle("PATCH", f"{CORE}/configmaps/{cm['metadata']['name']}", apply)
    server.handle("POST", JOBS, create)
    server.answer("GET", f"{CORE}/secrets/recipekit-run-key", run_key())
    server.answer("GET", f"{CORE}/persistentvolumeclaims/recipekit-scratch", claim())
    assert job["metadata"]["namespace"] == NS


def test_submit_dry_runs_then_applies_the_run_files_and_creates_the_job(
    server: RecordedAPIServer, bundle: Path, tmp_path: Path
) -> None:
    accepting(server, bundle)
    result = command(server, tmp_path, "submit", str(bundle))
    assert result.exit_code == 0, result.output
    job = job_of(bundle)
    name = job["metadata"]["name"]
    assert (
        f"submitted {name} (run id {job['metadata']['labels']['recipekit.io/run']}) to namespace {NS}" in result.stdout
    )
    assert f"recipekit status {name} -n {NS}" in result.stdout and fits(result)
    writes = [r for r in server.requests if r.method in ("PATCH", "POST")]
    # the dry run of both objects first, then (after the checks) the real requests, ConfigMap before Job
    assert [(r.method, r.arg("dryRun")) for r in writes] == [
        ("PATCH", "All"),
        ("POST", "All"),
        ("PATCH", None),
        ("POST", None),
    ]
    asked = server.asked("GET")
    assert (f"{JOBS}/{name}" in [p for _, p in asked]) and f"{CORE}/secrets/recipekit-run-key" in [p for _, p in asked]
    patch, post = writes[2], writes[3]
    assert patch.content_type == "application/apply-patch+yaml"
    assert (patch.arg("fieldManager"), patch.arg("force"), patch.arg("fieldValidation")) == (
        "recipekit",
        "true",
        "Strict",
    )
    assert patch.body == configmap_of(bundle) and post.body == job  # exactly the bundle's objects
    assert post.arg("fieldValidation") == "Strict"


def test_a_webhook_refusal_and_a_missing_run_key_are_all_said_and_nothing_is_created(
    server: RecordedAPIServer, bundle: Path, tmp_path: Path
) -> None:
    accepting(server, bundle)
    refusal = load("refusals.yaml")["webhook"]
    server.handle("POST", JOBS, lambda request: (400, refusal))
    server.answer("GET", f"{CORE}/secrets/recipekit-run-key", not_found(f"{CORE}/secrets/recipekit-run-key"), 404)
    result = command(server, tmp_path, "submit", str(bundle))
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    assert "nothing was created" in said
    assert "Volcano's admission webhook refused Job" in said
    assert 'unable to find job queue: queue.scheduling.volcano.sh "llm" not found; (HTTP 400)' in said
    assert f"Secret recipekit-run-key is missing in namespace {NS}: make it once with {run_key_command(NS)}" in said
    assert [r.arg("dryRun") for r in server.requests if r.method in ("PATCH", "POST")] == ["All", "All"]
    assert fits(result)


def test_a_run_key_too_short_to_sign_with_is_refused(server: RecordedAPIServer, bundle: Path, tmp_path: Path) -> None:
    accepting(server, bundle)
    server.answer("GET", f"{CORE}/secrets/recipekit-run-key", run_key(length=8))
    result = command(server, tmp_path, "submit", str(bundle))
    assert result.exit_code == 1
    assert "holds no 'key' of at least 16 bytes" in " ".join(result.stderr.split())


def test_the_pods_identity_must_exist_and_unreadable_checks_are_warnings(
    server: RecordedAPIServer, identity_bundle: Path, tmp_path: Path
) -> None:
    accepting(server, identity_bundle)
    server.answer("GET", f"{CORE}/secrets/regcred", {**run_key(), "metadata": {"name": "regcred"}})
    refusal = (
        'priorityclasses.scheduling.k8s.io "training-high" is forbidden: User "alice" cannot get resource '
        '"priorityclasses" in API group "scheduling.k8s.io" at the cluster scope'
    )
    forbidden = status(403, refusal, "Forbidden")
    server.answer("GET", "/apis/scheduling.k8s.io/v1/priorityclasses/training-high", forbidden, 403)
    result = command(server, tmp_path, "submit", str(identity_bundle))
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    assert f"ServiceAccount trainer is missing in namespace {NS}: the pods run as it (cluster.service_account)" in said
    assert "warning: cannot check PriorityClass training-high: priorityclasses.scheduling.k8s.io" in said
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer", "namespace": NS}}
    server.answer("GET", f"{CORE}/serviceaccounts/trainer", account)
    result = command(server, tmp_path, "submit", str(identity_bundle))
    assert result.exit_code == 0, result.output
    assert "warning: cannot check PriorityClass training-high" in result.stderr and fits(result)


def test_a_job_that_exists_is_this_run_already(server: RecordedAPIServer, bundle: Path, tmp_path: Path) -> None:
    accepting(server, bundle)
    job = job_of(bundle)
    running = {**job, "status": {"state": {"phase": "Running"}, "retryCount": 0}}
    server.answer("GET", f"{JOBS}/{job['metadata']['name']}", running)
    result = command(server, tmp_path, "submit", str(bundle))
    assert result.exit_code == 1
    assert f"already exists in namespace {NS} (Running): it is this run" in " ".join(result.stderr.split())
    assert server.asked("POST") == [] and server.asked("PATCH") == []


def test_submit_refuses_another_namespace_and_a_bundle_with_a_secret(bundle: Path, tmp_path: Path) -> None:
    from tests.unit.cluster.conftest import invoke

    result = invoke("submit", str(bundle), "-n", "other")
    assert result.exit_code == 2 and f"the bundle's namespace is {NS}, not other" in result.stderr
    for command_name in ("status", "logs", "cancel"):
        result = invoke(command_name, str(bundle), "-n", "other")
        assert result.exit_code == 2 and f"is a bundle of namespace {NS}, not other (-n)" in result.stderr
    planted = tmp_path / "b"
    import shutil

    shutil.copytree(bundle, planted)
    (planted / "key.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "k"}}))
    kustomization = yaml.safe_load((planted / "kustomization.yaml").read_text())
    kustomization["resources"].append("key.yaml")
    (planted / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    result = invoke("submit", str(planted))
    assert result.exit_code == 2 and "a Secret among the resources" in result.stderr
