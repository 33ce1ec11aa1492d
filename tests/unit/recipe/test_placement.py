"""cluster.placement: tolerations, node affinity, one pod per node and Volcano network topology — off by default (the
Job unchanged), typed and refused with the key named when wrong, and the Job they make passes the CRD and webhook
of the Volcano release it names (and no other)."""

from __future__ import annotations

import copy

import pytest
import yaml
from click.testing import CliRunner

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import resolve
from recipekit.bundle.placement import VOLCANO_RELEASE_ANNOTATION
from recipekit.cli import main
from recipekit.validate.static.volcano import pod_template_findings, schema_findings, webhook_findings
from tests.conftest import render_files

ASCEND = ["recipe=llama3_8b_sft", "hw=ascend910b", "cluster.nodes=4"]
TOLERATE = "cluster.placement.tolerations=[{key:'huawei.com/Ascend910',operator:Exists,effect:NoSchedule}]"
AFFINITY = [
    "cluster.placement.node_affinity.required=[{key:accelerator-type,operator:In,values:[module-910b-8]}]",
    "cluster.placement.node_affinity.preferred=[{weight:50,match:[{key:rack,operator:NotIn,values:[r9]}]}]",
    "cluster.placement.one_pod_per_node=required",
]


def topology(release: str, job: str = "{highest_tier_allowed:2}", partition: str | None = None) -> str:
    parts = [f"volcano:'{release}'", f"job:{job}"] + ([f"partition:{partition}"] if partition else [])
    return "cluster.placement.network_topology={" + ",".join(parts) + "}"


def job(overrides: list[str]) -> dict:
    return yaml.safe_load(render_files(overrides)["volcano-job.yaml"])


def admitted(doc: dict) -> list:
    """Every finding of the CRD schema, the webhook and the pod template check (empty: the cluster takes it)."""
    pods = pod_template_findings(doc)
    return schema_findings(doc) + webhook_findings(doc) + ([] if isinstance(pods, str) else pods)


def test_without_the_keys_the_job_has_no_placement_fields() -> None:
    doc = job(ASCEND)
    pod = doc["spec"]["tasks"][0]["template"]["spec"]
    assert "tolerations" not in pod and "affinity" not in pod
    assert "networkTopology" not in doc["spec"] and "partitionPolicy" not in doc["spec"]["tasks"][0]
    assert "annotations" not in doc["metadata"]


def test_tolerations_affinity_and_network_topology_pass_the_crd_of_the_named_release() -> None:
    partition = "{pods:2,mode:soft,highest_tier_name:leaf}"
    doc = job([*ASCEND, TOLERATE, *AFFINITY, topology("1.14", partition=partition)])
    task = doc["spec"]["tasks"][0]
    pod = task["template"]["spec"]
    assert pod["tolerations"] == [{"operator": "Exists", "key": "huawei.com/Ascend910", "effect": "NoSchedule"}]
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["module-910b-8"]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"]["app.kubernetes.io/name"] == doc["metadata"]["name"]
    # the trainers avoid each other only: Volcano labels each pod with its task, an elastic Job's rendezvous pod rdzv
    assert anti["labelSelector"]["matchLabels"]["volcano.sh/task-spec"] == task["name"]
    assert doc["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 2}
    assert task["partitionPolicy"] == {
        "totalPartitions": 2,
        "partitionSize": 2,
        "networkTopology": {"mode": "soft", "highestTierName": "leaf"},
    }
    assert doc["metadata"]["annotations"] == {VOLCANO_RELEASE_ANNOTATION: "1.14"}
    assert admitted(doc) == []
    # the same Job under a release without partitions is refused by that release's CRD
    older = copy.deepcopy(doc)
    older["metadata"]["annotations"][VOLCANO_RELEASE_ANNOTATION] = "1.13"
    assert any(f.field == "spec.tasks[0].partitionPolicy" for f in schema_findings(older))


@pytest.mark.parametrize("release", ["1.12", "1.13", "1.15"])
def test_job_level_topology_passes_each_release(release: str) -> None:
    assert admitted(job([*ASCEND, topology(release)])) == []


def test_a3_superpod_block_composes_with_placement() -> None:
    base = ["recipe=llama3_8b_sft", "hw=ascend910_a3_superpod", "cluster.nodes=4"]
    doc = job([*base, TOLERATE, *AFFINITY, topology("1.14", job="{highest_tier_name:spine}")])
    assert doc["metadata"]["annotations"] == {"sp-block": "64", VOLCANO_RELEASE_ANNOTATION: "1.14"}
    template = doc["spec"]["tasks"][0]["template"]
    assert template["metadata"]["annotations"]["sp-block"] == "64"
    assert "tolerations" in template["spec"] and "podAntiAffinity" in template["spec"]["affinity"]
    assert admitted(doc) == []


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        ("cluster.placement.tolerations=[{key:a,operator:Maybe}]", "tolerations[0].operator", "'Exists', 'Equal'"),
        ("cluster.placement.tolerations=[{key:a,effect:Never}]", "tolerations[0].effect", "'NoExecute'"),
        ("cluster.placement.tolerations=[{operator:Equal,value:b}]", "tolerations[0].operator", "key is unset"),
        ("cluster.placement.tolerations=[{key:a,operator:Exists,value:b}]", "tolerations[0].value", "Exists"),
        ("cluster.placement.tolerations=[{key:a,toleration_seconds:9}]", "toleration_seconds", "NoExecute"),
        ("cluster.placement.tolerations=[{key:'a b'}]", "tolerations[0].key", "label key"),
        ("cluster.placement.node_affinity.required=[{key:a,operator:In}]", "required[0].values", "one or more"),
        ("cluster.placement.node_affinity.required=[{key:a,operator:Gt,values:[x]}]", "values", "one integer"),
        ("cluster.placement.node_affinity.required=[{key:a,operator:Exists,values:[x]}]", "values", "no values"),
        ("cluster.placement.node_affinity.preferred=[{weight:101,match:[]}]", "preferred[0].weight", "100"),
        ("cluster.placement.one_pod_per_node=always", "one_pod_per_node", "'required'"),
        (topology("1.11"), "network_topology.volcano", "'1.12'"),
        (topology("1.14", job="{highest_tier_allowed:0}"), "job.highest_tier_allowed", "greater than or equal to 1"),
        (topology("1.14", job="{highest_tier_allowed:two}"), "job.highest_tier_allowed", "integer"),
        (topology("1.14", job="{highest_tier_allowed:1,highest_tier_name:a}"), "network_topology.job", "give one"),
        (topology("1.14", job="{mode:hard}"), "network_topology.job", "highest_tier_allowed"),
        (topology("1.14", job="{mode:strict,highest_tier_allowed:1}"), "job.mode", "'hard', 'soft'"),
        (topology("1.14", job="{highest_tier_name:Spine_1}"), "job.highest_tier_name", "DNS-1123"),
        (topology("1.13", job="{highest_tier_name:spine}"), "network_topology.job", "Volcano ≥ 1.14"),
        (topology("1.13", partition="{pods:2,highest_tier_allowed:1}"), "network_topology.partition", "≥ 1.14"),
        (topology("1.14", partition="{pods:3,highest_tier_allowed:1}"), "partition.pods", "do not divide the 4"),
    ],
)
def test_each_bad_value_is_refused_naming_its_key(override: str, key: str, words: str) -> None:
    with pytest.raises(RecipeError) as info:
        resolve([*ASCEND, override])
    assert any(key in p.key and words in f"{p.message} {p.hint or ''}" for p in info.value.problems), str(info.value)


def test_the_cli_refuses_a_bad_toleration_in_one_line_with_exit_2(tmp_path) -> None:
    bad = "cluster.placement.tolerations=[{key:a,operator:Sometimes}]"
    done = CliRunner().invoke(main, ["build", "recipe=llama3_8b_sft", bad, "-o", str(tmp_path / "b")])
    assert done.exit_code == 2 and "Traceback" not in done.output
    assert done.output.splitlines() == [
        "error: 1 problem:",
        "  - cluster.placement.tolerations[0].operator: must be one of 'Exists', 'Equal' (got 'Sometimes')",
    ]
    assert not (tmp_path / "b").exists()


def test_the_validator_holds_a_job_to_its_release() -> None:
    doc = job([*ASCEND, topology("1.14", partition="{pods:2,highest_tier_allowed:1}")])
    edited = copy.deepcopy(doc)
    edited["spec"]["networkTopology"] = {"mode": "medium", "highestTierAllowed": -1, "highestTierName": "a"}
    fields = {f.field: f.message for f in schema_findings(edited)}
    assert "not one of hard, soft" in fields["spec.networkTopology.mode"]
    assert "below the minimum 0" in fields["spec.networkTopology.highestTierAllowed"]
    assert any("simultaneously" in f.message for f in webhook_findings(edited))
    edited = copy.deepcopy(doc)
    edited["spec"]["tasks"][0]["partitionPolicy"]["totalPartitions"] = 3
    assert any("totalPartitions 3 × partitionSize 2" in f.message for f in webhook_findings(edited))
    edited = copy.deepcopy(doc)
    edited["metadata"]["annotations"][VOLCANO_RELEASE_ANNOTATION] = "1.12"
    edited["spec"]["networkTopology"] = {"mode": "hard", "highestTierName": "spine"}
    assert any("not in Volcano 1.12" in (f.hint or "") for f in schema_findings(edited))
    edited["metadata"]["annotations"][VOLCANO_RELEASE_ANNOTATION] = "2.0"
    assert any("not a known Volcano release" in f.message for f in schema_findings(edited))
    del edited["metadata"]["annotations"]
    assert any("older clusters" in (f.hint or "") for f in schema_findings(edited))


def test_the_bundle_readme_says_what_the_placement_needs_only_when_set() -> None:
    assert "HyperNode" not in render_files(ASCEND)["README.md"].decode()
    readme = render_files(["recipe=llama3_8b_sft", "cluster=ascend_hypernode"])["README.md"].decode()
    assert "written for Volcano 1.14" in readme and "`kubectl get hypernodes`" in readme
    assert "needs 4 distinct nodes whose taints the pods tolerate" in readme


def test_an_unquoted_version_is_taken_where_it_is_unambiguous_and_refused_naming_the_quoting_elsewhere() -> None:
    """Issue 38: `volcano: 1.12` unquoted is the number 1.12 to YAML and to Hydra's override grammar. It is taken as
    '1.12' (one release reads so); 1.10 is the number 1.1, which names no release: refused, saying it was read as a
    number and how to quote it (before: "must be one of '1.12', ... (got 1.12)")."""
    unquoted = "cluster.placement.network_topology={volcano:1.12,job:{highest_tier_allowed:2}}"
    assert resolve([*ASCEND, unquoted]).recipe.cluster.placement.network_topology.volcano == "1.12"
    with pytest.raises(RecipeError) as info:
        resolve([*ASCEND, "cluster.placement.network_topology={volcano:1.10,job:{highest_tier_allowed:2}}"])
    (problem,) = [p for p in info.value.problems if "volcano" in p.key]
    said = f"{problem.message} {problem.hint or ''}"
    assert "read as the number 1.1" in said and "quote it" in said, said
