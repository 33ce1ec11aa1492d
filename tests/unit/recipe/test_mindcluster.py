"""MindCluster fault rescheduling as recipe keys: off by default (no label), the vcjob labels when asked, refused off
Ascend."""

from __future__ import annotations

import pytest
import yaml

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import resolve
from recipekit.recipe.mindcluster import FAULT_RETRY_LABEL, FAULT_SCHEDULING_LABEL
from recipekit.validate.static.volcano import schema_findings, webhook_findings
from tests.conftest import render_files

ASCEND = ["recipe=llama3_8b_sft", "hw=ascend910b"]


def job(overrides: list[str]) -> dict:
    return yaml.safe_load(render_files(overrides)["volcano-job.yaml"])


def test_off_by_default_the_job_carries_no_mindcluster_label() -> None:
    labels = job(ASCEND)["metadata"]["labels"]
    assert FAULT_SCHEDULING_LABEL not in labels and FAULT_RETRY_LABEL not in labels


@pytest.mark.parametrize("mode", ["grace", "force"])
def test_job_level_rescheduling_labels_the_job(mode: str) -> None:
    doc = job([*ASCEND, f"cluster.mindcluster.fault_scheduling={mode}", "cluster.mindcluster.fault_retry_times=2"])
    labels = doc["metadata"]["labels"]
    assert labels[FAULT_SCHEDULING_LABEL] == mode and labels[FAULT_RETRY_LABEL] == "2"  # label values are strings
    assert schema_findings(doc) == [] and webhook_findings(doc) == []
    # the pods keep what MindCluster's device plugin needs; the policies stay the runtime contract's
    assert doc["spec"]["tasks"][0]["template"]["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
    assert {"event": "PodEvicted", "action": "RestartJob"} in doc["spec"]["policies"]


def test_mindcluster_on_gpus_is_refused_with_the_reason() -> None:
    with pytest.raises(RecipeError) as info:
        resolve(["recipe=llama3_8b_sft", "hw=h100", "cluster.mindcluster.fault_scheduling=grace"])
    assert "MindCluster fault rescheduling is for Ascend clusters" in str(info.value)


def test_unknown_modes_and_retry_counts_are_refused() -> None:
    with pytest.raises(RecipeError):
        resolve([*ASCEND, "cluster.mindcluster.fault_scheduling=pod"])
    with pytest.raises(RecipeError):
        resolve([*ASCEND, "cluster.mindcluster.fault_retry_times=101"])


def test_the_bundle_readme_says_what_mindcluster_does_only_when_on() -> None:
    assert "MindCluster fault rescheduling" not in render_files(ASCEND)["README.md"].decode()
    readme = render_files([*ASCEND, "cluster.mindcluster.fault_scheduling=grace"])["README.md"].decode()
    assert "`fault-scheduling: grace` on the Job" in readme and "deletes the pods gracefully" in readme
