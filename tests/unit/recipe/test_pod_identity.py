"""Who the pods are: cluster.service_account, image_pull_secrets, priority_class and extra pod labels and annotations
— absent from the Job unless set, refused with the key named when Kubernetes would refuse them (or when they would
change a key recipekit, Volcano or the hardware sets), and a Job that sets them all passes the Volcano CRD schema, its
admission webhook and the v1 PodTemplate schema with the API server's name, label and annotation rules."""

from __future__ import annotations

import copy

import pytest
import yaml

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import resolve
from recipekit.validate.static.volcano import pod_template_findings, schema_findings, webhook_findings
from tests.conftest import render_files

ASCEND = ["recipe=llama3_8b_sft", "hw=ascend910b", "cluster.nodes=2"]
IDENTITY = [
    "cluster.image_pull_secrets=[regcred,mirror.pull-secret]",
    "cluster.service_account=llm-trainer",
    "cluster.priority_class=training-high",
    "+cluster.pod_labels={team: llm, example.com/cost-centre: r-and-d}",
    "+cluster.pod_annotations={Example.COM/Owner: alice, example.com/ticket: 'LLM-42: phi-4 LoRA'}",
]


def job(overrides: list[str]) -> dict:
    return yaml.safe_load(render_files(overrides)["volcano-job.yaml"])


def admitted(doc: dict) -> list:
    pods = pod_template_findings(doc)
    assert not isinstance(pods, str), pods  # kubernetes-validate is in the test extra
    return schema_findings(doc) + webhook_findings(doc) + pods


def test_unset_the_pods_carry_no_identity_fields() -> None:
    doc = job(ASCEND)
    template = doc["spec"]["tasks"][0]["template"]
    assert not {"serviceAccountName", "imagePullSecrets", "priorityClassName"} & set(template["spec"])
    assert set(template["metadata"]["labels"]) == {
        "app.kubernetes.io/name",
        "app.kubernetes.io/managed-by",
        "ring-controller.atlas",
    }
    assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}


def test_pull_secrets_service_account_and_priority_class_pass_the_kubernetes_and_volcano_schemas() -> None:
    doc = job([*ASCEND, *IDENTITY])
    template = doc["spec"]["tasks"][0]["template"]
    pod = template["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror.pull-secret"}]
    assert pod["serviceAccountName"] == "llm-trainer"
    assert pod["priorityClassName"] == doc["spec"]["priorityClassName"] == "training-high"
    labels = template["metadata"]["labels"]
    assert labels["team"] == "llm" and labels["example.com/cost-centre"] == "r-and-d"
    assert labels["ring-controller.atlas"] == "ascend-910b"  # the hardware's label is kept beside them
    notes = template["metadata"]["annotations"]
    assert notes["Example.COM/Owner"] == "alice" and notes["sidecar.istio.io/inject"] == "false"
    assert admitted(doc) == []


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        ("cluster.service_account=Trainer", "cluster.service_account", "DNS-1123 subdomain"),
        ("cluster.image_pull_secrets=[regcred,reg_cred]", "cluster.image_pull_secrets[1]", "DNS-1123 subdomain"),
        ("cluster.image_pull_secrets=[regcred,regcred]", "cluster.image_pull_secrets", "regcred listed twice"),
        ("cluster.priority_class=-high", "cluster.priority_class", "DNS-1123 subdomain"),
        ("+cluster.pod_labels={team_: llm}", "cluster.pod_labels.team_", "Kubernetes label key"),
        ("+cluster.pod_labels={team: -llm}", "cluster.pod_labels.team", "Kubernetes label value"),
        ("+cluster.pod_labels={team: " + "x" * 64 + "}", "cluster.pod_labels.team", "at most 63"),
        ("+cluster.pod_annotations={example.com/: x}", "cluster.pod_annotations.example.com/", "empty name"),
        ("+cluster.pod_labels={app.kubernetes.io/name: x}", "cluster.pod_labels.app.kubernetes.io/name", "recipekit"),
        ("+cluster.pod_labels={volcano.sh/job-name: x}", "cluster.pod_labels.volcano.sh/job-name", "Volcano's job"),
        ("+cluster.pod_labels={recipekit.io/run: x}", "cluster.pod_labels.recipekit.io/run", "recipekit sets"),
        (
            "+cluster.pod_annotations={scheduling.k8s.io/group-name: x}",
            "cluster.pod_annotations.scheduling.k8s.io/group-name",
            "Volcano's job controller sets",
        ),
        (
            "+cluster.pod_annotations={sidecar.istio.io/inject: 'true'}",
            "cluster.pod_annotations.sidecar.istio.io/inject",
            "recipekit sets",
        ),
        ("+cluster.pod_labels={ring-controller.atlas: x}", "cluster.pod_labels.ring-controller.atlas", "hw.pod_labels"),
    ],
)
def test_a_value_kubernetes_or_the_pods_would_refuse_is_refused_naming_its_key(
    override: str, key: str, words: str
) -> None:
    with pytest.raises(RecipeError) as raised:
        resolve([*ASCEND, override])
    problems = [p for p in raised.value.problems if p.key == key]
    assert problems and words in str(problems[0]), raised.value.problems


def test_annotations_past_kubernetes_256_kib_are_refused() -> None:
    values = ",".join(f"example.com/n{i}: {'v' * 4000}" for i in range(66))  # 66 × 4 kB: past 256 KiB less 4 KiB
    with pytest.raises(RecipeError) as raised:
        resolve([*ASCEND, "+cluster.pod_annotations={" + values + "}"])
    assert "Kubernetes allows 262144 per pod" in str(raised.value)


def test_validate_refuses_a_hand_edited_job_with_names_the_api_server_refuses() -> None:
    doc = job([*ASCEND, *IDENTITY])
    edited = copy.deepcopy(doc)
    template = edited["spec"]["tasks"][0]["template"]
    template["spec"]["serviceAccountName"] = "LLM_Trainer"
    template["spec"]["imagePullSecrets"].append({"name": "reg cred"})
    template["metadata"]["labels"]["team"] = "llm team"
    template["metadata"]["annotations"]["bad key/"] = "x"
    fields = {f.field: f.message for f in pod_template_findings(edited)}
    where = "spec.tasks[0].template"
    assert "DNS-1123 subdomain" in fields[f"{where}.spec.serviceAccountName"]
    assert f"{where}.spec.imagePullSecrets[2].name" in fields
    assert "value" in fields[f"{where}.metadata.labels.team"]
    assert f"{where}.metadata.annotations.bad key/" in fields
